"""Measurement efficiency: how many model evaluations each localization method spends to find the heads
that one-shot greedy finds with one evaluation per head. This module owns the sweep (every variant at every budget
and seed), its ground truth, its summary and the benchmark's config and entry (`run`); what a variant is and how it
runs at a budget is `bench.variants`, how a method's heads are judged is `bench.judging`.

Axes: `masks` M, `layers` L, `heads` H, N = L * H heads flattened row-major (flat = layer * H + head);
`budgets` (fractions of N evaluations), `seeds` (design seeds), `k` (the top-k heads compared).

Every method here is the shipped one: a variant (`bench.variants.parse_variant`, whose docstring lists the name
tokens) names a registered method and changes a few of its settings.

Ground truth: every head ablated alone (`methods.base.single_head_plan`, one-shot greedy over every head), for
every metric the task reports. For each (variant, budget, seed): recall of the ground truth's top-k, for every
metric, and the score change from ablating the variant's top-k together (one more cached evaluation).

With held-out documents and general tasks (`bench.judging.Judging`), each method is also judged by the heads a run
of it would report: the general tasks are scored under the method's masks on their identification documents, and
the runner's own selection (`localize.confirm.find_heads`: universal heads confirmed on held-out documents, the
default `--selection=specific` confirmed by ablation on every task's identification documents, its extra masks
counted) picks the top-k, which is then ablated together on the held-out documents of the target and of every
general task. The raw ranking's top-k is judged there too (the `top_k` of a record, which recall scores). The
confirmation decides as a run's does (--specific_rule, --specific_max_general_drop, --general_max_samples: each drop
with its interval from the cache's per-document values, more documents of a general task where its power or a
straddling interval asks, counted as the record's `extra_documents`; each task's power to veto in the report).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxloc.bench import diagnostics
from jaxloc.bench.judging import Judging, held_out_drops, measured_on, runner_selection
from jaxloc.bench.problems import Problem, measure_gradient, real_problem, synthetic_problem
from jaxloc.bench.variants import (Variant, budget_masks, context, default_variants, measure_plan, needs_model,
                                   parse_variant, run_settings, run_variant)
from jaxloc.config import SEED, setting
from jaxloc.errors import UserError
from jaxloc.units import head_name
from jaxloc.localize import confirm, decisions, methods, validate
from jaxloc.localize.methods.base import single_head_plan
from jaxloc.localize.methods.greedy import IterativeGreedyPlan
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.tasks.evaluator import Evaluator, load_more_docs, load_task_split, RetainedProbability
from jaxloc.tasks.names import task_label

log = logging.getLogger(__name__)


@dataclasses.dataclass
class GroundTruth:
  """One-shot greedy on every head: change [metric] -> float [N]; ranking [metric] -> int [N]."""

  change: dict[str, np.ndarray]
  ranking: dict[str, np.ndarray]

  def top_k(self, metric: str, k: int) -> np.ndarray:
    return self.ranking[metric][:k]


def one_shot_ground_truth(problem: Problem) -> GroundTruth:
  """Every head ablated alone, ranked in each metric (ties by the others, as every single-head ranking)."""
  every = np.arange(problem.num_total)
  measured = measure_plan(single_head_plan(every, every, context(problem)), problem, problem.headline_metric)
  change, ranking = {}, {}
  for m in problem.metric_names:
    result = single_head_plan(every, every, context(problem)).rank(dataclasses.replace(measured, metric=m))
    change[m], ranking[m] = result.values, result.order
  return GroundTruth(change, ranking)


def iterative_greedy(problem: Problem, k: int) -> dict[str, Any]:
  """k rounds of iterative greedy (the shipped plan) on the headline metric."""
  plan = IterativeGreedyPlan(context(problem), k)
  measured = measure_plan(plan, problem, problem.headline_metric)
  return {"top_k": [int(h) for h in plan.rank(measured).order[:k]], "evaluations": int(len(measured))}


def recall(ranking: Sequence[int], truth: Sequence[int], k: int) -> float:
  """|method's top-k ∩ truth's top-k| / k."""
  if k < 1:
    raise UserError(f"top_k must be ≥ 1, got {k}")
  return len(set(np.asarray(ranking[:k]).tolist()) & set(np.asarray(truth[:k]).tolist())) / k


def names(problem: Problem, heads: Sequence[int]) -> list[str]:
  return [head_name(*divmod(int(h), problem.num_heads)) for h in heads]


def headline_drop(problem: Problem, masks: np.ndarray) -> np.ndarray:
  """float [M]: the relative drop of the problem's headline metric under each mask (NaN for a zero baseline)."""
  metric = problem.headline_metric
  return validate.relative_drop(problem.baseline[metric], problem.measure(masks)[metric])


