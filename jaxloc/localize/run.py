"""A localization run end to end: measure every task under the same masks (resumably), rank, select, find the
universal heads, validate on held-out documents, bootstrap the confidence, write the outputs.

The units are attention heads, or with `--unit=neurons` MLP neurons: only the layout changes (units per layer,
their names, `neurons.json` for `heads.json`); below, "heads" stands for either.

Outputs in `output_dir` (a contract users and scripts rely on): `measurements.npz` (the target's), `heads.json` (or
`neurons.json`), `coefficients.npy` [layers, units], and after validation `ablation.json`; each general task's measurements
under the same masks in `general/<task>/measurements.npz` (same contract); `jaxloc.report` draws the plots.
The runner drives the method through its plan (`methods.base`) and never asks which method it runs. What a run
checks and loads before the model loads (settings, tasks, layout, the stores it resumes) is `localize.preflight`.

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
from jaxloc.engine import peak
from jaxloc.heads import parse_units, run_file, singular, unit_name, units_per_layer
from jaxloc.localize import aliasing, confidence, confirm, decisions, designs, examples, methods, specificity, validate
from jaxloc.localize.measurements import MeasurementStore
from jaxloc.localize.preflight import Tasks, check_layout, engine_scoring_settings, load_tasks, store_specs
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.tasks.names import task_label
from jaxloc.tasks.evaluation import Evaluator, RetainedProbability

log = logging.getLogger(__name__)

# Masks scored on every task before the next ones: a resumed run re-measures at most this many.
MASKS_PER_ROUND = 64


@dataclasses.dataclass
class Measuring:
  """One task's measurements under the design and the evaluator that adds to them."""

  store: MeasurementStore
  evaluator: Evaluator


def measure(plan: methods.Plan, target: Measuring, general: list[Measuring], progress: bool = True) -> None:
  """Measures what `plan` asks for on the target and every general task (the same masks, MASKS_PER_ROUND at a
  time), saving after every engine batch; resumes from the stores: a general task that fell behind catches up first,
  one that holds masks the target no longer has (its store moved away) keeps those the target measures again."""
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

  def catch_up(task: Measuring, agreed: int) -> None:
    """A general task's store brought to the target's masks: its masks past the first `agreed` (known to agree) that
    differ from the target's are dropped, the target's it lacks are scored."""
    kept = _agreeing(task.store.masks, target.store.masks, agreed)
    if kept < len(task.store) and kept < len(target.store):
      task.store.truncate(kept)
    if len(task.store) < len(target.store):
      score(task, target.store.masks[len(task.store):])

  try:
    _recover(target, general)
    for task in general:
      catch_up(task, 0)

    def score_every_task(masks: np.ndarray) -> None:
      agreed = len(target.store)
      score(target, masks)
      for task in general:
        files.fault_point("between_tasks")
        catch_up(task, agreed)

    methods.drive(plan, target.store, score_every_task, chunk=MASKS_PER_ROUND)
    for task in general:  # masks kept from an earlier run that the target did not measure again
      if len(task.store) > len(target.store):
        task.store.truncate(len(target.store))
  finally:
    bar.close()


def _agreeing(masks: np.ndarray, reference: np.ndarray, start: int) -> int:
  """How many of `masks` equal `reference`'s from the first (those before `start` are known to)."""
  count = min(len(masks), len(reference))
  width = int(np.prod(masks.shape[1:]))
  differ = np.flatnonzero((masks[start:count] != reference[start:count]).reshape(-1, width).any(axis=1))
  return start + int(differ[0]) if len(differ) else count


def _recover(target: Measuring, general: list[Measuring]) -> None:
  """Says, in one line, what is kept of general tasks' measurements that the target's no longer match (its
  measurements.npz was moved away, or lost masks): masks a general task holds beyond the target's are kept while
  the target measures the same masks again; those that differ from the target's are dropped and measured again."""
  ahead, dropped = [], []
  for task in general:
    agreed = _agreeing(task.store.masks, target.store.masks, 0)
    name = task_label(task.evaluator.name)
    if agreed < len(task.store) and agreed == len(target.store):
      ahead.append(f"{name}'s {len(task.store)}")
    elif agreed < len(task.store):
      dropped.append(f"{name}'s last {len(task.store) - agreed}")
  if ahead:
    log.warning("%s holds %d measured masks; keeping %s: the target measures its missing masks again, the general "
                "tasks only masks they lack", target.store.path, len(target.store), ", ".join(ahead))
  if dropped:
    log.warning("dropping %s measured masks, which differ from the target's in %s, and measuring them again",
                ", ".join(dropped), target.store.path)


