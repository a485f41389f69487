"""Measurement efficiency: how many model evaluations each localization method spends to find the heads
that one-shot greedy finds with one evaluation per head.

Axes: `masks` M, `layers` L, `heads` H, N = L * H heads flattened row-major (flat = layer * H + head);
`budgets` (fractions of N evaluations), `seeds` (design seeds), `k` (the top-k heads compared).

Ground truth: one-shot greedy's full ranking (every head ablated alone, ranked by the score change,
most negative first), for every metric the task reports, from the same N + 1 evaluations. A ranking by
one metric breaks its ties by the others (0/1 accuracy over 100 documents ties often; the summed
log-probability almost never). `headline_metric` is the one the recall figures use.

Methods are named by tokens joined with '-' (`parse_method`):
  cs_stratified, cs_bernoulli   the paper: a nested design of B masks at `ablation_rate` (token r0.05),
                                Lasso with the alpha by 5-fold CV, heads ranked by coefficient;
    tokens: accuracy|logprob (metric solved; default the headline), nonpositive (coefficients ≤ 0),
            stability (rank by stability-selection frequency, coefficient as tie-break),
            r<rate> (ablation rate, default 0.1), upto<fraction> (largest budget run, for cost).
  two_stage                     screen: the CS method on s<fraction> of the budget (default 0.5);
                                confirm: ablate the top B - screen heads alone; rank them by the
                                confirmed change (then the rest in screen order). Takes the CS tokens.
  gradient                      rank by the mask gradient (one backward pass; its cost is measured in
                                mask evaluations); budget-free, reported at its own cost.
  gradient_confirm              confirm the gradient's top floor(B - cost) heads by single ablation.
  one_shot_greedy               greedy on a random subset of B heads (the baseline a budget buys).
Every method sees the task only through `Problem.measure` (cached masks, see mask_cache.py); its
`evaluations` are what it would spend alone (nominal), whatever the cache served.

For each (method, budget, seed): recall of the ground-truth top-k (the fraction of greedy's top-k heads
among the method's top-k), for the headline metric and the others; and the task score change from
ablating the method's top-k together (one more cached evaluation), next to greedy's top-k change.
Synthetic mode runs the same sweep on `SyntheticResponse` (no model; recall also against the planted
truth). `noise_floor` measures how well-defined the ground truth is (disjoint halves of the documents),
how saturated the designs are and how additive the top heads are.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import re
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxloc.bench.mask_cache import MaskCache, task_evaluator
from jaxloc.errors import UserError
from jaxloc.heads import head_name
from jaxloc.localize import designs, methods, solver
from jaxloc.localize.methods import lexicographic_ranking
from jaxloc.localize.synthetic import SyntheticResponse

log = logging.getLogger(__name__)

FAMILIES = ("cs_stratified", "cs_bernoulli", "two_stage", "gradient", "gradient_confirm", "one_shot_greedy")
DEFAULT_BUDGETS = (0.1, 0.25, 0.5, 1.0)
DEFAULT_SEEDS = (0, 1, 2, 3, 4)


# ------------------------------------------------------------------------------------------------
# Methods.


@dataclasses.dataclass(frozen=True)
class MethodSpec:
  """A localization method and its options (see the module docstring for the name tokens)."""

  name: str
  family: str
  metric: str | None = None  # None: the headline metric
  ablation_rate: float = 0.1
  nonpositive: bool = False
  stability: bool = False
  screen_fraction: float = 0.5
  max_budget: float = 1.0

  @property
  def design(self) -> str:
    return "bernoulli" if self.family == "cs_bernoulli" else "stratified"

  @property
  def uses_design(self) -> bool:
    return self.family in ("cs_stratified", "cs_bernoulli", "two_stage")

  @property
  def uses_gradient(self) -> bool:
    return self.family in ("gradient", "gradient_confirm")


def parse_method(name: str) -> MethodSpec:
  """`cs_stratified-logprob-r0.05-nonpositive` -> MethodSpec; UserError naming a bad token."""
  family, *tokens = name.strip().split("-")
  if family not in FAMILIES:
    raise UserError(f"unknown method {name!r}: it must start with one of {', '.join(FAMILIES)}")
  options: dict[str, Any] = {}
  for token in tokens:
    number = re.fullmatch(r"(r|s|upto)(\d*\.?\d+)", token)
    if token in ("accuracy", "logprob", "acc", "acc_norm", "exact_match"):
      options["metric"] = token
    elif token == "nonpositive":
      options["nonpositive"] = True
    elif token == "stability":
      options["stability"] = True
    elif number:
      value = float(number.group(2))
      key = {"r": "ablation_rate", "s": "screen_fraction", "upto": "max_budget"}[number.group(1)]
      if not 0 < value <= 1 or (key == "ablation_rate" and value >= 1):
        raise UserError(f"method {name!r}: {token!r} must be a fraction in (0, 1)")
      options[key] = value
    else:
      raise UserError(f"method {name!r}: unknown token {token!r}; tokens are accuracy, logprob, nonpositive, "
                      "stability, r<ablation rate>, s<screen fraction>, upto<largest budget fraction>")
  spec = MethodSpec(name=name.strip(), family=family, **options)
  if (spec.nonpositive or spec.stability or "ablation_rate" in options) and not spec.uses_design:
    raise UserError(f"method {name!r}: design/solver tokens apply to cs_* and two_stage only")
  return spec


@dataclasses.dataclass
class Problem:
  """What a method sees of a (model, task) or a simulation.

  measure:        bool [M, L, H] -> {metric: float [M]} (through a MaskCache).
  baseline:       {metric: score with nothing ablated}.
  metric_names:   every metric measure() reports; headline_metric first.
  gradient:       float [N] first-order score change of ablating each head (-d score / d keep), or None.
  gradient_cost:  the gradient pass in mask evaluations (measured), or None.
  """

  name: str
  num_layers: int
  num_heads: int
  measure: Callable[[np.ndarray], dict[str, np.ndarray]]
  baseline: dict[str, float]
  metric_names: list[str]
  gradient: np.ndarray | None = None
  gradient_cost: float | None = None

  @property
  def num_total(self) -> int:
    return self.num_layers * self.num_heads

  @property
  def headline_metric(self) -> str:
    return self.metric_names[0]

  def single_head_masks(self, heads: Sequence[int]) -> np.ndarray:
    return methods.single_head_masks(heads, self.num_layers, self.num_heads)

  def joint_mask(self, heads: Sequence[int]) -> np.ndarray:
    mask = np.zeros(self.num_total, bool)
    mask[np.asarray(heads, np.int64)] = True
    return mask.reshape(1, self.num_layers, self.num_heads)


@dataclasses.dataclass
class MethodRun:
  ranking: np.ndarray  # int [N], most important first
  evaluations: float   # nominal cost in mask evaluations
  info: dict[str, Any] = dataclasses.field(default_factory=dict)


def budget_masks(fraction: float, num_total: int) -> int:
  return max(2, int(round(fraction * num_total)))


def design_for(spec: MethodSpec, problem: Problem, num_masks: int, seed: int) -> np.ndarray:
  return designs.make_design(spec.design, problem.num_layers, problem.num_heads, num_masks=num_masks,
                             ablation_rate=spec.ablation_rate, seed=seed)


def marginal_effects(X: np.ndarray, y: np.ndarray) -> np.ndarray:
  """[N] mean score of the masks that ablate a head minus the mean of those that do not (0 if never
  or always ablated): the one-variable view of the design, used to order heads the Lasso leaves at 0."""
  X = X.astype(np.float64)
  ablated = X.sum(axis=0)
  kept = len(X) - ablated
  with np.errstate(invalid="ignore", divide="ignore"):
    effect = (y @ X) / ablated - (y @ (1 - X)) / kept
  return np.where((ablated > 0) & (kept > 0), effect, 0.0)


# The CV grid: 30 alphas from alpha_max down to alpha_max / 100. The CV choice lies near alpha_max / 15 to
# alpha_max / 40 on these problems; solver.lasso_cv's default grid (100 alphas down to alpha_max / 1000)
# spends most of its time in the near-interpolating tail (44 s vs 0.8 s at 512 masks x 512 heads) and
# picks the same alpha to within the grid spacing. A choice at the grid's end is recorded in the info.
CV_NUM_ALPHAS = 30
CV_EPS = 1e-2


def cs_ranking(X: np.ndarray, y: np.ndarray, *, nonpositive: bool, stability: bool, seed: int
               ) -> tuple[np.ndarray, dict[str, Any]]:
  """Heads ranked from a design X [M, N] (1 = ablated) and scores y [M] by the CV Lasso (standardized
  scores, as the paper's code); heads the Lasso zeroes follow, ordered by their marginal effect."""
  X = np.asarray(X, np.float32)
  y = np.asarray(y, np.float32)
  marginal = marginal_effects(X, y)
  if np.ptp(y) == 0:
    return lexicographic_ranking(marginal), {"constant_scores": True}
  folds = min(5, len(y))
  cv = solver.lasso_cv(X, y, num_folds=folds, seed=seed, standardize=True, nonpositive=nonpositive,
                       num_alphas=CV_NUM_ALPHAS, eps=CV_EPS)
  coef = np.asarray(cv.fit.coef, np.float64)
  info: dict[str, Any] = {"lasso_alpha": float(cv.fit.alpha), "nonzero": int(np.count_nonzero(coef)),
                          "alpha_at_grid_end": int(cv.best_index) == CV_NUM_ALPHAS - 1}
  if not stability:
    return lexicographic_ranking(coef, marginal), info
  # Meinshausen-Buhlmann over half-subsamples at the CV alpha and half of it (the frequency is the max
  # over the two): a confidence per head, ranked first by it.
  result = solver.stability_selection(X, y, float(cv.fit.alpha) * np.array([1.0, 0.5]), num_subsamples=50,
                                      standardize=True, nonpositive=nonpositive, seed=seed)
  info.update(stability_frequency=result.frequency, mean_selected=result.mean_selected,
              false_selection_bound_at_0_8=result.false_selection_bound(0.8))
  return lexicographic_ranking(-result.frequency, coef, marginal), info


def _metric_order(problem: Problem, metric: str | None) -> list[str]:
  metric = metric or problem.headline_metric
  if metric not in problem.metric_names:
    raise UserError(f"metric {metric!r} is not reported by {problem.name}; it has {', '.join(problem.metric_names)}")
  return [metric] + [m for m in problem.metric_names if m != metric]


def _confirmed_ranking(problem: Problem, candidates: Sequence[int], metric_order: Sequence[str],
                       fallback: Sequence[int]) -> np.ndarray:
  """Ablates each candidate alone and ranks them by the change (first metric, ties by the rest)."""
  values = problem.measure(problem.single_head_masks(candidates))
  return methods.confirm_ranking(candidates, [values[m] - problem.baseline[m] for m in metric_order], fallback)


def run_method(spec: MethodSpec, problem: Problem, num_masks: int, seed: int) -> MethodRun | None:
  """One method at a budget of `num_masks` evaluations; None when the budget cannot run it."""
  n = problem.num_total
  order = _metric_order(problem, spec.metric)
  if spec.family in ("cs_stratified", "cs_bernoulli"):
    design = design_for(spec, problem, num_masks, seed)
    y = problem.measure(design)[order[0]]
    ranking, info = cs_ranking(design.reshape(num_masks, n), y, nonpositive=spec.nonpositive,
                               stability=spec.stability, seed=seed)
    return MethodRun(ranking, num_masks, info)
  if spec.family == "two_stage":
    screen = max(2, int(round(spec.screen_fraction * num_masks)))
    confirm = num_masks - screen
    if confirm < 1:
      return None
    design = design_for(spec, problem, screen, seed)
    y = problem.measure(design)[order[0]]
    screened, info = cs_ranking(design.reshape(screen, n), y, nonpositive=spec.nonpositive,
                                stability=spec.stability, seed=seed)
    ranking = _confirmed_ranking(problem, screened[:confirm], order, screened)
    info.update(screen_masks=screen, confirmed_heads=int(confirm))
    return MethodRun(ranking, num_masks, info)
  if spec.family in ("gradient", "gradient_confirm"):
    if problem.gradient is None:
      return None
    by_gradient = lexicographic_ranking(problem.gradient)
    cost = float(problem.gradient_cost)
    if spec.family == "gradient":
      return MethodRun(by_gradient, cost)
    confirm = int(math.floor(num_masks - cost))
    if confirm < 1:
      return None
    # The same candidates as `experiments.localize --method=gradient_confirm --num_masks=confirm`.
    source = methods.gradient_confirm_source(problem.gradient, problem.num_layers, problem.num_heads, confirm,
                                             np.zeros(n, bool))
    ranking = _confirmed_ranking(problem, source.candidates, order, by_gradient)
    return MethodRun(ranking, cost + confirm, {"confirmed_heads": confirm})
  if spec.family == "one_shot_greedy":
    subset = np.random.default_rng(seed).permutation(n)
    candidates = subset[:min(num_masks, n)]
    ranking = _confirmed_ranking(problem, candidates, order, subset)
    return MethodRun(ranking, len(candidates))
  raise AssertionError(spec.family)


def prefetch(specs: Sequence[MethodSpec], problem: Problem, budgets: Sequence[float], seeds: Sequence[int]) -> None:
  """Measures each design's largest prefix in one call: the engine then batches full mask batches
  instead of padding a partial batch at every budget."""
  wanted: dict[tuple, int] = {}
  for spec in specs:
    if spec.uses_design:
      largest = max((budget_masks(b, problem.num_total) for b in budgets if b <= spec.max_budget + 1e-9),
                    default=0)
      for seed in seeds:
        key = (spec.design, spec.ablation_rate, seed)
        wanted[key] = max(wanted.get(key, 0), largest)
  for (kind, rate, seed), num_masks in sorted(wanted.items()):
    if num_masks >= 2:
      problem.measure(designs.make_design(kind, problem.num_layers, problem.num_heads, num_masks=num_masks,
                                          ablation_rate=rate, seed=seed))


# ------------------------------------------------------------------------------------------------
# Ground truth and scoring.


@dataclasses.dataclass
class GroundTruth:
  """One-shot greedy on every head: change [metric] -> float [N]; ranking [metric] -> int [N]."""

  change: dict[str, np.ndarray]
  ranking: dict[str, np.ndarray]

  def top_k(self, metric: str, k: int) -> np.ndarray:
    return self.ranking[metric][:k]


def one_shot_ground_truth(problem: Problem) -> GroundTruth:
  values = problem.measure(problem.single_head_masks(range(problem.num_total)))
  change = {m: values[m] - problem.baseline[m] for m in problem.metric_names}
  ranking = {m: lexicographic_ranking(*[change[x] for x in _metric_order(problem, m)])
             for m in problem.metric_names}
  return GroundTruth(change, ranking)


def iterative_greedy(problem: Problem, k: int) -> dict[str, Any]:
  """k rounds of iterative greedy on the headline metric (methods.IterativeGreedy, through the cache)."""
  from jaxloc.localize.methods import IterativeGreedy

  source = IterativeGreedy(problem.num_layers, problem.num_heads, k, np.zeros(problem.num_total, bool))
  order = _metric_order(problem, None)  # the headline metric, then the metrics that break its ties
  measured = np.zeros((0, problem.num_layers, problem.num_heads), bool)
  scores = {m: np.zeros((0,), np.float64) for m in order}

  def ties():
    return [scores[m] for m in order[1:]]

  while (todo := source.next_masks(measured, scores[order[0]], ties())) is not None:
    values = problem.measure(todo)
    measured = np.concatenate([measured, todo])
    scores = {m: np.concatenate([scores[m], values[m]]) for m in order}
  chosen, _, _ = source.replay(measured, scores[order[0]], ties())
  return {"top_k": [int(h) for h in chosen], "evaluations": int(len(measured))}


def recall(ranking: Sequence[int], truth: Sequence[int], k: int) -> float:
  """|method's top-k ∩ truth's top-k| / k."""
  if k < 1:
    raise UserError(f"top_k must be ≥ 1, got {k}")
  return len(set(np.asarray(ranking[:k]).tolist()) & set(np.asarray(truth[:k]).tolist())) / k


def _names(problem: Problem, heads: Sequence[int]) -> list[str]:
  return [head_name(*divmod(int(h), problem.num_heads)) for h in heads]


def sweep(problem: Problem, specs: Sequence[MethodSpec], budgets: Sequence[float], seeds: Sequence[int], k: int,
          truth: GroundTruth, planted: np.ndarray | None = None, progress: Callable[[str], None] | None = None
          ) -> list[dict[str, Any]]:
  """One record per (method, budget, seed) with recall and the top-k ablation change."""
  prefetch(specs, problem, budgets, seeds)
  runs = []
  for spec in specs:
    # The gradient alone has no budget: one record per seed at its own cost.
    fractions = [None] if spec.family == "gradient" else [b for b in budgets if b <= spec.max_budget + 1e-9]
    for fraction in fractions:
      num_masks = 0 if fraction is None else budget_masks(fraction, problem.num_total)
      for seed in seeds:
        start = time.perf_counter()
        result = run_method(spec, problem, num_masks, seed)
        if result is not None:
          runs.append((spec, fraction, num_masks, seed, result, time.perf_counter() - start))
    if progress:
      progress(spec.name)
  # Every top-k set in one measure call: full engine batches, and coinciding sets cost one evaluation.
  top_masks = np.concatenate([problem.joint_mask(r[4].ranking[:k]) for r in runs]) if runs else None
  drops = problem.measure(top_masks) if runs else {}
  records = []
  for i, (spec, fraction, num_masks, seed, result, seconds) in enumerate(runs):
    top = result.ranking[:k]
    record = {
        "method": spec.name, "budget_fraction": fraction,
        "budget_masks": num_masks, "seed": seed, "evaluations": float(result.evaluations),
        "top_k": _names(problem, top),
        "recall": {m: recall(result.ranking, truth.top_k(m, k), k) for m in problem.metric_names},
        "top_k_change": {m: float(drops[m][i] - problem.baseline[m]) for m in problem.metric_names},
        "solve_seconds": seconds,
    }
    if planted is not None:
      record["recall_planted"] = recall(result.ranking, planted, k)
    info = {key: value for key, value in result.info.items() if np.ndim(value) == 0}
    if "stability_frequency" in result.info:
      info["top_k_frequency"] = [float(result.info["stability_frequency"][h]) for h in top]
    record["info"] = info
    records.append(record)
  return records


def summarize(records: Sequence[dict[str, Any]], metric: str, k: int) -> list[dict[str, Any]]:
  """Mean and spread over seeds per (method, budget)."""
  groups: dict[tuple, list[dict[str, Any]]] = {}
  for r in records:
    groups.setdefault((r["method"], r["budget_fraction"]), []).append(r)
  rows = []
  for (method, fraction), group in groups.items():
    rec = np.array([r["recall"][metric] for r in group])
    change = np.array([r["top_k_change"][metric] for r in group])
    row = {"method": method, "budget_fraction": fraction, "seeds": len(group),
           "evaluations": float(np.mean([r["evaluations"] for r in group])),
           "recall_mean": float(rec.mean()), "recall_std": float(rec.std()), "recall_min": float(rec.min()),
           "recall_max": float(rec.max()),
           "hits_mean": float(rec.mean() * k), "seeds_with_hits_ge_k_minus_1": int(np.sum(np.round(rec * k) >= k - 1)),
           "change_mean": float(change.mean()), "change_std": float(change.std())}
    others = [m for m in group[0]["recall"] if m != metric]
    for m in others:
      row[f"recall_mean_{m}"] = float(np.mean([r["recall"][m] for r in group]))
    if "recall_planted" in group[0]:
      row["recall_planted_mean"] = float(np.mean([r["recall_planted"] for r in group]))
    rows.append(row)
  return rows


# ------------------------------------------------------------------------------------------------
# Diagnostics: how well-defined is the ground truth, how saturated the designs, how additive the heads.


def top_k_overlap(a: Sequence[int], b: Sequence[int], k: int) -> int:
  return len(set(np.asarray(a[:k]).tolist()) & set(np.asarray(b[:k]).tolist()))


def design_saturation(problem: Problem, specs: Sequence[MethodSpec], seeds: Sequence[int], budgets: Sequence[float],
                      floor_fraction: float = 0.1) -> list[dict[str, Any]]:
  """Per measured design (kind, rate): the mean score under its masks relative to the baseline, and the
  fraction of masks at the floor (headline score ≤ floor_fraction × baseline): saturated masks carry
  little information about which of their heads did it."""
  out = []
  seen = set()
  metric = problem.headline_metric
  for spec in specs:
    if not spec.uses_design or (spec.design, spec.ablation_rate) in seen:
      continue
    seen.add((spec.design, spec.ablation_rate))
    largest = max(budget_masks(b, problem.num_total) for b in budgets if b <= spec.max_budget + 1e-9)
    scores = np.concatenate([problem.measure(design_for(spec, problem, largest, s))[metric] for s in seeds])
    base = problem.baseline[metric]
    out.append({"design": spec.design, "ablation_rate": spec.ablation_rate, "masks": int(len(scores)),
                "scores": scores.tolist(),
                "heads_per_mask": spec.ablation_rate * problem.num_total,
                "mean_score": float(scores.mean()), "baseline": base,
                "fraction_at_floor": float(np.mean(scores <= floor_fraction * base)) if base > 0 else None,
                "floor": floor_fraction * base})
  return out


def additivity(problem: Problem, truth: GroundTruth, k: int) -> dict[str, Any]:
  """Greedy's top-k ablated together vs the sum of their single-head changes (interactions/saturation)."""
  top = truth.top_k(problem.headline_metric, k)
  joint = problem.measure(problem.joint_mask(top))
  return {m: {"joint_change": float(joint[m][0] - problem.baseline[m]),
              "sum_of_single_changes": float(np.sum(truth.change[m][top]))} for m in problem.metric_names}


def context_effects(problem: Problem, truth: GroundTruth, budgets: Sequence[float], seeds: Sequence[int], k: int
                    ) -> dict[str, Any]:
  """Isolated vs in-context importance. For greedy's top-k and the paper method's top-k at its largest
  budget: the change when the head is ablated alone (what greedy ranks by) next to the mean Lasso
  coefficient over seeds (the head's average marginal effect among ~10% other ablated heads, what CS
  ranks by). A head whose two numbers disagree is where interactions make the two methods answer
  different questions."""
  spec = parse_method("cs_stratified")
  num_masks = budget_masks(max(budgets), problem.num_total)
  coefs = []
  for seed in seeds:
    design = design_for(spec, problem, num_masks, seed)
    y = problem.measure(design)[problem.headline_metric]
    X = design.reshape(num_masks, -1).astype(np.float32)
    cv = solver.lasso_cv(X, y.astype(np.float32), num_folds=min(5, num_masks), seed=seed, standardize=True,
                         num_alphas=CV_NUM_ALPHAS, eps=CV_EPS)
    coefs.append(np.asarray(cv.fit.coef, np.float64))
  coef = np.mean(coefs, axis=0)
  metric = problem.headline_metric
  heads = list(dict.fromkeys(truth.top_k(metric, k).tolist() + lexicographic_ranking(coef)[:k].tolist()))
  return {"budget_masks": num_masks, "heads": _names(problem, heads),
          "single_change": truth.change[metric][heads].tolist(), "mean_lasso_coef": coef[heads].tolist(),
          "single_rank": [int(np.flatnonzero(truth.ranking[metric] == h)[0]) + 1 for h in heads],
          "lasso_rank": [int(np.flatnonzero(lexicographic_ranking(coef) == h)[0]) + 1 for h in heads]}


def gt_separation(truth: GroundTruth, metric: str, k: int, depth: int = 10) -> list[float]:
  """The single-head changes of greedy's top `depth` heads: is the k-th clearly apart from the (k+1)-th?"""
  return [float(truth.change[metric][h]) for h in truth.ranking[metric][:depth]]


# ------------------------------------------------------------------------------------------------
# Real problems: a model and a task.


def cache_directory(output_dir: str, model: str, task: str, num_samples, sample_seed: int, part: str) -> str:
  def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)

  return os.path.join(output_dir, "cache", f"{slug(os.path.basename(os.path.normpath(model)))}-{slug(task)}"
                      f"-n{num_samples}-s{sample_seed}-{part}")