def sweep(problem: Problem, variants: Sequence[Variant], base: LocalizeSettings, budgets: Sequence[float],
          seeds: Sequence[int], k: int, truth: GroundTruth, planted: np.ndarray | None = None,
          progress: Callable[[str], None] | None = None, judging: Judging | None = None
          ) -> list[dict[str, Any]]:
  """One record per (variant, budget, seed) with recall and the top-k ablation change; with `judging`, also the
  heads the runner would select (`runner_selection`) and the relative drop that its top-k and the raw top-k cause
  on the held-out documents of the task and of each general task, in each problem's headline metric."""
  runs = []
  for variant in variants:
    # Largest budget first: the nested designs of smaller budgets are then served from the cache.
    for fraction in sorted((b for b in budgets if b <= variant.max_budget + 1e-9), reverse=True):
      num_masks = budget_masks(fraction, problem.num_total)
      for seed in seeds:
        start = time.perf_counter()
        result = run_variant(variant, problem, base, num_masks, seed)
        if result is not None:
          found = runner_selection(result, problem, judging) if judging else None
          runs.append((variant, fraction, num_masks, seed, result, found, time.perf_counter() - start))
    if progress:
      progress(variant.name)
  # Every top-k set in one measure call: full engine batches, and coinciding sets cost one evaluation.
  raw = [problem.joint_mask(r[4].ranking[:k]) for r in runs]
  selected = [problem.joint_mask(r[5].selected[:k]) for r in runs] if judging else []
  joint = np.concatenate(raw + selected) if runs else np.zeros((0, problem.num_layers, problem.num_heads), bool)
  drops = problem.measure(joint[:len(raw)]) if runs else {}
  held = headline_drop(judging.held_out, joint) if runs and judging else None
  others = {name: headline_drop(p, joint) for name, _, p in judging.general} if runs and judging else {}
  records = []
  for i, (variant, fraction, num_masks, seed, result, found, seconds) in enumerate(runs):
    record = {
        "method": variant.name, "budget_fraction": fraction, "budget_masks": num_masks, "seed": seed,
        "evaluations": float(result.evaluations), "top_k": names(problem, result.ranking[:k]),
        "recall": {m: recall(result.ranking, truth.top_k(m, k), k) for m in problem.metric_names},
        "top_k_change": {m: float(drops[m][i] - problem.baseline[m]) for m in problem.metric_names},
        "solve_seconds": seconds, "info": result.info,
    }
    if planted is not None:
      record["recall_planted"] = recall(result.ranking, planted, k)
    if held is not None:
      record.update(held_out_drops(held[i], {name: d[i] for name, d in others.items()}))
    if found is not None:
      j = len(raw) + i  # every run has a selection when judged
      record.update(selected_top_k=names(problem, found.selected[:k]), universal=names(problem, found.universal),
                    confirmation_masks=found.confirmation_masks,
                    extra_documents=found.confirmation.extra_documents() if found.confirmation else 0,
                    evaluations_with_confirmation=float(result.evaluations) + found.confirmation_masks)
      record.update({f"selected_{key}": value for key, value in
                     held_out_drops(held[j], {name: d[j] for name, d in others.items()}).items()})
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
           "recall_max": float(rec.max()), "hits_mean": float(rec.mean() * k),
           "seeds_with_hits_ge_k_minus_1": int(np.sum(np.round(rec * k) >= k - 1)),
           "change_mean": float(change.mean()), "change_std": float(change.std())}
    for m in [m for m in group[0]["recall"] if m != metric]:
      row[f"recall_mean_{m}"] = float(np.mean([r["recall"][m] for r in group]))
    if "recall_planted" in group[0]:
      row["recall_planted_mean"] = float(np.mean([r["recall_planted"] for r in group]))
    for key in ("held_out_relative_drop", "max_general_relative_drop", "selected_held_out_relative_drop",
                "selected_max_general_relative_drop", "confirmation_masks", "extra_documents",
                "evaluations_with_confirmation"):
      if key in group[0]:
        row[f"{key}_mean"] = float(np.mean([r[key] for r in group]))
    if "selected_general_relative_drop" in group[0]:
      # Which general task the selection costs most, in how many seeds.
      worst = [max(r["selected_general_relative_drop"].items(), key=lambda item: -math.inf if math.isnan(item[1])
                   else item[1])[0] for r in group]
      row["selected_worst_general_task"] = {name: worst.count(name) for name in dict.fromkeys(worst)}
    rows.append(row)
  return sorted(rows, key=lambda r: r["budget_fraction"])


