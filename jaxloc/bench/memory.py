"""The memory planner's estimates against XLA's own accounting of the compiled scoring step and generation job.

For a model config and a task shape, `plan` picks masks and requests per call as the engine does
(`planner.Planner.scoring`), and `xla_bytes` compiles the engine's two jitted scoring functions at exactly that
shape with abstract parameters (nothing is allocated, so an 8B model compiles on a laptop) and reads
`compiled.memory_analysis()`. The activation bytes of a step are what it needs beyond the parameters:

  prefix call   temp + outputs (the prefix keys/values of every mask)
  scoring call  temp + outputs + its non-parameter arguments (tokens, masks, and those prefix keys/values)

and the step's peak is the larger of the two (the keys/values are alive in both). The planner must never be under
that peak and should be within 25% over it.

Generation likewise (`generation_plan`, `compare_generation`): the generator's layout of a job in mask slots and row
slots (`Planner.generation_slots`) against the peak of its calls (prefill of the prefix, loading masks, inserting rows,
decoding), each compiled as the generator jits it with its state (`generation_kernels.slot_shapes`) donated: a call's
bytes beyond the parameters are its temporaries, outputs and arguments with an output that reuses the donated state
counted once, plus what the job keeps alive that the call does not take (`generation_xla_bytes`).

On the CPU backend each call is compiled twice, and the larger of the two counts (`CPU_GRAPHS`): as the engine
runs it there, and without XLA:CPU's YNNPACK library fusions. Those fusions decide what a CPU keeps: where a layer
ends in a norm (Gemma 2/3, OLMo-2) one kernel computes the whole MLP (both input projections, the activation, the
down projection, the post-MLP norm) tile by tile and never holds the [rows, intermediate] activations, and the
final matmul is fused with the log-softmax's exponential. Without them every matmul writes its whole output, as on
an accelerator, whose calls the planner sizes; with them, the long attention calls hold more.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.bench import deviceless
from jaxloc.engine import batching, generation_kernels, planner, scoring_kernels
from jaxloc.models.config import ModelConfig
from jaxloc.models.layers import Context
from jaxloc.models.decoder import Ablation, Transformer
from jaxloc.tasks.registry import get_task

GIB = planner.GIB
GPU80_BYTES = int(0.75 * 80e9)  # an 80 GB GPU's bytes_limit under XLA's default 75% preallocation

# XLA debug options of the graphs compiled on the CPU backend: the graph as the engine runs it, and the graph without
# the YNNPACK library fusions (the module docstring).
CPU_GRAPHS = ({}, {"xla_cpu_experimental_ynn_fusion_type": ""})


def compiled_bytes(lowered, params: int | None = None) -> int:
  """XLA's activation bytes of a lowered call: its temporaries and outputs, plus, given the bytes of its `params`,
  its other arguments, an output that reuses a donated argument's buffer counted once (XLA's `alias` bytes: the
  generation calls donate their state, `generator.xla_bytes`). The larger over `CPU_GRAPHS` where it is compiled for
  a CPU, else as compiled (`deviceless.platform`)."""
  graphs = CPU_GRAPHS if deviceless.platform() == "cpu" else ({},)
  sizes = []
  for options in graphs:
    analysis = deviceless.compile(lowered, options).memory_analysis()
    size = int(analysis.temp_size_in_bytes + analysis.output_size_in_bytes)
    arguments = int(analysis.argument_size_in_bytes) - int(analysis.alias_size_in_bytes)
    sizes.append(size if params is None else size + arguments - params)
  return max(sizes)


@dataclasses.dataclass(frozen=True)
class TaskShape:
  """A request set as the planner sees it: suffix tokens after the shared prefix, the prefix, targets."""

  name: str
  num_requests: int
  mean_seq: float
  max_seq: int
  context: int
  targets: int


def task_shape(name: str, tokenizer, num_samples: int = 100, max_positions: int = 8192) -> TaskShape:
  """The shape of a registered task's scoring requests (its first `num_samples` documents) under `tokenizer`."""
  task = get_task(name)
  requests = task.requests(task.load_docs(num_samples=num_samples), tokenizer)
  tokenized = scoring_kernels.tokenize(tokenizer, requests, max_positions)
  prefix = scoring_kernels.shared_prefix_length(tokenized)
  suffixes = np.array([len(s) - prefix for s in tokenized.sequences])
  return TaskShape(name, len(requests), float(suffixes.mean()), int(suffixes.max()), prefix,
                   int(tokenized.num_targets.max()))


# Longer request sets than the embedded tasks have, shaped like the paper's benchmarks under a Llama-3 tokenizer.
LONG_SHAPES = (TaskShape("zero_shot_long (MMLU-like)", 400, 350.0, 700, 0, 1),
               TaskShape("few_shot_long (8-shot GSM8K-like)", 200, 150.0, 250, 900, 128))


