"""The batch planner's memory estimate against XLA's accounting, and the batches it picks on accelerators.

    python -m experiments.benchmark_memory --output_json=benchmark_memory.json

For every preset shape (`random:<preset>`) and task shape (the embedded tasks' real request sets under the
SmolLM2 tokenizer, plus two long synthetic shapes), the engine's plan is made twice: with the CPU defaults (2048
tokens per call, 8 GiB) and as on an 80 GB GPU (65536 tokens per call, the default budget of a 75% `bytes_limit`
less the bfloat16 parameters). Each planned call is compiled with abstract parameters (nothing is allocated) and
XLA's `memory_analysis()` is compared with the planner's estimate (`jaxloc.bench.memory`; on a CPU the larger of
the graph XLA:CPU runs and the graph without its library fusions, which holds what an accelerator holds). Compiled
on this backend in float32: XLA's CPU backend upcasts bfloat16 matmuls to float32 (copying the weights), which
would not describe an accelerator. Then the batches an 80 GB GPU and a 16 GiB TPU core get, per preset and task.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import dataclasses

from jaxloc import cli, files
from jaxloc.bench import memory
from jaxloc.errors import UserError
from jaxloc.localize.settings import setting
from jaxloc.models.presets import PRESETS


@dataclasses.dataclass
class BenchmarkMemoryConfig:
  presets: list = setting(list(PRESETS), "Preset shapes (random:<preset>).")
  tasks: list = setting(["plurals", "arithmetic_1d_4shot", "induction", "counting"],
                        "Embedded tasks whose request shapes are planned (plus the long synthetic shapes).")
  long_shapes: bool = setting(True, "Also plan the long synthetic shapes (MMLU-like, 8-shot GSM8K-like).")
  stress: bool = setting(True, "Also compare at fixed call shapes at the corners (jaxloc.bench.memory.STRESS_CALLS).")
  output_json: str = setting(None, "Where to write the figures.", type=str)


GPU_BYTES = int(0.75 * 80e9)  # an 80 GB GPU's bytes_limit under XLA's default 75% preallocation
TPU_CORE_BYTES = 16 * memory.GIB
SETTINGS = {"cpu": (2048, 8 * memory.GIB), "gpu80": (65536, None)}


def main(config: BenchmarkMemoryConfig) -> None:
  from jaxloc.models.loading import load_model

  unknown = [p for p in config.presets if p not in PRESETS]
  if unknown:
    raise UserError(f"unknown --presets {unknown}; valid: {', '.join(PRESETS)}")

  tokenizer = load_model("smollm2-135m").tokenizer
  shapes = [memory.task_shape(name, tokenizer) for name in config.tasks]
  shapes += list(memory.LONG_SHAPES) if config.long_shapes else []
  rows, batches = [], []
  print(f"backend {jax.default_backend()}, compiled in float32; estimate / XLA (never under 1.0; ideally at most ~1.25)")
  print(f"{'preset':14s} {'task':36s} {'plan':6s} {'masks':>5s} {'reqs':>4s} {'estimate GiB':>12s} "
        f"{'XLA GiB':>8s} {'ratio':>6s}")
  for preset in config.presets:
    model = PRESETS[preset]  # the preset's model config (`config` is the benchmark's)
    params_bf16 = memory.param_bytes(model, jnp.bfloat16)
    for shape in shapes:
      for setting, (tokens, budget) in SETTINGS.items():
        budget = budget or memory.device_budget(GPU_BYTES, params_bf16)
        dtype = jnp.float32 if setting == "cpu" else jnp.bfloat16
        plan = memory.plan(model, shape, dtype, budget, tokens)
        start = time.perf_counter()
        row = memory.compare(model, shape, jnp.float32, plan.masks_per_call, plan.requests_per_call)
        row.update(preset=preset, plan=setting, compile_seconds=time.perf_counter() - start)
        rows.append(row)
        print(f"{preset:14s} {shape.name:36s} {setting:6s} {row['masks']:5d} {row['requests']:4d} "
              f"{row['estimate_bytes'] / memory.GIB:12.2f} {row['xla_bytes'] / memory.GIB:8.2f} {row['ratio']:6.2f}",
              flush=True)
      batch = {"preset": preset, "task": shape.name}
      for device, device_bytes in (("gpu80", GPU_BYTES), ("tpu16", TPU_CORE_BYTES)):
        parallel = memory.min_model_parallel(device_bytes, params_bf16)
        plan = memory.plan(model, shape, jnp.bfloat16, memory.device_budget(device_bytes, params_bf16, parallel),
                           65536)
        batch[device] = {"model_parallel": parallel, "masks_per_call": plan.masks_per_call,
                         "requests_per_call": plan.requests_per_call, "estimated_gib": plan.estimated_bytes / memory.GIB}
      batches.append(batch)
  ratios = [r["ratio"] for r in rows]
  print(f"\nestimate / XLA over {len(rows)} planned calls: min {min(ratios):.3f}, max {max(ratios):.3f}")
  stress = []
  if config.stress:
    for preset in config.presets:
      for masks, requests, seq, context, targets in memory.STRESS_CALLS:
        shape = memory.TaskShape(f"{requests}x{seq} after {context}, {targets} targets", requests, seq, seq, context,
                                 targets)
        stress.append(dict(memory.compare(PRESETS[preset], shape, jnp.float32, masks, requests), preset=preset))
    stress_ratios = [r["ratio"] for r in stress]
    print(f"estimate / XLA over {len(stress)} stress call shapes: min {min(stress_ratios):.3f}, "
          f"max {max(stress_ratios):.3f}")
  print("\nbatches per call in bfloat16 (masks x requests; model_parallel where the parameters need it):")
  print(f"{'preset':14s} {'task':36s} {'80 GB GPU':>14s} {'16 GiB TPU core':>18s}")
  for b in batches:
    cells = [f"{b[d]['masks_per_call']} x {b[d]['requests_per_call']}" + (
        f" (mp {b[d]['model_parallel']})" if b[d]["model_parallel"] > 1 else "") for d in ("gpu80", "tpu16")]
    print(f"{b['preset']:14s} {b['task']:36s} {cells[0]:>14s} {cells[1]:>18s}")
  if config.output_json:
    files.write_json(config.output_json, {"backend": jax.default_backend(), "comparisons": rows, "stress": stress,
                                         "batches": batches, "min_ratio": min(ratios), "max_ratio": max(ratios)})


def console() -> None:
  cli.console(BenchmarkMemoryConfig, main)
