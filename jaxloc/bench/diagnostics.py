"""How well-defined the efficiency benchmark's ground truth is, how saturated the designs are, and how
additive the top heads are (the `noise_floor` section of a report).

Axes: N = L * H heads flattened; `k` the top-k compared. Takes the sweep's `drive` (run a registered
method on a problem) as an argument, so it measures exactly what the sweep measured, from the cache.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from jaxloc.heads import head_name
from jaxloc.localize.methods.base import rank_by


def top_k_overlap(a: Sequence[int], b: Sequence[int], k: int) -> int:
  return len(set(np.asarray(a[:k]).tolist()) & set(np.asarray(b[:k]).tolist()))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
  ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
  rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
  return float(np.corrcoef(ra, rb)[0, 1])


def _names(problem, heads) -> list[str]:
  return [head_name(*divmod(int(h), problem.num_heads)) for h in heads]


def design_saturation(problem, variants, base, budgets: Sequence[float], seeds: Sequence[int], drive: Callable,
                      floor_fraction: float = 0.1) -> list[dict[str, Any]]:
  """Per (method, ablation rate) of the variants that measure multi-head masks, at their largest budget:
  the scores under those masks and the fraction at the floor (headline score ≤ floor_fraction × baseline):
  saturated masks carry little information about which of their heads did it."""
  out, seen = [], set()
  metric = problem.headline_metric
  for variant in variants:
    fractions = [b for b in budgets if b <= variant.max_budget + 1e-9]
    if not fractions:
      continue
    num_masks = max(2, int(round(max(fractions) * problem.num_total)))
    settings = variant.settings(base, num_masks, seeds[0])
    key = (settings.method, settings.ablation_rate)
    if key in seen:
      continue
    scores = []
    for seed in seeds:
      measured, _ = drive(dataclasses.replace(settings, seed=seed, metric=metric), problem)
      scores.append(measured.scores[measured.flat().sum(axis=1) > 1])
    scores = np.concatenate(scores)
    if not len(scores):
      continue  # single-head methods
    seen.add(key)
    baseline = problem.baseline[metric]
    out.append({"design": settings.method, "ablation_rate": settings.ablation_rate, "masks": int(len(scores)),
                "scores": scores.tolist(), "heads_per_mask": settings.ablation_rate * problem.num_total,
                "mean_score": float(scores.mean()), "baseline": baseline,
                "fraction_at_floor": float(np.mean(scores <= floor_fraction * baseline)) if baseline > 0 else None,
                "floor": floor_fraction * baseline})
  return out


def additivity(problem, truth, k: int) -> dict[str, Any]:
  """Greedy's top-k ablated together vs the sum of their single-head changes (interactions/saturation)."""
  top = truth.top_k(problem.headline_metric, k)
  joint = problem.measure(problem.joint_mask(top))
  return {m: {"joint_change": float(joint[m][0] - problem.baseline[m]),
              "sum_of_single_changes": float(np.sum(truth.change[m][top]))} for m in problem.metric_names}


def context_effects(problem, truth, base, budgets: Sequence[float], seeds: Sequence[int], k: int, drive: Callable
                    ) -> dict[str, Any]:
  """Isolated vs in-context importance. For greedy's top-k and cs_stratified's top-k at the largest budget:
  the change when the head is ablated alone (what greedy ranks by) next to the mean Lasso coefficient over
  seeds (the head's average marginal effect among ~10% other ablated heads, what CS ranks by)."""
  num_masks = max(2, int(round(max(budgets) * problem.num_total)))
  metric = problem.headline_metric
  coefs = [drive(dataclasses.replace(base, method="cs_stratified", num_masks=num_masks, seed=seed, metric=metric),
                 problem)[1].values for seed in seeds]
  coef = np.mean(coefs, axis=0)
  by_coef = rank_by(coef)
  heads = list(dict.fromkeys(truth.top_k(metric, k).tolist() + by_coef[:k].tolist()))
  return {"budget_masks": num_masks, "heads": _names(problem, heads),
          "single_change": truth.change[metric][heads].tolist(), "mean_lasso_coef": coef[heads].tolist(),
          "single_rank": [int(np.flatnonzero(truth.ranking[metric] == h)[0]) + 1 for h in heads],
          "lasso_rank": [int(np.flatnonzero(by_coef == h)[0]) + 1 for h in heads]}


def noise_floor(problem, truth, halves, variants, base, cfg, drive: Callable) -> dict[str, Any]:
  """How reproducible greedy's top-k is on two disjoint halves of the documents (`halves`: their ground
  truths); design saturation; additivity of the top heads; isolated vs in-context effects."""
  k = cfg.top_k
  out: dict[str, Any] = {"split_half_top_k_overlap": {}, "half_vs_full_top_k_overlap": {}, "split_half_spearman": {}}
  for m in problem.metric_names:
    out["split_half_top_k_overlap"][m] = top_k_overlap(halves[0].ranking[m], halves[1].ranking[m], k)
    out["half_vs_full_top_k_overlap"][m] = [top_k_overlap(h.ranking[m], truth.ranking[m], k) for h in halves]
    out["split_half_spearman"][m] = spearman(halves[0].change[m], halves[1].change[m])
  metric = problem.headline_metric
  top = truth.ranking[metric][:20]
  out["top20"] = {"names": _names(problem, top), "full": truth.change[metric][top].tolist(),
                  "half0": halves[0].change[metric][top].tolist(), "half1": halves[1].change[metric][top].tolist()}
  out["design_saturation"] = design_saturation(problem, variants, base, cfg.budgets, cfg.seeds, drive)
  out["additivity"] = additivity(problem, truth, k)
  if any(v.name == "cs_stratified" for v in variants):
    out["context_effects"] = context_effects(problem, truth, base, cfg.budgets, cfg.seeds, k, drive)
  return out
