"""A localization run end to end: measure (resumably), solve, rank, validate, write the outputs.

Outputs in `output_dir` (contract, ARCHITECTURE.md): `measurements.npz`, `heads.json`,
`coefficients.npy` [layers, heads], and after validation `ablation.json`; `jaxloc.report` draws
`heatmap.png` and `ablation_curve.png` from them.

Axes: `masks` M, `layers` L, `heads` H, N = L * H flattened (flat = layer * H + head).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from jaxloc.errors import UserError
from jaxloc.heads import head_name, parse_heads
from jaxloc.localize import methods, solver, validate
from jaxloc.localize.measurements import MeasurementStore, write_json
from jaxloc.tasks import evaluation
from jaxloc.tasks.loglikelihood import MultipleChoiceTask, choice_layout
from jaxloc.tasks.registry import get_task

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LocalizeSettings:
  """Everything a run depends on (flags of `experiments.localize`)."""

  model: str
  task: str
  output_dir: str
  method: str = "cs_stratified"
  task_options: dict = dataclasses.field(default_factory=dict)
  num_masks: int = 300
  ablation_rate: float = 0.1
  num_samples: int | None = 100
  metric: str | None = None
  lasso_alpha: str = "cv"
  standardize: bool = True
  nonpositive: bool = False
  top_k: int = 5
  exclude_heads: list = dataclasses.field(default_factory=list)
  seed: int = 0
  data_dir: str | None = None
  ablation: str = "zero"
  check_sklearn: bool = False
  validate: bool = True
  general_tasks: list = dataclasses.field(default_factory=list)
  general_samples: int | None = 100
  universal_threshold: float = 0.5
  universal_candidates: int = 10
  solver_dtype: str = "float64"
  screen_fraction: float = 0.5

  def measurement_settings(self) -> dict[str, Any]:
    """The settings that make the measurements what they are; a resume must match them all."""
    keys = ["model", "task", "task_options", "method", "num_samples", "seed", "exclude_heads", "ablation",
            "data_dir"]
    if self.method.startswith("cs_"):
      keys += ["num_masks", "ablation_rate"]
    if self.method == "greedy":
      keys += ["top_k"]
    if self.method == "gradient_confirm":
      keys += ["num_masks"]
    if self.method == "two_stage":
      keys += ["num_masks", "ablation_rate", "screen_fraction"]
    return {k: getattr(self, k) for k in keys}

  def check(self) -> None:
    if self.method not in methods.METHODS:
      raise UserError(f"unknown --method={self.method}; valid: {', '.join(methods.METHODS)}")
    if self.method.startswith("cs_"):
      if self.num_masks < 2:
        raise UserError(f"--num_masks={self.num_masks} must be ≥ 2 for compressed sensing")
      if not 0 < self.ablation_rate < 1:
        raise UserError(f"--ablation_rate={self.ablation_rate} must be in (0, 1)")
    if self.method == "two_stage":
      if self.num_masks < 3:
        raise UserError(f"--num_masks={self.num_masks} must be ≥ 3 for two_stage (a screen of ≥ 2 masks and "
                        "≥ 1 confirmation)")
      if not 0 < self.screen_fraction < 1:
        raise UserError(f"--screen_fraction={self.screen_fraction} must be in (0, 1)")
      if not 0 < self.ablation_rate < 1:
        raise UserError(f"--ablation_rate={self.ablation_rate} must be in (0, 1)")
    if self.method == "gradient_confirm" and self.num_masks < 1:
      raise UserError(f"--num_masks={self.num_masks} (heads confirmed) must be ≥ 1 for gradient_confirm")
    if self.top_k < 1:
      raise UserError(f"--top_k={self.top_k} must be ≥ 1")
    if self.lasso_alpha != "cv":
      try:
        alpha = float(self.lasso_alpha)
      except ValueError:
        raise UserError(f"--lasso_alpha={self.lasso_alpha!r} must be 'cv' or a number ≥ 0") from None
      if alpha < 0:
        raise UserError(f"--lasso_alpha={self.lasso_alpha} must be ≥ 0")
    if self.ablation not in ("zero", "mean"):
      raise UserError(f"--ablation={self.ablation} must be zero or mean")
    if self.solver_dtype not in ("float32", "float64"):
      raise UserError(f"--solver_dtype={self.solver_dtype} must be float32 or float64")
    if not 0 < self.universal_threshold <= 1:
      raise UserError(f"--universal_threshold={self.universal_threshold} must be in (0, 1]")


def _eval_set(engine, name: str, options: dict, num_samples, seed: int, data_dir, ablation: str
              ) -> validate.EvalSet:
  task = get_task(name, **options)
  docs = task.load_docs(num_samples=num_samples, seed=seed, data_dir=data_dir)
  fill = evaluation.mean_ablation_values(engine, task, docs) if ablation == "mean" else None
  return validate.EvalSet(name, task, docs, fill)


GRADIENT = "gradient.npy"


def _gradient_change(engine, output_dir: str, target: validate.EvalSet) -> np.ndarray:
  """[N] first-order score change of ablating each head: -d(log-probability)/d(keep mask) at the
  unablated model, one backward pass. Saved in output_dir so that a resumed run confirms the same
  candidates (a recomputed gradient could reorder near-ties)."""
  path = os.path.join(output_dir, GRADIENT)
  if os.path.exists(path):
    return np.load(path)
  task = target.task
  if task.output_type != "loglikelihood":
    raise UserError(f"--method=gradient_confirm needs a scored (loglikelihood) task; {target.name} is a "
                    "generation task: use cs_stratified or one_shot_greedy")
  requests = task.requests(target.docs, engine.tokenizer)
  weights = None
  if isinstance(task, MultipleChoiceTask):
    # The gold choice's log-likelihood, averaged over docs: the choices compete, their sum does not.
    request_index, _, gold = choice_layout(target.docs)
    weights = np.zeros(len(requests))
    weights[request_index[np.arange(len(gold)), gold]] = 1.0 / len(gold)
  change = -np.asarray(engine.mask_gradient(requests, weights, head_fill=target.head_fill), np.float64).reshape(-1)
  tmp = path + ".tmp.npy"
  np.save(tmp, change)
  os.replace(tmp, path)
  return change


def _tie_breaks(store: MeasurementStore) -> list[np.ndarray]:
  """Score changes [M] in the task's other metrics: they break exact ties of the metric (frequent for 0/1
  accuracy), for the greedy methods' choices and rankings alike."""
  return [store.metrics[m] - store.baselines[m] for m in sorted(store.metrics)
          if m != store.metric and m in store.baselines]


