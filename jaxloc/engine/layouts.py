"""Request sets laid out for scoring, and the few compiled shapes they share.

A request set is tokenized, its shared prefix found, its suffixes packed into rows (`scoring_kernels.arrange`) and cut
into chunks of equal size (`scoring_kernels.layout`); a chunk's arrays and the masks per call make its `CallShape`, and
every distinct shape is one more compile of each scoring kernel (the prefix, the chunk, the unablated residual streams).

A run scores many request sets: every task's identification documents and its held-out ones, subsets of them for
gradients and learned masks, in any mix of tasks. Left to itself each would get a shape of its own. Two rules keep
the count to a handful per run:

  * the masks of every call of a shape pad to one number (the planner's, `Planner.scoring`; the scorer may add one
    smaller size where a full call costs several compiles, `scorer.call_size`), whatever the caller
    asks for: a baseline, a validation curve or a single-head check costs at most one full call, never a compile;
  * a request set takes a shape already laid out when it fits there (prefix no longer than its own, suffixes no
    wider than the rows, as many slots and targets) at most ADOPT_SLACK more compute than its own shape, whose
    sizes round up to short ladders (`batching`), so that near-equal request sets land on the same one; a set the
    caller scores in a few calls only (held-out documents: validation and single-head checks) takes one at up to
    ADOPT_SLACK_FEW_CALLS more, since padding a few calls costs less than a compile.

Axes: `masks` Mb, `requests` (token rows) Rb, `seq` S, `context` P, `targets` T, `slots` N (as in `scoring_kernels.py`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import numpy as np

from jaxloc.engine import scoring_kernels
from jaxloc.engine.batching import bucket, bucket_count, bucket_pow2
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.planner import GIB, Planner, ScoringBatches
from jaxloc.engine.requests import ScoringRequest
from jaxloc.errors import UserError
from jaxloc.models.loading import LoadedModel

log = logging.getLogger(__name__)

# Request layouts kept (oldest dropped first): a localization reuses a handful, a trained mask one per step.
MAX_LAYOUTS = 32
# A request set takes a shape already compiled when that computes at most this fraction more than its own shape: on
# a CPU a compile of the default model costs about two full calls, on an accelerator at 8B tens of seconds.
ADOPT_SLACK = 0.25
# The same for a request set scored in a few calls (`prepare(few_calls=True)`): a task's held-out documents, fewer
# than its identification ones, would otherwise get a smaller shape of their own, compiled for a handful of calls.
ADOPT_SLACK_FEW_CALLS = 3.0


@dataclasses.dataclass(frozen=True)
class CallShape:
  """The compiled shape of one scoring call: `masks` keep-masks over a chunk of `rows` token rows `width` wide after
  a shared prefix of `prefix` tokens, scoring at most `targets` continuation tokens of `slots` requests."""

  prefix: int
  rows: int
  width: int
  targets: int
  slots: int
  masks: int
  estimated_bytes: int = dataclasses.field(compare=False)


class Layouts:
  """Request sets tokenized, arranged in rows (`scoring_kernels.arrange`), cut into chunks (`scoring_kernels.layout`,
  padded with `pad_id`) and given a call shape (module docstring), kept per request set, oldest dropped first; `shapes`
  are the packed shapes laid out so far, in order."""

  def __init__(self, model: LoadedModel, config: EngineConfig, planner: Planner, pad_id: int):
    self.model, self.config, self.planner, self.pad_id = model, config, planner, pad_id
    c = model.config
    flops = c.flops_per_token(with_lm_head=False)
    self._key_cost = 4 * c.num_heads * c.head_dim * c.num_layers / flops  # a key's cost relative to a token's
    self._target_cost = 2 * c.hidden_size * c.vocab_size / flops  # the LM head at one target, likewise
    self._kept: dict = {}
    self._pinned: dict = {}  # request sets whose layout is kept for good (`prepare(pin=True)`)
    self.shapes: list[CallShape] = []

  def prepare(self, requests: Sequence[ScoringRequest], few_calls: bool = False, pin: bool = False
              ) -> tuple[scoring_kernels.ScoringLayout, ScoringBatches]:
    """Tokenizes and lays out a request set (cached: localization scores one set many times); `few_calls`: the
    caller will score it in a few calls only, so it may pad into a larger shape laid out before (module
    docstring). The first call's layout is kept (the MAX_LAYOUTS most recent sets'); with `pin`, for good, so that a
    request set a run measures keeps one layout, and its scores one rounding, however many sets come after it."""
    key = tuple(requests)
    if key in self._pinned:
      return self._pinned[key]
    if key in self._kept:
      if pin:
        self._pinned[key] = self._kept.pop(key)
        return self._pinned[key]
      return self._kept[key]
    if not requests:
      raise UserError("no requests to score")
    c = self.model.config
    tokenized = scoring_kernels.tokenize(self.model.tokenizer, requests, c.max_position_embeddings)
    prefix_len = scoring_kernels.shared_prefix_length(tokenized) if self.config.share_prefix else 0
    if self.config.pack:
      lay, shape, taken = self._packed(tokenized, prefix_len, ADOPT_SLACK_FEW_CALLS if few_calls else ADOPT_SLACK)
      plan = ScoringBatches(shape.masks, shape.rows, shape.estimated_bytes)
      how = f"packed, {shape.width} wide" + (", a shape laid out before" if taken else "")
    else:
      lay, plan = self._unpacked(tokenized, prefix_len)
      how = "one request each"
    log.info("scoring %d requests: shared prefix %d tokens, %d chunks of %d rows (%s), %d masks per call, ~%.2f GiB "
             "per call", len(requests), len(lay.prefix), len(lay.chunks), plan.requests_per_call, how,
             plan.masks_per_call, plan.estimated_bytes / GIB)
    if pin:
      self._pinned[key] = lay, plan
      return lay, plan
    if len(self._kept) >= MAX_LAYOUTS:
      self._kept.pop(next(iter(self._kept)))
    self._kept[key] = lay, plan
    return lay, plan

  def masks_per_call(self, requests: Sequence[ScoringRequest]) -> int:
    return self.prepare(requests)[1].masks_per_call

  def _cost(self, shape: CallShape, chunks: int) -> float:
    """Compute per mask, in token equivalents: every padded row token (attending its row and the prefix), the
    prefix, the LM head at every padded target."""
    tokens = shape.rows * shape.width * (1 + self._key_cost * (shape.width + shape.prefix))
    return chunks * (tokens + shape.targets * self._target_cost) + shape.prefix * (1 + self._key_cost * shape.prefix)

  def _packed(self, tokenized: scoring_kernels.TokenizedRequests, prefix_len: int, slack: float
              ) -> tuple[scoring_kernels.ScoringLayout, CallShape, bool]:
    """The layout in the cheapest shape laid out before that costs at most `slack` more than the request set's
    own shape, else in its own (then remembered); and whether the shape was taken from before."""
    own, own_rows = self._own_shape(tokenized, prefix_len)
    own_cost = self._cost(own, -(-len(own_rows) // own.rows))
    best = None
    for shape in self.shapes:
      rows = self._fit(tokenized, prefix_len, shape)
      if rows is not None:
        cost = self._cost(shape, -(-len(rows) // shape.rows))
        if cost <= (1 + slack) * own_cost and (best is None or cost < best[0]):
          best = cost, shape, rows
    taken = best is not None and best[1] != own
    shape, rows = (best[1], best[2]) if best is not None else (own, own_rows)
    if shape not in self.shapes:
      self.shapes.append(shape)
    lay = scoring_kernels.layout(tokenized, rows, shape.rows, shape.prefix, self.pad_id, shape.width, slots=shape.slots,
                         targets=shape.targets)
    return lay, shape, taken

  def _own_shape(self, tokenized: scoring_kernels.TokenizedRequests, prefix_len: int
                 ) -> tuple[CallShape, list[list[int]]]:
    """The request set's own shape and rows: packed at the width that computes least (`scoring_kernels.arrange`), in
    equal chunks of as many rows as the planner allows (rounded up to `bucket_count`), slots and targets bucketed."""
    rows, width = scoring_kernels.arrange(tokenized, prefix_len, True, self._key_cost)
    row_targets = max(int(tokenized.num_targets[row].sum()) for row in rows)

    def plan(num_rows: int) -> ScoringBatches:
      return self.planner.scoring(num_requests=num_rows, mean_seq=float(width), max_seq=width, context=prefix_len,
                                  max_targets=row_targets)

    per_chunk = bucket_count(len(rows))
    batches = plan(per_chunk)
    if batches.requests_per_call < per_chunk:
      # Equal chunks: 100 rows at 97 per call would pad the second call to 97 rows for 3.
      chunks = -(-len(rows) // batches.requests_per_call)
      per_chunk = min(bucket_count(-(-len(rows) // chunks)), batches.requests_per_call)
      batches = plan(per_chunk)
    slots, targets = scoring_kernels.chunk_sizes(tokenized, rows, per_chunk)
    return CallShape(prefix_len, per_chunk, width, bucket(targets), bucket(slots), batches.masks_per_call,
                     batches.estimated_bytes), rows

  def _fit(self, tokenized: scoring_kernels.TokenizedRequests, prefix_len: int,
           shape: CallShape) -> list[list[int]] | None:
    """The request set's rows in `shape` (first fit at its width, after its prefix), or None where they do not fit:
    a longer prefix than the set shares, a suffix wider than the rows, a chunk with more slots or targets, or
    targets per row that would take the call over the memory budget."""
    if shape.prefix > prefix_len:
      return None
    lengths = np.array([len(s) - shape.prefix - 1 for s in tokenized.sequences])
    if lengths.max() > shape.width:
      return None
    rows = scoring_kernels.first_fit(lengths, shape.width)
    slots, targets = scoring_kernels.chunk_sizes(tokenized, rows, shape.rows)
    if slots > shape.slots or targets > shape.targets:
      return None
    row_targets = max(int(tokenized.num_targets[row].sum()) for row in rows)
    needed = self.planner.activation_bytes(shape.masks, shape.rows, shape.width, shape.prefix, bucket_pow2(row_targets))
    return rows if needed <= self.planner.call_budget else None

  def _unpacked(self, tokenized: scoring_kernels.TokenizedRequests, prefix_len: int
                ) -> tuple[scoring_kernels.ScoringLayout, ScoringBatches]:
    """One request per row, shortest first, in equal chunks each as wide as its longest row (bucketed)."""
    rows, width = scoring_kernels.arrange(tokenized, prefix_len, False)
    row_tokens = [len(tokenized.sequences[row[0]]) - prefix_len - 1 for row in rows]
    plan = self.planner.scoring(num_requests=len(rows), mean_seq=float(np.mean(row_tokens)), max_seq=width,
                                context=prefix_len, max_targets=int(tokenized.num_targets.max()))
    chunks = -(-len(rows) // plan.requests_per_call)
    per_chunk = -(-len(rows) // chunks)
    return scoring_kernels.layout(tokenized, rows, per_chunk, prefix_len, self.pad_id), plan
