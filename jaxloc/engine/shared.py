"""What the engine's jobs (scoring, generation, attribution) share: the model and its resolved config, one placement,
one memory planner, the caches of request layouts and residual streams, and the stats.

Layouts are cached because a localization scores the same request set many times; residual streams because a batch
of masks that ablates nothing below layer l resumes at l from the unablated model's streams of its request set.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jaxloc.engine import scoring
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.placement import Placement
from jaxloc.engine.planner import GIB, Planner, ScoringBatches, resolve
from jaxloc.engine.requests import ScoringRequest
from jaxloc.errors import UserError
from jaxloc.models.config import ModelConfig
from jaxloc.models.loading import LoadedModel

log = logging.getLogger(__name__)

# Request layouts kept (oldest dropped first): a localization reuses a handful, a trained mask one per step.
MAX_LAYOUTS = 32


@dataclasses.dataclass
class EngineStats:
  """What the engine did, for throughput reports."""

  calls: int = 0
  mask_evaluations: int = 0
  tokens: int = 0  # real tokens computed (shared prefix counted once per mask), padding excluded
  padded_tokens: int = 0
  layer_tokens: int = 0  # scoring: real tokens times the layers computed for them (fewer past a batch's start layer)
  targets: int = 0  # scoring: real continuation tokens scored (the LM head runs at each)
  seconds: float = 0.0


def pad_id_of(model: LoadedModel) -> int:
  """The token that pads rows: the tokenizer's pad token, else its EOS, else the config's pad token, else 0."""
  tok = model.tokenizer
  for candidate in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None),
                    model.config.pad_token_id):
    if candidate is not None:
      return int(candidate)
  return 0


class Layouts:
  """Request sets tokenized, arranged in rows (`scoring.arrange`), cut into chunks (`scoring.layout`, padded with
  `pad_id`) and planned (`Planner.scoring`), kept per (requests, number of masks), oldest dropped first."""

  def __init__(self, model: LoadedModel, config: EngineConfig, planner: Planner, pad_id: int):
    self.model, self.config, self.planner, self.pad_id = model, config, planner, pad_id
    self._kept: dict = {}

  def prepare(self, requests: Sequence[ScoringRequest], num_masks: int) -> tuple[scoring.ScoringLayout,
                                                                                 ScoringBatches]:
    """Tokenizes and lays out a request set for `num_masks` masks (cached: localization scores one set many times)."""
    key = (tuple(requests), num_masks)
    if key in self._kept:
      return self._kept[key]
    if not requests:
      raise UserError("no requests to score")
    c, pack, parallel = self.model.config, self.config.pack, self.planner.data_parallel
    tokenized = scoring.tokenize(self.model.tokenizer, requests, c.max_position_embeddings)
    prefix_len = scoring.shared_prefix_length(tokenized) if self.config.share_prefix else 0
    key_cost = 4 * c.num_heads * c.head_dim * c.num_layers / c.flops_per_token(with_lm_head=False)
    rows, width = scoring.arrange(tokenized, prefix_len, pack, key_cost)
    row_tokens = [sum(len(tokenized.sequences[i]) - prefix_len - 1 for i in row) for row in rows]
    plan = self.planner.scoring(
        num_masks=num_masks, num_requests=len(rows), mean_seq=float(width if pack else np.mean(row_tokens)),
        max_seq=width, context=prefix_len, max_targets=max(int(tokenized.num_targets[row].sum()) for row in rows))
    # Equal chunks: 100 rows at 97 per call would pad the second call to 97 rows for 3.
    num_chunks = -(-len(rows) // plan.requests_per_call)
    rows_per_chunk = -(-len(rows) // num_chunks)
    if plan.masks_per_call % parallel:  # masks cannot be split: split rows instead
      rows_per_chunk = -(-rows_per_chunk // parallel) * parallel
    lay = scoring.layout(tokenized, rows, rows_per_chunk, prefix_len, self.pad_id, width if pack else None)
    log.info("scoring %d requests: shared prefix %d tokens, %d rows (%s), %d chunks of %d rows, %d masks per call, "
             "~%.2f GiB per call", len(requests), prefix_len, len(rows),
             f"packed, {width} wide" if pack else "one request each", len(lay.chunks), rows_per_chunk,
             plan.masks_per_call, plan.estimated_bytes / GIB)
    if len(self._kept) >= MAX_LAYOUTS:
      self._kept.pop(next(iter(self._kept)))
    self._kept[key] = lay, plan
    return lay, plan

  def masks_per_call(self, requests: Sequence[ScoringRequest], num_masks: int) -> int:
    return self.prepare(requests, num_masks)[1].masks_per_call


class ResidualCache:
  """Values with a size in bytes, kept within `capacity` bytes, least recently used dropped first."""

  def __init__(self, capacity: int):
    self.capacity = capacity
    self._kept: dict = {}  # key -> (value, bytes), least recently used first

  def get(self, key):
    """The value kept for `key` (now the most recently used), or None."""
    if key not in self._kept:
      return None
    self._kept[key] = self._kept.pop(key)
    return self._kept[key][0]

  def make_room(self, size: int) -> None:
    """Drops values until `size` more bytes fit: called before computing a new value, so the old ones are freed
    first."""
    while self._kept and sum(b for _, b in self._kept.values()) + size > self.capacity:
      self._kept.pop(next(iter(self._kept)))

  def put(self, key, value, size: int) -> None:
    self._kept[key] = value, size


@dataclasses.dataclass
class Shared:
  """One engine's model, resolved config (`planner.resolve`), placement, planner, caches and stats."""

  model: LoadedModel
  config: EngineConfig
  placement: Placement
  planner: Planner
  pad_id: int
  layouts: Layouts
  residuals: ResidualCache
  stats: EngineStats

  @classmethod
  def build(cls, model: LoadedModel, config: EngineConfig, mesh: Mesh) -> "Shared":
    config = resolve(config, model.dtype)
    placement = Placement.build(model.params, mesh, getattr(jnp, config.activation_dtype))
    planner = Planner.of(config, model.config, placement.data_parallel)
    pad = pad_id_of(model)
    return cls(model, config, placement, planner, pad, Layouts(model, config, planner, pad),
               ResidualCache(planner.residual_cache), EngineStats())

  @property
  def module(self) -> Any:
    return self.model.module

  @property
  def model_config(self) -> ModelConfig:
    return self.model.config
