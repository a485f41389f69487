"""A localization run end to end: measure every task under the same masks (resumably), rank, select, find the
universal heads, validate on held-out documents, bootstrap the confidence, write the outputs.

The units are attention heads, or with `--unit=neurons` MLP neurons: only the layout changes (units per layer,
their names, `neurons.json` for `heads.json`); below, "heads" stands for either.

Outputs in `output_dir` (a contract users and scripts rely on): `measurements.npz` (the target's), `heads.json` (or
`neurons.json`), `coefficients.npy` [layers, units], and after validation `ablation.json`; each general task's measurements
under the same masks in `general/<task>/measurements.npz` (same contract); `jaxloc.report` draws the plots.
The runner drives the method through its plan (`methods.base`) and never asks which method it runs.

Documents: every task has identification documents (the design is scored on them) and, when validating,
held-out documents disjoint from them (`--validation_samples`); every reported drop is held out unless
labelled in-sample.

Axes: `masks` M, `layers` L, `heads` H, N = L * H flattened (flat = layer * H + head).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.heads import parse_units, run_file, singular, unit_name, units_per_layer
from jaxloc.localize import aliasing, confidence, confirm, designs, methods, specificity, validate
from jaxloc.localize.measurements import MeasurementStore
from jaxloc.localize.methods.base import SCORED_GENERAL_TASKS, SCORED_TARGET
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.tasks.names import task_label
from jaxloc.tasks.evaluation import Evaluator, RetainedProbability, load_task_split

log = logging.getLogger(__name__)

# Masks scored on every task before the next ones: a resumed run re-measures at most this many.
MASKS_PER_ROUND = 64


@dataclasses.dataclass
class TaskDocs:
  """A task with its identification and held-out documents, loaded before the model (`load_tasks`)."""

  name: str
  task: Any
  docs: list
  held_out: list
  metric: str


@dataclasses.dataclass
class Tasks:
  target: TaskDocs
  general: list[TaskDocs]

  @property
  def all(self) -> list[TaskDocs]:
    return [self.target, *self.general]


def load_tasks(settings: LocalizeSettings) -> Tasks:
  """Checks the settings and loads every task the run needs, so that an unknown task or metric, a missing
  dataset, too few documents for held-out validation or bad method options are reported before the model
  loads."""
  settings.check()
  held_out = settings.validation_samples if settings.validate else 0
  task, docs, held = load_task_split(settings.task, settings.task_options, num_samples=settings.num_samples,
                                     validation_samples=held_out, seed=settings.seed, data_dir=settings.data_dir)
  metric = settings.metric or task.default_metric
  if metric not in task.metric_names:
    why = (" per document (it is aggregated over the whole document set)" if metric in task.aggregate_metric_names
           else "")
    raise UserError(f"--metric={metric} is not a metric of {settings.task}{why}; localization can target "
                    f"{', '.join(task.metric_names) or 'none of its metrics'}")
  method = methods.get(settings.method)
  if SCORED_TARGET in method.needs and task.output_type != "loglikelihood":
    raise UserError(f"--method={settings.method} needs a scored (loglikelihood) task; {settings.task} is a "
                    f"generation task: use {_methods_without(SCORED_TARGET, settings.unit)}")
  general = []
  for name in dict.fromkeys(settings.general_tasks):
    if name != settings.task:
      g_task, g_docs, g_held = load_task_split(name, {}, num_samples=settings.general_samples,
                                               validation_samples=held_out, seed=settings.seed,
                                               data_dir=settings.data_dir)
      if SCORED_GENERAL_TASKS in method.needs and g_task.output_type != "loglikelihood":
        raise UserError(f"--method={settings.method} needs every general task scored (loglikelihood); general task "
                        f"{name} is a generation task: leave it out of --general_tasks or use "
                        f"{_methods_without(SCORED_GENERAL_TASKS, settings.unit)}")
      general.append(TaskDocs(name, g_task, g_docs, g_held, g_task.default_metric))
  return Tasks(TaskDocs(settings.task, task, docs, held, metric), general)


def _methods_without(need: str, unit: str) -> str:
  """The methods for `unit` that do without `need`."""
  return ", ".join(name for name in methods.names_for(unit) if need not in methods.get(name).needs)


@dataclasses.dataclass
class Measuring:
  """One task's measurements under the design and the evaluator that adds to them."""

  store: MeasurementStore
  evaluator: Evaluator


