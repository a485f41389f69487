"""The scoring job of an engine: teacher-forced scores of a request set under many masks, pipelined.

Axes: `masks` M (Mb per call), `requests` R. Masks are grouped by the first layer they ablate: a batch starts there
from the unablated model's residual streams of its request set, kept in the shared residual cache when they fit.
The compiled kernels are `scoring_kernels.py`'s; the layouts and call sizes come from the shared `Layouts` and
`Planner`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Callable, Hashable, Iterator, Sequence

import jax
import numpy as np
from numpy.typing import ArrayLike

from jaxloc.engine import scoring_kernels
from jaxloc.engine.batching import bucket_pow2
from jaxloc.engine.masks import check_fills, check_masks, start_layers
from jaxloc.engine.mesh import to_host
from jaxloc.engine.planner import GIB
from jaxloc.engine.requests import ScoreOutputs, ScoringRequest
from jaxloc.engine.resources import SharedResources

log = logging.getLogger(__name__)

# A chunk's unablated residual streams (`scoring_kernels.unablated_residuals`): the prefix's (None without one), the
# rows'.
Streams = tuple[jax.Array | None, jax.Array]


# A smaller call is compiled only when it saves this many compiles' worth of compute: a handful of calls take it.
COMPILE_MARGIN = 4.0


def call_size(needed: int, planned: int, compiled: set[int], full_call_seconds: float | None,
              compile_seconds: float | None) -> int:
  """Masks per call for a request set scored under `needed` masks: the planner's `planned` (every call of a shape
  takes it, so a baseline, a validation curve and a design batch share one compile), unless all `needed` fit one
  call and a smaller size pays. A shape gets at most one smaller size (`compiled` holds its sizes): the power of two
  that holds `needed`, once computing it instead saves more than COMPILE_MARGIN compiles: (1 - size / planned) of
  the shape's full call against `compile_seconds`, both measured by this engine (None: not yet, keep the planned
  size); later calls that fit it take it. On an accelerator a compile costs tens of seconds and a call far less;
  on a CPU at 1B parameters a full call of the planner's masks costs more than a dozen compiles."""
  if needed >= planned:
    return planned
  smaller = [s for s in compiled if s < planned]
  if smaller:
    return smaller[0] if needed <= smaller[0] else planned
  if full_call_seconds is None or compile_seconds is None:
    return planned
  size = min(bucket_pow2(needed), planned)
  return size if (1 - size / planned) * full_call_seconds > COMPILE_MARGIN * compile_seconds else planned


