"""A scale rehearsal: the real localization pipeline on a random model shaped like a real checkpoint, measured.

The point is not the heads it finds (random weights carry no capability) but what running at that shape costs: wall
time, peak host memory, what was compiled and how long that took, and the planner's choices (masks per call, rows,
chunks, widths) for every request set of the run. `random_model` builds such a model with any tokenizer, so that a
machine without the embedded SmolLM2 package (an accelerator image) can run it from a saved tokenizer folder.
"""

from __future__ import annotations

import dataclasses
import resource
import tempfile
import time
from typing import Any

import jax.numpy as jnp

from jaxloc.bench import decode_cost, memory
from jaxloc.engine import batching, generation_kernels, planner
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.localize import methods
from jaxloc.localize.localization import localize
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.models import presets
from jaxloc.models.config import ModelConfig
from jaxloc.models.decoder import Transformer
from jaxloc.models.loading import LoadedModel

# A design small enough for two CPU cores at 1B parameters: one gradient over every head, a few single-head
# confirmations, few documents, two short general tasks, validation on as many held-out documents.
SMALL_DESIGN = dict(task="plurals", method=methods.DEFAULT_RUN, num_masks=8, num_samples=8,
                    general_tasks=["induction", "arithmetic_1d_4shot"], general_samples=8, validation_samples=8,
                    top_k=3, curve_k=2, universal_candidates=2, bootstrap=10, metric="logprob")


def tiny_config(vocab_size: int, eos_token_id: int) -> ModelConfig:
  """A tiny Llama for CPU smoke runs of anything that takes a preset (the kit's --small)."""
  return ModelConfig("llama", vocab_size, 64, 128, 2, 4, 2, 16, 1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                     eos_token_ids=(eos_token_id,))


def random_model(name: str, config: ModelConfig, dtype, tokenizer) -> LoadedModel:
  """Random weights of `config` made on the devices, with `tokenizer` (its ids must fit the vocabulary)."""
  start = time.perf_counter()
  module = Transformer(config, param_dtype=dtype)
  params = presets.random_params(module, config, dtype)
  return LoadedModel(name, config, params, module, tokenizer, dtype, "random weights", time.perf_counter() - start)