def measure(plan: methods.Plan, target: Measuring, general: list[Measuring], progress: bool = True) -> None:
  """Measures what `plan` asks for on the target and every general task (the same masks, MASKS_PER_ROUND at a
  time), saving after every engine batch; resumes from the stores (a general task that fell behind catches up
  first)."""
  tasks = [target, *general]
  total = plan.expected_total() * len(tasks)
  bar = tqdm(total=total, initial=min(sum(len(t.store) for t in tasks), total), unit="task·mask",
             desc=f"measuring {task_label(target.evaluator.name)}" + (f" +{len(general)} general" if general else ""),
             disable=not progress, dynamic_ncols=True)

  def score(task: Measuring, masks: np.ndarray) -> None:
    for where, metrics in task.evaluator.batches((~masks).astype(np.float32), per_doc=True):
      task.store.append(masks[where], metrics)
      bar.update(where.stop - where.start)
      bar.set_postfix({task_label(task.evaluator.name): f"{float(np.mean(metrics[task.store.metric])):.3f}"})

  try:
    for task in general:
      n = len(task.store)
      if n > len(target.store) or not np.array_equal(task.store.masks, target.store.masks[:n]):
        raise UserError(f"{task.store.path} does not hold the masks of {target.store.path}; move "
                        f"{task.store.output_dir} away to re-measure {task.evaluator.name}")
      if n < len(target.store):
        score(task, target.store.masks[n:])
    def score_every_task(masks: np.ndarray) -> None:
      for task in tasks:
        score(task, masks)

    methods.drive(plan, target.store, score_every_task, chunk=MASKS_PER_ROUND)
  finally:
    bar.close()


@dataclasses.dataclass
class Found:
  """What the run concluded from its measurements (flat head indices)."""

  ranking: methods.Ranking  # the target's
  general_rankings: list[methods.Ranking]
  effects: specificity.Effects
  order: list[int]  # the target's ranking without excluded heads
  candidates: list[int]  # flagged universal by the estimates
  universal: list[int]  # confirmed
  selected: list[int]  # max(curve_k, top_k) heads, in order
  alone: dict[int, np.ndarray]  # head -> relative drop per task ablated alone, on the confirming documents
  confirmation: confirm.Confirmation | None = None  # --selection=specific: the selection measured alone


