"""The engine's one memory planner: every "how many fit" question, answered from one budget.

The budget (`EngineConfig.memory_budget_gb`) bounds the engine's activations: one compiled call's, plus the
residual cache (`residual_cache_gb`), the unablated residual streams kept across scoring calls so that a batch of
masks starts at the first layer it ablates. A `Planner` answers, for one engine:

  scoring        masks and requests per call (`scoring`), from `activation_bytes`, which follows XLA's own buffers
  generation     mask slots and rows per mask slot of a generation job (`generation_slots`)
  attribution    requests per integrated-gradients call (`attribution_rows`)
  mean sums      rows per call of the mean-ablation statistics (`sum_rows`)
  residual cache whether a request set's streams (`residual_stream_bytes`) or the prompts' shared prefill
                 (`prompt_stream_bytes`) fit it

Scoring calls get the budget less the residual cache; generation and integrated gradients size their calls against
the whole budget. Defaults come from the device (`default_memory_budget`, `default_tokens_per_batch`) through
`resolve`. Axes: `masks` (Mb per call), `requests` (Rb per call), `seq` (S), `context` (P, a shared prefix),
`targets` (T, continuation tokens scored per request).
"""

from __future__ import annotations

import dataclasses
import logging
import os

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from jaxloc.engine.batching import bucket_pow2, floor_pow2
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.generation_kernels import CHUNK_STEPS
from jaxloc.errors import UserError
from jaxloc.models.config import ModelConfig

log = logging.getLogger(__name__)

GIB = 1024**3


def gib_bytes(gib: float) -> int:
  return int(gib * GIB)


def default_memory_budget() -> int:
  """Bytes the engine may use for activations.

  Accelerators: 60% of what the first device reports free (the rest holds parameters, the XLA
  workspace and fragmentation). CPU: a quarter of physical memory, at most 8 GiB.
  """
  device = jax.local_devices()[0]
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    if limit:
      return accelerator_budget(limit, stats.get("bytes_in_use", 0))
    return 8 * GIB
  try:
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError):
    physical = 16 * GIB
  return int(min(8 * GIB, physical / 4))


# The share of an accelerator's free memory (once the parameters are placed) that activations may take by default.
FREE_SHARE = 0.6


def accelerator_budget(limit: int, in_use: int, share: float = FREE_SHARE) -> int:
  """`share` (default 60%) of what an accelerator has free once the parameters are placed."""
  return int(share * (limit - in_use))


def default_tokens_per_batch() -> int:
  """Token rows per compiled call. Large enough to saturate the matmul units, small enough to stay in cache
  on CPUs; accelerators want far more rows."""
  return 2048 if jax.devices()[0].platform == "cpu" else 65536


def resolve(config: EngineConfig, model_dtype: DTypeLike) -> EngineConfig:
  """`config` with every default filled in for this machine and a model in `model_dtype`: the device's memory
  budget and tokens per call, a quarter of the budget for the residual cache, the model's dtype for activations."""
  if config.memory_budget_gb is not None and config.memory_budget_gb <= 0:
    raise UserError(f"the memory budget must be positive, got {config.memory_budget_gb} GiB")
  for name in ("tokens_per_batch", "generation_batch"):
    value = getattr(config, name)
    if value is not None and value < 1:
      raise UserError(f"{name} must be at least 1, got {value}")
  budget = default_memory_budget() if config.memory_budget_gb is None else gib_bytes(config.memory_budget_gb)
  cache = budget // 4 if config.residual_cache_gb is None else gib_bytes(config.residual_cache_gb)
  if not 0 <= cache < budget:
    raise UserError(f"the residual cache ({cache / GIB:.2f} GiB) must be under the memory budget "
                    f"({budget / GIB:.2f} GiB)")
  dtype = config.activations_for(jnp.dtype(model_dtype).name)
  if not jnp.issubdtype(getattr(jnp, dtype, int), jnp.floating):
    raise UserError(f"activation dtype {dtype!r} is not a floating-point dtype; use float32 or bfloat16")
  tokens = default_tokens_per_batch() if config.tokens_per_batch is None else config.tokens_per_batch
  return dataclasses.replace(config, memory_budget_gb=budget / GIB, tokens_per_batch=tokens,
                             residual_cache_gb=cache / GIB, activation_dtype=dtype)