def measure(engine, store: MeasurementStore, source: methods.MaskSource, target: validate.EvalSet,
            progress: bool = True) -> None:
  """Measures what `source` asks for, saving after every engine batch; resumes from `store`."""
  total = source.expected_total()
  bar = tqdm(total=total, initial=min(len(store), total), desc=f"measuring {target.name}", unit="mask",
             disable=not progress, dynamic_ncols=True)
  try:
    while (todo := source.next_masks(store.masks, store.scores, _tie_breaks(store))) is not None:
      keep = (~todo).astype(np.float32)
      for where, metrics in evaluation.run_batches(engine, target.task, target.docs, keep,
                                                   head_fill=target.head_fill):
        store.append(todo[where], metrics)
        bar.update(where.stop - where.start)
        bar.set_postfix({store.metric: f"{float(np.mean(metrics[store.metric])):.3f}"})
  finally:
    bar.close()


GREEDY_LIKE = ("greedy", "one_shot_greedy", "gradient_confirm", "two_stage")
SCREEN_RANKING = "screen_ranking.npy"


def lasso(settings: LocalizeSettings, masks: np.ndarray, scores: np.ndarray, metric: str
          ) -> tuple[np.ndarray, dict[str, Any]]:
  """(coefficients [N], solver facts) of the Lasso of `scores` [M] on the ablation design `masks` [M, L, H]."""
  # float64 by default: the Lasso is tiny next to the measurements, float64 FISTA converges in fewer steps
  # than float32 (which stalls at ~1e-5 relative) and matches scikit-learn to ~1e-12.
  float64 = settings.solver_dtype == "float64"
  np_dtype = np.float64 if float64 else np.float32
  X = masks.reshape(len(masks), -1).astype(np_dtype)
  y = scores.astype(np_dtype)
  if np.ptp(y) == 0:
    raise UserError(f"every mask scored {y[0]:.4g} on {metric}: nothing to localize (is the task "
                    "too hard or too easy for this model? try --metric=logprob or another task)")
  options = dict(standardize=settings.standardize, nonpositive=settings.nonpositive)
  facts: dict[str, Any] = {"standardize": settings.standardize, "nonpositive": settings.nonpositive,
                           "dtype": settings.solver_dtype}
  with jax.enable_x64(float64):
    dtype = jnp.float64 if float64 else jnp.float32
    if settings.lasso_alpha == "cv":
      folds = min(5, len(masks))
      cv = solver.lasso_cv(X, y, num_folds=folds, seed=settings.seed, dtype=dtype, **options)
      fit = cv.fit
      facts.update(lasso_alpha=float(fit.alpha), alpha_selection=f"{folds}-fold cross-validation",
                   alpha_at_grid_edge=bool(int(cv.best_index) in (0, len(cv.alphas) - 1)))
      if facts["alpha_at_grid_edge"]:
        log.warning("cross-validation chose alpha %.3g at the edge of its grid: the ranking may be unreliable "
                    "(measure more masks, or fix --lasso_alpha)", float(fit.alpha))
    else:
      fit = solver.fit_lasso(X, y, float(settings.lasso_alpha), dtype=dtype, **options)
      facts.update(lasso_alpha=float(settings.lasso_alpha), alpha_selection="fixed")
    coef = np.asarray(fit.coef, np.float64)
    facts.update(intercept=float(fit.intercept), converged=bool(fit.converged), iterations=int(fit.iterations),
                 nonzero=int(np.count_nonzero(coef)))
    if settings.check_sklearn:
      facts["sklearn_max_abs_diff"] = float(solver.check_against_sklearn(X, y, float(fit.alpha), result=fit,
                                                                          **options))
  return coef, facts