# Call shapes (masks, requests, suffix tokens, prefix tokens, targets) at the corners the planned calls miss:
# long sequences, long prefixes, many targets, many masks.
STRESS_CALLS = ((1, 16, 512, 0, 1), (4, 16, 512, 0, 1), (2, 8, 256, 512, 1), (4, 64, 64, 64, 1), (4, 64, 16, 64, 8),
                (16, 100, 8, 16, 2), (64, 100, 8, 16, 2), (8, 32, 32, 256, 4), (32, 16, 128, 0, 1),
                (2, 4, 1024, 0, 1), (8, 100, 16, 40, 4), (1, 1, 64, 2048, 1), (4, 8, 64, 1024, 8))


def device_budget(device_bytes: int, params: int, model_parallel: int = 1, share: float = planner.FREE_SHARE) -> int:
  """The engine's activation budget on an accelerator with `device_bytes` (its `bytes_limit`) once a 1/model_parallel
  share of the parameters is placed (`planner.accelerator_budget`; `share` of what is free, the default's unless
  told)."""
  return planner.accelerator_budget(device_bytes, params // model_parallel, share)


def min_model_parallel(device_bytes: int, params: int) -> int:
  """The smallest power-of-two tensor-parallel size whose parameter share leaves half the device free."""
  n = 1
  while params / n > 0.5 * device_bytes:
    n *= 2
  return n


def param_bytes(config: ModelConfig, dtype) -> int:
  return sum(int(np.prod(leaf.shape)) * jnp.dtype(dtype).itemsize for leaf in jax.tree.leaves(_params(config, dtype)))


@functools.lru_cache(maxsize=None)
def _params(config: ModelConfig, dtype):
  module = Transformer(config, param_dtype=dtype)
  tokens = jnp.zeros((1, 1, 1), jnp.int32)
  return jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), tokens, tokens)["params"])


def decode_params(config: ModelConfig, dtype) -> dict[str, Any]:
  """The abstract parameters a decode call takes: the model's, its layers as a generation job lays them out once
  (`generation_kernels.decode_layers`); as many bytes as `param_bytes`."""
  params = _params(config, dtype)
  return dict(params, layers=jax.eval_shape(functools.partial(generation_kernels.decode_layers, config), params))


def plan(config: ModelConfig, shape: TaskShape, dtype, memory_budget: int, tokens_per_batch: int
         ) -> planner.ScoringBatches:
  """The engine's plan for `shape` with `memory_budget` bytes for one call (the question the engine's layouts ask
  its planner)."""
  plans = planner.Planner(config, memory_budget, tokens_per_batch, jnp.dtype(dtype).itemsize)
  return plans.scoring(num_requests=shape.num_requests, mean_seq=shape.mean_seq,
                       max_seq=batching.bucket(shape.max_seq), context=shape.context, max_targets=shape.targets)


def xla_bytes(config: ModelConfig, dtype, masks: int, requests: int, seq: int, context: int, targets: int
              ) -> dict[str, int]:
  """XLA's activation bytes of one scoring step at this shape (see the module docstring)."""
  module = Transformer(config, param_dtype=dtype)
  params = _params(config, dtype)
  sds = jax.ShapeDtypeStruct
  ablation = Ablation(head_mask=sds((masks, config.num_layers, config.num_heads), dtype))
  targets = batching.bucket_pow2(targets)
  seq = batching.bucket(seq)
  tokens = sds((requests, seq), jnp.int32)
  flat = sds((requests * targets,), jnp.int32)
  rows = scoring_kernels.Rows(tokens, tokens, tokens, flat, flat, sds((requests * targets, requests), jnp.float32))
  result = {"prefix": 0, "scoring": 0}
  kv = None
  if context:
    prefix_fn = jax.jit(functools.partial(scoring_kernels.prefix_context, module, dtype=dtype))
    result["prefix"] = compiled_bytes(deviceless.lower(prefix_fn, params, ablation, sds((context,), jnp.int32)))
    k_shape = (config.num_layers, masks, context, config.num_kv_heads, config.head_dim)
    v_shape = (config.num_layers, masks, config.num_kv_heads, config.head_dim, context)
    kv = Context(sds(k_shape, dtype), sds(v_shape, dtype), sds((masks, 1, context), jnp.bool_),
                 sds((1, 1, context), jnp.int32))
  score_fn = jax.jit(functools.partial(scoring_kernels.score_chunk, module, config, dtype=dtype))
  result["scoring"] = compiled_bytes(deviceless.lower(score_fn, params, ablation, kv, rows),
                                     param_bytes(config, dtype))
  result["peak"] = max(result["prefix"], result["scoring"])
  return result


