"""After identification: does ablating the top heads destroy the task and spare everything else?

Axes: `k` (0 = unablated, then the top-1, top-2, ... heads ablated together), `layers`, `heads`.

Universal heads are heads whose ablation alone drops *every* general task by at least
`universal_threshold` (relative): they break the model rather than the capability. They are tested
among the top candidates, reported apart, and left out of the top-k (the paper filters them too).
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


def _cumulative_masks(ranking: Sequence[int], top_k: int, num_layers: int, num_heads: int) -> np.ndarray:
  """Keep-masks [k+1, L, H]: row k ablates the first k heads of `ranking`."""
  masks = np.ones((top_k + 1, num_layers * num_heads), np.float32)
  for k in range(1, top_k + 1):
    masks[k:, ranking[k - 1]] = 0
  return masks.reshape(top_k + 1, num_layers, num_heads)


def single_head_drops(candidates: Sequence[int], eval_sets: Sequence[Evaluator]) -> np.ndarray:
  """Relative drop [candidates, eval sets] of each set's default metric with one candidate ablated."""
  c = eval_sets[0].engine.config
  drops = np.zeros((len(candidates), len(eval_sets)))
  if not candidates:
    return drops
  masks = np.ones((len(candidates) + 1, c.num_layers * c.num_heads), np.float32)
  for row, head in enumerate(candidates, start=1):
    masks[row, head] = 0
  masks = masks.reshape(-1, c.num_layers, c.num_heads)
  for j, eval_set in enumerate(eval_sets):
    metric = eval_set.task.default_metric
    values = eval_set.run(masks)[metric]
    drops[:, j] = relative_drop(float(values[0]), values[1:])
  return drops


def find_universal_heads(candidates: Sequence[int], target: Evaluator, general: Sequence[Evaluator],
                         threshold: float) -> tuple[list[int], dict[str, dict[str, float]]]:
  """Candidates whose ablation alone drops every general task by ≥ threshold (relative).

  Returns them and, per candidate, its single-head drop on the target and on every general task.
  """
  c = target.engine.config
  eval_sets = [target, *general]
  drops = single_head_drops(candidates, eval_sets)
  universal = []
  if general:
    universal = [int(h) for h, row in zip(candidates, drops[:, 1:])
                 if np.all(np.nan_to_num(row, nan=0.0) >= threshold)]
  detail = {head_name(*divmod(int(h), c.num_heads)): {s.name: float(d) for s, d in zip(eval_sets, row)}
            for h, row in zip(candidates, drops)}
  return universal, detail


def ablation_curve(ranking: Sequence[int], top_k: int, target: Evaluator, general: Sequence[Evaluator]
                   ) -> dict[str, Any]:
  """Task and general-task metrics with the top-1..k heads ablated (k = 0 is the unablated model)."""
  c = target.engine.config
  masks = _cumulative_masks(ranking, top_k, c.num_layers, c.num_heads)
  task_metrics = target.run(masks)
  result: dict[str, Any] = {
      "heads": [head_name(*divmod(int(h), c.num_heads)) for h in ranking[:top_k]],
      "k": list(range(top_k + 1)),
      "task": {"name": target.name, "default_metric": target.task.default_metric,
               "metrics": {m: np.asarray(v, float).tolist() for m, v in task_metrics.items()},
               "relative_drop": {m: relative_drop(float(v[0]), v).tolist() for m, v in task_metrics.items()}},
      "general": {},
  }
  for eval_set in general:
    metric = eval_set.task.default_metric
    values = eval_set.run(masks)[metric]
    result["general"][eval_set.name] = {"metric": metric, "scores": np.asarray(values, float).tolist(),
                                        "relative_drop": relative_drop(float(values[0]), values).tolist()}
  return result