def localize(engine, settings: LocalizeSettings, tasks: Tasks | None = None, *, progress: bool = True
             ) -> dict[str, Any]:
  """Runs (or resumes) a localization and writes its outputs; returns the heads.json (neurons.json) payload."""
  tasks = tasks or load_tasks(settings)
  method = methods.get(settings.method)
  timing: dict[str, float] = {}
  start = time.perf_counter()
  compiled_before, compile_before = engine.compile_count, dataclasses.replace(engine.compile_time)
  c = engine.model_config
  unit = settings.unit
  per_layer = units_per_layer(c, unit)
  exclude = parse_units(settings.exclude_heads, c.num_layers, per_layer, unit)
  settings.exclude_heads = [unit_name(*h, unit) for h in exclude]
  excluded = designs.excluded_heads(settings.exclude_heads, c.num_layers * per_layer, num_heads=per_layer, unit=unit)

  identification = [Evaluator.build(engine, t.name, t.task, t.docs, settings.ablation, unit) for t in tasks.all]
  measuring = _open_stores(settings, method, tasks, identification, (c.num_layers, per_layer))
  resumed = len(measuring[0].store)
  log.info("%s baseline %s = %.4f (%d samples)%s", settings.task, measuring[0].store.metric,
           measuring[0].store.baseline, len(tasks.target.docs),
           f"; resuming after {resumed} saved masks" if resumed else "")
  timing["setup_seconds"] = time.perf_counter() - start

  def gradient() -> np.ndarray:
    t = time.perf_counter()
    change = identification[0].first_order_change()
    timing["gradient_seconds"] = time.perf_counter() - t
    return change

  def attribution(steps: int) -> np.ndarray:
    t = time.perf_counter()
    scores = identification[0].attribution(steps, progress)
    timing["attribution_seconds"] = time.perf_counter() - t
    return scores

  objective = RetainedProbability(identification)
  context = methods.Context(c.num_layers, per_layer, excluded, gradient, objective, directory=settings.output_dir,
                            attribution=attribution)
  plan = method.plan(settings, context)
  t = time.perf_counter()
  measure(plan, measuring[0], measuring[1:], progress)
  timing["measure_seconds"] = time.perf_counter() - t
  timing["measured_this_run"] = len(measuring[0].store) - resumed
  if timing["measured_this_run"]:
    timing["seconds_per_mask"] = timing["measure_seconds"] / timing["measured_this_run"]
  if objective.seconds:
    # Training time in the unit of the other methods' cost: masks scored on every task, timed in this run.
    timing["training_seconds"] = objective.seconds
    if "seconds_per_mask" in timing:
      timing["training_mask_evaluations"] = objective.seconds / timing["seconds_per_mask"]

  design = _design(measuring[0].store.masks, excluded)
  if design is not None and design.warning():
    log.warning("%s", design.warning())

  t = time.perf_counter()
  ranking = plan.rank(measuring[0].store)
  general_rankings = [specificity.estimate(plan, m.store) for m in measuring[1:]]
  timing["solve_seconds"] = time.perf_counter() - t
  files.save_array(os.path.join(settings.output_dir, "coefficients.npy"),
                   ranking.values.reshape(c.num_layers, per_layer))

  # Universal heads and single-head checks are measured on documents the design never saw (held out; the
  # identification documents when not validating).
  t = time.perf_counter()
  metrics = [m.store.metric for m in measuring]
  in_sample = validate.Scorer(identification, metrics)
  confirming = in_sample
  if settings.validate:
    confirming = validate.Scorer([e.on(td.held_out)
                                  for e, td in zip(identification, tasks.all)], metrics)
  found = _find_heads(settings, ranking, general_rankings, measuring, excluded, confirming, in_sample, design)
  if settings.validate:
    _validate(settings, found, confirming, in_sample)
  timing["validate_seconds"] = time.perf_counter() - t

  t = time.perf_counter()
  conf = _confidence(settings, method, context, found, measuring, excluded, progress)
  timing["bootstrap_seconds"] = time.perf_counter() - t
  timing["total_seconds"] = time.perf_counter() - start

  payload = _heads_json(settings, per_layer, found, excluded, conf, measuring, confirming)
  payload.update(num_layers=c.num_layers, timing=timing,
                 design=None if design is None else design.facts(lambda h: unit_name(*divmod(int(h), per_layer), unit)),
                 engine={"compilations": engine.compile_count - compiled_before,
                         # tracing, lowering and XLA compiling (or reading a persistent-cache hit back), in seconds
                         "compile_seconds": engine.compile_time.seconds - compile_before.seconds,
                         "xla_compile_seconds": engine.compile_time.backend_seconds - compile_before.backend_seconds,
                         "compile_cache_hits": engine.compile_time.cache_hits - compile_before.cache_hits,
                         "seconds_per_mask": timing.get("seconds_per_mask"), "dtype": np.dtype(engine.model.dtype).name,
                         "activation_dtype": np.dtype(engine.dtype).name,
                         "devices": engine.mesh.size, "processes": jax.process_count()})
  files.write_json(os.path.join(settings.output_dir, run_file(unit)), payload)
  return payload


def _design(masks: np.ndarray, excluded: np.ndarray) -> aliasing.DesignDiagnostics | None:
  """The diagnostics of the run's random design: the measured masks that ablate two or more units (a method's
  single-unit measurements are no design); None when there are none."""
  rows = masks.reshape(len(masks), int(np.prod(masks.shape[1:]))).sum(axis=1) > 1
  return aliasing.diagnose(masks[rows], excluded) if rows.any() else None


def _open_stores(settings: LocalizeSettings, method, tasks: Tasks, identification: list[Evaluator], shape
                 ) -> list[Measuring]:
  """The target's store in output_dir and each general task's in general/<task>/, baselines measured."""
  measuring = []
  for t, evaluator in zip(tasks.all, identification):
    is_target = t is tasks.target
    directory = settings.output_dir if is_target else os.path.join(settings.output_dir, "general", task_label(t.name))
    measurement_settings = {**settings.shared_measurement_settings(), **method.measurement_settings(settings)}
    if not is_target:
      measurement_settings.update(task=t.name, task_options={}, num_samples=settings.general_samples)
    store = MeasurementStore(directory, measurement_settings, t.metric, *shape)
    if store.baseline is None:
      baseline = evaluator.run(np.ones((1, *shape), np.float32), per_doc=True)
      store.set_baseline({k: v[0] for k, v in baseline.items()})
    measuring.append(Measuring(store, evaluator))
  return measuring