class Scorer:
  """`Engine.score` and `Engine.score_batches`."""

  def __init__(self, shared: SharedResources):
    self.shared = shared
    module, config, dtype = shared.module, shared.model_config, shared.placement.dtype
    self._prefix_fn = shared.jit(functools.partial(scoring_kernels.prefix_context, module, dtype=dtype))
    self._score_fn = shared.jit(functools.partial(scoring_kernels.score_chunk, module, config, dtype=dtype))
    self._residuals_fn = shared.jit(functools.partial(scoring_kernels.unablated_residuals, module, dtype=dtype))
    self.jitted = (self._prefix_fn, self._score_fn, self._residuals_fn)
    self._too_big: set[Hashable] = set()  # request sets whose streams did not fit the residual cache (warned once)
    self._sizes: dict[Hashable, set[int]] = {}  # call shape -> the masks per call compiled for it (`call_size`)
    self._full_call: dict[Hashable, float] = {}  # call shape -> seconds of its fastest full call that compiled nothing

  def _compiled(self) -> int:
    return sum(fn.compiled_shapes() for fn in self.jitted)

  def _compile_seconds(self, kernels: int) -> float | None:
    """What compiling `kernels` more kernels should cost: this engine's mean compile so far, executables read from
    the persistent cache left out (None before any compile, and in a multi-process run, whose processes must all
    pick the same call size but each time their own calls)."""
    if jax.process_count() > 1:
      return None
    compile_time = self.shared.stats.compile
    compiled = self._compiled() - compile_time.cache_hits
    return kernels * compile_time.seconds / compiled if compiled > 0 else None

  def _residual_streams(self, requests: Sequence[ScoringRequest], lay: scoring_kernels.ScoringLayout,
                        chunks: list[tuple[scoring_kernels.Chunk, scoring_kernels.Rows]]) -> list[Streams] | None:
    """The unablated residual streams of a laid-out request set, per chunk (computed once per request set and chunk
    shape, whatever the number of masks; kept while the residual cache has room, least recently used dropped
    first); None when they cannot fit it."""
    shared, place = self.shared, self.shared.placement
    key = (tuple(requests), len(lay.chunks), lay.chunks[0].rows.tokens.shape)
    kept: list[Streams] | None = shared.residuals.get(key)
    if kept is not None:
      return kept
    size = shared.planner.residual_stream_bytes(len(lay.prefix) + sum(chunk.rows.tokens.size for chunk in lay.chunks))
    if not shared.planner.fits_residual_cache(size):
      if key not in self._too_big:
        self._too_big.add(key)
        log.warning("the unablated residual streams of %d requests need %.2f GiB, over the residual cache of %.2f "
                    "GiB: every mask of them starts at layer 0 (raise --residual_cache_gb to skip unablated layers)",
                    len(requests), size / GIB, shared.planner.residual_cache / GIB)
      return None
    shared.residuals.make_room(size)
    start = time.perf_counter()
    prefix = place.prefix(lay.prefix)
    # Without the targets, which the streams do not read: request sets that differ only in their targets share one
    # compiled shape (jit keys on every argument, used or not).
    streams = [self._residuals_fn(place.params, prefix, dataclasses.replace(rows, target_pos=None, target_ids=None,
                                                                            target_slots=None))
               for _, rows in chunks]
    shared.residuals.put(key, streams, size)
    shared.stats.calls += len(chunks)
    shared.stats.seconds += time.perf_counter() - start
    return streams

  def score_batches(self, requests: Sequence[ScoringRequest], head_masks: ArrayLike | None = None,
                    head_fill: ArrayLike | None = None, *, neuron_masks: ArrayLike | None = None,
                    neuron_fill: ArrayLike | None = None, few_calls: bool = False, exact: bool = False
                    ) -> Iterator[tuple[slice, ScoreOutputs]]:
    """Yields (mask slice, outputs for those masks) in mask order as batches finish, so callers can checkpoint.
    `few_calls`: these requests are scored in a few calls in all (held-out documents), so their layout may pad into
    a larger shape laid out before instead of compiling its own (`Layouts.prepare`).

    Masks are evaluated grouped by the first layer they ablate (a stable sort, so masks already in that order keep
    it): a batch starts at its lowest first ablated layer, from the unablated residual streams, when they fit the
    residual cache, and each mask in it at its own (`scoring_kernels.score_chunk`'s `mask_starts`), so a mask's scores
    do not depend on the masks that share its call. Every call takes the layout's number of masks (the last is padded
    with unablated ones), or the shape's one smaller size when all the masks fit it (`call_size`), unless `exact`:
    then always the layout's, so that a mask's scores are bit for bit the same in any call of the request set (a
    call's size picks XLA's kernels; the smaller size is chosen by timing). Measurements a run resumes are exact."""
    shared, place, stats = self.shared, self.shared.placement, self.shared.stats
    config = shared.model_config
    masks = check_masks(config, head_masks, neuron_masks)
    lay, plan = shared.layouts.prepare(requests, few_calls)
    fill = place.fills(check_fills(config, head_fill, neuron_fill))
    shape = (0 if lay.prefix is None else len(lay.prefix), len(lay.chunks), lay.chunks[0].rows.tokens.shape)
    sizes = self._sizes.setdefault(shape, {plan.masks_per_call})
    per_call = plan.masks_per_call if exact else call_size(len(masks), plan.masks_per_call, sizes,
                                                            self._full_call.get(shape),
                                                            self._compile_seconds(1 + (lay.prefix is not None)))
    sizes.add(per_call)
    shard_masks = per_call % place.data_parallel == 0
    mask_sharding = place.split(3) if shard_masks else place.replicated
    row_sharding = place.replicated if shard_masks else place.split(2)
    prefix = place.prefix(lay.prefix)
    chunks = [(chunk, place.rows(chunk.rows, row_sharding)) for chunk in lay.chunks]
    # With a residual cache every batch resumes from the streams, even at layer 0: one compiled variant per shape.
    streams = self._residual_streams(requests, lay, chunks) if shared.planner.residual_cache else None
    num_layers = config.num_layers
    # A mask that ablates nothing starts at the last layer (the streams hold what enters each layer).
    starts = (np.minimum(start_layers(config, masks), num_layers - 1) if streams is not None
              else np.zeros(len(masks), np.int64))
    order = np.argsort(starts, kind="stable")
    starts_sharding = place.split(1) if shard_masks else place.replicated

    Dispatched = tuple[np.ndarray, int, list[tuple[jax.Array, jax.Array]], float, float, bool]

    def dispatch(begin: int) -> Dispatched:
      """Starts one batch of masks on the devices (asynchronously) and returns its handles."""
      start = time.perf_counter()
      compiled = self._compiled()
      members = order[begin:begin + per_call]
      ablation = place.ablation(masks.rows(members).padded(per_call), fill, mask_sharding)
      layer = int(starts[members].min())
      if streams is None:
        context = self._prefix_fn(place.params, ablation, prefix) if prefix is not None else None
        results = [self._score_fn(place.params, ablation, context, rows) for _, rows in chunks]
      else:
        at = place.put(np.int32(layer))
        # Padding masks ablate nothing: they start with the batch.
        own = place.put(np.pad(starts[members], (0, per_call - len(members)), constant_values=layer).astype(np.int32),
                        starts_sharding)
        context = (self._prefix_fn(place.params, ablation, prefix, at, streams[0][0], own) if prefix is not None
                   else None)
        results = [self._score_fn(place.params, ablation, context, rows, at, chunk_streams[1], own)
                   for (_, rows), chunk_streams in zip(chunks, streams)]
      return members, layer, results, start, time.perf_counter() - start, self._compiled() > compiled

    logprob = np.zeros((len(masks), lay.num_requests), np.float32)
    is_greedy = np.zeros((len(masks), lay.num_requests), bool)
    done = np.zeros(len(masks), bool)

    last = [0.0]  # when the previous batch came back: a pipelined batch's call time is counted from then

    def collect(members: np.ndarray, layer: int, results: list[tuple[jax.Array, jax.Array]], dispatched: float,
                seconds: float, compiling: bool) -> None:
      start = time.perf_counter()
      real = len(members)
      for (chunk, _), (lp, greedy) in zip(chunks, results):
        slots = chunk.index >= 0
        requests_of = chunk.index[slots]
        logprob[np.ix_(members, requests_of)] = to_host(lp)[:real, slots]
        is_greedy[np.ix_(members, requests_of)] = to_host(greedy)[:real, slots]
      done[members] = True
      stats.calls += len(chunks) + (prefix is not None)
      stats.mask_evaluations += real
      stats.tokens += real * lay.tokens_per_mask
      stats.padded_tokens += per_call * lay.padded_tokens_per_mask
      stats.layer_tokens += real * lay.tokens_per_mask * (num_layers - layer)
      stats.targets += real * int(lay.num_targets.sum())
      end = time.perf_counter()
      stats.seconds += seconds + end - start
      if per_call == plan.masks_per_call and not compiling:
        took = end - max(dispatched, last[0])
        self._full_call[shape] = min(self._full_call.get(shape, took), took)
      last[0] = end

    # The next batch is dispatched before the caller gets (and saves) the previous one, so the devices never
    # wait for the host's bookkeeping.
    ready = 0
    pending: Dispatched | None = dispatch(0)
    for begin in range(per_call, len(masks) + per_call, per_call):
      following = dispatch(begin) if begin < len(masks) else None
      assert pending is not None  # None only once the last batch is collected, which ends the loop
      collect(*pending)
      pending = following
      finished = ready + int(np.argmin(np.append(done[ready:], False)))
      if finished > ready:
        yield slice(ready, finished), ScoreOutputs(logprob[ready:finished], is_greedy[ready:finished], lay.num_targets)
        ready = finished

  def score(self, requests: Sequence[ScoringRequest], head_masks: ArrayLike | None = None,
            head_fill: ArrayLike | None = None, progress: Callable[[int], None] | None = None, *,
            neuron_masks: ArrayLike | None = None, neuron_fill: ArrayLike | None = None,
            exact: bool = False) -> ScoreOutputs:
    """Teacher-forced scores of every request under every mask (head masks [M, L, H] and/or neuron masks
    [M, L, F], 1 keep / 0 ablate). `exact`: a mask's scores bit for bit the same whatever masks share its call
    (`score_batches`; every call at the layout's full size)."""
    masks = check_masks(self.shared.model_config, head_masks, neuron_masks)
    logprob = np.zeros((len(masks), len(requests)), np.float32)
    is_greedy = np.zeros((len(masks), len(requests)), bool)
    num_targets = None
    for where, out in self.score_batches(requests, masks.heads, head_fill, neuron_masks=masks.neurons,
                                         neuron_fill=neuron_fill, exact=exact):
      logprob[where], is_greedy[where], num_targets = out.logprob, out.is_greedy, out.num_tokens
      if progress:
        progress(where.stop - where.start)
    return ScoreOutputs(logprob, is_greedy, num_targets)  # type: ignore[arg-type]  # None only for zero masks