def localize(engine, settings: LocalizeSettings, tasks: Tasks | None = None, *, progress: bool = True
             ) -> dict[str, Any]:
  """Runs (or resumes) a localization and writes its outputs; returns the heads.json (neurons.json) payload. The run
  holds its output directory (`files.hold_run_directory`): another run into it is refused."""
  with files.hold_run_directory(settings.output_dir):
    return _localize(engine, settings, tasks, progress)


def _localize(engine, settings: LocalizeSettings, tasks: Tasks | None, progress: bool) -> dict[str, Any]:
  tasks = tasks or load_tasks(settings)
  method = settings.method_object
  timing: dict[str, float] = {}
  start = time.perf_counter()
  machine = peak.machine_facts(engine.dtype)  # the matmul peak this run's seconds are read against
  provenance = peak.provenance(engine)  # before measuring: nothing after the measuring may end the run
  compiled_before, compile_before = engine.compile_count, dataclasses.replace(engine.compile_time)
  c = engine.model_config
  check_layout(settings, tasks, c)
  unit = settings.unit
  per_layer = units_per_layer(c, unit)
  exclude = parse_units(settings.exclude_heads, c.num_layers, per_layer, unit)
  settings.exclude_heads = [unit_name(*h, unit) for h in exclude]
  excluded = designs.excluded_heads(settings.exclude_heads, c.num_layers * per_layer, num_heads=per_layer, unit=unit)

  identification = [Evaluator.build(engine, t.name, t.task, t.docs, settings.ablation, unit, exact=True)
                    for t in tasks.all]
  _lay_out(settings, tasks, identification)
  measuring = _open_stores(settings, tasks, identification, (c.num_layers, per_layer), engine_scoring_settings(engine))
  resumed = len(measuring[0].store)
  log.info("%s baseline %s = %.4f (%d samples)%s", settings.task, measuring[0].store.metric,
           measuring[0].store.baseline, len(tasks.target.docs),
           f"; resuming after {resumed} saved masks" if resumed else "")
  metrics = [m.store.metric for m in measuring]
  # The confirmation's decisions score the identification documents, and more of a general task's (its reserve) where
  # its power or a straddling interval asks (`decisions`).
  in_sample = validate.Scorer(identification, metrics, reserves=[t.reserve for t in tasks.all])
  powers = confirm.powers(settings, in_sample, [m.store for m in measuring])
  for power in powers:
    if power is not None:
      log.info("power to veto: %s", decisions.describe_power(task_label(power.task), power.facts()))
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

  design = aliasing.of_measurements(measuring[0].store.masks, excluded)
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
  # The bars' totals (ETAs): estimates, raised when exceeded. In-sample with validation: the confirmation (the top-k
  # together, a few units alone: most were measured by the method) and the top-k's curve.
  held_out = validate.planned_masks(settings.top_k, settings.curve_k, settings.universal_candidates,
                                    settings.selection != "raw")
  in_sample.expected = 3 * settings.top_k + 2 if settings.validate else held_out
  in_sample.progress = "scoring on identification documents" if progress else None
  confirming = in_sample
  if settings.validate:
    confirming = validate.Scorer([e.on(td.held_out) for e, td in zip(identification, tasks.all)], metrics,
                                 progress="scoring on held-out documents" if progress else None, expected=held_out)
  try:
    found = _find_heads(settings, ranking, general_rankings, measuring, excluded, confirming, in_sample, design)
    if settings.validate:
      files.fault_point("validation")
      _validate(settings, found, confirming, in_sample)
  finally:
    in_sample.close()
    confirming.close()
  timing["validate_seconds"] = time.perf_counter() - t

  t = time.perf_counter()
  conf = _confidence(settings, method, context, found, measuring, excluded, progress)
  timing["bootstrap_seconds"] = time.perf_counter() - t
  timing["total_seconds"] = time.perf_counter() - start
  machine.update(peak.machine_facts(engine.dtype, at="end"))

  payload = _heads_json(settings, per_layer, found, excluded, conf, measuring, confirming)
  for power in powers:
    if power is not None:
      payload["general_tasks"][task_label(power.task)]["power"] = power.facts()
  payload.update(num_layers=c.num_layers, timing=timing, machine=machine, model_provenance=provenance,
                 design=None if design is None else design.facts(lambda h: unit_name(*divmod(int(h), per_layer), unit)),
                 engine={"compilations": engine.compile_count - compiled_before,
                         # tracing, lowering and XLA compiling (or reading a persistent-cache hit back), in seconds
                         "compile_seconds": engine.compile_time.seconds - compile_before.seconds,
                         "xla_compile_seconds": engine.compile_time.backend_seconds - compile_before.backend_seconds,
                         "compile_cache_hits": engine.compile_time.cache_hits - compile_before.cache_hits,
                         "seconds_per_mask": timing.get("seconds_per_mask"), "dtype": np.dtype(engine.model.dtype).name,
                         "activation_dtype": np.dtype(engine.dtype).name,
                         "float32_matmuls": engine.shared.matmul_precision,
                         "devices": engine.mesh.size, "processes": jax.process_count()})
  files.write_json(os.path.join(settings.output_dir, run_file(unit)), payload)
  if settings.validate:  # after the run file: its compile counts and seconds are the localization's alone
    examples.write(settings.output_dir, confirming, found.selected[:settings.top_k])
  return payload


