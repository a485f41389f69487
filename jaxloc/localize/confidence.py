"""Per-head confidence without another model evaluation: a bootstrap over what was already measured.

Each resample draws every task's documents with replacement (per-document metrics are kept in the
measurements) and, when the plan's masks are i.i.d. draws of a random design (`Plan.exchangeable_rows`), the
masks too (the same rows for every task, since they were measured under the same masks). It re-estimates
every task's effects (`Plan.estimate`), re-runs the run's selection (the universal heads stay those the run
confirmed) and records which heads it selects in the top-k and the target value of every head.

Reported per head: `selection_frequency` (fraction of resamples selecting it in the top-k) and `interval`
(the 2.5th and 97.5th percentiles of its value: Lasso coefficient or measured change).

Axes: `resamples` B, N heads flattened.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
from tqdm import tqdm

from jaxloc.localize.methods.base import Measured, Plan, Ranking
from jaxloc.localize.specificity import estimate


@dataclasses.dataclass
class Confidence:
  selection_frequency: np.ndarray  # float [N]
  low: np.ndarray  # float [N]
  high: np.ndarray  # float [N]
  resamples: int
  resampled: str  # what each resample draws

  def facts(self) -> dict:
    return {"resamples": self.resamples, "resampled": self.resampled,
            "selection_frequency": "fraction of resamples whose top-k selection holds the head",
            "interval": "2.5th-97.5th percentile of the head's value over the resamples"}


def bootstrap(plans: Sequence[Plan], measured: Sequence[Measured], select: Callable[[list[Ranking]], list[int]],
              top_k: int, resamples: int, seed: int, progress: bool = False) -> Confidence | None:
  """Resamples the measurements of every task (target first; `plans[t]` estimates task t) and counts which
  heads `select(rankings)` puts in the top-k. None when there is nothing to resample."""
  if resamples <= 0 or not len(measured[0]):
    return None
  rng = np.random.default_rng([seed, 11])
  rows_too = bool(plans[0].exchangeable_rows)
  docs_too = all(m.doc_metrics is not None for m in measured)
  if not (rows_too or docs_too):
    return None
  num_heads = measured[0].masks.shape[1] * measured[0].masks.shape[2]
  counts = np.zeros(num_heads)
  values = np.zeros((resamples, num_heads))
  for b in tqdm(range(resamples), desc="bootstrap", unit="resample", disable=not progress, dynamic_ncols=True):
    rows = rng.integers(0, len(measured[0]), len(measured[0])) if rows_too else None
    rankings = []
    for plan, task in zip(plans, measured):
      resampled = task.rows(rows) if rows is not None else task
      if docs_too:
        resampled = resampled.resample_docs(rng.integers(0, task.num_docs, task.num_docs))
      rankings.append(estimate(plan, resampled))
    counts[select(rankings)[:top_k]] += 1
    values[b] = rankings[0].values
  low, high = np.percentile(values, [2.5, 97.5], axis=0)
  what = " and ".join(w for w, on in (("documents", docs_too), ("masks", rows_too)) if on)
  return Confidence(counts / resamples, low, high, resamples, what)