def compare(config: ModelConfig, shape: TaskShape, dtype, masks: int, requests: int) -> dict[str, Any]:
  """The planner's estimate and XLA's bytes at one call shape; ratio = estimate / XLA."""
  estimate = planner.activation_bytes(config, masks, requests, batching.bucket(shape.max_seq), shape.context,
                                      batching.bucket_pow2(shape.targets), jnp.dtype(dtype).itemsize)
  measured = xla_bytes(config, dtype, masks, requests, shape.max_seq, shape.context, shape.targets)
  return {"task": shape.name, "masks": masks, "requests": requests, "estimate_bytes": estimate,
          "xla_bytes": measured["peak"], "xla_prefix_bytes": measured["prefix"],
          "xla_scoring_bytes": measured["scoring"], "ratio": estimate / measured["peak"]}


# --- generation ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GenerationShape:
  """A generation job as the generator sees it: `masks` x `docs` rows whose prompts share a `prefix` of tokens, each
  a `suffix` after it, emitting at most `new` tokens; `stop_states` states of the stop-string automaton. `widths`:
  the bucketed prefix, suffix and new-token widths the generator compiles (`generator._generate_grid`)."""

  name: str
  masks: int
  docs: int
  prefix: int
  suffix: int
  new: int
  stop_states: int = 16

  @property
  def widths(self) -> tuple[int, int, int]:
    return batching.bucket(self.prefix), batching.bucket(self.suffix), batching.bucket_pow2(self.new)  # the generator's


# The paper's math localization: 5-shot GSM8K prompts (a ~700-token shared prefix, questions of ~100 tokens after
# it), greedy answers of up to 256 tokens, 100 documents under each of 400 masks.
GSM8K_GENERATION = GenerationShape("GSM8K-like 5-shot", masks=400, docs=100, prefix=700, suffix=120, new=256)


def generation_plan(config: ModelConfig, shape: GenerationShape, dtype, memory_budget: int,
                    platform: str = "gpu") -> planner.GenerationSlots:
  """The generator's layout for `shape` with `memory_budget` bytes on `platform` (whose row cap applies)."""
  prefix, suffix, new = shape.widths
  plans = planner.Planner(config, memory_budget, 65536, jnp.dtype(dtype).itemsize)
  return plans.generation_slots(masks=shape.masks, docs=shape.docs, prefix=prefix, suffix=suffix, new=new,
                                stop_states=shape.stop_states, platform=platform)


def gpu80_budget(config: ModelConfig, share: float = planner.FREE_SHARE) -> int:
  """`device_budget` on an 80 GB GPU (`GPU80_BYTES`) with bfloat16 parameters (`share` of what is free)."""
  return device_budget(GPU80_BYTES, param_bytes(config, jnp.bfloat16), share=share)


def gpu80_generation_plan(config: ModelConfig, shape: GenerationShape, share: float = planner.FREE_SHARE
                          ) -> planner.GenerationSlots:
  """The generator's bfloat16 layout for `shape` on an 80 GB GPU (`gpu80_budget` at `share`)."""
  return generation_plan(config, shape, jnp.bfloat16, gpu80_budget(config, share))


