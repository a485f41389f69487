"""After identification: ablate heads on documents and measure every task (held-out documents in a run).

Axes: `k` (0 = unablated, then the first 1, 2, ... heads of an order ablated together), `layers`, `heads`.
An `eval_sets` list holds the target first, then the general tasks; each is measured in its own metric
(`metrics`, the target's localized metric and each general task's default metric).

Every relative drop of an ablation curve comes with a 95% interval from a paired bootstrap over the documents
(the same resampled documents scored unablated and ablated; `INTERVAL_RESAMPLES`, no model evaluations):
100 documents of a task the model gets half right move a relative drop by several percent.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxloc.heads import head_name
from jaxloc.tasks.evaluation import Evaluator

INTERVAL_RESAMPLES = 1000


def relative_drop(baseline: float, values: np.ndarray) -> np.ndarray:
  """(baseline - value) / |baseline|; NaN where the baseline is 0."""
  values = np.asarray(values, np.float64)
  if baseline == 0:
    return np.full(values.shape, np.nan)
  return (baseline - values) / abs(baseline)


def _cumulative_masks(order: Sequence[int], k: int, num_layers: int, num_heads: int) -> np.ndarray:
  """Keep-masks [k+1, L, H]: row j ablates the first j heads of `order`."""
  masks = np.ones((k + 1, num_layers * num_heads), np.float32)
  for j in range(1, k + 1):
    masks[j:, order[j - 1]] = 0
  return masks.reshape(k + 1, num_layers, num_heads)


class Scorer:
  """The tasks of a validation on one document split, each scored in its metric, every distinct keep-mask
  evaluated once: the unablated model, a head that is both checked alone and first in a curve, and the prefix
  two curves share are measured one time however many reports use them."""

  def __init__(self, eval_sets: Sequence[Evaluator], metrics: Sequence[str]):
    self.eval_sets, self.metrics = list(eval_sets), list(metrics)
    self._cache: list[dict[bytes, np.ndarray]] = [{} for _ in self.eval_sets]  # mask bytes -> float [docs]
    c = self.eval_sets[0].engine.config
    self.num_layers, self.num_heads = c.num_layers, c.num_heads

  def per_doc(self, keep: np.ndarray) -> list[np.ndarray]:
    """Per eval set, float [masks, docs] of its metric under each keep-mask [masks, L, H]."""
    keep = np.asarray(keep, np.float32)
    keys = [row.tobytes() for row in keep]
    for eval_set, metric, cache in zip(self.eval_sets, self.metrics, self._cache):
      first: dict[bytes, int] = {}
      for i, key in enumerate(keys):
        first.setdefault(key, i)
      todo = [i for key, i in first.items() if key not in cache]
      if todo:
        values = np.asarray(eval_set.run(keep[todo], per_doc=True)[metric], np.float64)
        cache.update(zip((keys[i] for i in todo), values))
    return [np.stack([cache[key] for key in keys]) for cache in self._cache]


def drop_interval(per_doc: np.ndarray, seed: int = 0) -> np.ndarray:
  """float [k+1, 2]: 2.5th and 97.5th percentiles of the relative drop of each row against row 0 of
  per_doc [k+1, docs], over paired resamples of the documents (NaN where a resample's baseline is 0)."""
  rng = np.random.default_rng(seed)
  docs = per_doc.shape[1]
  means = per_doc[:, rng.integers(0, docs, (INTERVAL_RESAMPLES, docs))].mean(axis=2)  # [k+1, resamples]
  with np.errstate(invalid="ignore", divide="ignore"):
    drops = (means[:1] - means) / np.abs(means[:1])
  return np.nanpercentile(drops, [2.5, 97.5], axis=1).T


def single_head_drops(heads: Sequence[int], scorer: Scorer) -> np.ndarray:
  """Relative drop [heads, eval sets] of each set's metric with one head ablated."""
  drops = np.zeros((len(heads), len(scorer.eval_sets)))
  if not len(heads):
    return drops
  keep = np.ones((len(heads) + 1, scorer.num_layers * scorer.num_heads), np.float32)
  keep[np.arange(1, len(heads) + 1), np.asarray(heads, np.int64)] = 0
  for j, values in enumerate(scorer.per_doc(keep.reshape(-1, scorer.num_layers, scorer.num_heads))):
    means = values.mean(axis=1)
    drops[:, j] = relative_drop(float(means[0]), means[1:])
  return drops


def ablation_curve(order: Sequence[int], k: int, scorer: Scorer) -> dict[str, Any]:
  """Every task's metric and relative drop (with its 95% interval) with the first 0..k heads of `order`
  ablated together, and the largest general drop at each k (the specificity curve when `order` is a
  selection)."""
  eval_sets, metrics = scorer.eval_sets, scorer.metrics
  k = min(k, len(order))
  per_doc = scorer.per_doc(_cumulative_masks(order, k, scorer.num_layers, scorer.num_heads))

  def entry(eval_set, metric, values):
    scores = values.mean(axis=1)
    interval = np.full((k + 1, 2), np.nan) if scores[0] == 0 else drop_interval(values)
    return {"metric": metric, "num_docs": len(eval_set.docs), "scores": scores.tolist(),
            "relative_drop": relative_drop(float(scores[0]), scores).tolist(),
            "relative_drop_interval": [[None if np.isnan(x) else float(x) for x in row] for row in interval]}

  entries = [entry(s, m, v) for s, m, v in zip(eval_sets, metrics, per_doc)]
  general = np.array([e["relative_drop"] for e in entries[1:]], float).reshape(-1, k + 1)
  return {
      "heads": [head_name(*divmod(int(h), scorer.num_heads)) for h in order[:k]],
      "k": list(range(k + 1)),
      "task": {"name": eval_sets[0].name, **entries[0]},
      "general": {s.name: e for s, e in zip(eval_sets[1:], entries[1:])},
      "max_general_relative_drop": [None if np.all(np.isnan(col)) else float(np.nanmax(col)) for col in general.T],
  }


def drops_at(curve: dict[str, Any], k: int) -> dict[str, Any]:
  """The `held_out`/`in_sample` record of ablation.json: the drops with the first k heads of a curve ablated."""
  return {"num_docs": curve["task"]["num_docs"], "k": k, "heads": curve["heads"][:k],
          "task_relative_drop": curve["task"]["relative_drop"][k],
          "task_relative_drop_interval": curve["task"]["relative_drop_interval"][k],
          "general_relative_drop": {name: g["relative_drop"][k] for name, g in curve["general"].items()},
          "general_relative_drop_interval": {name: g["relative_drop_interval"][k]
                                             for name, g in curve["general"].items()},
          "general_num_docs": {name: g["num_docs"] for name, g in curve["general"].items()}}
