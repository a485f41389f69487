"""The paper's baselines: one-shot greedy (ablate each head alone) and iterative greedy (k rounds, each
keeping the head whose ablation, on top of the heads kept so far, hurts most)."""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from jaxloc.localize.methods.base import (Context, FixedDesignPlan, Measured, Method, Ranking, check_prefix, rank_by,
                                          single_head_plan, single_head_ranking)


@dataclasses.dataclass(frozen=True)
class OneShotGreedy(Method):
  """Each head ablated alone; ranked by the score change. With --num_masks below the number of heads, a
  seeded random subset of that many heads (what a smaller budget buys); the rest follow unranked, in
  the subset's random order."""

  name: str = "one_shot_greedy"
  units = ("heads", "neurons")
  listing_order = 10  # listed first (`Method.listing_order`)
  run_settings = types.MappingProxyType({"num_masks": "heads ablated alone (a seeded random subset when fewer than "
                                                      "all)"})
  efficiency_variants = ("",)

  @staticmethod
  def _heads(settings, context: Context) -> tuple[np.ndarray, np.ndarray]:
    """(heads measured, in measuring order; all heads in screen order: measured first, then the rest)."""
    active = context.active_heads()
    if settings.num_masks >= len(active):
      rest = np.flatnonzero(context.excluded)
      return active, np.concatenate([active, rest])
    permutation = np.random.default_rng(settings.seed).permutation(context.num_total)
    chosen = [h for h in permutation if not context.excluded[h]][:settings.num_masks]
    chosen_set = set(chosen)
    return np.asarray(chosen, np.int64), np.asarray(chosen + [h for h in permutation if h not in chosen_set])

  def plan(self, settings, context: Context) -> FixedDesignPlan:
    return single_head_plan(*self._heads(settings, context), context)


@dataclasses.dataclass
class IterativeGreedyPlan:
  """Round r ablates each remaining head on top of the r heads chosen so far and keeps the one whose
  ablation scores lowest (exact ties, frequent once 0/1 accuracy reaches its floor, by the other
  metrics). Its masks are recomputed from the saved scores, never stored separately."""

  context: Context
  rounds: int
  exchangeable_rows: bool = False

  def _round_masks(self, chosen: list[int]) -> tuple[np.ndarray, np.ndarray]:
    c = self.context
    candidates = np.array([h for h in c.active_heads() if h not in chosen], np.int64)
    masks = np.zeros((len(candidates), c.num_total), bool)
    masks[:, chosen] = True
    masks[np.arange(len(candidates)), candidates] = True
    return masks.reshape(-1, c.num_layers, c.num_heads), candidates

  def replay(self, measured: Measured):
    """(chosen heads, per-round (candidates, [metric changes]), masks still to measure or None)."""
    chosen: list[int] = []
    rounds = []
    offset = 0
    for _ in range(self.rounds):
      masks, candidates = self._round_masks(chosen)
      if len(candidates) == 0:
        break
      have = len(measured) - offset
      if have < len(masks):
        check_prefix(measured.masks[offset:], masks)
        return chosen, rounds, masks[max(have, 0):]
      where = slice(offset, offset + len(masks))
      check_prefix(measured.masks[where], masks)
      values = [v[where] for v in measured.changes()]
      chosen.append(int(candidates[rank_by(*values)[0]]))
      rounds.append((candidates, values))
      offset += len(masks)
    return chosen, rounds, None

  def next_masks(self, measured: Measured) -> np.ndarray | None:
    return self.replay(measured)[2]

  def expected_total(self) -> int:
    active = len(self.context.active_heads())
    return sum(max(active - r, 0) for r in range(self.rounds))

  def rank(self, measured: Measured) -> Ranking:
    """Chosen heads first, in the order chosen, each valued by its marginal change when chosen; the others
    by their marginal change in the last round (ties by the other metrics)."""
    chosen, rounds, _ = self.replay(measured)
    n = self.context.num_total
    keys = [np.zeros(n) for _ in measured.metric_order]
    level = [0.0] * len(keys)  # the chosen set's score change so far, per metric
    for round_index, (candidates, values) in enumerate(rounds):
      for key, value, base in zip(keys, values, level):
        free = ~np.isin(candidates, chosen[:round_index])
        key[candidates[free]] = value[free] - base
      best = int(np.flatnonzero(candidates == chosen[round_index])[0])
      level = [v[best] for v in values]
    chosen_set = set(chosen)
    rest = [int(h) for h in rank_by(*keys) if int(h) not in chosen_set]
    return Ranking(np.array(chosen + rest, np.int64), keys[0],
                   {"value": "score change when ablated on top of the heads chosen before", "rounds": len(rounds)})


  def estimate(self, measured: Measured) -> Ranking:
    """Single-head changes from round one (every head ablated alone): later rounds depend on the target's
    choices, so another task's scores (or a resample) are read from round one only."""
    first = len(self._round_masks([])[0])
    return single_head_ranking(measured.rows(slice(0, min(first, len(measured)))),
                               np.arange(self.context.num_total))


@dataclasses.dataclass(frozen=True)
class IterativeGreedy(Method):
  """`greedy`: --top_k rounds of iterative greedy (about top_k × N evaluations)."""

  name: str = "greedy"
  units = ("heads",)
  listing_order = 40
  run_settings = types.MappingProxyType({"top_k": "also its rounds (about top_k × N evaluations)"})
  example_options = types.MappingProxyType({"top_k": 2})

  def plan(self, settings, context: Context) -> IterativeGreedyPlan:
    return IterativeGreedyPlan(context, settings.top_k)


METHODS = (OneShotGreedy(), IterativeGreedy())
