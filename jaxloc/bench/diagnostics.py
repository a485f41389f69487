"""How well-defined the efficiency benchmark's ground truth is, how saturated the designs are, and how
additive the top heads are (the `noise_floor` section of a report).

Axes: N = L * H heads flattened; `k` the top-k compared. Takes the sweep's `run` (a registered method's settings
on a problem -> measurements, ranking) as an argument, so it measures exactly what the sweep measured, from the
cache.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from jaxloc.units import head_name
from jaxloc.localize.methods.base import Context, rank_by


def top_k_overlap(a: Sequence[int], b: Sequence[int], k: int) -> int:
  return len(set(np.asarray(a[:k]).tolist()) & set(np.asarray(b[:k]).tolist()))


def spearman(a: np.ndarray, b: np.ndarray) -> float:
  ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
  rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
  return float(np.corrcoef(ra, rb)[0, 1])


def _names(problem, heads) -> list[str]:
  return [head_name(*divmod(int(h), problem.num_heads)) for h in heads]


def design_saturation(problem, variants, base, budgets: Sequence[float], seeds: Sequence[int], run: Callable,
                      floor_fraction: float = 0.1) -> list[dict[str, Any]]:
  """Per (method, ablation rate) of the variants with an ablation rate that measure multi-head masks, at their
  largest budget:
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
    rate = settings.flags().get("ablation_rate")
    key = (settings.method, rate)
    if rate is None or key in seen:
      continue
    scores = []
    for seed in seeds:
      measured, _ = run(settings.replace(seed=seed, metric=metric), problem)
      scores.append(measured.scores[measured.flat().sum(axis=1) > 1])
    scores = np.concatenate(scores)
    if not len(scores):
      continue  # single-head methods
    seen.add(key)
    baseline = problem.baseline[metric]
    out.append({"design": settings.method, "ablation_rate": rate, "masks": int(len(scores)),
                "scores": scores.tolist(), "heads_per_mask": rate * problem.num_total,
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


def context_effects(problem, truth, variant, base, budgets: Sequence[float], seeds: Sequence[int], k: int,
                    run: Callable) -> dict[str, Any]:
  """Isolated vs in-context importance. For greedy's top-k and the top-k of `variant` (a random design ranked by a
  Lasso) at the largest budget: the change when the head is ablated alone (what greedy ranks by) next to the mean
  Lasso coefficient over seeds (the head's average marginal effect among ~10% other ablated heads, what compressed
  sensing ranks by)."""
  num_masks = max(2, int(round(max(budgets) * problem.num_total)))
  metric = problem.headline_metric
  coefs = [run(variant.settings(base, num_masks, seed).replace(metric=metric), problem)[1].values
           for seed in seeds]
  coef = np.mean(coefs, axis=0)
  by_coef = rank_by(coef)
  heads = list(dict.fromkeys(truth.top_k(metric, k).tolist() + by_coef[:k].tolist()))
  return {"budget_masks": num_masks, "heads": _names(problem, heads),
          "single_change": truth.change[metric][heads].tolist(), "mean_lasso_coef": coef[heads].tolist(),
          "single_rank": [int(np.flatnonzero(truth.ranking[metric] == h)[0]) + 1 for h in heads],
          "lasso_rank": [int(np.flatnonzero(by_coef == h)[0]) + 1 for h in heads]}


def noise_floor(problem, truth, halves, variants, base, cfg, run: Callable) -> dict[str, Any]:
  """How reproducible greedy's top-k is on two disjoint halves of the documents (`halves`: their ground
  truths); design saturation; additivity of the top heads; isolated vs in-context effects (for the first variant
  at its defaults that ranks a random design by a Lasso, when there is one)."""
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
  out["design_saturation"] = design_saturation(problem, variants, base, cfg.budgets, cfg.seeds, run)
  out["additivity"] = additivity(problem, truth, k)
  lasso = next((v for v in variants if v.name == v.method and _ranks_a_random_design(v, base, problem)), None)
  if lasso is not None:
    out["context_effects"] = context_effects(problem, truth, lasso, base, cfg.budgets, cfg.seeds, k, run)
  return out


def _ranks_a_random_design(variant, base, problem) -> bool:
  """Whether the variant measures a random design (its plan's rows are exchangeable) and ranks it by a Lasso: a
  method with the design settings of compressed sensing (an ablation rate and a Lasso alpha) and such a plan."""
  settings = variant.settings(base, 2, 0)
  if not {"ablation_rate", "lasso_alpha"} <= set(settings.flags()):
    return False  # only such methods are planned here: planning another may train or differentiate
  plan = settings.method_object.plan(settings, Context(problem.num_layers, problem.num_heads,
                                                       np.zeros(problem.num_total, bool)))
  return bool(plan.exchangeable_rows)
