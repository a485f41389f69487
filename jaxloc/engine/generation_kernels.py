"""The generation kernels: pure, jittable functions for greedy decoding of many (mask, prompt) rows held in slots, the
prompts' shared prefix once per mask, each row only its own suffix and new tokens, rows replaced as they finish. The
generation job that compiles them and drives them between chunks is `generator.py`.

Axes: `slots` Ms (masks decoded at once; each holds one mask and its prefix's keys/values), `rows` Rs (row slots of a
mask slot, each a (mask, prompt) pair of that mask), `prefix` P (the prompts' shared token prefix, right-padded),
`suffix` S (a row's prompt after the prefix, right-padded), `cache` C (a row's own keys/values: its suffix, then its
new tokens), `span` (the part of C a chunk reads), `new` T (tokens a row may emit), `filled` Mi (mask slots an insert
starts rows in), `inserted` Ri (rows it starts in each), `layers` L, `kv_heads` K, `head_dim` Dh, `embed` D, `vocab` V,
`states` Q (of the stop-string automaton, `stops.py`).

A decode step's attention reads the mask's prefix keys/values once for all of that mask's rows, and each row's own
cache up to `span` (`layers.Attention`: one softmax over the prefix, the row's cache and the token itself). Keys and
values of the prefix come from one prefill per mask (`load_masks`); below the first layer a mask ablates they are
the unablated model's, computed once for all masks (`unablated_prefix`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from jaxloc.engine import batching
from jaxloc.models.config import ModelConfig
from jaxloc.models.decoder import Ablation, OutputSpec, Resume, greedy_tokens, layer_params
from jaxloc.models.layers import Context

Array = jax.Array


@dataclasses.dataclass
class Slots:
  """The decoding state of a generation job (a pytree, donated to and returned by every call).

  ablation: the mask slots' masks (head_mask [Ms, L, H], neuron_mask [Ms, L, F], 1 keep) with their fills.
  prefix_len: int32 scalar, the real tokens of the P-wide prefix; prefix_k [L, Ms, P, K, Dh], prefix_v
  [L, Ms, K, Dh, P] (as a `Context` holds them).
  cache_k, cache_v: each row's own keys/values, per layer (L arrays, apart, so that a decode step reads each layer's
  where it lies: `Transformer.unrolled`), keys [Ms, Rs, K, Dh, C] and values [Ms, Rs, K, C, Dh] (the layouts its
  matmuls read, `layers.Context`); length [Ms, Rs]: how many are filled.
  current [Ms, Rs]: the token a row feeds next (emitted by the step that feeds it); tokens [Ms, Rs, T]: emitted so
  far, `count` [Ms, Rs] of them; done [Ms, Rs]: the row emits nothing more; automaton [Ms, Rs]: its stop-string state.
  """

  ablation: Ablation
  prefix_len: Array
  prefix_k: Array
  prefix_v: Array
  cache_k: tuple[Array, ...]
  cache_v: tuple[Array, ...]
  length: Array
  current: Array
  tokens: Array
  count: Array
  done: Array
  automaton: Array


jax.tree_util.register_dataclass(Slots, data_fields=[f.name for f in dataclasses.fields(Slots)], meta_fields=[])


def slot_shapes(config: ModelConfig, dtype: DTypeLike, *, slots: int, rows: int, prefix: int, cache: int, new: int,
                heads: bool = True, neurons: bool = False, head_fill: bool = False, neuron_fill: bool = False) -> Slots:
  """A `Slots` of `jax.ShapeDtypeStruct`s: a job's state as shapes, to compile its calls ahead of time (and read
  XLA's memory and cost analyses) before any of it exists. heads/neurons: which masks the slots hold; *_fill:
  mean ablation."""
  c = config
  shape: Callable[..., Any] = jax.ShapeDtypeStruct  # shapes stand in for the arrays of a `Slots` (a pytree)
  prefix_k = shape((c.num_layers, slots, prefix, c.num_kv_heads, c.head_dim), dtype)
  prefix_v = shape((c.num_layers, slots, c.num_kv_heads, c.head_dim, prefix), dtype)
  own_k = tuple(shape((slots, rows, c.num_kv_heads, c.head_dim, cache), dtype) for _ in range(c.num_layers))
  own_v = tuple(shape((slots, rows, c.num_kv_heads, cache, c.head_dim), dtype) for _ in range(c.num_layers))
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
                tokens: Array, lengths: Array, *, pad_id: int, dtype: DTypeLike) -> Slots:
  """Starts new rows in some mask slots: slot [Mi] names them (Ms, past the slots, a padding entry; None: every slot
  in order, Mi = Ms), and the suffixes tokens[i] [Ri, W] (right-padded, `lengths` [Mi, Ri] real tokens, W at most the
  cache) go into slot[i]'s row slots row[i] [Ri] (Rs drops a padding entry), prefilled under the slot's mask after
  its prefix; each row's first new token is the argmax after its last suffix token. Named slots are gathered (their
  masks, a copy of their prefix keys/values) and only they are computed; None reads every slot where it lies, so
  that slots split over devices each stay on theirs."""
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
  first = greedy_tokens(config, params, last)
  at = lambda a: a.at[mi, row]  # noqa: E731  [Mi, Ri] entries of a [Ms, Rs, ...] array
  return dataclasses.replace(
      state, cache_k=tuple(c.at[mi, row, :, :, :width].set(jnp.moveaxis(k, 2, 4), mode="drop")  # [Mi, Ri, K, Dh, W]
                           for c, k in zip(state.cache_k, out.k)),
      cache_v=tuple(c.at[mi, row, :, :width].set(jnp.swapaxes(v, 2, 3), mode="drop")  # [Mi, Ri, K, W, Dh]
                    for c, v in zip(state.cache_v, out.v)),
      length=at(state.length).set(lengths, mode="drop"), current=at(state.current).set(first, mode="drop"),
      tokens=at(state.tokens).set(pad_id, mode="drop"), count=at(state.count).set(0, mode="drop"),
      done=at(state.done).set(False, mode="drop"), automaton=at(state.automaton).set(0, mode="drop"))


def decode_span(needed: int, cache: int) -> int:
  """The span a decode chunk reads of each row's `cache`-wide cache when its live rows need `needed` entries: the
  whole cache, unless a size of `batching.bucket_coarse`'s ladder at most a third of the cache covers them. A span
  below the cache is a slice, which XLA copies before the attention's matmuls (every layer's at once): a sliced read
  moves three times the span, a whole read the cache once."""
  span = batching.bucket_coarse(needed)
  return span if 3 * span <= cache else cache


def decode_layers(config: ModelConfig, params: Any) -> tuple[Any, ...]:
  """Every decoder layer's parameters as `decode` reads them: sliced from the stacked [L, ...], the kernels in the
  decode step's layout (`decoder.layer_params`; `Transformer.unrolled` reads each where it lies). A copy of the
  layers' weights: a generation job makes it once and holds it where that costs it no rows
  (`GenerationSlots.held_layers`), giving it to every decode call as `params["layers"]`; else each decode call makes
  its own."""
  return layer_params(params["layers"], config.num_layers)


def decode(module: Any, config: ModelConfig, params: Any, state: Slots, eos_ids: Array, stop_next: Array,
           stop_hit: Array, budget: Array, *, steps: int, span: int, dtype: DTypeLike) -> Slots:
  """Up to `steps` greedy steps of every live row (fewer once all are done), reading each row's cache up to `span`.

  params: the model's, `params["layers"]` as `decode_layers` lays them out (once per job), or stacked [L, ...] (then
  laid out here, once per call, before the loop).
  A step emits each live row's current token, ends the row on EOS (eos_ids [E]), a stop string (stop_next, stop_hit
  [V, Q], `stops.stop_tables`) or its `budget`-th token (int32 scalar, at most T), and feeds the token through the
  model to pick the next. The caller picks `span` at least every live row's length + steps.
  """
  if not isinstance(params["layers"], tuple):
    params = dict(params, layers=decode_layers(config, params))
  slots, rows = state.length.shape
  emitted = state.tokens.shape[2]
  mi, ri = jnp.arange(slots)[:, None], jnp.arange(rows)[None, :]
  stacked = prefix_context(state)
  # Each layer's prefix apart, once per call: a step reads each where it lies.
  context = None if stacked is None else tuple(Context(stacked.k[layer], stacked.v[layer], stacked.valid,
                                                       stacked.positions) for layer in range(config.num_layers))
  positions = (state.prefix_len + jnp.arange(span))[None, None]
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
    # `valid` is `span` wide: each layer's attention reads the first `span` entries of its cache (`layers.Attention`).
    valid = jnp.arange(span)[None, None] < s.length[..., None]
    cache = tuple(Context(lk, lv, valid, positions) for lk, lv in zip(k, v))
    out = module.apply({"params": params}, s.current[..., None], (s.prefix_len + s.length)[..., None],
                       ablation=s.ablation, context=context, cache=cache, outputs=OutputSpec(kv=True), dtype=dtype)
    # The new keys/values are written once the step has read every cache: so the writes are in place (without this
    # order XLA copies each layer's whole cache before writing it, as nothing orders the reads first).
    hidden, new_k, new_v = jax.lax.optimization_barrier((out.hidden, out.k, out.v))
    k = tuple(lk.at[mi, ri, :, :, s.length].set(new[:, :, 0], mode="drop") for lk, new in zip(k, new_k))
    v = tuple(lv.at[mi, ri, :, s.length].set(new[:, :, 0], mode="drop") for lv, new in zip(v, new_v))
    following = greedy_tokens(config, params, hidden[:, :, 0])
    s = dataclasses.replace(s, length=s.length + ~done, current=jnp.where(done, s.current, following),
                            tokens=tokens, count=count, done=done, automaton=automaton)
    return step + 1, k, v, s

  # The loop carries each cache once (the state's own fields, None here, are not arrays for that while).
  rest = dataclasses.replace(state, cache_k=None, cache_v=None)  # type: ignore[arg-type]
  _, k, v, rest = jax.lax.while_loop(cond, body, (jnp.int32(0), state.cache_k, state.cache_v, rest))
  return dataclasses.replace(rest, cache_k=k, cache_v=v)