def real_problem(engine, model_name: str, task_name: str, docs, task, *, output_dir: str, num_samples,
                 sample_seed: int, part: str, headline_metric: str) -> tuple[Problem, MaskCache]:
  c = engine.config
  if headline_metric not in task.metric_names:
    raise UserError(f"--headline_metric={headline_metric} is not a metric of {task_name}; it has "
                    f"{', '.join(task.metric_names)}")
  doc_ids = hashlib.sha256(repr([d.get("id", i) for i, d in enumerate(docs)]).encode()).hexdigest()[:16]
  settings = {"model": model_name, "task": task_name, "task_options": {}, "num_samples": num_samples,
              "sample_seed": sample_seed, "docs": part, "ablation": "zero", "doc_ids": doc_ids}
  cache = MaskCache(cache_directory(output_dir, model_name, task_name, num_samples, sample_seed, part), settings,
                    task_evaluator(engine, task, docs), c.num_layers, c.num_heads, task.default_metric)
  base = cache.measure(np.zeros((1, c.num_layers, c.num_heads), bool))
  metric_names = [headline_metric] + [m for m in task.metric_names if m != headline_metric]
  problem = Problem(f"{task_name} ({part})", c.num_layers, c.num_heads, cache.measure,
                    {m: float(v[0]) for m, v in base.items()}, metric_names)
  return problem, cache


