"""The generation kernels: pure, jittable functions for decoding many (mask, prompt) rows held in slots, the
prompts' shared prefix once per mask, each row only its own suffix and new tokens, rows replaced as they finish; each
next token greedy or sampled (`sampling.next_tokens`). The generation job that compiles them and drives them between
chunks is `generator.py`.

Axes: `slots` Ms (masks decoded at once; each holds one mask and its prefix's keys/values), `rows` Rs (row slots of a
mask slot, each a (mask, prompt) pair of that mask), `prefix` P (the prompts' shared token prefix, right-padded),
`suffix` S (a row's prompt after the prefix, right-padded), `cache` C (a row's own keys/values: its suffix, then its
new tokens, held in blocks of positions, `cache_blocks`), `new` T (tokens a row may emit), `steps` (of a decode call),
`filled` Mi (mask slots an insert starts rows in), `inserted` Ri (rows it starts in each), `layers` L, `kv_heads` K,
`head_dim` Dh, `embed` D, `vocab` V, `states` Q (of the stop-string automaton, `stops.py`).

A decode step's attention reads the mask's prefix keys/values once for all of that mask's rows, each row's own
cache in the blocks its live rows have filled, and the keys/values of the call's own earlier steps
(`layers.Attention`: one softmax over the prefix, the row's blocks, its new entries and the token itself). Each block
is an array of its own, so a call reads as many as it needs where they lie (a slice of one array would be copied
first); a call writes its new entries into the blocks once, after its last step. Keys and values of the prefix come
from one prefill per mask (`load_masks`); below the first layer a mask ablates they are the unablated model's,
computed once for all masks (`unablated_prefix`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from jaxloc.engine.sampling import Sampler, next_tokens
from jaxloc.models.config import NO_WINDOW, ModelConfig
from jaxloc.models.decoder import Ablation, OutputSpec, Resume, layer_params
from jaxloc.models.layers import Context

Array = jax.Array

# `window_skip`'s granularity, in prefix entries.
WINDOW_SKIP_STEP = 128
# Decode steps per call: a row that ends mid-call idles for the rest of it; the host refills between calls.
CHUNK_STEPS = 16
# A row's cache is held in blocks of at least CACHE_BLOCK positions, at most MAX_CACHE_BLOCKS of them (`cache_blocks`).
CACHE_BLOCK = 64
MAX_CACHE_BLOCKS = 8


@dataclasses.dataclass
class Slots:
  """The decoding state of a generation job (a pytree, donated to and returned by every call).

  ablation: the mask slots' masks (head_mask [Ms, L, H], neuron_mask [Ms, L, F], 1 keep) with their fills.
  prefix_len: int32 scalar, the real tokens of the P-wide prefix; prefix_k [L, Ms, P, K, Dh], prefix_v
  [L, Ms, K, Dh, P] (as a `Context` holds them).
  cache_k, cache_v: each row's own keys/values, per layer (L tuples, apart, so that a decode step reads each layer's
  where it lies: `Transformer.unrolled`), each a tuple of blocks of positions (`cache_blocks`), keys [Ms, Rs, K, Dh,
  width] and values [Ms, Rs, K, width, Dh] (the layouts its matmuls read, `layers.Context`); length [Ms, Rs]: how
  many positions are filled.
  current [Ms, Rs]: the token a row feeds next (emitted by the step that feeds it); tokens [Ms, Rs, T]: emitted so
  far, `count` [Ms, Rs] of them; done [Ms, Rs]: the row emits nothing more; automaton [Ms, Rs]: its stop-string state.
  """

  ablation: Ablation
  prefix_len: Array
  prefix_k: Array
  prefix_v: Array
  cache_k: tuple[tuple[Array, ...], ...]
  cache_v: tuple[tuple[Array, ...], ...]
  length: Array
  current: Array
  tokens: Array
  count: Array
  done: Array
  automaton: Array


jax.tree_util.register_dataclass(Slots, data_fields=[f.name for f in dataclasses.fields(Slots)], meta_fields=[])


def cache_blocks(cache: int) -> tuple[int, ...]:
  """The widths of the blocks a `cache`-wide row cache is held in: CACHE_BLOCK positions each, or more where that
  would make over MAX_CACHE_BLOCKS blocks (a call reads a block with one product per layer), the last one narrower
  where the cache ends."""
  width = max(CACHE_BLOCK, -(-cache // MAX_CACHE_BLOCKS))
  return tuple(min(width, cache - start) for start in range(0, cache, width))


def block_starts(state: Slots) -> np.ndarray:
  """The first position of each block of the state's row caches (every layer's blocks alike)."""
  return np.cumsum((0,) + tuple(b.shape[-1] for b in state.cache_k[0]))[:-1]


def read_blocks(filled: int, cache: int) -> int:
  """How many leading blocks of a `cache`-wide row cache (`cache_blocks`) hold its first `filled` positions."""
  ends = np.cumsum(cache_blocks(cache))
  return int(np.searchsorted(ends, filled)) + 1 if filled else 0


def slot_shapes(config: ModelConfig, dtype: DTypeLike, *, slots: int, rows: int, prefix: int, cache: int, new: int,
                heads: bool = True, neurons: bool = False, head_fill: bool = False, neuron_fill: bool = False) -> Slots:
  """A `Slots` of `jax.ShapeDtypeStruct`s: a job's state as shapes, to compile its calls ahead of time (and read
  XLA's memory and cost analyses) before any of it exists. heads/neurons: which masks the slots hold; *_fill:
  mean ablation."""
  c = config
  shape: Callable[..., Any] = jax.ShapeDtypeStruct  # shapes stand in for the arrays of a `Slots` (a pytree)
  prefix_k = shape((c.num_layers, slots, prefix, c.num_kv_heads, c.head_dim), dtype)
  prefix_v = shape((c.num_layers, slots, c.num_kv_heads, c.head_dim, prefix), dtype)
  widths = cache_blocks(cache)
  own_k = tuple(tuple(shape((slots, rows, c.num_kv_heads, c.head_dim, w), dtype) for w in widths)
                for _ in range(c.num_layers))
  own_v = tuple(tuple(shape((slots, rows, c.num_kv_heads, w, c.head_dim), dtype) for w in widths)
                for _ in range(c.num_layers))
  per_row = lambda d: shape((slots, rows), d)  # noqa: E731
  ablation = Ablation(shape((slots, c.num_layers, c.num_heads), dtype) if heads else None,
                      shape((c.num_layers, c.num_heads, c.head_dim), dtype) if heads and head_fill else None,
                      shape((slots, c.num_layers, c.intermediate_size), dtype) if neurons else None,
                      shape((c.num_layers, c.intermediate_size), dtype) if neurons and neuron_fill else None)
  return Slots(ablation, shape((), jnp.int32), prefix_k, prefix_v, own_k, own_v, per_row(jnp.int32), per_row(jnp.int32),
               shape((slots, rows, new), jnp.int32), per_row(jnp.int32), per_row(bool), per_row(jnp.int32))


def empty_slots(shapes: Slots, head_fill: Array | None, neuron_fill: Array | None, prefix_len: int | Array) -> Slots:
  """A state of `shapes` (`slot_shapes`) with every row ended and every mask slot keeping everything: zeros, the fills
  given (or None), `prefix_len` real prefix tokens."""
  state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  ablation = state.ablation
  ones = lambda a: None if a is None else jnp.ones_like(a)  # noqa: E731
  return dataclasses.replace(
      state, ablation=Ablation(ones(ablation.head_mask), head_fill, ones(ablation.neuron_mask), neuron_fill),
      prefix_len=jnp.asarray(prefix_len, jnp.int32), done=jnp.ones(shapes.done.shape, bool))


def prefix_context(state: Slots) -> Context | None:
  """The mask slots' prefix keys/values as the model's shared `Context` (None without a prefix)."""
  width = state.prefix_k.shape[2]
  if width == 0:
    return None
  positions = jnp.arange(width)[None, None]
  valid = jnp.broadcast_to(positions < state.prefix_len, (state.prefix_k.shape[1], 1, width))
  return Context(state.prefix_k, state.prefix_v, valid, positions)


def unablated_prefix(module: Any, params: Any, prefix_tokens: Array, *,
                     dtype: DTypeLike) -> tuple[Array, Array, Array]:
  """The unablated model on the prefix [P]: the residual stream entering every layer [L, P, D] and every layer's
  keys/values [L, P, K, Dh]. A mask that ablates nothing below layer l takes the layers below from them."""
  width = prefix_tokens.shape[0]
  out = module.apply({"params": params}, prefix_tokens[None, None], jnp.arange(width)[None, None],
                     outputs=OutputSpec(kv=True, residuals=True), dtype=dtype)
  return out.residual[:, 0, 0], out.k[:, 0, 0], out.v[:, 0, 0]


def load_masks(module: Any, params: Any, state: Slots, slot: Array, masks: Ablation, prefix_tokens: Array,
               start: tuple[Array, Array, Array, Array] | None = None, *, dtype: DTypeLike) -> Slots:
  """Puts masks [Mn] (their fills are the state's) into mask slots `slot` [Mn] (Ms drops a padding entry) and
  prefills the prefix [P] under each.

  start: None, or (start_layer int32 scalar, `unablated_prefix`'s three arrays) when no mask ablates anything below
  start_layer: the prefill resumes there, and the layers below keep the unablated keys/values.
  """
  def put(into: Array | None, new: Array | None) -> Array | None:
    if into is None:
      return None
    assert new is not None, "the masks hold every kind the slots do"
    return into.at[slot].set(new.astype(into.dtype), mode="drop")

  ablation = dataclasses.replace(state.ablation, head_mask=put(state.ablation.head_mask, masks.head_mask),
                                 neuron_mask=put(state.ablation.neuron_mask, masks.neuron_mask))
  state = dataclasses.replace(state, ablation=ablation)
  width = prefix_tokens.shape[0]
  if width == 0:
    return state
  count = slot.shape[0]
  tokens = jnp.broadcast_to(prefix_tokens[None, None], (count, 1, width))
  resume = None if start is None else Resume(start[0], start[1][start[0]][None, None])
  masks = dataclasses.replace(masks, head_fill=state.ablation.head_fill, neuron_fill=state.ablation.neuron_fill)
  out = module.apply({"params": params}, tokens, jnp.arange(width)[None, None], ablation=masks, start=resume,
                     outputs=OutputSpec(kv=True), dtype=dtype)
  k, v = out.k[:, :, 0], out.v[:, :, 0]  # [L, Mn, P, K, Dh]
  if start is not None:
    below = (jnp.arange(k.shape[0]) < start[0])[:, None, None, None, None]
    k = jnp.where(below, start[2][:, None].astype(k.dtype), k)
    v = jnp.where(below, start[3][:, None].astype(v.dtype), v)
  return dataclasses.replace(state, prefix_k=state.prefix_k.at[:, slot].set(k, mode="drop"),
                             prefix_v=state.prefix_v.at[:, slot].set(jnp.moveaxis(v, 2, -1), mode="drop"))


def insert_rows(module: Any, config: ModelConfig, params: Any, state: Slots, slot: Array | None, row: Array,
                tokens: Array, lengths: Array, *, pad_id: int, dtype: DTypeLike, sampler: Sampler | None = None,
                row_ids: Array | None = None) -> Slots:
  """Starts new rows in some mask slots: slot [Mi] names them (Ms, past the slots, a padding entry; None: every slot
  in order, Mi = Ms), and the suffixes tokens[i] [Ri, W] (right-padded, `lengths` [Mi, Ri] real tokens, W at most the
  cache) go into slot[i]'s row slots row[i] [Ri] (Rs drops a padding entry), prefilled under the slot's mask after
  its prefix; each row's first new token is picked after its last suffix token (`sampling.next_tokens`: the argmax
  without a `sampler`, else drawn with the key of row_ids [Mi, Ri, 2], each row's (mask, prompt) indices, and token
  index 0). Named slots are gathered (their masks, a copy of their prefix keys/values) and only they are computed;
  None reads every slot where it lies, so that slots split over devices each stay on theirs."""
  ablation, context = state.ablation, prefix_context(state)
  if slot is None:
    mi = jnp.arange(state.length.shape[0])[:, None]
  else:
    picked = jnp.minimum(slot, state.length.shape[0] - 1)  # a padding entry computes the last slot's, written nowhere
    take = lambda a: None if a is None else a[picked]  # noqa: E731
    ablation = dataclasses.replace(ablation, head_mask=take(ablation.head_mask), neuron_mask=take(ablation.neuron_mask))
    if context is not None:
      context = Context(context.k[:, picked], context.v[:, picked], context.valid[picked], context.positions)
    mi = slot[:, None]
  _, inserted, width = tokens.shape
  columns = jnp.arange(width)[None, None]
  segments = jnp.where(columns < lengths[..., None], 0, -1)  # padding sees only padding
  out = module.apply({"params": params}, tokens, state.prefix_len + columns, ablation=ablation, context=context,
                     segments=segments, outputs=OutputSpec(kv=True), dtype=dtype)
  last = jnp.take_along_axis(out.hidden, jnp.maximum(lengths - 1, 0)[..., None, None], axis=2)[:, :, 0]
  first = next_tokens(config, params, last, sampler, row_ids, None if sampler is None else jnp.zeros_like(lengths))
  at = lambda a: a.at[mi, row]  # noqa: E731  [Mi, Ri] entries of a [Ms, Rs, ...] array
  starts = block_starts(state)

  def into(blocks: tuple[Array, ...], new: Array, axis: int) -> tuple[Array, ...]:  # new [Mi, Ri, W, K, Dh]
    out = []
    for block, start in zip(blocks, starts):
      part = new[:, :, start:min(width, start + block.shape[axis])]  # the suffix's positions in this block
      if part.shape[2]:
        index = (slice(None),) * (axis - 2) + (slice(0, part.shape[2]),)
        block = block.at[(mi, row) + index].set(jnp.moveaxis(part, 2, axis), mode="drop")
      out.append(block)
    return tuple(out)

  return dataclasses.replace(
      state, cache_k=tuple(into(c, k, 4) for c, k in zip(state.cache_k, out.k)),  # blocks [Mi, Ri, K, Dh, width]
      cache_v=tuple(into(c, v, 3) for c, v in zip(state.cache_v, out.v)),  # blocks [Mi, Ri, K, width, Dh]
      length=at(state.length).set(lengths, mode="drop"), current=at(state.current).set(first, mode="drop"),
      tokens=at(state.tokens).set(pad_id, mode="drop"), count=at(state.count).set(0, mode="drop"),
      done=at(state.done).set(False, mode="drop"), automaton=at(state.automaton).set(0, mode="drop"))


def window_skip(config: ModelConfig, prefix: int, first_position: int) -> int:
  """Entries at the front of the P = `prefix`-wide prefix that no sliding-window layer's query at `first_position`
  or later sees (a query at p sees keys at positions > p - window), floored to a multiple of `WINDOW_SKIP_STEP` (so
  a job compiles few decode calls): a decode chunk whose live rows' next tokens are at `first_position` or later
  leaves them out of those layers' attention (`decode`'s `skip`). 0 without sliding layers, and where fewer than a
  step would go; always short of the whole prefix."""
  window = config.sliding_window
  if not config.has_sliding_layers or window is None:
    return 0
  unseen = min(first_position - window + 1, prefix - 1)
  return max(0, unseen // WINDOW_SKIP_STEP * WINDOW_SKIP_STEP)


def decode_layers(config: ModelConfig, params: Any) -> tuple[Any, ...]:
  """Every decoder layer's parameters as `decode` reads them: sliced from the stacked [L, ...], the kernels in the
  decode step's layout (`decoder.layer_params`; `Transformer.unrolled` reads each where it lies). A copy of the
  layers' weights: a generation job makes it once and holds it where that costs it no rows
  (`GenerationSlots.held_layers`), giving it to every decode call as `params["layers"]`; else each decode call makes
  its own."""
  return layer_params(params["layers"], config.num_layers)


def decode(module: Any, config: ModelConfig, params: Any, state: Slots, eos_ids: Array, stop_next: Array,
           stop_hit: Array, budget: Array, sampler: Sampler | None = None, row_ids: Array | None = None, *, steps: int,
           blocks: int, dtype: DTypeLike, skip: int = 0) -> Slots:
  """Up to `steps` steps of every live row (fewer once all are done), reading the first `blocks` blocks of each row's
  cache, and the prefix from entry `skip` on in sliding-window layers (full layers read all of it).

  params: the model's, `params["layers"]` as `decode_layers` lays them out (once per job), or stacked [L, ...] (then
  laid out here, once per call, before the loop).
  A step emits each live row's current token, ends the row on EOS (eos_ids [E]), a stop string (stop_next, stop_hit
  [V, Q], `stops.stop_tables`) or its `budget`-th token (int32 scalar, at most T), and feeds the token through the
  model to pick the next (`sampling.next_tokens`: greedy without a `sampler`, else drawn with the key of the row's
  (mask, prompt) indices, row_ids [Ms, Rs, 2], and the index of the token drawn among the row's own). The call's new
  keys/values go into a buffer of `steps` entries per row, which its later steps read after the blocks, and into the
  blocks once the loop ends. The caller picks `blocks` to hold every live row's filled positions (`read_blocks`), and
  `skip` at most `window_skip` of the live rows' first position: the entries skipped are those every live row's
  window has passed (positions only grow within a call), so a sliding layer's attention leaves out only prefix keys
  it would mask.
  """
  if not isinstance(params["layers"], tuple):
    params = dict(params, layers=decode_layers(config, params))
  slots, rows = state.length.shape
  emitted = state.tokens.shape[2]
  mi, ri = jnp.arange(slots)[:, None], jnp.arange(rows)[None, :]
  stacked = prefix_context(state)
  # Each layer's prefix apart, once per call (a sliding layer's from entry `skip`): a step reads each where it lies.
  front = tuple(skip if window != NO_WINDOW else 0 for window in config.layer_windows()) or (0,) * config.num_layers
  context = None if stacked is None else tuple(
      Context(stacked.k[layer][:, at:], stacked.v[layer][..., at:], stacked.valid[..., at:],
              stacked.positions[..., at:]) for layer, at in enumerate(front))
  # The blocks read, fixed for the call: each row's positions filled before it, every layer's block b alike.
  filled = state.length
  starts = block_starts(state)
  seen = tuple((start + jnp.arange(b.shape[-1]) < filled[..., None], (state.prefix_len + start + jnp.arange(
      b.shape[-1]))[None, None]) for start, b in zip(starts, state.cache_k[0][:blocks]))
  new_positions = state.prefix_len + filled[..., None] + jnp.arange(steps)
  kv_heads, head_dim = state.prefix_k.shape[3], state.prefix_k.shape[4]
  Carry = tuple[Array, tuple[Array, ...], tuple[Array, ...], Slots]

  def cond(carry: Carry) -> Array:
    return (carry[0] < steps) & ~carry[-1].done.all()

  def body(carry: Carry) -> Carry:
    step, k, v, s = carry
    live = ~s.done
    tokens = s.tokens.at[mi, ri, jnp.where(live, s.count, emitted)].set(s.current, mode="drop")
    count = s.count + live
    done = (s.done | (s.current[..., None] == eos_ids).any(-1) | stop_hit[s.current, s.automaton]
            | (count >= budget))
    automaton = stop_next[s.current, s.automaton]
    # This call's entries so far: a row live since the call began wrote one at each step, an ended row none since.
    written = jnp.arange(steps)[None, None] < (s.length - filled)[..., None]
    cache = tuple(tuple(Context(bk, bv, valid, positions) for bk, bv, (valid, positions) in zip(lk, lv, seen))
                  + (Context(nk, nv, written, new_positions),)
                  for lk, lv, nk, nv in zip(state.cache_k, state.cache_v, k, v))
    out = module.apply({"params": params}, s.current[..., None], (s.prefix_len + s.length)[..., None],
                       ablation=s.ablation, context=context, cache=cache, outputs=OutputSpec(kv=True), dtype=dtype)
    # The new keys/values are written once the step has read every buffer: so the writes are in place (without this
    # order XLA copies each layer's whole buffer before writing it, as nothing orders the reads first).
    hidden, new_k, new_v = jax.lax.optimization_barrier((out.hidden, out.k, out.v))
    k = tuple(nk.at[:, :, :, :, step].set(new[:, :, 0]) for nk, new in zip(k, new_k))
    v = tuple(nv.at[:, :, :, step].set(new[:, :, 0]) for nv, new in zip(v, new_v))
    following = next_tokens(config, params, hidden[:, :, 0], sampler, row_ids, count)
    s = dataclasses.replace(s, length=s.length + ~done, current=jnp.where(done, s.current, following),
                            tokens=tokens, count=count, done=done, automaton=automaton)
    return step + 1, k, v, s

  dtype_kv = state.prefix_k.dtype
  new_k = tuple(jnp.zeros((slots, rows, kv_heads, head_dim, steps), dtype_kv) for _ in range(config.num_layers))
  new_v = tuple(jnp.zeros((slots, rows, kv_heads, steps, head_dim), dtype_kv) for _ in range(config.num_layers))
  # The loop carries only its own entries (the state's blocks, None here, are read, not carried).
  rest = dataclasses.replace(state, cache_k=None, cache_v=None)  # type: ignore[arg-type]
  _, new_k, new_v, rest = jax.lax.while_loop(cond, body, (jnp.int32(0), new_k, new_v, rest))
  # Each row's entries of this call, at positions filled + j for j < the entries it wrote, into the blocks.
  target = filled[..., None] + jnp.arange(steps)
  wrote = jnp.arange(steps)[None, None] < (rest.length - filled)[..., None]
  m3, r3 = mi[..., None], ri[..., None]

  def flush(layer_blocks: tuple[Array, ...], new: Array, axis: int) -> tuple[Array, ...]:  # new [Ms, Rs, steps, K, Dh]
    out = []
    for block, start in zip(layer_blocks, starts):
      index = target - start
      index = jnp.where(wrote & (index >= 0) & (index < block.shape[axis]), index, block.shape[axis])  # else dropped
      out.append(block.at[(m3, r3) + (slice(None),) * (axis - 2) + (index,)].set(new, mode="drop"))
    return tuple(out)

  return dataclasses.replace(rest, cache_k=tuple(flush(b, jnp.moveaxis(n, 4, 2), 4)
                                                 for b, n in zip(state.cache_k, new_k)),
                             cache_v=tuple(flush(b, jnp.moveaxis(n, 3, 2), 3) for b, n in zip(state.cache_v, new_v)))
