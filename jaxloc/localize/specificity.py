"""Each unit's estimated effect on every task, from what every task measured under the same masks, and the
universal-unit rule over those effects. It estimates; measuring is `validate`'s, deciding `confirm`'s, the selection
rule `selection`'s.

Axes: N heads flattened (flat = layer * H + head); `tasks` = the target first, then the general tasks.

Estimated relative drop of task t when head h is ablated alone: -value_t[h] / |baseline_t|, where value_t is
the plan's estimate from task t's scores under the design (`Plan.estimate`: the Lasso coefficient, or the
measured change of a single-head ablation); NaN where the plan has no estimate for h (a head a confirmation
method never ablated). A task the model cannot do at all (baseline 0) has nothing to lose: its drops are 0.
Drops are fractions (0.6 = 60%).

Universal heads (the paper filters them; the rule is stated in heads.json and the README):
  a head *breaks* a set of tasks when its relative drop is at least `threshold` on at least `min_tasks` of
  them, the target included. Candidates are the heads whose *estimated* drops break the tasks; up to
  `limit` of them, best-ranked on the target first, are ablated alone on documents the design never saw;
  those whose measured drops break the tasks are universal.

Selection (`--selection`) is `selection`'s: a rule object over these effects.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxloc.localize.methods.base import Measured, Plan, Ranking


@dataclasses.dataclass
class Effects:
  """Estimated relative drops of every task under every head's ablation."""

  tasks: list[str]  # the target first
  drops: np.ndarray  # float [tasks, N], NaN where unknown

  @property
  def general(self) -> np.ndarray:
    return self.drops[1:]

  def of(self, head: int) -> dict[str, float | None]:
    return {t: (None if np.isnan(d) else float(d)) for t, d in zip(self.tasks, self.drops[:, head])}


def estimate(plan: Plan, measured: Measured) -> Ranking:
  """`plan.estimate(measured)`; a task whose score never moved under the design has no effect anywhere (the
  Lasso refuses a constant target, which is right for the task localized but not for a general task)."""
  if len(measured) and np.ptp(measured.scores) == 0:
    n = measured.masks.shape[1] * measured.masks.shape[2]
    return Ranking(np.arange(n), np.zeros(n), {"value": "none: the score never changed"})
  return plan.estimate(measured)


def relative_drops(ranking: Ranking, baseline: float) -> np.ndarray:
  """float [N]: -value / |baseline| (0 when the baseline is 0), NaN where the ranking has no estimate."""
  values = np.asarray(ranking.values, np.float64)
  drops = -values / abs(baseline) if baseline != 0 else np.zeros(values.shape)
  if ranking.known is not None:
    drops = np.where(ranking.known, drops, np.nan)
  return drops


# A drop that equals a rule's bound meets it: 3 of 30 correct documents lost is a 10% drop, which floating point
# computes as 0.10000000000000003.
BOUND_TOLERANCE = 1e-9


def breaks(drops: np.ndarray, threshold: float, min_tasks: int) -> np.ndarray:
  """bool [...]: at least `min_tasks` of the last axis's drops are ≥ threshold (NaN counts as no drop)."""
  drops = np.nan_to_num(np.asarray(drops, np.float64), nan=-np.inf)
  return (drops >= threshold - BOUND_TOLERANCE).sum(axis=-1) >= min_tasks


def within(drops: np.ndarray, max_drop: float) -> np.ndarray:
  """bool: the drops are ≤ max_drop (NaN counts as within)."""
  return np.nan_to_num(np.asarray(drops, np.float64), nan=-np.inf) <= max_drop + BOUND_TOLERANCE


def universal_candidates(effects: Effects, order: Sequence[int], excluded: np.ndarray, threshold: float,
                         min_tasks: int, limit: int) -> list[int]:
  """Up to `limit` heads whose estimated drops break the tasks, in the target's ranking order."""
  flagged = breaks(effects.drops.T, threshold, min_tasks)
  return [int(h) for h in order if flagged[h] and not excluded[h]][:limit]


def universal_rule(threshold: float, min_tasks: int) -> str:
  return (f"ablated alone, drops at least {min_tasks} tasks (target included) by ≥ {100 * threshold:.0f}% "
          "(relative): flagged from the design's estimates, confirmed by single-head ablation on held-out documents")