def measure_gradient(engine, task, docs, problem: Problem, repeats: int = 2) -> dict[str, Any]:
  """The mask gradient (of the mean summed target log-probability) and its cost against mask evaluations
  timed in the same process: a warm gradient pass vs a warm full batch of masks (masks_per_call)."""
  from jaxloc.tasks import evaluation

  if task.output_type != "loglikelihood":
    return {"available": False, "reason": "generation task: no teacher-forced log-probability to differentiate"}
  requests = task.requests(docs, engine.tokenizer)
  engine.mask_gradient(requests)  # compile
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    grad = engine.mask_gradient(requests)
    seconds.append(time.perf_counter() - start)
  c = engine.config
  per_call = engine.masks_per_call(requests, 64)
  keep = np.ones((per_call, c.num_layers, c.num_heads), np.float32)
  keep[:, 0, 0] = 0  # any masks: the cost does not depend on which heads are ablated
  evaluation.run(engine, task, docs, keep)  # compile this batch shape (usually already done)
  mask_seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    evaluation.run(engine, task, docs, keep)
    mask_seconds.append((time.perf_counter() - start) / per_call)
  gradient_seconds, per_mask = float(np.median(seconds)), float(np.median(mask_seconds))
  problem.gradient = -np.asarray(grad, np.float64).reshape(-1)  # first-order change of ablating each head
  problem.gradient_cost = gradient_seconds / per_mask
  return {"available": True, "gradient_seconds": gradient_seconds, "mask_evaluation_seconds": per_mask,
          "masks_per_call": per_call, "forward_equivalents": problem.gradient_cost,
          "timing_evaluations": per_call * (repeats + 1)}


