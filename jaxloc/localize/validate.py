"""After identification: ablate heads on documents and measure every task (held-out documents in a run).

Axes: `k` (0 = unablated, then the first 1, 2, ... heads of an order ablated together), `layers`, `heads`.
An `eval_sets` list holds the target first, then the general tasks; each is measured in its own metric
(`metrics`, the target's localized metric and each general task's default metric).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxloc.heads import head_name
from jaxloc.tasks.evaluation import Evaluator


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


def _scores(eval_sets: Sequence[Evaluator], metrics: Sequence[str], keep: np.ndarray) -> list[np.ndarray]:
  return [np.asarray(s.run(keep)[m], np.float64) for s, m in zip(eval_sets, metrics)]


def single_head_drops(heads: Sequence[int], eval_sets: Sequence[Evaluator], metrics: Sequence[str]
                      ) -> np.ndarray:
  """Relative drop [heads, eval sets] of each set's metric with one head ablated."""
  drops = np.zeros((len(heads), len(eval_sets)))
  if not len(heads):
    return drops
  c = eval_sets[0].engine.config
  keep = np.ones((len(heads) + 1, c.num_layers * c.num_heads), np.float32)
  keep[np.arange(1, len(heads) + 1), np.asarray(heads, np.int64)] = 0
  for j, values in enumerate(_scores(eval_sets, metrics, keep.reshape(-1, c.num_layers, c.num_heads))):
    drops[:, j] = relative_drop(float(values[0]), values[1:])
  return drops


def ablation_curve(order: Sequence[int], k: int, eval_sets: Sequence[Evaluator], metrics: Sequence[str]
                   ) -> dict[str, Any]:
  """Every task's metric and relative drop with the first 0..k heads of `order` ablated together, and the
  largest general drop at each k (the specificity curve when `order` is a selection)."""
  c = eval_sets[0].engine.config
  k = min(k, len(order))
  keep = _cumulative_masks(order, k, c.num_layers, c.num_heads)
  scores = _scores(eval_sets, metrics, keep)
  drops = [relative_drop(float(v[0]), v) for v in scores]
  general = np.array(drops[1:]) if len(drops) > 1 else np.full((1, k + 1), np.nan)
  entry = lambda s, m, v, d: {"metric": m, "num_docs": len(s.docs), "scores": v.tolist(),  # noqa: E731
                              "relative_drop": d.tolist()}
  return {
      "heads": [head_name(*divmod(int(h), c.num_heads)) for h in order[:k]],
      "k": list(range(k + 1)),
      "task": {"name": eval_sets[0].name, **entry(eval_sets[0], metrics[0], scores[0], drops[0])},
      "general": {s.name: entry(s, m, v, d) for s, m, v, d in zip(eval_sets[1:], metrics[1:], scores[1:], drops[1:])},
      "max_general_relative_drop": [None if np.all(np.isnan(col)) else float(np.nanmax(col)) for col in general.T],
  }


def drops_at(curve: dict[str, Any], k: int) -> dict[str, Any]:
  """The `held_out`/`in_sample` record of ablation.json: the drops with the first k heads of a curve ablated."""
  return {"num_docs": curve["task"]["num_docs"], "k": k, "heads": curve["heads"][:k],
          "task_relative_drop": curve["task"]["relative_drop"][k],
          "general_relative_drop": {name: g["relative_drop"][k] for name, g in curve["general"].items()},
          "general_num_docs": {name: g["num_docs"] for name, g in curve["general"].items()}}