def _screen_ranker(settings: LocalizeSettings, metric: str):
  """two_stage's screen ranking: (ranking [N], solver facts) of the Lasso on the screen masks. The ranking
  is saved in output_dir so that a resumed run confirms the same candidates (a re-solve could reorder
  near-ties)."""
  path = os.path.join(settings.output_dir, SCREEN_RANKING)

  def rank(masks: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    if os.path.exists(path):
      return np.load(path), {"loaded_from": SCREEN_RANKING}
    coef, facts = lasso(settings, masks, scores, metric)
    ranking = solver.rank_heads(coef)
    tmp = path + ".tmp.npy"
    np.save(tmp, ranking)
    os.replace(tmp, path)
    return ranking, facts

  return rank


def solve(settings: LocalizeSettings, store: MeasurementStore, source, num_layers: int, num_heads: int
          ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
  """(ranking [N], per-head values [N], solver facts) from the measurements."""
  masks, scores, baseline = store.masks, store.scores, store.baseline
  if settings.method in GREEDY_LIKE:
    ranking, values = methods.greedy_result(source, settings.method, masks, scores, baseline, _tie_breaks(store))
    facts = {}
    if settings.method == "gradient_confirm":
      facts = {"screen": "mask gradient of the task's log-probability at the unablated model",
               "confirmed_heads": int(len(masks)), "unconfirmed_score": "0 (not measured)"}
    if settings.method == "two_stage":
      facts = {"screen": f"Lasso on {len(source.screen)} stratified masks", "screen_masks": len(source.screen),
               "confirmed_heads": int(source.num_confirm), "unconfirmed_score": "0 (not measured)",
               "screen_solver": source.screen_facts}
    return ranking, values, facts
  coef, facts = lasso(settings, masks, scores, store.metric)
  return solver.rank_heads(coef), coef, facts


def localize(engine, settings: LocalizeSettings, *, progress: bool = True) -> dict[str, Any]:
  """Runs (or resumes) a localization and writes its outputs; returns the heads.json payload."""
  settings.check()
  timing: dict[str, float] = {}
  start = time.perf_counter()
  c = engine.config
  exclude = parse_heads(settings.exclude_heads, c.num_layers, c.num_heads)
  exclude_names = [head_name(*h) for h in exclude]
  settings.exclude_heads = exclude_names
  target = _eval_set(engine, settings.task, settings.task_options, settings.num_samples, settings.seed,
                     settings.data_dir, settings.ablation)
  metric = settings.metric or target.task.default_metric
  if metric not in target.task.metric_names:
    raise UserError(f"--metric={metric} is not a metric of {settings.task}; it has "
                    f"{', '.join(target.task.metric_names)}")
  store = MeasurementStore(settings.output_dir, settings.measurement_settings(), metric, c.num_layers,
                           c.num_heads)
  resumed = len(store)
  if store.baseline is None:
    baseline = evaluation.run(engine, target.task, target.docs, np.ones((1, c.num_layers, c.num_heads), np.float32))
    store.set_baseline({k: float(v[0]) for k, v in baseline.items()})
  log.info("%s baseline %s = %.4f (%d samples)%s", settings.task, metric, store.baseline, len(target.docs),
           f"; resuming after {resumed} saved masks" if resumed else "")
  timing["setup_seconds"] = time.perf_counter() - start
  gradient_change = None
  if settings.method == "gradient_confirm":
    t = time.perf_counter()
    gradient_change = _gradient_change(engine, settings.output_dir, target)
    timing["gradient_seconds"] = time.perf_counter() - t
  source = methods.make_source(settings.method, c.num_layers, c.num_heads, num_masks=settings.num_masks,
                               ablation_rate=settings.ablation_rate, seed=settings.seed, exclude=exclude_names,
                               rounds=settings.top_k, gradient_change=gradient_change,
                               screen_fraction=settings.screen_fraction,
                               rank_screen=_screen_ranker(settings, metric))
  t = time.perf_counter()
  measure(engine, store, source, target, progress)
  timing["measure_seconds"] = time.perf_counter() - t
  timing["measured_this_run"] = len(store) - resumed
  if timing["measured_this_run"]:
    timing["seconds_per_mask"] = timing["measure_seconds"] / timing["measured_this_run"]

  t = time.perf_counter()
  ranking, values, facts = solve(settings, store, source, c.num_layers, c.num_heads)
  timing["solve_seconds"] = time.perf_counter() - t
  coefficients = values.reshape(c.num_layers, c.num_heads)
  np.save(os.path.join(settings.output_dir, "coefficients.npy"), coefficients)
  excluded_flat = {layer * c.num_heads + head for layer, head in exclude}
  ranking = [int(h) for h in ranking if int(h) not in excluded_flat]

  universal: list[int] = []
  ablation: dict[str, Any] | None = None
  if settings.validate:
    t = time.perf_counter()
    general = [_eval_set(engine, name, {}, settings.general_samples, settings.seed, settings.data_dir,
                         settings.ablation) for name in settings.general_tasks if name != settings.task]
    candidates = ranking[:settings.universal_candidates]
    universal, universal_detail = validate.find_universal_heads(engine, candidates, target, general,
                                                                settings.universal_threshold)
    filtered = [h for h in ranking if h not in universal]
    ablation = validate.ablation_curve(engine, filtered, settings.top_k, target, general)
    ablation.update(universal_heads=[head_name(*divmod(h, c.num_heads)) for h in universal],
                    universal_threshold=settings.universal_threshold, single_head_drops=universal_detail,
                    metric=metric)
    write_json(os.path.join(settings.output_dir, "ablation.json"), ablation)
    timing["validate_seconds"] = time.perf_counter() - t
  timing["total_seconds"] = time.perf_counter() - start

  # Every head, most important first; universal heads (filtered from the top-k) and excluded heads last.
  ordered = [h for h in ranking if h not in universal] + universal + sorted(excluded_flat)
  heads = [{"name": head_name(*divmod(h, c.num_heads)), "layer": h // c.num_heads, "head": h % c.num_heads,
            "score": float(values[h])} for h in ordered]
  payload = {
      "model": settings.model, "task": settings.task, "method": settings.method, "metric": metric,
      "num_layers": c.num_layers, "num_heads": c.num_heads, "num_evaluations": len(store),
      "baseline": store.baseline, "heads": heads,
      "top_k": [h["name"] for h in heads[:settings.top_k]],
      "universal_heads": [head_name(*divmod(h, c.num_heads)) for h in universal],
      "solver": facts, "flags": dataclasses.asdict(settings), "timing": timing,
  }
  write_json(os.path.join(settings.output_dir, "heads.json"), payload)
  return payload