@dataclasses.dataclass
class EfficiencyConfig:
  """Everything a benchmark run depends on (flags of `experiments.benchmark_efficiency`)."""

  output_dir: str
  model: str = "smollm2-135m"
  tasks: Sequence[str] = ("plurals", "arithmetic_1d_4shot")
  num_samples: int = 100
  sample_seed: int = 0
  methods: Sequence[str] = ()  # empty: default_methods()
  budgets: Sequence[float] = DEFAULT_BUDGETS
  seeds: Sequence[int] = DEFAULT_SEEDS
  top_k: int = 5
  headline_metric: str = "accuracy"
  iterative_greedy: bool = False
  noise_floor: bool = True
  gradient: bool = True
  # Synthetic mode.
  synthetic_sizes: Sequence[tuple[int, int]] = ((16, 32), (32, 32))
  synthetic_planted: int = 10
  synthetic_interaction_scale: float = 0.5

  def check(self) -> list[MethodSpec]:
    if self.top_k < 1:
      raise UserError(f"--top_k={self.top_k} must be ≥ 1")
    if not self.budgets or any(not 0 < b <= 1 for b in self.budgets):
      raise UserError(f"--budgets={list(self.budgets)} must be fractions in (0, 1]")
    if not self.seeds:
      raise UserError("--seeds must name at least one seed")
    specs = [parse_method(m) for m in self.methods]
    if len({s.name for s in specs}) != len(specs):
      raise UserError(f"--methods has duplicates: {[s.name for s in specs]}")
    return specs