def _find_heads(settings: LocalizeSettings, ranking, general_rankings, measuring: list[Measuring],
                excluded: np.ndarray, confirming: validate.Scorer, identification: validate.Scorer,
                design: aliasing.DesignDiagnostics | None) -> Found:
  """Estimated effects per task, universal heads (flagged, then confirmed alone) and the selection (with general
  tasks and --selection=specific, confirmed by single-head measurements: `confirm`)."""
  effects = specificity.Effects(
      [m.evaluator.name for m in measuring],
      np.stack([specificity.relative_drops(r, m.store.baseline)
                for r, m in zip([ranking, *general_rankings], measuring)]))
  order = [int(h) for h in ranking.order if not excluded[h]]
  candidates = specificity.universal_candidates(effects, order, excluded, settings.universal_threshold,
                                                settings.universal_min_tasks, settings.universal_candidates)
  count = max(settings.curve_k, settings.top_k)

  def select(universal):
    return specificity.select(order, effects, excluded, universal, settings.selection,
                              settings.specific_max_general_drop, count)

  # One batch of single-head ablations for the candidates and the first --curve_k heads selected if none is
  # universal, then any of the first --curve_k the final selection adds (a neuron selection of hundreds is
  # checked alone only at its head).
  first = list(dict.fromkeys(candidates + select([])[:settings.curve_k]))
  alone = dict(zip(first, validate.single_head_drops(first, confirming)))
  universal = [h for h in candidates
               if specificity.breaks(alone[h], settings.universal_threshold, settings.universal_min_tasks)]
  selected = select(universal)
  confirmation = None
  if settings.selection == "specific" and len(measuring) > 1:
    selected, confirmation = _confirm(settings, order, universal, measuring, identification, design, selected)
  missing = [h for h in selected[:settings.curve_k] if h not in alone]
  alone.update(zip(missing, validate.single_head_drops(missing, confirming)))
  if len(selected) < settings.top_k:
    log.warning("only %d %s qualify under --selection=%s (try --selection=raw or a larger "
                "--specific_max_general_drop)", len(selected), settings.unit, settings.selection)
  return Found(ranking, general_rankings, effects, order, candidates, universal, selected, alone, confirmation)


def _confirm(settings: LocalizeSettings, order: list[int], universal: list[int], measuring: list[Measuring],
             identification: validate.Scorer, design: aliasing.DesignDiagnostics | None, estimated: list[int]
             ) -> tuple[list[int], confirm.Confirmation]:
  """The specific selection confirmed by measurement (`confirm`). A heads selection is confirmed whole; a neuron
  selection of hundreds is confirmed at its head (--curve_k) and continues with the estimated selection."""
  stores = [m.store for m in measuring]
  known = confirm.measured_alone(stores[0].masks, [s.scores for s in stores], [s.baseline for s in stores])
  count = max(settings.curve_k, settings.top_k) if settings.unit == "heads" else settings.curve_k
  limit = settings.specific_max_general_drop
  passes = lambda drops: bool(np.all(np.nan_to_num(drops[1:], nan=0.0) <= limit))  # noqa: E731
  selected, confirmation = confirm.confirm([h for h in order if h not in set(universal)], count, passes, known,
                                           identification, design.group_of if design else lambda h: [h],
                                           settings.output_dir)
  rest = [h for h in estimated if h not in set(selected) | set(confirmation.rejected)]
  return (selected + rest)[:max(settings.curve_k, settings.top_k)], confirmation


def _validate(settings: LocalizeSettings, found: Found, held_out: validate.Scorer, identification: validate.Scorer
              ) -> None:
  """ablation.json: the selected heads ablated together on held-out documents (and in-sample, labelled), the
  specificity curves of the selection and of the raw ranking, the held-out single-head drops."""
  unit, name = held_out.unit, held_out.name
  top = found.selected[:settings.top_k]
  curve = validate.ablation_curve(found.selected, max(settings.curve_k, len(top)), held_out, also=[len(top)])
  in_sample = validate.ablation_curve(top, len(top), identification)
  ablation: dict[str, Any] = {
      "metric": held_out.metrics[0], "selection": settings.selection, "unit": unit, unit: [name(h) for h in top],
      "held_out": validate.drops_at(curve, len(top)),
      "in_sample": validate.drops_at(in_sample, len(top)),
      "specificity_curve": curve,
      f"single_{singular(unit)}_drops": {name(h): {task_label(e.name): float(d)
                                                  for e, d in zip(held_out.eval_sets, drops)}
                                         for h, drops in found.alone.items()},
      f"universal_{unit}": [name(h) for h in found.universal],
  }
  if settings.selection != "raw":
    raw = specificity.select(found.order, found.effects, np.zeros(len(found.ranking.values), bool), found.universal,
                             "raw", 0.0, settings.curve_k)
    ablation["raw_specificity_curve"] = validate.ablation_curve(raw, max(settings.curve_k, len(top)), held_out,
                                                                also=[len(top)])
  files.write_json(os.path.join(settings.output_dir, "ablation.json"), ablation)