def _nbytes(tree) -> int:
  return sum(int(np.prod(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(tree))


def generation_xla_bytes(config: ModelConfig, dtype, slots: int, rows: int, prefix: int, suffix: int, new: int,
                         stop_states: int = 16, inserted: tuple[int, int] | None = None, loaded: int | None = None,
                         *, held_layers: bool) -> dict[str, int]:
  """XLA's bytes beyond the parameters of a generation job's calls at this layout, each compiled as the generator
  jits it (the state donated). A call's bytes are its temporaries, outputs and non-parameter arguments
  (`compiled_bytes`), plus what the job keeps alive that the call does not take: the state (`generation_kernels.Slots`),
  the unablated prefix (`generation_kernels.unablated_prefix`, kept while masks load), the stop-string tables and,
  where the job holds them (`held_layers`), the layers' weights laid out for decoding
  (`generation_kernels.decode_layers`; a decode call then takes them in place of the stacked layers, whose bytes they
  equal; else it lays them out itself).

    prefix       the unablated prefill of the prefix (the state is alive)
    load         `load_masks` of `loaded` masks (default as many as one call loads, `Planner.load_masks`),
                 resuming from the unablated prefix
    insert       `insert_rows` starting rows in mask slots: `inserted` (slots, rows in each; default all of them)
    decode       `decode` of `generation_kernels.CHUNK_STEPS` steps reading every block of the rows' caches (a
                 call reading fewer holds less: each block is read where it lies)

  peak: the largest; state: the state's own bytes."""
  c, sds, i32 = config, jax.ShapeDtypeStruct, jnp.int32
  module = Transformer(c, param_dtype=dtype)
  params, params_size = _params(c, dtype), param_bytes(c, dtype)
  cache = suffix + new
  state = generation_kernels.slot_shapes(c, dtype, slots=slots, rows=rows, prefix=prefix, cache=cache, new=new)
  tables = (sds((2,), i32), sds((c.vocab_size, stop_states), i32), sds((c.vocab_size, stop_states), jnp.bool_))
  unablated = (sds((c.num_layers, prefix, c.hidden_size), dtype),
               sds((c.num_layers, prefix, c.num_kv_heads, c.head_dim), dtype),
               sds((c.num_layers, prefix, c.num_kv_heads, c.head_dim), dtype))
  weights = decode_params(c, dtype) if held_layers else params
  held = {"state": _nbytes(state), "unablated": _nbytes(unablated), "tables": _nbytes(tables),
          "weights": _nbytes(weights["layers"]) if held_layers else 0}

  def call(fn, *args, alive=(), given=params, **static):
    lowered = deviceless.lower(fn, given, *args, **static)
    return compiled_bytes(lowered, params_size) + sum(held[k] for k in alive)

  result = {}
  jit = functools.partial(jax.jit, keep_unused=True)  # every parameter an argument, as `params_size` counts them
  prefix_fn = jit(functools.partial(generation_kernels.unablated_prefix, module, dtype=dtype))
  result["prefix"] = call(prefix_fn, sds((prefix,), i32), alive=("state", "tables", "weights"))
  load_fn = jit(functools.partial(generation_kernels.load_masks, module, dtype=dtype), donate_argnums=(1,))
  loaded = loaded or planner.Planner(c, GIB, 65536, jnp.dtype(dtype).itemsize).load_masks(slots, prefix)
  masks = Ablation(head_mask=sds((loaded, c.num_layers, c.num_heads), dtype))
  result["load"] = call(load_fn, state, sds((loaded,), i32), masks, sds((prefix,), i32), (sds((), i32), *unablated),
                        alive=("tables", "weights"))
  insert_fn = jit(functools.partial(generation_kernels.insert_rows, module, c, dtype=dtype),
                  static_argnames=("pad_id",),
                      donate_argnums=(1,))
  filled, inserted = inserted or (slots, rows)
  result["insert"] = call(insert_fn, state, sds((filled,), i32), sds((filled, inserted), i32),
                          sds((filled, inserted, suffix), i32), sds((filled, inserted), i32),
                          alive=("unablated", "tables", "weights"), pad_id=0)
  decode_fn = jit(functools.partial(generation_kernels.decode, module, c, dtype=dtype),
                  static_argnames=("steps", "blocks"), donate_argnums=(1,))
  result["decode"] = call(decode_fn, state, *tables, sds((), i32), alive=("unablated", "weights"), given=weights,
                          steps=generation_kernels.CHUNK_STEPS, blocks=len(generation_kernels.cache_blocks(cache)))
  result["peak"] = max(result.values())
  result["state"] = held["state"]
  return result


def compare_generation(config: ModelConfig, shape: GenerationShape, dtype, layout: planner.GenerationSlots
                       ) -> dict[str, Any]:
  """The planner's estimate (`Planner.generation_bytes`, term by term) and XLA's bytes of a generation job's calls at
  one layout (its mask slots, rows, held layers and prefill room: the insert and the mask load measured are the
  largest the generator makes in that room), in `dtype`; ratio = estimate / XLA's peak over the calls."""
  prefix, suffix, new = shape.widths
  slots, rows, held_layers, room = layout.slots, layout.rows, layout.held_layers, layout.prefill_room
  plans = planner.Planner(config, GIB, 65536, jnp.dtype(dtype).itemsize)
  terms = plans.generation_terms(slots, rows, prefix, suffix, new, shape.stop_states, held_layers=held_layers,
                                 prefill_room=room)
  estimate = sum(terms.values())
  measured = generation_xla_bytes(config, dtype, slots, rows, prefix, suffix, new, shape.stop_states,
                                  plans.insert_call(slots, rows, suffix, prefix=prefix, room=room),
                                  plans.load_masks(slots, prefix, room), held_layers=held_layers)
  return {"task": shape.name, "slots": slots, "rows": rows, "held_layers": held_layers, "prefill_room": room,
          "prefix": prefix,
          "suffix": suffix, "new": new,
          "estimate_bytes": estimate, "estimate_terms": terms, "xla_bytes": measured["peak"],
          "xla_calls": {k: v for k, v in measured.items() if k not in ("peak", "state")},
          "state_bytes": measured["state"], "peak_call": max((v, k) for k, v in measured.items()
                                                            if k not in ("peak", "state"))[1],
          "ratio": estimate / measured["peak"]}