def default_methods(synthetic: bool = False) -> list[str]:
  """The paper's two designs, each beyond-paper variant, and the baselines. On a model the lower ablation
  rate and the Bernoulli design stop at 25% of N (each costs 5 seeds x its masks in model evaluations; the
  targets are at 10% and 25%); the gradient methods need a model."""
  limit = "0.5" if synthetic else "0.25"
  names = ["one_shot_greedy", "cs_stratified", f"cs_bernoulli-upto{limit}", "cs_stratified-logprob",
           "cs_stratified-nonpositive", "cs_stratified-stability", f"cs_stratified-r0.03-upto{limit}",
           f"cs_stratified-logprob-r0.03-upto{limit}", "two_stage", "two_stage-logprob"]
  if not synthetic:
    names += ["gradient", "gradient_confirm"]
  return names


def run_task(engine, cfg: EfficiencyConfig, specs: Sequence[MethodSpec], task_name: str) -> dict[str, Any]:
  """The whole benchmark for one task of a real model."""
  from jaxloc.tasks.registry import get_task

  start = time.perf_counter()
  task = get_task(task_name)
  docs = task.load_docs(num_samples=cfg.num_samples, seed=cfg.sample_seed)
  common = dict(output_dir=cfg.output_dir, num_samples=cfg.num_samples, sample_seed=cfg.sample_seed,
                headline_metric=cfg.headline_metric)
  problem, cache = real_problem(engine, cfg.model, task_name, docs, task, part="all", **common)
  k = cfg.top_k
  log.info("%s: baseline %s; ground truth (one-shot greedy, %d masks)", task_name, problem.baseline,
           problem.num_total)
  truth = one_shot_ground_truth(problem)
  report: dict[str, Any] = {"task": task_name, "model": cfg.model, "num_docs": len(docs),
                            "num_layers": problem.num_layers, "num_heads": problem.num_heads,
                            "headline_metric": cfg.headline_metric, "metrics": problem.metric_names,
                            "baseline": problem.baseline}
  gradient = measure_gradient(engine, task, docs, problem) if cfg.gradient else {"available": False}
  report["gradient"] = gradient
  report["ground_truth"] = ground_truth_report(problem, truth, k)
  if gradient.get("available"):
    gradient["spearman_with_greedy"] = {m: _spearman(problem.gradient, truth.change[m]) for m in problem.metric_names}
    gradient["top_k"] = _names(problem, lexicographic_ranking(problem.gradient)[:k])
  if cfg.iterative_greedy:
    report["ground_truth"]["iterative_greedy"] = iterative = iterative_greedy(problem, k)
    iterative["names"] = _names(problem, iterative["top_k"])
    iterative["recall_of_one_shot"] = recall(truth.top_k(cfg.headline_metric, k), iterative["top_k"], k)
  usable = [s for s in specs if not (s.uses_gradient and problem.gradient is None)]
  records = sweep(problem, usable, cfg.budgets, cfg.seeds, k, truth,
                  progress=lambda name: log.info("%s: %s done (%s)", task_name, name, cache.counts()))
  report["records"] = records
  report["summary"] = summarize(records, cfg.headline_metric, k)
  if cfg.noise_floor:
    report["noise_floor"] = noise_floor(engine, cfg, task_name, task, docs, problem, truth, usable, k)
  report["cache"] = cache.counts()
  report["seconds"] = time.perf_counter() - start
  return report


def ground_truth_report(problem: Problem, truth: GroundTruth, k: int) -> dict[str, Any]:
  out: dict[str, Any] = {"evaluations": problem.num_total}
  for m in problem.metric_names:
    top = truth.top_k(m, k)
    out[m] = {"top_k": _names(problem, top), "single_changes_top10": gt_separation(truth, m, k),
              "names_top10": _names(problem, truth.ranking[m][:10])}
  joint = problem.measure(problem.joint_mask(truth.top_k(problem.headline_metric, k)))
  out["top_k_change"] = {m: float(joint[m][0] - problem.baseline[m]) for m in problem.metric_names}
  # How sparse the effects are: heads whose single ablation costs at least this much (headline metric).
  change = truth.change[problem.headline_metric]
  scale = abs(problem.baseline[problem.headline_metric]) or 1.0
  out["heads_with_relative_drop_at_least"] = {f"{q:g}": int(np.sum(change <= -q * scale))
                                              for q in (0.02, 0.05, 0.1, 0.2)}
  out["overlap_between_metrics"] = top_k_overlap(truth.ranking[problem.metric_names[0]],
                                                 truth.ranking[problem.metric_names[-1]], k)
  return out