@dataclasses.dataclass
class EfficiencyConfig:
  """Everything a benchmark run depends on: one field per flag of `experiments.benchmark_efficiency` (the flags
  are generated from these fields, `jaxloc.cli.define_flags`, so a default lives here only)."""

  output_dir: str = setting(None, "Where the outputs and the measurement cache go.", type=str, required=True)
  model: str = "smollm2-135m"  # the --model flag of the model flags
  tasks: list = setting(["plurals", "arithmetic_1d_4shot"], "Tasks to benchmark (real mode).")
  num_samples: int = setting(100, "Documents per task (seeded subset).", lower=2)
  sample_seed: int = setting(0, "Seed of the document subset.", **SEED)
  methods: list = setting([], "Methods: registered method names with setting tokens (see jaxloc/bench/variants.py); "
                          "empty = the default set.")
  budgets: list = setting([0.1, 0.25, 0.5, 1.0], "Budgets as fractions of N evaluations (1 = one-shot greedy over "
                          "every head; above 1 for a method that costs more, e.g. one that trains a mask first).",
                          element=float)
  seeds: list = setting([0, 1, 2, 3, 4], "Design seeds.", element=int)
  top_k: int = setting(5, "Heads compared with greedy's top-k.", lower=1)
  headline_metric: str = setting("accuracy", "Metric of the ground truth that the recall figures use.")
  iterative_greedy: bool = setting(False, "Also run iterative greedy's top-k (about k·N evaluations).")
  noise_floor: bool = setting(True, "Greedy on two disjoint halves of the docs (about N more half-size "
                              "evaluations), design saturation and additivity of the top heads.")
  gradient: bool = setting(True, "Time the mask gradient and run the methods that need it (and those that train on "
                           "the relaxed objective, whose training is converted to evaluations with the mask time "
                           "measured there).")
  validation_samples: int = setting(100, "Held-out documents of each task (disjoint from the identification "
                                    "documents) on which every method's top-k is ablated too. 0: none.", lower=0)
  general_tasks: list = setting(["counting", "plurals", "induction", "arithmetic_1d_4shot"],
                                "Tasks (the benchmarked one left out) on whose held-out documents every method's "
                                "top-k is ablated: the largest relative drop is its cost in specificity. "
                                "A method that trains a mask also trains on their identification documents. Needs "
                                "--validation_samples.")
  specific_max_general_drop: float = setting(0.1, "The largest relative drop on any general task a selected head may "
                                             "have (experiments.localize's --specific_max_general_drop).", lower=0.0,
                                             upper=1.0)
  specific_rule: str = setting("interval", "How the confirmation of a method's selection decides (experiments.localize's "
                               "--specific_rule): interval, upper_bound (more documents of a general task where a "
                               "drop's interval straddles the bound, real mode) or point (the identification "
                               "documents' point estimates).", choices=("interval", "upper_bound", "point"))
  general_max_samples: int = setting(800, "At most this many documents of a general task per confirmation decision "
                                     "(experiments.localize's --general_max_samples): --num_samples, then more of the "
                                     "task's, disjoint from the held-out ones. At least --num_samples.", lower=2)
  synthetic_sizes: list = setting([(16, 32), (32, 32)], "Synthetic mode: (layers, heads) of each problem.")
  synthetic_planted: int = setting(10, "Synthetic mode: heads with a large effect.", lower=1)
  synthetic_interaction_scale: float = setting(0.5, "Synthetic mode: sd of pairwise interactions (logits).",
                                               lower=0.0)

  def check(self) -> list[Variant]:
    if self.top_k < 1:
      raise UserError(f"--top_k={self.top_k} must be ≥ 1")
    if not self.budgets or any(not b > 0 for b in self.budgets):
      raise UserError(f"--budgets={list(self.budgets)} must be positive fractions of N")
    if not self.seeds:
      raise UserError("--seeds must name at least one seed")
    if self.general_max_samples < self.num_samples:
      raise UserError(f"--general_max_samples={self.general_max_samples} is below --num_samples={self.num_samples}: a "
                      "confirmation decision uses at least the identification documents")
    variants = [parse_variant(m) for m in self.methods]
    if len({v.name for v in variants}) != len(variants):
      raise UserError(f"--methods has duplicates: {[v.name for v in variants]}")
    return variants

  def base_settings(self, task: str) -> LocalizeSettings:
    """`experiments.localize`'s defaults for this task: the solver, grid and ranking users run."""
    return LocalizeSettings(model=self.model, task=task, output_dir=self.output_dir, metric=self.headline_metric,
                            top_k=self.top_k, general_samples=self.num_samples,
                            general_max_samples=self.general_max_samples, specific_rule=self.specific_rule,
                            specific_max_general_drop=self.specific_max_general_drop)