def _lay_out(settings: LocalizeSettings, tasks: Tasks, identification: list[Evaluator]) -> None:
  """Every request set the run scores under masks, laid out (and pinned) before anything is scored, in one order:
  a set's layout depends on the shapes laid out before it, and a resumed run scores them in another order (a general
  task catching up before the target) or not at all (a saved baseline, gradient or training step). With the
  evaluators' exact scoring, a mask's scores then depend on the mask alone: a resumed run's are bit-identical."""
  for evaluator in identification:
    evaluator.lay_out(pin=True)
  if settings.validate:
    for evaluator, t in zip(identification, tasks.all):
      evaluator.on(t.held_out).lay_out(pin=True)


def _open_stores(settings: LocalizeSettings, tasks: Tasks, identification: list[Evaluator], shape,
                 scoring: dict[str, Any]) -> list[Measuring]:
  """Every task's store (`store_specs`), baselines measured: every store is opened (and its settings checked)
  before anything is measured."""
  stores = [MeasurementStore(spec.directory, spec.settings, t.metric, *shape, labels=spec.labels)
            for t, spec in zip(tasks.all, store_specs(settings, tasks, scoring))]
  for store, evaluator in zip(stores, identification):
    if store.baseline is None:
      baseline = evaluator.run(np.ones((1, *shape), np.float32), per_doc=True)
      store.set_baseline({k: v[0] for k, v in baseline.items()})
  return [Measuring(store, evaluator) for store, evaluator in zip(stores, identification)]


def _find_heads(settings: LocalizeSettings, ranking, general_rankings, measuring: list[Measuring],
                excluded: np.ndarray, confirming: validate.Scorer, identification: validate.Scorer,
                design: aliasing.DesignDiagnostics | None) -> confirm.Found:
  """Universal heads and the selection (`confirm.find_heads`: with general tasks and --selection=specific, confirmed
  on the identification documents by single-head measurements and the top-k's together), then the first --curve_k
  selected heads ablated alone on the confirming documents (a neuron selection of hundreds is checked alone only at
  its head)."""
  found = confirm.find_heads(settings, ranking, general_rankings, [m.store for m in measuring], excluded, confirming,
                             identification, design, settings.output_dir)
  missing = [h for h in found.selected[:settings.curve_k] if h not in found.alone]
  found.alone.update(zip(missing, validate.single_head_drops(missing, confirming)))
  if len(found.selected) < settings.top_k:
    log.warning("only %d %s qualify under --selection=%s (try --selection=raw or a larger "
                "--specific_max_general_drop)", len(found.selected), settings.unit, settings.selection)
  if found.confirmation is not None:
    c = found.confirmation
    log.info("confirmation: %d masks on every task's identification documents, %d of them the first %d %s together "
             "(%d measurements of the method reused), %d rejected alone, %d together; %d more general-task documents "
             "scored where power or a straddling interval asked", c.masks, len(c.measured_sets), c.together,
             settings.unit, len(c.reused), len(c.rejected), len(c.rejected_together), c.extra_documents())
  return found


def _validate(settings: LocalizeSettings, found: confirm.Found, held_out: validate.Scorer,
              identification: validate.Scorer) -> None:
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


def _confidence(settings: LocalizeSettings, method, context: methods.Context, found: confirm.Found,
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


def _heads_json(settings: LocalizeSettings, per_layer: int, found: confirm.Found, excluded: np.ndarray,
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
    if found.ranking.known is not None and not found.ranking.known[h]:
      entry["measured"] = False  # its value is a placeholder: the method never measured or estimated it
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
      "num_evaluations": len(target) + found.confirmation_masks,
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