def noise_floor(engine, cfg: EfficiencyConfig, task_name: str, task, docs, problem: Problem, truth: GroundTruth,
                specs: Sequence[MethodSpec], k: int) -> dict[str, Any]:
  """How reproducible greedy's top-k is on two disjoint halves of the documents; design saturation;
  additivity of the top heads."""
  half = len(docs) // 2
  halves = []
  for part, subset in (("half0", docs[:half]), ("half1", docs[half:2 * half])):
    p, _ = real_problem(engine, cfg.model, task_name, subset, task, part=part, output_dir=cfg.output_dir,
                        num_samples=cfg.num_samples, sample_seed=cfg.sample_seed,
                        headline_metric=cfg.headline_metric)
    halves.append(one_shot_ground_truth(p))
  out: dict[str, Any] = {"docs_per_half": half, "split_half_top_k_overlap": {}, "half_vs_full_top_k_overlap": {}}
  for m in problem.metric_names:
    out["split_half_top_k_overlap"][m] = top_k_overlap(halves[0].ranking[m], halves[1].ranking[m], k)
    out["half_vs_full_top_k_overlap"][m] = [top_k_overlap(h.ranking[m], truth.ranking[m], k) for h in halves]
    out.setdefault("split_half_spearman", {})[m] = _spearman(halves[0].change[m], halves[1].change[m])
  metric = problem.headline_metric
  top = truth.ranking[metric][:20]
  out["top20"] = {"names": _names(problem, top), "full": truth.change[metric][top].tolist(),
                  "half0": halves[0].change[metric][top].tolist(), "half1": halves[1].change[metric][top].tolist()}
  out["design_saturation"] = design_saturation(problem, specs, cfg.seeds, cfg.budgets)
  out["additivity"] = additivity(problem, truth, k)
  if any(s.name == "cs_stratified" for s in specs):
    out["context_effects"] = context_effects(problem, truth, cfg.budgets, cfg.seeds, k)
  return out


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
  ra = np.argsort(np.argsort(a, kind="stable"), kind="stable").astype(np.float64)
  rb = np.argsort(np.argsort(b, kind="stable"), kind="stable").astype(np.float64)
  return float(np.corrcoef(ra, rb)[0, 1])


# ------------------------------------------------------------------------------------------------
# Synthetic mode.


def synthetic_evaluator(responses: dict[str, SyntheticResponse], noise_seed: int):
  """An evaluator whose noise is a fixed function of the mask (a deterministic model on fixed
  documents), so repeated masks give the same score, as on a real model."""

  def evaluate(masks: np.ndarray):
    flat = np.asarray(masks, bool).reshape(len(masks), -1)
    out = {}
    for name, response in responses.items():
      values = np.empty(len(flat))
      for i, row in enumerate(flat):
        digest = hashlib.blake2b(np.packbits(row).tobytes(), digest_size=8).digest()
        rng = np.random.default_rng([noise_seed, *np.frombuffer(digest, np.uint32).tolist(), len(name)])
        values[i] = response.evaluate(row[None], rng)[0]
      out[name] = values
    yield slice(0, len(flat)), out

  return evaluate


def synthetic_problem(num_layers: int, num_heads: int, seed: int, *, num_planted: int = 10,
                      interaction_scale: float = 0.5, headline_metric: str = "accuracy",
                      num_samples: int = 100) -> tuple[Problem, MaskCache, SyntheticResponse]:
  """A simulated task over num_layers × num_heads heads: `num_planted` sparse effects (single-ablation
  drops U(0.05, 0.4) from 0.8), dense background effects, pairwise interactions between planted heads,
  logistic saturation, and the binomial noise of a `num_samples`-document accuracy; its `logprob` metric
  is log p plus Gaussian noise (sd 0.05) from the same p."""
  n = num_layers * num_heads
  common = dict(num_planted=num_planted, planted_drop=(0.05, 0.4), interaction_scale=interaction_scale,
                link="logistic", num_samples=num_samples, seed=seed)
  responses = {"accuracy": SyntheticResponse(n, metric="accuracy", **common),
               "logprob": SyntheticResponse(n, metric="logprob", **common)}
  cache = MaskCache(None, {}, synthetic_evaluator(responses, noise_seed=10_000 + seed), num_layers, num_heads,
                    "accuracy")
  base = cache.measure(np.zeros((1, num_layers, num_heads), bool))
  names = [headline_metric] + [m for m in responses if m != headline_metric]
  problem = Problem(f"synthetic N={n} seed={seed}", num_layers, num_heads, cache.measure,
                    {m: float(v[0]) for m, v in base.items()}, names)
  return problem, cache, responses["accuracy"]


def run_synthetic(cfg: EfficiencyConfig, specs: Sequence[MethodSpec]) -> list[dict[str, Any]]:
  """The sweep on synthetic responses at each size; one simulated task per seed (design seed = seed)."""
  reports = []
  usable = [s for s in specs if not s.uses_gradient]
  for num_layers, num_heads in cfg.synthetic_sizes:
    start = time.perf_counter()
    n = num_layers * num_heads
    records, split, counts = [], [], []
    for seed in cfg.seeds:
      problem, cache, response = synthetic_problem(num_layers, num_heads, seed, num_planted=cfg.synthetic_planted,
                                                   interaction_scale=cfg.synthetic_interaction_scale,
                                                   headline_metric=cfg.headline_metric,
                                                   num_samples=cfg.num_samples)
      truth = one_shot_ground_truth(problem)
      planted = response.true_top_k(cfg.top_k)
      split.append(top_k_overlap(truth.ranking[cfg.headline_metric], planted, cfg.top_k))
      records += sweep(problem, usable, cfg.budgets, [seed], cfg.top_k, truth, planted=planted)
      counts.append(cache.counts())
      log.info("synthetic N=%d seed %d done (%.0f s so far)", n, seed, time.perf_counter() - start)
    reports.append({"task": f"synthetic N={n}", "model": "SyntheticResponse", "num_layers": num_layers,
                    "num_heads": num_heads, "headline_metric": cfg.headline_metric,
                    "metrics": [cfg.headline_metric] + [m for m in ("accuracy", "logprob") if m != cfg.headline_metric],
                    "records": records,
                    "summary": summarize(records, cfg.headline_metric, cfg.top_k),
                    "ground_truth": {"greedy_vs_planted_top_k_overlap": split},
                    "cache": {key: int(sum(c[key] for c in counts)) for key in ("evaluated", "served_from_cache")},
                    "seconds": time.perf_counter() - start})
  return reports


