"""Attribution under masks: the mask objective and its gradient, integrated gradients of neurons, and the unablated
model's mean unit outputs (the fill values of mean ablation).

Axes: `masks` M (Mb per call), `requests` R (Rb per call), `seq` S, `targets` T, `slots` N (requests of a call),
`layers` L, `heads` H, `mlp` F, `head_dim` Dh. The kernels are pure functions jitted once per shape by `Attribution`;
requests are laid out as for scoring (`scoring_kernels.py`), and the planner sizes integrated-gradients calls.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from numpy.typing import ArrayLike

from jaxloc.engine import batching, scoring_kernels
from jaxloc.engine.masks import check_fills, check_masks
from jaxloc.engine.mesh import to_host
from jaxloc.engine.requests import ScoringRequest
from jaxloc.engine.scoring_kernels import Rows, prefix_context, score_chunk, target_logprob
from jaxloc.engine.resources import SharedResources
from jaxloc.errors import UserError
from jaxloc.models.layers import Context
from jaxloc.models.config import ModelConfig
from jaxloc.models.decoder import Ablation, OutputSpec


def mask_objective(module: Any, config: ModelConfig, params: Any, ablation: Ablation,
                   prefix_tokens: jax.Array | None, rows: Rows, weights: jax.Array, offsets: jax.Array,
                   dtype: DTypeLike, retained: bool = False) -> jax.Array:
  """Per mask [Mb]: sum over slots of weights[n] * f(logprob[m, n] - offsets[n]), where f is the identity, or
  with `retained` the probability kept relative to the offsets, exp(min(., 0)) (in [0, 1]: a request that loses
  everything counts 1, however many nats it loses).

  Differentiable in the ablation's masks (the prefix keys/values are recomputed inside, so the gradient flows
  through them too): at an all-ones mask with zero offsets its gradient is mask-gradient attribution; at soft
  masks it is what a learned mask trains on.
  """
  context = None
  if prefix_tokens is not None:
    context = prefix_context(module, params, ablation, prefix_tokens, dtype=dtype)
  logprob, _ = score_chunk(module, config, params, ablation, context, rows, dtype=dtype)
  change = logprob - offsets[None]
  values = jnp.exp(jnp.minimum(change, 0.0)) if retained else change
  return values @ weights


def mask_objective_and_grad(module: Any, config: ModelConfig, params: Any, ablation: Ablation, *args: Any,
                            dtype: DTypeLike, retained: bool = False
                            ) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
  """`mask_objective` [Mb] and its gradients in the head mask [Mb, L, H] and the neuron mask [Mb, L, F] (None
  for a kind the ablation does not hold; masks are independent: the gradient of the sum over masks is each
  mask's own)."""

  def total(masks: tuple[jax.Array | None, jax.Array | None]) -> tuple[jax.Array, jax.Array]:
    values = mask_objective(module, config, params, dataclasses.replace(ablation, head_mask=masks[0],
                                                                        neuron_mask=masks[1]),
                            *args, dtype=dtype, retained=retained)  # type: ignore[misc]  # args: the 5 before dtype
    return values.sum(), values

  (_, values), grads = jax.value_and_grad(total, has_aux=True)((ablation.head_mask, ablation.neuron_mask))
  return values, grads[0], grads[1]


def neuron_integrated_gradients(module: Any, config: ModelConfig, params: Any, neuron_fill: jax.Array | None,
                                prefix_tokens: jax.Array | None, tokens: jax.Array, positions: jax.Array,
                                target_pos: jax.Array, target_ids: jax.Array, target_valid: jax.Array, *, steps: int,
                                dtype: DTypeLike) -> jax.Array:
  """Integrated-gradients attribution [Rb, L, F] of every neuron at each request's last context position (the
  position predicting its first target token) for the probability of the request's target.

  One request per row: tokens, positions [Rb, S]; target_pos, target_ids, target_valid [Rb, T] (positions within
  the row, `Chunk.row_targets`).

  The neurons of every layer at that position are scaled together from 0 (from their mean `neuron_fill`, when
  given) to their value along `steps` points (alpha = k / steps, k = 1..steps); a neuron's attribution is its
  value (minus the fill) times the mean gradient of the target probability along the path, which is the mean
  gradient in a neuron mask that scales that position only. One
  forward and backward pass over requests × steps rows, each row its own mask. The shared prefix is computed
  once, unablated (the scaled position is never in it).
  """
  rows, seq = tokens.shape
  cfg = config
  alphas = jnp.arange(1, steps + 1, dtype=jnp.float32) / steps
  width = rows * steps
  repeat = lambda a: jnp.repeat(a, steps, axis=0)[:, None]  # noqa: E731  [Rb, ...] -> [Rb * steps, 1, ...]
  context = None
  if prefix_tokens is not None:
    one = Ablation(neuron_mask=jnp.ones((1, cfg.num_layers, cfg.intermediate_size), dtype))
    prefix = prefix_context(module, params, one, prefix_tokens, dtype=dtype)
    expand = lambda a: jnp.broadcast_to(a, (a.shape[0], width) + a.shape[2:])  # noqa: E731
    context = Context(expand(prefix.k), expand(prefix.v), jnp.ones((width, 1, prefix_tokens.shape[0]), bool),
                      prefix.positions)
  where = (jnp.arange(seq)[None, :] == target_pos[:, :1])  # [Rb, S]: the first predictor position
  masks = jnp.broadcast_to(jnp.tile(alphas, rows)[:, None, None], (width, cfg.num_layers, cfg.intermediate_size))
  slots = jnp.repeat(target_valid.astype(jnp.float32)[..., None], steps, axis=0)  # [Rb * steps, T, 1]

  def probability(mask: jax.Array) -> jax.Array:
    ablation = Ablation(neuron_mask=mask, neuron_fill=neuron_fill, neuron_where=repeat(where))
    out = module.apply({"params": params}, repeat(tokens), repeat(positions), ablation=ablation, context=context,
                       dtype=dtype)
    logprob, _ = target_logprob(config, params, out.hidden, jnp.repeat(target_pos, steps, axis=0),
                                jnp.repeat(target_ids, steps, axis=0), slots)
    return jnp.exp(logprob).sum()

  grad = jax.grad(probability)(masks.astype(dtype))
  return grad.astype(jnp.float32).reshape(rows, steps, cfg.num_layers, cfg.intermediate_size).mean(axis=1)


def unit_sums(module: Any, params: Any, tokens: jax.Array, segments: jax.Array, *,
              dtype: DTypeLike) -> tuple[jax.Array, jax.Array]:
  """Per-head attention outputs [L, K, G, Dh] and neuron values [L, F] of the unablated model, summed over the
  tokens [1, Rb, S] whose segment is not -1."""
  positions = jnp.arange(tokens.shape[-1])[None, None]
  out = module.apply({"params": params}, tokens, positions, segments=segments, outputs=OutputSpec(unit_sums=True),
                     dtype=dtype)
  return out.head_sums[:, 0], out.neuron_sums[:, 0]


class Attribution:
  """The attribution job of an engine (`Engine.mask_objective`, `neuron_attribution`, `ablation_means`)."""

  def __init__(self, shared: SharedResources):
    self.shared = shared
    module, config, dtype = shared.module, shared.model_config, shared.placement.dtype
    self._objective_fn = shared.jit(functools.partial(mask_objective_and_grad, module, config, dtype=dtype),
                                    static_argnames=("retained",))
    self._attribution_fn = shared.jit(functools.partial(neuron_integrated_gradients, module, config, dtype=dtype),
                                      static_argnames=("steps",))
    self._sums_fn = shared.jit(functools.partial(unit_sums, module, dtype=dtype))
    self.jitted = (self._objective_fn, self._attribution_fn, self._sums_fn)

  def mask_objective(self, requests: Sequence[ScoringRequest], head_masks: ArrayLike | None = None,
                     weights: Sequence[float] | None = None, offsets: Sequence[float] | None = None, *,
                     retained: bool = False, head_fill: ArrayLike | None = None,
                     neuron_masks: ArrayLike | None = None, neuron_fill: ArrayLike | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per keep-mask m (soft values allowed): sum_r weights[r] * f(logprob[m, r] - offsets[r]) and its gradient
    in the mask, float [M] and [M, L, H] (head masks) or [M, L, F] (neuron masks; give one kind); f is the identity,
    or with `retained` exp(min(., 0)), the probability a request keeps relative to `offsets`
    (`mask_objective`). Weights default to 1/R, offsets to 0.

    One forward and backward pass per request chunk and mask batch. At an all-ones mask with the defaults the
    gradient is the mask gradient: a unit whose gradient is large and positive loses the most log-probability
    when its output is scaled down.
    """
    shared, place = self.shared, self.shared.placement
    masks = check_masks(shared.model_config, head_masks, neuron_masks)
    if masks.heads is not None and masks.neurons is not None:
      raise UserError("mask_objective differentiates in one kind of mask: give head masks or neuron masks")
    lay, plan = shared.layouts.prepare(requests)
    # A backward pass keeps every layer's activations: no more masks per call than given (a power of two, so that
    # callers with varying counts share a handful of shapes), at most the layout's.
    per_call = min(plan.masks_per_call, batching.bucket_pow2(len(masks)))
    weight = np.full(len(requests), 1.0 / len(requests)) if weights is None else np.asarray(weights, np.float64)
    offset = np.zeros(len(requests)) if offsets is None else np.asarray(offsets, np.float64)
    for name, given in (("weight", weight), ("offset", offset)):
      if given.shape != (len(requests),):
        raise UserError(f"need one {name} per request ({len(requests)}), got {given.shape}")
    prefix = place.prefix(lay.prefix)
    fill = place.fills(check_fills(shared.model_config, head_fill, neuron_fill))
    values = np.zeros(len(masks), np.float64)
    kind = masks.heads if masks.heads is not None else masks.neurons
    assert kind is not None  # check_masks gives at least one kind
    grads = np.zeros(kind.shape, np.float64)
    for chunk in lay.chunks:
      slots = chunk.index >= 0
      host_slots = [np.zeros(len(chunk.index), np.float32) for _ in range(2)]
      for slot_values, given in zip(host_slots, (weight, offset)):
        slot_values[slots] = given[chunk.index[slots]]
      split = len(chunk.rows.tokens) % place.data_parallel == 0  # token rows over the data axis when they divide
      rows = place.rows(chunk.rows, place.split(2) if split else place.replicated)
      per_slot = [place.put(a) for a in host_slots]
      for begin in range(0, len(masks), per_call):
        batch = masks.rows(slice(begin, begin + per_call))
        real = len(batch)
        value, head_grad, neuron_grad = self._objective_fn(
            place.params, place.ablation(batch.padded(per_call), fill, place.replicated), prefix, rows, *per_slot,
            retained=retained)
        values[begin:begin + real] += to_host(value)[:real]
        grads[begin:begin + real] += to_host(head_grad if masks.heads is not None else neuron_grad)[:real]
    return values, grads

  def neuron_attribution(self, requests: Sequence[ScoringRequest], steps: int = 20,
                         neuron_fill: ArrayLike | None = None,
                         progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Integrated-gradients attribution float [R, L, F] of every neuron at each request's last context position
    for the probability of its continuation (`neuron_integrated_gradients`): value times the mean gradient along
    `steps` points of the path from 0 (the mean, with `neuron_fill`) to the neuron's value. Requests go in chunks
    the planner sizes (`Planner.attribution_rows`)."""
    if steps < 1:
      raise UserError(f"integrated gradients need at least 1 step, got {steps}")
    shared, place, c = self.shared, self.shared.placement, self.shared.model_config
    tokenized = scoring_kernels.tokenize(shared.model.tokenizer, requests, c.max_position_embeddings)
    prefix_len = scoring_kernels.shared_prefix_length(tokenized) if shared.config.share_prefix else 0
    rows = shared.planner.attribution_rows(
        suffix=batching.bucket(max(len(s) for s in tokenized.sequences) - prefix_len), context=prefix_len,
        targets=int(tokenized.num_targets.max()), steps=steps, num_requests=len(requests))
    one_per_row, width = scoring_kernels.arrange(tokenized, prefix_len, pack=False)
    lay = scoring_kernels.layout(tokenized, one_per_row, rows, prefix_len, shared.pad_id,
                                 width)  # one width: one compile
    prefix = place.prefix(lay.prefix)
    fill = place.fills(check_fills(c, None, neuron_fill)).neurons
    out = np.zeros((len(requests), c.num_layers, c.intermediate_size), np.float32)
    for chunk in lay.chunks:
      start = time.perf_counter()
      arrays = [place.put(a) for a in (chunk.rows.tokens, chunk.rows.positions, *chunk.row_targets())]
      scores = to_host(self._attribution_fn(place.params, fill, prefix, *arrays, steps=steps))
      real = chunk.index >= 0
      out[chunk.index[real]] = scores[real]
      shared.stats.calls += 1
      shared.stats.seconds += time.perf_counter() - start
      if progress:
        progress(int(real.sum()))
    return out

  def ablation_means(self, requests: Sequence[ScoringRequest]) -> tuple[np.ndarray, np.ndarray]:
    """Mean attention output of every head [L, H, Dh] and mean value of every neuron [L, F] over all tokens of
    `requests` (unablated model): the fill values of mean ablation."""
    shared, place, c = self.shared, self.shared.placement, self.shared.model_config
    tokenized = scoring_kernels.tokenize(shared.model.tokenizer, requests, c.max_position_embeddings)
    order = np.argsort([len(s) for s in tokenized.sequences])
    head_total = np.zeros((c.num_layers, c.num_kv_heads, c.queries_per_kv, c.head_dim), np.float64)
    neuron_total = np.zeros((c.num_layers, c.intermediate_size), np.float64)
    count = 0
    rows = shared.planner.sum_rows(float(np.mean([len(s) for s in tokenized.sequences])))
    width = batching.bucket(max(len(s) for s in tokenized.sequences))  # one width for every call: one compile
    for begin in range(0, len(order), rows):
      members = order[begin:begin + rows]
      tokens = np.full((1, rows, width), shared.pad_id, np.int32)
      segments = np.full((1, rows, width), -1, np.int32)  # one segment per row; -1 on padding
      for row, i in enumerate(members):
        seq = tokenized.sequences[i]
        tokens[0, row, :len(seq)] = seq
        segments[0, row, :len(seq)] = 0
      head_sums, neuron_sums = self._sums_fn(place.params, place.put(tokens), place.put(segments))
      head_total += np.asarray(to_host(head_sums), np.float64)
      neuron_total += np.asarray(to_host(neuron_sums), np.float64)
      count += int((segments >= 0).sum())
    heads = (head_total / count).reshape(c.num_layers, c.num_heads, c.head_dim).astype(np.float32)
    return heads, (neuron_total / count).astype(np.float32)