def peak_host_bytes() -> int:
  """This process's peak resident memory (Linux reports kilobytes)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rehearse(model: LoadedModel, engine_config: EngineConfig | None = None, output_dir: str | None = None,
             **design: Any) -> dict[str, Any]:
  """Runs one localization (`SMALL_DESIGN`, overridden by `design`) on `model` and reports its costs."""
  engine = Engine(model, engine_config or EngineConfig())
  directory = output_dir or tempfile.mkdtemp(prefix="jaxloc_rehearsal_")
  values = {**SMALL_DESIGN, **design}
  settings = LocalizeSettings.make(model=model.name, output_dir=directory, **values)
  start = time.perf_counter()
  payload = localize(engine, settings, progress=False)
  seconds = time.perf_counter() - start
  c = model.config
  return {
      "model": model.name, "dtype": jnp.dtype(model.dtype).name, "layers": c.num_layers, "heads": c.num_heads,
      "kv_heads": c.num_kv_heads, "vocab": c.vocab_size, "design": values, "wall_seconds": seconds,
      "load_seconds": model.load_seconds, "peak_host_gib": peak_host_bytes() / 2**30, "engine": payload["engine"],
      "timing": payload["timing"],
      "planner": {"budget_gib": engine.shared.planner.call_budget / 2**30,
                  "tokens_per_batch": engine.config.tokens_per_batch,
                  "scoring_shapes": [dataclasses.asdict(s) for s in engine.shared.layouts.shapes]},
      "output_dir": directory}


GPU_TOKENS_PER_BATCH = 65536


def _costs(compiled) -> dict[str, float]:
  """XLA's own accounting of a compiled call, as compiled: bytes by kind, and its cost analysis (flops, bytes
  accessed)."""
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {"argument_bytes": int(memory.argument_size_in_bytes), "output_bytes": int(memory.output_size_in_bytes),
          "temp_bytes": int(memory.temp_size_in_bytes), "alias_bytes": int(memory.alias_size_in_bytes),
          "flops": float(cost.get("flops", 0.0)), "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


def abstract_calls(name: str, config: ModelConfig, dtype=jnp.bfloat16, compile_dtype=jnp.float32) -> dict[str, Any]:
  """The scoring and generation calls the planner picks for `config` in `dtype` on an 80 GB GPU, lowered with
  abstract parameters and compiled on this backend in `compile_dtype` (nothing is allocated or run): XLA's memory
  and cost analysis beside the planner's estimate at the compiled dtype. (XLA's CPU backend upcasts bfloat16
  matmuls and copies the weights, so on a CPU the comparison is made in float32, as `benchmark_memory` does; on
  an accelerator pass compile_dtype=dtype.) Scoring: the 8-shot GSM8K-like long shape (`memory.LONG_SHAPES`).
  Generation: the GSM8K-like job (`memory.GSM8K_GENERATION`) in the generator's mask slots and row slots
  (`Planner.generation_slots`), XLA's peak over the job's calls (`memory.generation_xla_bytes`), the decode call of
  one chunk as compiled (memory and cost analysis: XLA counts a loop's body once, so its flops and bytes are one
  decode step plus the call's own work outside the loop), and one decode step's
  bytes against the floor (`decode_cost.step_cost`, every loop multiplied out)."""
  import functools

  import jax

  sds = jax.ShapeDtypeStruct
  itemsize = jnp.dtype(dtype).itemsize
  params_bytes = memory.param_bytes(config, dtype)
  budget = memory.GPU80_BYTES - params_bytes
  plans = planner.Planner(config, budget, GPU_TOKENS_PER_BATCH, itemsize)
  compiled_plans = dataclasses.replace(plans, dtype_bytes=jnp.dtype(compile_dtype).itemsize)
  shape = memory.LONG_SHAPES[1]
  scoring_plan = memory.plan(config, shape, dtype, budget, GPU_TOKENS_PER_BATCH)
  start = time.perf_counter()
  xla = memory.xla_bytes(config, compile_dtype, scoring_plan.masks_per_call, scoring_plan.requests_per_call,
                         shape.max_seq, shape.context, shape.targets)
  scoring_seconds = time.perf_counter() - start
  estimate = compiled_plans.activation_bytes(scoring_plan.masks_per_call, scoring_plan.requests_per_call,
                                             batching.bucket(shape.max_seq), shape.context,
                                             batching.bucket_pow2(shape.targets))
  job = memory.GSM8K_GENERATION
  prefix, suffix, new = job.widths
  layout = plans.generation_slots(masks=job.masks, docs=job.docs, prefix=prefix, suffix=suffix, new=new,
                                  stop_states=job.stop_states, platform="gpu")
  slots, rows, room = layout.slots, layout.rows, layout.prefill_room
  start = time.perf_counter()
  generation_xla = memory.generation_xla_bytes(config, compile_dtype, slots, rows, prefix, suffix, new,
                                               job.stop_states,
                                               plans.insert_call(slots, rows, suffix, prefix=prefix, room=room),
                                               plans.load_masks(slots, prefix, room), held_layers=layout.held_layers)
  module = Transformer(config, param_dtype=compile_dtype)
  params = (memory.decode_params(config, compile_dtype) if layout.held_layers
            else memory._params(config, compile_dtype))  # noqa: SLF001  (the abstract parameter tree of memory.py)
  decode = jax.jit(functools.partial(generation_kernels.decode, module, config, dtype=compile_dtype),
                   static_argnames=("steps", "blocks"), donate_argnums=(1,))
  state = generation_kernels.slot_shapes(config, compile_dtype, slots=slots, rows=rows, prefix=prefix,
                                         cache=suffix + new,
                                 new=new)
  costs = _costs(decode.lower(params, state, sds((2,), jnp.int32), sds((config.vocab_size, job.stop_states), jnp.int32),
                              sds((config.vocab_size, job.stop_states), jnp.bool_), sds((), jnp.int32),
                              steps=generation_kernels.CHUNK_STEPS,
                              blocks=len(generation_kernels.cache_blocks(suffix + new))).compile())
  step = decode_cost.step_cost(config, compile_dtype, slots, rows, prefix, suffix + new, new, top=0,
                               held_layers=layout.held_layers)
  generation_seconds = time.perf_counter() - start
  estimate_generation = compiled_plans.generation_bytes(slots, rows, prefix, suffix, new, job.stop_states,
                                                        held_layers=layout.held_layers, prefill_room=room)

  return {
      "model": name, "dtype": jnp.dtype(dtype).name, "compiled_in": jnp.dtype(compile_dtype).name,
      "backend": jax.default_backend(), "param_gib": params_bytes / 2**30, "budget_gib": budget / 2**30,
      "scoring": {"shape": dataclasses.asdict(shape), "masks_per_call": scoring_plan.masks_per_call,
                  "requests_per_call": scoring_plan.requests_per_call,
                  "planner_estimate_gib": scoring_plan.estimated_bytes / 2**30,
                  "compiled_estimate_gib": estimate / 2**30, "xla_gib": xla["peak"] / 2**30,
                  "estimate_over_xla": estimate / xla["peak"], "compile_seconds": scoring_seconds},
      "generation": {"shape": dataclasses.asdict(job), "prefix": prefix, "suffix": suffix, "new_tokens": new,
                     "mask_slots": slots, "rows": rows, "planner_estimate_gib": layout.estimated_bytes / 2**30,
                     "compiled_estimate_gib": estimate_generation / 2**30,
                     "xla_peak_gib": generation_xla["peak"] / 2**30,
                     "state_gib": generation_xla["state"] / 2**30,
                     "xla_calls_gib": {k: v / 2**30 for k, v in generation_xla.items() if k not in ("peak", "state")},
                     "estimate_over_xla": estimate_generation / generation_xla["peak"], "decode_call": costs,
                     "decode_step_bytes": step["step_bytes"], "decode_step_floor_bytes": step["floor"]["total"],
                     "decode_step_over_floor": step["ratio"], "compile_seconds": generation_seconds}}