# ------------------------------------------------------------------------------------------------
# Report: markdown tables and a plot.


def _budget_label(fraction: float | None, n: int) -> str:
  return "own cost" if fraction is None else f"{fraction:.0%} ({budget_masks(fraction, n)})"


def format_tables(report: dict[str, Any], k: int) -> str:
  """Markdown: per task, mean recall ± sd over seeds (hits ≥ k-1 in how many seeds) and the top-k change."""
  lines = []
  for t in report["tasks"]:
    n = t["num_layers"] * t["num_heads"]
    metric = t["headline_metric"]
    summary = t["summary"]
    budgets = sorted({r["budget_fraction"] for r in summary if r["budget_fraction"] is not None})
    lines.append(f"### {t['task']} ({t['model']}, N = {n} heads, headline metric: {metric})")
    lines.append("")
    facts = []
    if "baseline" in t:
      facts.append("baseline " + ", ".join(f"{m} {v:.3f}" for m, v in t["baseline"].items()))
    gt = t.get("ground_truth", {})
    if metric in gt:
      facts.append(f"greedy top-{k} ({metric}): {', '.join(gt[metric]['top_k'])}; ablated together: "
                   + ", ".join(f"{m} {v:+.3f}" for m, v in gt["top_k_change"].items()))
    g = t.get("gradient", {})
    if g.get("available"):
      facts.append(f"mask gradient: {g['gradient_seconds']:.2f} s vs {g['mask_evaluation_seconds']:.3f} s per mask "
                   f"evaluation = {g['forward_equivalents']:.1f} evaluations")
    nf = t.get("noise_floor")
    if nf:
      facts.append(f"greedy top-{k} overlap between two disjoint halves of the docs: "
                   + ", ".join(f"{m} {v}/{k}" for m, v in nf["split_half_top_k_overlap"].items()))
    if nf and "context_effects" in nf:
      ce = nf["context_effects"]
      facts.append(f"isolated vs in-context effect (single-head change | mean Lasso coefficient at "
                   f"{ce['budget_masks']} masks; ranks): " + "; ".join(
                       f"{h} {a:+.2f} (#{ra}) | {b:+.3f} (#{rb})" for h, a, b, ra, rb in zip(
                           ce["heads"], ce["single_change"], ce["mean_lasso_coef"], ce["single_rank"],
                           ce["lasso_rank"])))
    if nf:
      add = nf["additivity"][metric]
      facts.append(f"greedy's top-{k} ablated together: {metric} {add['joint_change']:+.3f} vs the sum of their "
                   f"single changes {add['sum_of_single_changes']:+.3f} (saturation/interactions); masks at the "
                   "floor: " + ", ".join(f"{d['design']} rate {d['ablation_rate']:g}: "
                                         f"{100 * (d['fraction_at_floor'] or 0):.0f}%"
                                         for d in nf["design_saturation"]))
      facts.append(f"greedy's top-10 single-head changes ({metric}): "
                   + ", ".join(f"{v:+.2f}" for v in gt[metric]["single_changes_top10"]))
    if "greedy_vs_planted_top_k_overlap" in gt:
      facts.append(f"greedy top-{k} vs planted top-{k} overlap per seed: {gt['greedy_vs_planted_top_k_overlap']}")
    lines += [f"- {f}" for f in facts]
    lines.append("")
    methods = list(dict.fromkeys(r["method"] for r in summary))
    by = {(r["method"], r["budget_fraction"]): r for r in summary}
    header = "| method | " + " | ".join(_budget_label(b, n) for b in budgets) + " | own cost |"

    def table(title: str, cell: Callable[[dict[str, Any], float | None], str]) -> None:
      """One row per method, one column per budget (None: the method's own cost, e.g. the gradient)."""
      lines.extend([title, "", header, "|" + "---|" * (len(budgets) + 2)])
      for m in methods:
        cells = ["" if by.get((m, b)) is None else cell(by[(m, b)], b) for b in budgets + [None]]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
      lines.append("")

    table(f"Recall of greedy's top-{k} ({metric}), mean ± sd over seeds [seeds with ≥ {k - 1}/{k}]:",
          lambda r, b: f"{r['recall_mean']:.2f} ± {r['recall_std']:.2f} [{r['seeds_with_hits_ge_k_minus_1']}/"
                       f"{r['seeds']}]" + (f" @{r['evaluations']:.1f}" if b is None else ""))
    for other in [m for m in t.get("metrics", [metric]) if m != metric]:
      table(f"Recall of greedy's top-{k} by {other} (mean over seeds):",
            lambda r, b, other=other: f"{r[f'recall_mean_{other}']:.2f}")
    if any("recall_planted_mean" in r for r in summary):
      table(f"Recall of the planted top-{k} (the simulation's truth; mean over seeds):",
            lambda r, b: f"{r['recall_planted_mean']:.2f}")
    table(f"Change of {metric} when the method's top-{k} are ablated together (mean ± sd):",
          lambda r, b: f"{r['change_mean']:+.3f} ± {r['change_std']:.3f}")
  return "\n".join(lines)