def ground_truth_report(problem: Problem, truth: GroundTruth, k: int) -> dict[str, Any]:
  out: dict[str, Any] = {"evaluations": problem.num_total}
  for m in problem.metric_names:
    top = truth.top_k(m, k)
    out[m] = {"top_k": names(problem, top), "names_top10": names(problem, truth.ranking[m][:10]),
              "single_changes_top10": [float(truth.change[m][h]) for h in truth.ranking[m][:10]]}
  joint = problem.measure(problem.joint_mask(truth.top_k(problem.headline_metric, k)))
  out["top_k_change"] = {m: float(joint[m][0] - problem.baseline[m]) for m in problem.metric_names}
  # How sparse the effects are: heads whose single ablation costs at least this much (headline metric).
  change = truth.change[problem.headline_metric]
  scale = abs(problem.baseline[problem.headline_metric]) or 1.0
  out["heads_with_relative_drop_at_least"] = {f"{q:g}": int(np.sum(change <= -q * scale))
                                              for q in (0.02, 0.05, 0.1, 0.2)}
  out["overlap_between_metrics"] = diagnostics.top_k_overlap(truth.ranking[problem.metric_names[0]],
                                                             truth.ranking[problem.metric_names[-1]], k)
  return out


def run_task(engine, cfg: EfficiencyConfig, variants: Sequence[Variant], task_name: str) -> dict[str, Any]:
  """The whole benchmark for one task of a real model."""
  start = time.perf_counter()
  split = dict(num_samples=cfg.num_samples, validation_samples=cfg.validation_samples, seed=cfg.sample_seed,
               data_dir=None)
  task, docs, held_docs = load_task_split(task_name, **split)
  evaluator = Evaluator(engine, task_name, task, docs)
  common = dict(output_dir=cfg.output_dir, num_samples=cfg.num_samples, sample_seed=cfg.sample_seed)
  problem, cache = real_problem(evaluator, cfg.model, part="all", headline_metric=cfg.headline_metric, **common)
  judging, trained_on = None, [evaluator]
  if cfg.validation_samples:
    held_out, _ = real_problem(evaluator.on(held_docs), cfg.model, part="held_out",
                               headline_metric=cfg.headline_metric, **common)
    judging = Judging(held_out, [])
    reserves: list[list] = [[]]
    for name in dict.fromkeys(g for g in cfg.general_tasks if g != task_name):
      g_task, g_docs, g_held = load_task_split(name, **split)
      # Identification documents as the target's are (a task benchmarked as a target shares its cache).
      identification = Evaluator(engine, name, g_task, g_docs)
      parts = [real_problem(e, cfg.model, part=part, headline_metric=g_task.default_metric, **common)[0]
               for e, part in ((identification, "all"), (identification.on(g_held), "held_out"))]
      judging.general.append((name, *parts))
      reserves.append(load_more_docs(g_task, g_docs + g_held, cfg.general_max_samples - cfg.num_samples,
                                     seed=cfg.sample_seed, data_dir=None))
      if g_task.output_type == "loglikelihood":
        trained_on.append(identification)
    # Where a method's selection is confirmed, as a run confirms it (`localization.Localization.measure`).
    judging.in_sample = validate.TaskMeasures(
        [evaluator, *(p.evaluator for _, p, _ in judging.general)],
        [cfg.headline_metric, *(p.headline_metric for _, p, _ in judging.general)], reserves=reserves)
  if problem.objective is not None:
    problem.objective = RetainedProbability(trained_on)
  base = cfg.base_settings(task_name)
  k = cfg.top_k
  power_lines = []
  if judging is not None:  # each general task's power to veto, as a run prints it at its start
    unmeasured = np.zeros((0, problem.num_layers, problem.num_heads), bool)
    for power in confirm.powers(base, judging.in_sample, [measured_on(p, unmeasured) for p in
                                                         (problem, *(p for _, p, _ in judging.general))]):
      if power is not None:
        power_lines.append(decisions.describe_power(task_label(power.task), power.facts()))
        log.info("%s: power to veto: %s", task_name, power_lines[-1])
  log.info("%s: baseline %s; ground truth (one-shot greedy, %d masks)", task_name, problem.baseline,
           problem.num_total)
  truth = one_shot_ground_truth(problem)
  report: dict[str, Any] = {"task": task_name, "model": cfg.model, "num_docs": len(docs),
                            "num_layers": problem.num_layers, "num_heads": problem.num_heads,
                            "headline_metric": cfg.headline_metric, "metrics": problem.metric_names,
                            "baseline": problem.baseline}
  gradient = measure_gradient(problem) if cfg.gradient else {"available": False}
  report["gradient"] = gradient
  report["ground_truth"] = ground_truth_report(problem, truth, k)
  if gradient.get("available"):
    by_gradient = methods.base.rank_by(problem.gradient)
    gradient["spearman_with_greedy"] = {m: diagnostics.spearman(problem.gradient, truth.change[m])
                                        for m in problem.metric_names}
    gradient["top_k"] = names(problem, by_gradient[:k])
    gradient["recall"] = recall(by_gradient, truth.top_k(cfg.headline_metric, k), k)
  if cfg.iterative_greedy:
    report["ground_truth"]["iterative_greedy"] = iterative = iterative_greedy(problem, k)
    iterative["names"] = names(problem, iterative["top_k"])
    iterative["recall_of_one_shot"] = recall(truth.top_k(cfg.headline_metric, k), iterative["top_k"], k)
  records = sweep(problem, variants, base, cfg.budgets, cfg.seeds, k, truth,
                  progress=lambda name: log.info("%s: %s done (%s)", task_name, name, cache.counts()),
                  judging=judging)
  if judging is not None:
    report["held_out"] = {"num_docs": len(held_docs), "baseline": judging.held_out.baseline,
                          "general": {name: {"metric": p.headline_metric, "baseline": p.baseline[p.headline_metric],
                                             "num_docs": len(p.evaluator.docs)} for name, _, p in judging.general},
                          "selection": base.selector.describe(),
                          "decision_rule": confirm.rule(base).describe(), "power_to_veto": power_lines}
  report["records"] = records
  report["summary"] = summarize(records, cfg.headline_metric, k)
  trained = {key: m for key, m in problem.memory.items() if "training_seconds" in m}
  if trained:  # what each trained mask cost, once per seed, in seconds and evaluations (timed in this run)
    report["training"] = {}
    for (name, seed), memory in trained.items():
      seconds = float(memory["training_seconds"])
      report["training"].setdefault(name, {})[str(seed)] = {"seconds": seconds,
                                                             "evaluations": seconds / problem.mask_seconds}
  if cfg.noise_floor:
    halves = []
    for part, subset in (("half0", docs[:len(docs) // 2]), ("half1", docs[len(docs) // 2:2 * (len(docs) // 2)])):
      half, _ = real_problem(Evaluator(engine, task_name, task, subset), cfg.model, part=part,
                             headline_metric=cfg.headline_metric, **common)
      halves.append(one_shot_ground_truth(half))
    report["noise_floor"] = diagnostics.noise_floor(problem, truth, halves, variants, base, cfg, run_settings)
  report["cache"] = cache.counts()
  report["seconds"] = time.perf_counter() - start
  return report


def run_synthetic(cfg: EfficiencyConfig, variants: Sequence[Variant]) -> list[dict[str, Any]]:
  """The sweep on synthetic responses at each size; one simulated task per seed (design seed = seed)."""
  reports = []
  usable = [v for v in variants if not needs_model(v.method)]
  for num_layers, num_heads in cfg.synthetic_sizes:
    start = time.perf_counter()
    n = num_layers * num_heads
    records, split, counts = [], [], []
    for seed in cfg.seeds:
      problem, cache, response = synthetic_problem(num_layers, num_heads, seed, num_planted=cfg.synthetic_planted,
                                                   interaction_scale=cfg.synthetic_interaction_scale,
                                                   headline_metric=cfg.headline_metric,
                                                   num_samples=cfg.num_samples)
      base = cfg.base_settings(problem.name)
      truth = one_shot_ground_truth(problem)
      planted = response.true_top_k(cfg.top_k)
      split.append(diagnostics.top_k_overlap(truth.ranking[cfg.headline_metric], planted, cfg.top_k))
      records += sweep(problem, usable, base, cfg.budgets, [seed], cfg.top_k, truth, planted=planted)
      counts.append(cache.counts())
      log.info("synthetic N=%d seed %d done (%.0f s so far)", n, seed, time.perf_counter() - start)
    reports.append({"task": f"synthetic N={n}", "model": "SyntheticResponse", "num_layers": num_layers,
                    "num_heads": num_heads, "headline_metric": cfg.headline_metric,
                    "metrics": [cfg.headline_metric] + [m for m in ("accuracy", "logprob") if m != cfg.headline_metric],
                    "records": records, "summary": summarize(records, cfg.headline_metric, cfg.top_k),
                    "ground_truth": {"greedy_vs_planted_top_k_overlap": split},
                    "cache": {key: int(sum(c[key] for c in counts)) for key in ("evaluated", "served_from_cache")},
                    "seconds": time.perf_counter() - start})
  return reports


def run(cfg: EfficiencyConfig, *, synthetic: bool, engine_factory: Callable[[], Any] | None = None
        ) -> dict[str, Any]:
  """The benchmark: synthetic sizes, or each task of cfg.model through the engine engine_factory() builds."""
  if not cfg.methods:
    cfg = dataclasses.replace(cfg, methods=default_variants(synthetic))
  variants = cfg.check()
  start = time.perf_counter()
  if synthetic:
    skipped = [v.name for v in variants if needs_model(v.method)]
    if skipped:
      log.info("synthetic mode has no model to differentiate: skipping %s", ", ".join(skipped))
    tasks = run_synthetic(cfg, variants)
  else:
    if not cfg.tasks:
      raise UserError("--tasks must name at least one task")
    engine = engine_factory()
    tasks = [run_task(engine, cfg, variants, name) for name in cfg.tasks]
  return {"mode": "synthetic" if synthetic else "model", "config": dataclasses.asdict(cfg), "tasks": tasks,
          "seconds": time.perf_counter() - start}