def _confidence(settings: LocalizeSettings, method, context: methods.Context, found: Found,
                measuring: list[Measuring], excluded: np.ndarray, progress: bool) -> confidence.Confidence | None:
  """The bootstrap: every task re-estimated on resampled measurements, the run's selection re-run (its
  universal heads kept)."""
  plans = [method.bootstrap_plan(settings, context, r) for r in [found.ranking, *found.general_rankings]]

  def select(rankings):
    drops = np.stack([specificity.relative_drops(r, m.store.baseline) for r, m in zip(rankings, measuring)])
    return specificity.select([h for h in rankings[0].order if not excluded[h]],
                              specificity.Effects(found.effects.tasks, drops), excluded, found.universal,
                              settings.selection, settings.specific_max_general_drop, settings.top_k)

  return confidence.bootstrap(plans, [m.store for m in measuring], select, settings.top_k, settings.bootstrap,
                              settings.seed, progress)


def _heads_json(settings: LocalizeSettings, per_layer: int, found: Found, excluded: np.ndarray,
                conf: confidence.Confidence | None, measuring: list[Measuring], confirming: validate.Scorer
                ) -> dict[str, Any]:
  unit = settings.unit
  one = singular(unit)
  name = lambda h: unit_name(*divmod(int(h), per_layer), unit)  # noqa: E731
  split = "held_out" if settings.validate else "in_sample"
  # Every unit: the selection first (in order), then the other ranked units, universal and excluded units last.
  chosen = set(found.selected) | set(found.universal)
  ordered = (found.selected + [h for h in found.order if h not in chosen] + found.universal
             + np.flatnonzero(excluded).tolist())
  units = []
  for h in ordered:
    entry = {"name": name(h), "layer": h // per_layer, one: h % per_layer, "score": float(found.ranking.values[h]),
             "estimated_relative_drop": {task_label(k): v for k, v in found.effects.of(h).items()}}
    if conf is not None:
      entry.update(selection_frequency=float(conf.selection_frequency[h]),
                   interval=[float(conf.low[h]), float(conf.high[h])])
    if h in found.alone:
      entry[f"{split}_single_{one}_drop"] = {task_label(e.name): float(d)
                                             for e, d in zip(confirming.eval_sets, found.alone[h])}
    units.append(entry)
  target = measuring[0].store
  return {
      "model": settings.model, "task": settings.task, "method": settings.method, "metric": target.metric,
      "unit": unit, f"num_{unit}": per_layer,
      "num_evaluations": len(target) + (len(found.confirmation.measured) if found.confirmation else 0),
      "baseline": target.baseline,
      "num_docs": len(measuring[0].evaluator.docs), unit: units,
      "confirmation": None if found.confirmation is None else found.confirmation.facts(
          name, [task_label(m.evaluator.name) for m in measuring], settings.specific_max_general_drop),
      "top_k": [name(h) for h in found.selected[:settings.top_k]],
      "selection": specificity.selection_rule(settings.selection, settings.specific_max_general_drop),
      f"universal_{unit}": [name(h) for h in found.universal],
      "universal": {"rule": specificity.universal_rule(settings.universal_threshold, settings.universal_min_tasks),
                    "threshold": settings.universal_threshold, "min_tasks": settings.universal_min_tasks,
                    "confirmed_on": split, "candidates": [name(h) for h in found.candidates]},
      "general_tasks": {task_label(m.evaluator.name): {"metric": m.store.metric, "baseline": m.store.baseline,
                                                       "num_docs": len(m.evaluator.docs)} for m in measuring[1:]},
      "confidence": conf.facts() if conf is not None else None,
      "solver": found.ranking.facts, "flags": settings.flags(),
  }