def plot_diagnostics(report: dict[str, Any], path: str, k: int) -> bool:
  """Per real task: greedy's top-20 single-head changes on all docs and on two disjoint halves (is the
  top-k well defined?), and the score distribution under each CS design (saturation). False if no task
  has the noise-floor figures."""
  tasks = [t for t in report["tasks"] if t.get("noise_floor")]
  if not tasks:
    return False
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 3.6 * len(tasks)), squeeze=False)
  for row, t in enumerate(tasks):
    nf, metric = t["noise_floor"], t["headline_metric"]
    ax = axes[row][0]
    x = np.arange(len(nf["top20"]["names"]))
    ax.bar(x, nf["top20"]["full"], color="lightgrey", label=f"all {t['num_docs']} docs")
    ax.plot(x, nf["top20"]["half0"], "o", color="tab:blue", markersize=4, label="docs half 1")
    ax.plot(x, nf["top20"]["half1"], "s", color="tab:orange", markersize=4, label="docs half 2")
    ax.axvline(k - 0.5, color="black", linestyle=":", linewidth=1)
    ax.set_xticks(x)
    ax.set_xticklabels(nf["top20"]["names"], rotation=60, fontsize=7)
    ax.set_ylabel(f"{metric} change, head ablated alone")
    ax.set_title(f"{t['task']}: greedy's top 20 (split-half top-{k} overlap "
                 f"{nf['split_half_top_k_overlap'][metric]}/{k})", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[row][1]
    for d in nf["design_saturation"]:
      ax.hist(d["scores"], bins=25, alpha=0.5, label=f"{d['design']} rate {d['ablation_rate']:g} "
              f"({d['heads_per_mask']:.0f} heads/mask): {100 * (d['fraction_at_floor'] or 0):.0f}% at floor")
    ax.axvline(t["baseline"][metric], color="black", linestyle="--", linewidth=1, label="baseline")
    ax.set_xlabel(f"{metric} under a design mask")
    ax.set_ylabel("masks")
    ax.set_title(f"{t['task']}: saturation of the CS designs", fontsize=9)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def _style(method: str, index: int) -> dict[str, Any]:
  """Colour by family (greys for the paper's CS, warm for adaptive, blue for greedy), one marker per variant."""
  family = method.split("-")[0]
  base = "-".join(t for t in method.split("-") if not t.startswith("upto"))  # a cost limit is not a variant
  colors = {"cs_stratified": "black", "cs_bernoulli": "dimgrey", "two_stage": "tab:purple", "gradient": "tab:orange",
            "gradient_confirm": "tab:red", "one_shot_greedy": "tab:blue"}
  variant_colors = ["tab:green", "tab:olive", "tab:cyan", "tab:brown", "tab:pink", "tab:gray"]
  color = colors.get(family, "tab:gray") if base == family else variant_colors[index % len(variant_colors)]
  if family == "two_stage" and base != family:
    color = "plum"
  thick = base in ("cs_stratified", "cs_bernoulli", "gradient_confirm")
  return dict(color=color, linewidth=2.6 if thick else 1.3, marker="os^vDP*Xhd"[index % 10], markersize=4,
              linestyle="-" if base == family else "--")


def plot(report: dict[str, Any], path: str, k: int) -> None:
  """Per task: recall of greedy's top-k and the top-k ablation change against evaluations (log scale),
  mean over seeds with a ± sd band; one line per method."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  tasks = report["tasks"]
  methods_seen = list(dict.fromkeys(r["method"] for t in tasks for r in t["summary"]))
  fig, axes = plt.subplots(len(tasks), 2, figsize=(13.5, 3.6 * len(tasks) + 0.4), squeeze=False)
  for row, t in enumerate(tasks):
    n = t["num_layers"] * t["num_heads"]
    metric = t["headline_metric"]
    for col, (key, label) in enumerate((("recall", f"recall of greedy's top-{k}"),
                                        ("change", f"{metric} change, top-{k} ablated"))):
      ax = axes[row][col]
      for index, m in enumerate(methods_seen):
        rows = sorted([r for r in t["summary"] if r["method"] == m], key=lambda r: r["evaluations"])
        if not rows:
          continue
        x = np.array([r["evaluations"] for r in rows])
        mean = np.array([r[f"{key}_mean"] for r in rows])
        sd = np.array([r[f"{key}_std"] for r in rows])
        style = _style(m, index)
        ax.plot(x, mean, label=m, **style)
        ax.fill_between(x, mean - sd, mean + sd, color=style["color"], alpha=0.08, linewidth=0)
      if key == "change" and "top_k_change" in t.get("ground_truth", {}):
        ax.axhline(t["ground_truth"]["top_k_change"][metric], color="tab:blue", linestyle=":", linewidth=1.2,
                   label=f"greedy's top-{k} (N evaluations)")
      if key == "recall":
        ax.axhline((k - 1) / k, color="grey", linestyle=":", linewidth=1)
        ax.set_ylim(-0.03, 1.03)
      for fraction in (0.1, 0.25):
        ax.axvline(fraction * n, color="grey", linewidth=0.6, alpha=0.5)
        if key == "recall":
          ax.text(fraction * n, 1.0, f" {fraction:.0%}", fontsize=7, color="grey", va="top")
      ax.set_xscale("log")
      ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
      ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
      ax.set_xlabel("model evaluations (log scale; gradient pass counted in evaluations)", fontsize=8)
      ax.set_ylabel(label, fontsize=9)
      ax.set_title(f"{t['task']} (N = {n})", fontsize=9)
  handles, labels = axes[0][1].get_legend_handles_labels()
  fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
  fig.tight_layout(rect=(0, 0, 0.78, 1))
  fig.savefig(path, dpi=120)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------
# Entry point.


def write_outputs(report: dict[str, Any], output_dir: str, k: int) -> str:
  """efficiency.json, efficiency.md, efficiency.png (and efficiency_diagnostics.png when a task has the
  noise-floor figures) in output_dir; returns the tables."""
  from jaxloc.localize.measurements import write_json

  os.makedirs(output_dir, exist_ok=True)
  write_json(os.path.join(output_dir, "efficiency.json"), report)
  tables = format_tables(report, k)
  with open(os.path.join(output_dir, "efficiency.md"), "w") as f:
    f.write(tables + "\n")
  plot(report, os.path.join(output_dir, "efficiency.png"), k)
  plot_diagnostics(report, os.path.join(output_dir, "efficiency_diagnostics.png"), k)
  return tables + f"\noutputs in {output_dir}"


def combine_reports(paths: Sequence[str]) -> dict[str, Any]:
  """The tasks of several saved efficiency.json files as one report (each keeps its own config)."""
  import json

  tasks, configs = [], []
  for path in paths:
    try:
      with open(path) as f:
        report = json.load(f)
      tasks += report["tasks"]
      configs.append({"path": path, "mode": report.get("mode"), "config": report.get("config")})
    except (OSError, ValueError, KeyError) as e:
      raise UserError(f"cannot read an efficiency report from {path}: {e}") from None
  return {"mode": "combined", "sources": configs, "tasks": tasks}


def run(cfg: EfficiencyConfig, *, synthetic: bool, engine_factory: Callable[[], Any] | None = None
        ) -> dict[str, Any]:
  """The benchmark: synthetic sizes, or each task of cfg.model through the engine engine_factory() builds."""
  if not cfg.methods:
    cfg = dataclasses.replace(cfg, methods=default_methods(synthetic))
  specs = cfg.check()
  start = time.perf_counter()
  if synthetic:
    skipped = [s.name for s in specs if s.uses_gradient]
    if skipped:
      log.info("synthetic mode has no model gradient: skipping %s", ", ".join(skipped))
    tasks = run_synthetic(cfg, specs)
  else:
    if not cfg.tasks:
      raise UserError("--tasks must name at least one task")
    engine = engine_factory()
    tasks = [run_task(engine, cfg, specs, name) for name in cfg.tasks]
  return {"mode": "synthetic" if synthetic else "model", "config": dataclasses.asdict(cfg), "tasks": tasks,
          "seconds": time.perf_counter() - start}