def layer_weight_bytes(config: ModelConfig, dtype_bytes: int) -> int:
  """One decoder layer's matmul weights (attention's q, k, v, o and the MLP's three)."""
  c = config
  kv_dims = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
  return (3 * c.hidden_size * c.intermediate_size + c.hidden_size * kv_dims
          + c.num_heads * c.head_dim * c.hidden_size) * dtype_bytes


def score_copies(config: ModelConfig) -> float:
  """The float32 copies of a layer's attention scores XLA holds at once (`layers.Attention` takes the softmax block
  by block: the scores and their exponentials): two, and two and a half in the families with post-attention and
  post-MLP norms (Gemma 2/3, OLMo-2), whose long calls XLA measured at up to 2.23 copies
  (`experiments.benchmark_memory`)."""
  return 2.5 if config.post_norm else 2.0


def score_bytes(config: ModelConfig, score_elements: int) -> int:
  """What a layer's attention scores hold: `score_copies` float32 copies, and the mask of the positions each row
  sees (a bool per row and key position, shared by its heads)."""
  return int(score_copies(config) * score_elements * 4) + score_elements // config.num_heads


def activation_bytes(config: ModelConfig, masks: int, requests: int, seq: int, context: int, targets: int,
                     dtype_bytes: int) -> int:
  """Peak bytes beyond the parameters of one scoring step (the prefix call, then the scoring call).

  Layers are scanned, so one layer is live at a time, in one of two phases whose buffers XLA reuses for each
  other, each with the scan's slice of that layer's weights: attention (per token row, part of the residual and
  q/k/v before and after rotation; the attention scores, `score_bytes`) or the MLP (a residual and
  two intermediate-size rows, three where the layer norms the MLP's output (`post_norm`: the gate, the up projection
  and their product outlast the weight slice until the norm); with many rows, 2.6 residuals and three intermediate
  rows outlast the weight slice). After the layers, the logits phase holds two float32 copies of the logits of the
  scored positions (the logits and the log-softmax's exponential; a final-logit soft cap is computed within them),
  the final hidden rows and those gathered at the scored positions. The prefix keys/values (counted 1.5 times: the
  scan stacks them) stay live through both calls.

  The coefficients follow XLA's own buffer assignment (`compiled.memory_analysis()`), checked by
  `experiments.benchmark_memory` over the planned calls and corner shapes of every preset, compiled both as XLA:CPU
  runs them and without its library fusions (every matmul then writes its whole output, as on an accelerator; the
  fused graph holds less in the MLP and the logits, more in long attention calls; `jaxloc.bench.memory`): never under
  either. Pre-norm families (Llama, Qwen2, Qwen3) are at most ~30% over; the families with post-attention and
  post-MLP norms (Gemma 2/3, OLMo-2), counted at their most (`score_copies`), are up to ~50% over at long sequences
  and prefixes (BUILD.md, "Memory").
  """
  c = config
  kv_dims = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
  weights = layer_weight_bytes(c, dtype_bytes)
  prefix_kv = 3 * c.num_layers * masks * context * c.num_kv_heads * c.head_dim * dtype_bytes  # 1.5 x (k and v)

  intermediate_rows = 3 if c.post_norm else 2

  def layer(rows: int, score_elements: int) -> int:
    attention = (weights + rows * (7 * c.hidden_size // 10 + 2 * kv_dims) * dtype_bytes
                 + score_bytes(c, score_elements))
    mlp = max(weights + rows * (c.hidden_size + intermediate_rows * c.intermediate_size) * dtype_bytes,
              rows * (13 * c.hidden_size // 5 + 3 * c.intermediate_size) * dtype_bytes)
    return max(attention, mlp)

  rows = masks * requests * seq
  scored = masks * requests * targets
  logits = 2 * scored * c.vocab_size * 4 + (rows + scored) * c.hidden_size * dtype_bytes
  scoring = prefix_kv + max(layer(rows, rows * c.num_heads * (seq + context)), logits)
  prefix = prefix_kv + layer(masks * context, masks * c.num_heads * context * context) if context else 0
  return max(scoring, prefix)


@dataclasses.dataclass(frozen=True)
class ScoringBatches:
  """How a scoring job is cut into compiled calls."""

  masks_per_call: int
  requests_per_call: int
  estimated_bytes: int


@dataclasses.dataclass(frozen=True)
class GenerationSlots:
  """How a generation job is laid out: `slots` masks decoded at once, `rows` row slots each
  (`generation_kernels.py`); `held_layers`: the job lays its layers out for decoding once and holds that copy
  (`generation_kernels.decode_layers`), else each decode call lays them out for itself; `prefill_room`: the bytes an
  insert or a mask load may hold beyond what the job keeps (`Planner.insert_call`, `Planner.load_masks`), None: as
  many as `tokens_per_batch` tokens make. A room is set where holding the layers fits only beside smaller prefills."""

  slots: int
  rows: int
  estimated_bytes: int
  held_layers: bool
  prefill_room: int | None = None


# A generation job of more than one call's work spreads a call's rows over this many mask slots where its decoding then
# reads no more (`Planner.generation_slots`).
MAX_SLOTS = 16


@dataclasses.dataclass(frozen=True)
class Planner:
  """The sizes of one engine's calls. budget and residual_cache in bytes (module docstring); generation_batch caps
  the rows a generation job decodes at once (None: from the budget)."""

  model: ModelConfig
  budget: int
  tokens_per_batch: int
  dtype_bytes: int
  residual_cache: int = 0
  data_parallel: int = 1
  generation_batch: int | None = None

  @classmethod
  def of(cls, config: EngineConfig, model: ModelConfig, data_parallel: int = 1) -> "Planner":
    """The planner of a resolved config (`resolve`)."""
    assert config.memory_budget_gb is not None and config.residual_cache_gb is not None \
        and config.tokens_per_batch is not None, "Planner.of takes a resolved config (`resolve`)"
    return cls(model, gib_bytes(config.memory_budget_gb), config.tokens_per_batch,
               jnp.dtype(config.activation_dtype).itemsize, gib_bytes(config.residual_cache_gb), data_parallel,
               config.generation_batch)

  @property
  def call_budget(self) -> int:
    """What one scoring call's activations may use: the budget less the residual cache, alive across calls."""
    return self.budget - self.residual_cache

  def activation_bytes(self, masks: int, requests: int, seq: int, context: int, targets: int) -> int:
    return activation_bytes(self.model, masks, requests, seq, context, targets, self.dtype_bytes)

  def scoring(self, *, num_requests: int, mean_seq: float, max_seq: int, context: int,
              max_targets: int) -> ScoringBatches:
    """Masks and requests per call: fill `tokens_per_batch` rows, then shrink until within the call budget.

    Whole request sets go into one call when they fit (the shared prefix is then computed once per mask
    per call); the masks axis absorbs the remaining rows. Masks per call is a multiple of the data-parallel
    size, and does not depend on how many masks a caller has: every call of a layout pads to it, so a baseline,
    a validation curve and a design batch share one compiled shape (the padding costs at most one call).
    """
    parallel = self.data_parallel
    mean_seq = max(mean_seq, 1.0)
    requests = min(num_requests, max(1, int(self.tokens_per_batch // mean_seq)))
    masks = max(1, int(self.tokens_per_batch // (requests * mean_seq)))
    masks = max(parallel, masks // parallel * parallel)
    targets = bucket_pow2(max_targets)

    def cost(m: int, r: int) -> int:
      return self.activation_bytes(m, r, max_seq, context, targets)

    while cost(masks, requests) > self.call_budget:
      if masks > parallel:
        masks = max(parallel, masks // 2 // parallel * parallel)
      elif requests > 1:
        requests = max(1, requests // 2)
      else:
        raise UserError(f"one request of {max_seq} tokens (context {context}) needs "
                        f"{cost(masks, requests) / GIB:.2f} GiB, over the memory budget of "
                        f"{self.call_budget / GIB:.2f} GiB; raise --memory_budget_gb or shorten the prompts")
    return ScoringBatches(masks, requests, cost(masks, requests))

  def generation_slots(self, *, masks: int, docs: int, prefix: int, suffix: int, new: int, stop_states: int = 1,
                       platform: str | None = None) -> GenerationSlots:
    """Mask slots and row slots per mask slot of a generation job over `masks` masks x `docs` prompts sharing a
    `prefix` (each a `suffix` after it, emitting at most `new` tokens; `stop_states` states of the stop-string
    automaton): rows fill the row cap (`generation_batch`, or 64 on CPUs and 1024 on accelerators; `platform` names
    the one whose cap applies, default this machine's), a mask slot holding up to all of a mask's prompts (never more
    rows than the cap), then shrink until `generation_bytes` fits the budget. A job of several masks that is more
    than one call's work then spreads the call's rows over `MAX_SLOTS` mask slots, on one device (split over devices,
    every insert computes every slot: `insert_call`), where they fit and its decoding reads no more bytes so
    (`decode_reads`; each slot holds its own copy of the prefix): rows that one wide slot's mask leaves empty take up
    other masks' prompts, and a slot whose mask's prompts have run out waits only for its own few rows before it
    takes up another mask (`generator.assign_masks`), where one slot of all the rows would wait for its mask's
    longest generation. Both are powers of two (a handful of shapes whatever the counts); mask slots a multiple of
    the data-parallel size. The job holds its layers laid out for decoding where that copy costs it no
    slots or rows; else each decode call lays them out (once per chunk)."""
    cap = self.generation_batch or (1024 if (platform or jax.devices()[0].platform) != "cpu" else 64)
    rows = min(bucket_pow2(docs), floor_pow2(cap))
    plan = self.generation_layout(min(bucket_pow2(masks), floor_pow2(cap // rows)), rows, prefix, suffix, new,
                                  stop_states, held_layers=False)
    while plan.estimated_bytes > self.budget and (plan.rows > 1 or plan.slots > self.data_parallel):
      plan = self.smaller(plan, prefix, suffix, new, stop_states)
    total = plan.slots * plan.rows
    spread = min(MAX_SLOTS, total)
    if (masks > 1 and bucket_pow2(masks) * bucket_pow2(docs) > total and spread > plan.slots
        and self.data_parallel == 1):
      # More than one call's work: the same rows over more mask slots, where the job then reads no more.
      split = self.generation_layout(spread, total // spread, prefix, suffix, new, stop_states, held_layers=False)
      if (split.estimated_bytes <= self.budget and self.decode_reads(split, masks, docs, prefix, suffix, new)
          <= self.decode_reads(plan, masks, docs, prefix, suffix, new)):
        plan = split
    # Holding the layers costs no rows exactly where the held layout of this size fits: as it is, or with inserts
    # and mask loads made smaller to fit in what the held layers leave (a decode call then copies no weights, where
    # each laid out all of them, once a chunk; a prefill of fewer tokens is still bound by its matmuls).
    held = self.generation_layout(plan.slots, plan.rows, prefix, suffix, new, stop_states, held_layers=True)
    if held.estimated_bytes > self.budget:
      terms = self.generation_terms(plan.slots, plan.rows, prefix, suffix, new, stop_states, held_layers=True)
      room = self.budget - sum(v for k, v in terms.items() if k != "activations")
      held = self.generation_layout(plan.slots, plan.rows, prefix, suffix, new, stop_states, held_layers=True,
                                    prefill_room=room)
    if held.estimated_bytes <= self.budget:
      plan = held
    if plan.estimated_bytes > self.budget:
      raise UserError(f"one generation row ({prefix} + {suffix} prompt tokens, {new} new) needs "
                      f"{plan.estimated_bytes / GIB:.2f} GiB, over the memory budget of {self.budget / GIB:.2f} GiB; "
                      "raise --memory_budget_gb or shorten the prompts")
    return plan

  def decode_reads(self, layout: GenerationSlots, masks: int, docs: int, prefix: int, suffix: int, new: int) -> int:
    """Bytes a job of `masks` x `docs` prompts reads decoding in `layout` if every row runs to its `new` tokens (the
    worst case; rows that stop early favor more mask slots, `generation_slots`): a mask's prompts take passes of a
    slot's rows, `new` steps each, and a step advances every slot, reading the weights once, each slot's prefix
    keys/values and each row's cache to its end (`decode_cost.floor_bytes`, the cache at its widest)."""
    c = self.model
    kv = c.num_layers * 2 * c.num_kv_heads * c.head_dim * self.dtype_bytes  # one token's keys and values
    step = (c.num_layers * layer_weight_bytes(c, self.dtype_bytes) + c.vocab_size * c.hidden_size * self.dtype_bytes
            + layout.slots * (prefix + layout.rows * (suffix + new)) * kv)
    passes = masks * -(-docs // layout.rows)
    return -(-passes // layout.slots) * new * step

  def generation_layout(self, slots: int, rows: int, prefix: int, suffix: int, new: int, stop_states: int, *,
                        held_layers: bool, prefill_room: int | None = None) -> GenerationSlots:
    """`slots` mask slots (rounded up to a multiple of the data-parallel size) of `rows` rows, with their estimate."""
    parallel = self.data_parallel
    slots = max(parallel, -(-max(1, slots) // parallel) * parallel)
    return GenerationSlots(slots, rows, self.generation_bytes(slots, rows, prefix, suffix, new, stop_states,
                                                              held_layers=held_layers, prefill_room=prefill_room),
                           held_layers, prefill_room)

  def smaller(self, layout: GenerationSlots, prefix: int, suffix: int, new: int, stop_states: int = 1
              ) -> GenerationSlots:
    """The next layout down: half the mask slots while more than the data-parallel size, then half the rows (a
    prefill room stays: the smaller layout keeps more beside it)."""
    if layout.slots > self.data_parallel:
      return self.generation_layout(layout.slots // 2, layout.rows, prefix, suffix, new, stop_states,
                                    held_layers=layout.held_layers, prefill_room=layout.prefill_room)
    return self.generation_layout(layout.slots, max(1, layout.rows // 2), prefix, suffix, new, stop_states,
                                  held_layers=layout.held_layers, prefill_room=layout.prefill_room)

  def load_masks(self, slots: int, prefix: int, room: int | None = None) -> int:
    """Masks one call loads (prefilling the prefix under each): as many as `tokens_per_batch` prefix tokens hold (a
    power of two, at least 1, at most the mask slots), halved while the load's bytes (`load_bytes`) exceed `room`."""
    loaded = min(floor_pow2(slots), floor_pow2(max(1, self.tokens_per_batch // max(1, prefix))))
    while room is not None and loaded > 1 and self.load_bytes(loaded, prefix) > room:
      loaded //= 2
    return loaded

  def load_bytes(self, loaded: int, prefix: int) -> int:
    """A mask load's bytes (`generation_kernels.load_masks` of `loaded` masks): the prefix prefilled under each, its
    keys/values scattered into the state after."""
    c = self.model
    return (self.activation_bytes(loaded, 1, prefix, 0, 1)
            + c.num_layers * loaded * prefix * 2 * c.num_kv_heads * c.head_dim * self.dtype_bytes)

  def insert_call(self, slots: int, rows: int, suffix: int, width: int | None = None, *, prefix: int = 0,
                  room: int | None = None) -> tuple[int, int]:
    """The largest insert (`generation_kernels.insert_rows`) of prompts `width` wide (default `suffix`, the job's
    widest) in a job of `slots` x `rows`: (mask slots, rows started in each), powers of two. At the job's width, rows
    first, as many as `tokens_per_batch` tokens hold (at least one in one slot), so that the prefill's activations do
    not grow with the rows a decode step holds; narrower prompts start more rows, in each slot and then in more slots,
    within the same tokens. Where the mask slots are split over devices (`data_parallel` > 1) an insert starts rows
    in every slot, each device in its own, as many in each as the tokens hold over all the slots. Given a `room`,
    the mask slots and then the rows are halved while the insert's bytes after a `prefix` (`insert_bytes`) exceed
    it (down to one row in one slot)."""
    width = width or suffix
    if self.data_parallel > 1:
      filled, inserted = slots, min(rows, floor_pow2(max(1, self.tokens_per_batch // max(1, slots * width))))
    else:
      widest = min(rows, floor_pow2(max(1, self.tokens_per_batch // max(1, suffix))))
      tokens = (min(floor_pow2(slots), floor_pow2(max(1, self.tokens_per_batch // (widest * suffix))))
                * widest * suffix)
      inserted = min(rows, floor_pow2(max(1, tokens // width)))
      filled = min(floor_pow2(slots), floor_pow2(max(1, tokens // (inserted * width))))
    while room is not None and self.insert_bytes(filled, inserted, width, prefix) > room:
      if filled > 1 and self.data_parallel == 1:
        filled //= 2
      elif inserted > 1:
        inserted //= 2
      else:
        break
    return filled, inserted

  def insert_bytes(self, filled: int, inserted: int, width: int, prefix: int) -> int:
    """An insert's bytes (`generation_kernels.insert_rows` of `inserted` rows `width` wide in each of `filled` mask
    slots, after a `prefix`): the scoring formula's prefill, less its prefix keys/values (the state holds them), 5%
    over (OLMo-2's insert, q/k norms over the whole projection, holds 0.1% more than the formula); plus the inserted
    rows' stacked keys/values and the filled slots' prefix keys/values, gathered."""
    c = self.model
    kv = 2 * c.num_kv_heads * c.head_dim * self.dtype_bytes  # one token's keys and values in one layer
    return (21 * (self.activation_bytes(filled, inserted, width, prefix, 1)
                  - 3 * c.num_layers * filled * prefix * c.num_kv_heads * c.head_dim * self.dtype_bytes) // 20
            + c.num_layers * filled * inserted * width * kv + c.num_layers * filled * prefix * kv)

  def generation_bytes(self, slots: int, rows: int, prefix: int, suffix: int, new: int, stop_states: int, *,
                       held_layers: bool, prefill_room: int | None = None) -> int:
    """Peak bytes beyond the parameters of a generation job's calls (`generation_terms`, summed)."""
    return sum(self.generation_terms(slots, rows, prefix, suffix, new, stop_states, held_layers=held_layers,
                                     prefill_room=prefill_room).values())

  def generation_terms(self, slots: int, rows: int, prefix: int, suffix: int, new: int, stop_states: int, *,
                       held_layers: bool, prefill_room: int | None = None) -> dict[str, int]:
    """What a generation job holds beyond the parameters, term by term. Across the job: every layer's matmul weights
    as the decode steps read them (`generation_kernels.decode_layers`) where the job holds them (`held_layers`), the
    mask slots' prefix keys/values, every row's own cache (suffix and new tokens), the unablated prefix (residual
    streams, keys and values of every layer: masks resume above their first ablated layer from it), the stop-string
    automaton's tables ([vocab, stop_states], int32 and bool). Within a call, the larger of: a decode chunk (its own
    copy of the laid-out weights where the job holds none, live through the logits too; its copy of the prefix
    keys/values, each layer's apart; one layer's caches copied; the call's own new keys/values, `CHUNK_STEPS` a row
    in every layer, and their copy laid out for the cache's blocks; one token per row attending to the prefix, its
    cache and the call's new entries: its scores, `score_bytes`), an insert (`insert_call` of the widest prompts and
    of the narrowest, within `prefill_room`: `insert_bytes`) and a mask load (`load_masks`, within it: `load_bytes`).

    The terms follow XLA's `memory_analysis()` of the compiled calls (`experiments.benchmark_memory
    --parts=generation`, every preset): never under."""
    c = self.model
    kv = 2 * c.num_kv_heads * c.head_dim * self.dtype_bytes  # one token's keys and values in one layer
    cache = suffix + new
    # A decode call's new keys/values, kept apart until its last step, then laid out as the blocks take them
    # (`generation_kernels.decode`): twice.
    recent = 2 * c.num_layers * slots * rows * CHUNK_STEPS * kv
    weights = c.num_layers * layer_weight_bytes(c, self.dtype_bytes)
    # A decode call's own copy of the prefix keys/values, each layer's apart (`generation_kernels.decode`).
    decode = (self.activation_bytes(slots, rows, 1, 0, 1) + (0 if held_layers else weights) + recent
              + c.num_layers * slots * prefix * kv
              + score_bytes(c, slots * rows * c.num_heads * (prefix + cache + CHUNK_STEPS + 1))
              + slots * rows * cache * kv)

    def insert(width: int) -> int:
      return self.insert_bytes(*self.insert_call(slots, rows, suffix, width, prefix=prefix, room=prefill_room), width,
                               prefix)

    # The widest prompts' insert, and the narrowest's (`batching.bucket_coarse`: 16), with the most rows and logits.
    prefill = max(insert(suffix), insert(min(16, suffix)))
    load = self.load_bytes(self.load_masks(slots, prefix, prefill_room), prefix)
    return {"decode_weights": weights if held_layers else 0,
            "prefix_kv": c.num_layers * slots * prefix * kv, "cache": c.num_layers * slots * rows * cache * kv,
            "unablated_prefix": c.num_layers * prefix * (c.hidden_size * self.dtype_bytes + kv),
            "stop_tables": c.vocab_size * stop_states * 5, "activations": max(decode, prefill, load)}

  def attribution_rows(self, *, suffix: int, context: int, targets: int, steps: int, num_requests: int) -> int:
    """Requests per integrated-gradients call, each `steps` rows of `suffix` tokens after a shared `context`. A
    backward pass keeps every layer's activations: three forward passes' worth per row (an allowance, not fitted to
    XLA's buffers as scoring is), plus a neuron mask, its gradient and the running mean."""
    c = self.model
    per_row = 3 * self.activation_bytes(1, 1, suffix, context, targets)
    per_row += c.num_layers * c.intermediate_size * 4 * 3
    return min(max(1, int(self.budget // (per_row * steps))), num_requests)

  def sum_rows(self, mean_tokens: float) -> int:
    """Rows per call of the mean-ablation statistics (one forward pass, no masks): `tokens_per_batch` tokens."""
    return max(1, self.tokens_per_batch // max(1, int(mean_tokens)))

  def residual_stream_bytes(self, tokens: int) -> int:
    """The unablated residual stream entering every layer at `tokens` positions (scoring resumes from it)."""
    c = self.model
    return c.num_layers * c.hidden_size * self.dtype_bytes * tokens

  def prompt_stream_bytes(self, prompts: int, width: int) -> int:
    """The unablated prefill of `prompts` prompts `width` wide: every layer's residual stream, keys and values."""
    c = self.model
    return c.num_layers * prompts * width * (c.hidden_size + 2 * c.num_kv_heads * c.head_dim) * self.dtype_bytes

  def fits_residual_cache(self, size: int) -> bool:
    return size <= self.residual_cache
