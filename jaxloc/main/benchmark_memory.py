"""The batch planner's memory estimate against XLA's accounting, and the batches it picks on accelerators.

    python -m experiments.benchmark_memory --output_json=benchmark_memory.json

For every preset shape (`random:<preset>`) and task shape (the embedded tasks' real request sets under the
SmolLM2 tokenizer, plus two long synthetic shapes), the engine's plan is made twice: with the CPU defaults (2048
tokens per call, 8 GiB) and as on an 80 GB GPU (65536 tokens per call, the default budget of a 75% `bytes_limit`
less the bfloat16 parameters). Each planned call is compiled with abstract parameters (nothing is allocated) and
XLA's `memory_analysis()` is compared with the planner's estimate (`jaxloc.bench.memory`; on a CPU the larger of
the graph XLA:CPU runs and the graph without its library fusions, which holds what an accelerator holds). On a CPU
compiled in float32: XLA's CPU backend upcasts bfloat16 matmuls to float32 (copying the weights), which would not
describe an accelerator; on an accelerator, or for a `--target`, in bfloat16 and for the 80 GB plan only, as it
runs there (`compile_dtype`). Then the batches an 80 GB GPU and a 16 GiB TPU core get, per preset and task.

Generation (`--parts=generation`): for every preset, the GSM8K-like generation job (`memory.GSM8K_GENERATION`: 400
masks x 100 documents, a 700-token shared prefix, 120-token questions, 256 new tokens) laid out as the generator
lays it out on an 80 GB GPU (bfloat16 plan), its calls compiled (`compile_dtype`) with abstract parameters and
state, the planner's estimate against the peak of XLA's bytes over the calls. Decode cost (`--parts=decode_cost`):
one decode step of that job at `--decode_preset`'s layout, the bytes XLA's graph moves against the floor
(`jaxloc.bench.decode_cost`). Only the generation parts:

    python -m experiments.benchmark_memory --parts=generation,decode_cost --output_json=benchmark_memory.json

For a GPU that is not here (`--target=h100`, `jaxloc.bench.deviceless`: XLA:GPU compiles for the described device
with no GPU or driver; XLA's CUDA plugin on the path): every call in bfloat16, as the GPU runs it, XLA:GPU's own
graph and memory analysis; the decode step's bytes also as milliseconds at the device's memory bandwidth, and as
the minutes 400 masks' decoding takes at that rate. `--free_share` lays the generation job out within another share
of an 80 GB GPU's free memory than the engine's default (a wider budget: more rows a decode step); an
`--output_json` holds the figures of one share. cuBLAS fallbacks are recorded per part.

    pip install --no-deps --target=.deviceless jax-cuda12-plugin==$JAX jax-cuda12-pjrt==$JAX   # $JAX: jaxlib's version
    PYTHONPATH=.deviceless python -m experiments.benchmark_memory --target=h100 --parts=generation,decode_cost \
        --output_json=benchmark_memory_h100.json
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax.numpy as jnp

from jaxloc import cli, files
from jaxloc.bench import decode_cost, deviceless, memory
from jaxloc.engine import generation_kernels, planner
from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.models.loading import load_model
from jaxloc.models.presets import PRESETS


PARTS = ("scoring", "generation", "decode_cost")


@dataclasses.dataclass
class BenchmarkMemoryConfig:
  presets: list = setting(list(PRESETS), "Preset shapes (random:<preset>).")
  tasks: list = setting(["plurals", "arithmetic_1d_4shot", "induction", "counting"],
                        "Embedded tasks whose request shapes are planned (plus the long synthetic shapes).")
  long_shapes: bool = setting(True, "Also plan the long synthetic shapes (MMLU-like, 8-shot GSM8K-like).")
  stress: bool = setting(True, "Also compare at fixed call shapes at the corners (jaxloc.bench.memory.STRESS_CALLS).")
  parts: list = setting(list(PARTS),
                        "What to run: scoring (the planned scoring calls, the corners, the batches), generation (the "
                        "GSM8K-like generation job per preset), decode_cost (bytes per decode step against the floor).")
  decode_preset: str = setting("llama-3.1-8b", "The preset whose decode step --parts=decode_cost compiles.")
  target: str = setting("", "Compile for this GPU instead of the backend in use, with no GPU here "
                        f"(jaxloc.bench.deviceless: {', '.join(deviceless.TARGETS)}; needs XLA's CUDA plugin), in "
                        "bfloat16 as the GPU runs it; empty: the backend in use.")
  free_share: float = setting(planner.FREE_SHARE, "The share of an 80 GB GPU's free memory (once the parameters "
                              "are placed) that the generation job's layouts take: the engine's default, or what a "
                              "larger budget would lay out (the kit's h100 step runs both).", lower=0.05, upper=1.0)
  output_json: str = setting(None, "Where to write the figures (an existing file keeps the parts not run).", type=str)


TPU_CORE_BYTES = 16 * memory.GIB
SETTINGS = {"cpu": (2048, 8 * memory.GIB), "gpu80": (65536, None)}


def compile_dtype():
  """What the calls are compiled in: float32 for a CPU (XLA:CPU upcasts bfloat16 matmuls, copying the weights),
  bfloat16, as it runs there, for a GPU (`--target`)."""
  return jnp.float32 if deviceless.platform() == "cpu" else jnp.bfloat16


def main(config: BenchmarkMemoryConfig) -> None:
  if config.target:  # before anything starts JAX
    deviceless.check(config.target)
  if config.output_json:
    files.check_writable(config.output_json, "--output_json")
  unknown = [p for p in config.presets + [config.decode_preset] if p not in PRESETS]
  if unknown:
    raise UserError(f"unknown --presets or --decode_preset {unknown}; valid: {', '.join(PRESETS)}")
  unknown = [p for p in config.parts if p not in PARTS]
  if unknown:
    raise UserError(f"unknown --parts {unknown}; valid: {', '.join(PARTS)}")

  payload = (files.read_json(config.output_json) or {}) if config.output_json else {}
  with deviceless.compiling_for(config.target or None):
    compiled_for = {"backend": deviceless.platform(), "target": deviceless.TARGETS[config.target]["description"]
                    + " (compiled without one)" if config.target else None, "free_share": config.free_share}
    earlier = {key: payload.get(key) for key in compiled_for}
    earlier["free_share"] = payload.get("free_share", planner.FREE_SHARE)  # (files from before the flag: the default)
    if payload and earlier != compiled_for:  # parts not run this time would describe another device
      raise UserError(f"--output_json={config.output_json} holds figures compiled for {earlier}, not "
                      f"{compiled_for}: write this run's elsewhere")
    payload.update(compiled_for)
    fallbacks: dict = {}  # per part
    if config.target:
      earlier_fallbacks = payload.get("cublas_fallbacks", {})
      if not isinstance(earlier_fallbacks, dict) and set(config.parts) != {"scoring", "generation", "decode_cost"}:
        raise UserError(f"--output_json={config.output_json} lists its cuBLAS fallbacks for every part at once (a "
                        "file from before they were kept per part): run every part into it, or write elsewhere")
      fallbacks = payload["cublas_fallbacks"] = earlier_fallbacks if isinstance(earlier_fallbacks, dict) else {}
    for part, run in (("scoring", scoring), ("generation", generation), ("decode_cost", decode_step)):
      if part not in config.parts:
        continue
      deviceless.FALLBACKS.clear()
      figures = run(config)
      if part == "scoring":  # its figures are several top-level entries
        payload.update(figures)
      else:
        payload[part] = figures
      if config.target:  # per part: a run of some parts keeps the others' with their figures
        fallbacks[part] = list(deviceless.FALLBACKS)
        if deviceless.FALLBACKS:
          print(f"\n{part}: {len(deviceless.FALLBACKS)} calls compiled with their matmuls on cuBLAS: XLA:GPU's Triton "
                f"emitter found no tiling without the device to autotune (jaxloc.bench.deviceless.compile); the "
                f"first: {deviceless.FALLBACKS[0]}")
  if config.output_json:
    files.write_json(config.output_json, payload)


def scoring(config: BenchmarkMemoryConfig) -> dict:
  """The scoring calls planned per preset and task shape against XLA, the corners, and the batches per device."""
  tokenizer = load_model("smollm2-135m").tokenizer
  shapes = [memory.task_shape(name, tokenizer) for name in config.tasks]
  shapes += list(memory.LONG_SHAPES) if config.long_shapes else []
  rows, batches = [], []
  dtype_name = jnp.dtype(compile_dtype()).name
  settings = SETTINGS if deviceless.platform() == "cpu" else {"gpu80": SETTINGS["gpu80"]}
  print(f"backend {deviceless.platform()}, compiled in {dtype_name}; estimate / XLA (never under 1.0; ideally at "
        "most ~1.25)")
  print(f"{'preset':14s} {'task':36s} {'plan':6s} {'masks':>5s} {'reqs':>4s} {'estimate GiB':>12s} "
        f"{'XLA GiB':>8s} {'ratio':>6s}")
  for preset in config.presets:
    model = PRESETS[preset]  # the preset's model config (`config` is the benchmark's)
    params_bf16 = memory.param_bytes(model, jnp.bfloat16)
    for shape in shapes:
      for setting, (tokens, budget) in settings.items():
        budget = budget or memory.device_budget(memory.GPU80_BYTES, params_bf16)
        dtype = jnp.float32 if setting == "cpu" else jnp.bfloat16
        plan = memory.plan(model, shape, dtype, budget, tokens)
        start = time.perf_counter()
        row = memory.compare(model, shape, compile_dtype(), plan.masks_per_call, plan.requests_per_call)
        row.update(preset=preset, plan=setting, compile_seconds=time.perf_counter() - start)
        rows.append(row)
        print(f"{preset:14s} {shape.name:36s} {setting:6s} {row['masks']:5d} {row['requests']:4d} "
              f"{row['estimate_bytes'] / memory.GIB:12.2f} {row['xla_bytes'] / memory.GIB:8.2f} {row['ratio']:6.2f}",
              flush=True)
      batch = {"preset": preset, "task": shape.name}
      for device, device_bytes in (("gpu80", memory.GPU80_BYTES), ("tpu16", TPU_CORE_BYTES)):
        parallel = memory.min_model_parallel(device_bytes, params_bf16)
        plan = memory.plan(model, shape, jnp.bfloat16, memory.device_budget(device_bytes, params_bf16, parallel),
                           65536)
        batch[device] = {"model_parallel": parallel, "masks_per_call": plan.masks_per_call,
                         "requests_per_call": plan.requests_per_call,
                         "estimated_gib": plan.estimated_bytes / memory.GIB}
      batches.append(batch)
  ratios = [r["ratio"] for r in rows]
  print(f"\nestimate / XLA over {len(rows)} planned calls: min {min(ratios):.3f}, max {max(ratios):.3f}")
  stress = []
  if config.stress:
    for preset in config.presets:
      for masks, requests, seq, context, targets in memory.STRESS_CALLS:
        shape = memory.TaskShape(f"{requests}x{seq} after {context}, {targets} targets", requests, seq, seq, context,
                                 targets)
        stress.append(dict(memory.compare(PRESETS[preset], shape, compile_dtype(), masks, requests), preset=preset))
    stress_ratios = [r["ratio"] for r in stress]
    print(f"estimate / XLA over {len(stress)} stress call shapes: min {min(stress_ratios):.3f}, "
          f"max {max(stress_ratios):.3f}")
  print("\nbatches per call in bfloat16 (masks x requests; model_parallel where the parameters need it):")
  print(f"{'preset':14s} {'task':36s} {'80 GB GPU':>14s} {'16 GiB TPU core':>18s}")
  for b in batches:
    cells = [f"{b[d]['masks_per_call']} x {b[d]['requests_per_call']}" + (
        f" (mp {b[d]['model_parallel']})" if b[d]["model_parallel"] > 1 else "") for d in ("gpu80", "tpu16")]
    print(f"{b['preset']:14s} {b['task']:36s} {cells[0]:>14s} {cells[1]:>18s}")
  return {"comparisons": rows, "stress": stress, "batches": batches, "min_ratio": min(ratios),
          "max_ratio": max(ratios)}


def generation(config: BenchmarkMemoryConfig) -> list[dict]:
  """The GSM8K-like generation job per preset: the generator's layout on an 80 GB GPU, the planner's estimate and
  XLA's peak over the job's calls, both in `compile_dtype`."""
  shape = memory.GSM8K_GENERATION
  prefix, suffix, new = shape.widths
  print(f"\ngeneration: {shape.name}, {shape.masks} masks x {shape.docs} documents, prefix {prefix}, suffix {suffix}, "
        f"{new} new tokens; the 80 GB GPU layout (bfloat16 plan), compiled in {jnp.dtype(compile_dtype()).name}; "
        "estimate / XLA's peak over the calls (never under 1.0)")
  print(f"{'preset':14s} {'slots':>5s} {'rows':>4s} {'held':>4s} {'estimate GiB':>12s} {'XLA GiB':>8s} {'ratio':>6s} "
        f"{'peak call':>10s} {'state GiB':>9s}  XLA beyond the state, GiB, per call")
  rows = []
  for preset in config.presets:
    model = PRESETS[preset]
    budget = memory.gpu80_budget(model, config.free_share)
    plan = memory.gpu80_generation_plan(model, shape, config.free_share)
    start = time.perf_counter()
    row = memory.compare_generation(model, shape, compile_dtype(), plan)
    row.update(preset=preset, budget_bytes=budget, plan_estimate_bytes=plan.estimated_bytes,
               compile_seconds=time.perf_counter() - start)
    rows.append(row)
    beyond = ", ".join(f"{call} {(size - row['state_bytes']) / memory.GIB:.2f}"
                       for call, size in row["xla_calls"].items())
    print(f"{preset:14s} {row['slots']:5d} {row['rows']:4d} {'yes' if row['held_layers'] else 'no':>4s} "
          f"{row['estimate_bytes'] / memory.GIB:12.2f} "
          f"{row['xla_bytes'] / memory.GIB:8.2f} {row['ratio']:6.2f} {row['peak_call']:>10s} "
          f"{row['state_bytes'] / memory.GIB:9.2f}  {beyond}", flush=True)
  ratios = [r["ratio"] for r in rows]
  print(f"estimate / XLA over {len(rows)} generation jobs: min {min(ratios):.3f}, max {max(ratios):.3f}")
  return rows


def decode_step(config: BenchmarkMemoryConfig) -> list[dict]:
  """One decode step of the GSM8K-like job at `decode_preset`'s 80 GB layout: XLA's bytes against the floor, at the
  whole cache and at its first half of blocks (`generation_kernels.cache_blocks`); on a CPU in float32, for both of
  its graphs."""
  model = PRESETS[config.decode_preset]
  shape = memory.GSM8K_GENERATION
  prefix, suffix, new = shape.widths
  plan = memory.gpu80_generation_plan(model, shape, config.free_share)
  cpu = deviceless.platform() == "cpu"
  dtype = compile_dtype()
  graphs = dict(zip(("xla_cpu", "without_library_fusions"), memory.CPU_GRAPHS)) if cpu else {"as_compiled": {}}
  print(f"\ndecode step of {config.decode_preset}, {shape.name} ({jnp.dtype(dtype).name}; weights read once, the "
        "prefix once per mask slot and each row's cache to the span is the floor; goal: within 1.5x)")
  results = []
  every = len(generation_kernels.cache_blocks(suffix + new))
  for blocks in sorted({every, max(1, every // 2)}, reverse=True):
    for graph, options in graphs.items():
      cost = decode_cost.step_cost(model, dtype, plan.slots, plan.rows, prefix, suffix + new, new, blocks=blocks,
                                   compiler_options=options, held_layers=plan.held_layers)
      cost.update(preset=config.decode_preset, graph=graph)
      results.append(cost)
      print(f"[{graph}] " + decode_cost.describe(cost), flush=True)
      if config.target:  # the time the step's bytes take at the target's memory bandwidth, the call's own spread
        bandwidth = deviceless.TARGETS[config.target]["memory_bandwidth"]
        cost["bandwidth_bound_ms"] = 1e3 * cost["amortized_ratio"] * cost["floor"]["total"] / bandwidth
        cost["decode_minutes"] = decode_minutes(shape, plan.slots, plan.rows, cost["bandwidth_bound_ms"])
        print(f"  at the {config.target}'s {bandwidth / 1e12:.2f} TB/s: {cost['bandwidth_bound_ms']:.2f} ms a step "
              f"(the floor's: {1e3 * cost['floor']['total'] / bandwidth:.2f} ms), {plan.slots} masks a step: "
              f"{shape.masks} masks x {math.ceil(shape.docs / plan.rows) * shape.new} steps = "
              f"{cost['decode_minutes']:.1f} minutes of decoding")
  return results


def decode_minutes(shape: memory.GenerationShape, slots: int, rows: int, step_ms: float) -> float:
  """Minutes of decoding for `shape`'s masks at `step_ms` a step of `slots` mask slots x `rows` rows: a slot's rows
  hold one mask's documents, in as many passes as it takes where it holds fewer; a mask takes `shape.new` steps of a
  slot a pass, and a step serves `slots` masks."""
  return shape.masks * math.ceil(shape.docs / rows) * shape.new * step_ms / slots / 6e4


def console() -> None:
  cli.console(BenchmarkMemoryConfig, main)
