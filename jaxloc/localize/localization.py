"""A localization run end to end, as explicit stages (`Localization`): preflight, measure every task under the same
masks (resumably), solve (rank, estimate), confirm (universal heads, the selection), validate on held-out documents
and bootstrap the confidence, report (write the outputs).

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
from typing import Any, Sequence

import jax
import numpy as np
from tqdm import tqdm

from jaxloc import files
from jaxloc.engine import peak
from jaxloc.errors import UserError
from jaxloc.units import parse_units, run_file, singular, unit_name, units_per_layer
from jaxloc.localize import (aliasing, confidence, confirm, decisions, designs, examples, methods, outputs,
                             selection, specificity, validate)
from jaxloc.localize.measurements import MeasurementStore
from jaxloc.localize.methods.base import Measured, Ranking
from jaxloc.localize.preflight import (Tasks, check_layout, check_resume, engine_scoring_settings, load_tasks,
                                       store_specs)
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.models.config import ModelConfig
from jaxloc.models.loading import read_config
from jaxloc.tasks.names import task_label
from jaxloc.tasks.evaluator import Evaluator, RetainedProbability

log = logging.getLogger(__name__)

# Masks scored on every task before the next ones: a resumed run re-measures at most this many.
MASKS_PER_ROUND = 64


@dataclasses.dataclass
class Measuring:
  """One task's measurements under the design and the evaluator that adds to them."""

  store: MeasurementStore
  evaluator: Evaluator


def measure_tasks(plan: methods.Plan, target: Measuring, general: list[Measuring], progress: bool = True) -> None:
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


@dataclasses.dataclass
class Solution:
  """What the solve stage estimates from the measurements: the target's ranking, each general task's estimates under
  the same masks (`specificity.estimate`), and the design's aliasing (None for a design without one)."""

  ranking: Ranking
  general_rankings: list[Ranking]
  design: aliasing.DesignDiagnostics | None


def estimate(plan: methods.Plan, measured: Sequence[Measured], excluded: np.ndarray, ranking: Ranking | None = None
          ) -> Solution:
  """The solve stage's estimates from `measured` (the target first, then the general tasks, under the same masks); `ranking`: the
  target's, when the caller has ranked it already (the efficiency benchmark ranks before it judges)."""
  design = aliasing.of_measurements(measured[0].masks, excluded)
  return Solution(plan.rank(measured[0]) if ranking is None else ranking,
                  [specificity.estimate(plan, m) for m in measured[1:]], design)


def conclude(settings: LocalizeSettings, solution: Solution, measured: Sequence[Measured], excluded: np.ndarray,
             confirming: validate.Measures, identification: validate.Measures, directory: str | None = None
             ) -> confirm.Found:
  """The confirm stage on a solution: the universal units and the selection (`confirm.find_heads`; the run saves
  its confirmation in `directory`)."""
  return confirm.find_heads(settings, solution.ranking, solution.general_rankings, measured, excluded, confirming,
                            identification, solution.design, directory)


class Localization:
  """A localization run as explicit stages, each a method, run in order (`run` runs them all):

    preflight  (a constructor) the settings, the tasks' documents, the model's layout from its config and the
               stores a resume would open, checked before the model loads: anything the input decides is a
               UserError before any weight is read;
    measure    every task scored under the method's masks on the engine (resumable), baselines and power first;
    solve      the ranking and each general task's estimates (`estimate`), coefficients.npy;
    confirm    universal units and the selection, confirmed by measurement (`conclude`);
    validate   the selection on held-out documents (ablation.json, with --validate) and the bootstrap's confidence;
    report     heads.json (neurons.json) and the examples page's data; returns heads.json's payload.

  The CLI (`jaxloc.main.localize`: preflight before the model loads, then the engine), the API
  (`jaxloc.api.run_localization`) and the rehearsal drive these; the efficiency benchmark drives the solve and
  confirm stages' own functions (`estimate`, `conclude`) over its cached problems. Each stage's outputs are attributes (`tasks`, `stores`, `solution`, `found`,
  `ablation`, `payload`)."""

  def __init__(self, settings: LocalizeSettings, tasks: Tasks, config: ModelConfig):
    self.settings, self.tasks, self.config = settings, tasks, config
    self.unit = settings.unit
    self.per_layer = units_per_layer(config, self.unit)
    exclude = parse_units(settings.exclude_heads, config.num_layers, self.per_layer, self.unit)
    settings.exclude_heads = [unit_name(*h, self.unit) for h in exclude]
    self.excluded = designs.excluded_heads(settings.exclude_heads, config.num_layers * self.per_layer,
                                           num_heads=self.per_layer, unit=self.unit)
    self.timing: dict[str, float] = {}
    self.solution: Solution | None = None
    self.found: confirm.Found | None = None
    self.ablation: dict[str, Any] | None = None
    self.payload: dict[str, Any] | None = None

  @classmethod
  def preflight(cls, settings: LocalizeSettings, *, tasks: Tasks | None = None, config: ModelConfig | None = None,
                scoring: dict[str, Any] | None = None) -> "Localization":
    """The run checked before its model loads: the settings and tasks (`load_tasks`, or `tasks` already loaded), the
    layout against the model's `config` (read from --model's files when None: `read_config`), and with the engine's
    `scoring` settings (`preflight.scoring_settings`) what a resume would refuse (`check_resume`)."""
    if tasks is None:
      tasks = load_tasks(settings)
    else:
      settings.check()
    config = read_config(settings.model) if config is None else config
    check_layout(settings, tasks, config)
    localization = cls(settings, tasks, config)
    if scoring is not None:
      localization.check_resume(scoring)
    return localization

  def check_resume(self, scoring: dict[str, Any]) -> None:
    """What a resume into the output directory would refuse under an engine with `scoring` settings
    (`preflight.check_resume`), before the model loads."""
    check_resume(self.settings, self.tasks, scoring)

  @property
  def stores(self) -> list[MeasurementStore]:
    """Every task's measurements, the target first (after `measure`)."""
    return [m.store for m in self.measuring]

  def run(self, engine, progress: bool = True) -> dict[str, Any]:
    """Every stage after the preflight, in order, holding the output directory (`files.hold_run_directory`: another
    run into it is refused); heads.json's payload."""
    with files.hold_run_directory(self.settings.output_dir):
      self.measure(engine, progress)
      self.solve()
      self.confirm()
      self.validate()
      return self.report()

  def measure(self, engine, progress: bool = True) -> None:
    settings, c, timing = self.settings, engine.model_config, self.timing
    if (c.num_layers, units_per_layer(c, self.unit)) != (self.config.num_layers, self.per_layer):
      raise UserError(f"the engine's model ({engine.model.name}) has another layout than the preflight's "
                      f"({settings.model}): {c.num_layers} layers × {units_per_layer(c, self.unit)} {self.unit}")
    self.engine, self.progress = engine, progress
    self.start = time.perf_counter()
    self.machine = peak.machine_facts(engine.dtype)  # the matmul peak this run's seconds are read against
    self.provenance = peak.provenance(engine)  # before measuring: nothing after the measuring may end the run
    self.compiled_before, self.compile_before = engine.compile_count, dataclasses.replace(engine.compile_time)
    self.identification = [Evaluator.build(engine, t.name, t.task, t.docs, settings.ablation, self.unit, exact=True)
                           for t in self.tasks.all]
    _lay_out(settings, self.tasks, self.identification)
    self.measuring = _open_stores(settings, self.tasks, self.identification, (c.num_layers, self.per_layer),
                                  engine_scoring_settings(engine))
    target = self.measuring[0].store
    resumed = len(target)
    log.info("%s baseline %s = %.4f (%d samples)%s", settings.task, target.metric, target.baseline,
             len(self.tasks.target.docs), f"; resuming after {resumed} saved masks" if resumed else "")
    self.metrics = [m.store.metric for m in self.measuring]
    # The confirmation's decisions score the identification documents, and more of a general task's (its reserve)
    # where its power or a straddling interval asks (`decisions`).
    self.in_sample = validate.TaskMeasures(self.identification, self.metrics,
                                           reserves=[t.reserve for t in self.tasks.all])
    self.powers = confirm.powers(settings, self.in_sample, self.stores)
    for power in self.powers:
      if power is not None:
        log.info("power to veto: %s", decisions.describe_power(task_label(power.task), power.facts()))
    timing["setup_seconds"] = time.perf_counter() - self.start

    def gradient() -> np.ndarray:
      t = time.perf_counter()
      change = self.identification[0].first_order_change()
      timing["gradient_seconds"] = time.perf_counter() - t
      return change

    def attribution(steps: int) -> np.ndarray:
      t = time.perf_counter()
      scores = self.identification[0].attribution(steps, progress)
      timing["attribution_seconds"] = time.perf_counter() - t
      return scores

    objective = RetainedProbability(self.identification)
    self.context = methods.Context(c.num_layers, self.per_layer, self.excluded, gradient, objective,
                                   directory=settings.output_dir, attribution=attribution)
    self.plan = settings.method_object.plan(settings, self.context)
    t = time.perf_counter()
    measure_tasks(self.plan, self.measuring[0], self.measuring[1:], progress)
    timing["measure_seconds"] = time.perf_counter() - t
    timing["measured_this_run"] = len(target) - resumed
    if timing["measured_this_run"]:
      timing["seconds_per_mask"] = timing["measure_seconds"] / timing["measured_this_run"]
    if objective.seconds:
      # Training time in the unit of the other methods' cost: masks scored on every task, timed in this run.
      timing["training_seconds"] = objective.seconds
      if "seconds_per_mask" in timing:
        timing["training_mask_evaluations"] = objective.seconds / timing["seconds_per_mask"]

  def solve(self) -> None:
    t = time.perf_counter()
    self.solution = estimate(self.plan, self.stores, self.excluded)
    design = self.solution.design
    if design is not None and design.warning():
      log.warning("%s", design.warning())
    self.timing["solve_seconds"] = time.perf_counter() - t
    files.save_array(os.path.join(self.settings.output_dir, "coefficients.npy"),
                     self.solution.ranking.values.reshape(self.config.num_layers, self.per_layer))

  def confirm(self) -> None:
    """Universal units and the selection measured on documents the design never saw where they are checked alone
    (held out; the identification documents when not validating), the selection confirmed on the identification
    documents."""
    settings, progress = self.settings, self.progress
    t = time.perf_counter()
    # The bars' totals (ETAs): estimates, raised when exceeded. In-sample with validation: the confirmation (the
    # top-k together, a few units alone: most were measured by the method) and the top-k's curve.
    held_out = validate.planned_masks(settings.top_k, settings.curve_k, settings.universal_candidates,
                                      settings.selector != selection.RAW)
    self.in_sample.expected = 3 * settings.top_k + 2 if settings.validate else held_out
    self.in_sample.progress = "scoring on identification documents" if progress else None
    self.confirming = self.in_sample
    if settings.validate:
      self.confirming = validate.TaskMeasures([e.on(td.held_out) for e, td in zip(self.identification, self.tasks.all)],
                                        self.metrics, progress="scoring on held-out documents" if progress else None,
                                        expected=held_out)
    try:
      self.found = _find_heads(settings, self.solution, self.measuring, self.excluded, self.confirming, self.in_sample)
    except BaseException:
      self._close_scorers()
      raise
    self.timing["confirm_seconds"] = time.perf_counter() - t

  def validate(self) -> None:
    settings = self.settings
    t = time.perf_counter()
    try:
      if settings.validate:
        files.fault_point("validation")
        self.ablation = _validate(settings, self.found, self.confirming, self.in_sample)
    finally:
      self._close_scorers()
    self.timing["validate_seconds"] = time.perf_counter() - t
    t = time.perf_counter()
    self.confidence = _confidence(settings, settings.method_object, self.context, self.found, self.measuring,
                                  self.excluded, self.progress)
    self.timing["bootstrap_seconds"] = time.perf_counter() - t

  def _close_scorers(self) -> None:
    self.in_sample.close()
    self.confirming.close()

  def report(self) -> dict[str, Any]:
    settings, engine, timing = self.settings, self.engine, self.timing
    timing["total_seconds"] = time.perf_counter() - self.start
    self.machine.update(peak.machine_facts(engine.dtype, at="end"))
    per_layer, unit, c = self.per_layer, self.unit, self.config
    payload = outputs.heads_json(settings, per_layer, self.found, self.excluded, self.confidence, self.measuring,
                          self.confirming)
    for power in self.powers:
      if power is not None:
        payload["general_tasks"][task_label(power.task)]["power"] = power.facts()
    design = self.solution.design
    payload.update(num_layers=c.num_layers, timing=timing, machine=self.machine, model_provenance=self.provenance,
                   design=None if design is None else design.facts(
                       lambda h: unit_name(*divmod(int(h), per_layer), unit)),
                   engine={"compilations": engine.compile_count - self.compiled_before,
                           # tracing, lowering and XLA compiling (or reading a persistent-cache hit back), in seconds
                           "compile_seconds": engine.compile_time.seconds - self.compile_before.seconds,
                           "xla_compile_seconds": engine.compile_time.backend_seconds
                           - self.compile_before.backend_seconds,
                           "compile_cache_hits": engine.compile_time.cache_hits - self.compile_before.cache_hits,
                           "seconds_per_mask": timing.get("seconds_per_mask"),
                           "dtype": np.dtype(engine.model.dtype).name,
                           "activation_dtype": np.dtype(engine.dtype).name,
                           "float32_matmuls": engine.shared.matmul_precision,
                           "devices": engine.mesh.size, "processes": jax.process_count()})
    files.write_json(os.path.join(settings.output_dir, run_file(unit)), payload)
    if settings.validate:  # after the run file: its compile counts and seconds are the localization's alone
      examples.write(settings.output_dir, self.confirming, self.found.selected[:settings.top_k])
    self.payload = files.jsonable(payload)  # as written
    return self.payload


def localize(engine, settings: LocalizeSettings, tasks: Tasks | None = None, *, progress: bool = True
             ) -> dict[str, Any]:
  """Runs (or resumes) a localization on `engine`, every stage (`Localization`), and writes its outputs; returns the
  heads.json (neurons.json) payload."""
  scoring = engine_scoring_settings(engine)
  with files.hold_run_directory(settings.output_dir):
    run = Localization.preflight(settings, tasks=tasks, config=engine.model_config, scoring=scoring)
    return run.run(engine, progress)


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


def _find_heads(settings: LocalizeSettings, solution: Solution, measuring: list[Measuring], excluded: np.ndarray,
                confirming: validate.TaskMeasures, identification: validate.TaskMeasures) -> confirm.Found:
  """Universal heads and the selection (`conclude`: with general tasks and a confirmed selection rule, confirmed
  on the identification documents by single-head measurements and the top-k's together), then the first --curve_k
  selected heads ablated alone on the confirming documents (a neuron selection of hundreds is checked alone only at
  its head)."""
  found = conclude(settings, solution, [m.store for m in measuring], excluded, confirming, identification,
                   settings.output_dir)
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


def _validate(settings: LocalizeSettings, found: confirm.Found, held_out: validate.TaskMeasures,
              identification: validate.TaskMeasures) -> dict[str, Any]:
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
  if settings.selector != selection.RAW:
    raw = selection.RAW.select(found.order, found.effects, np.zeros(len(found.ranking.values), bool),
                               found.universal, settings.curve_k)
    ablation["raw_specificity_curve"] = validate.ablation_curve(raw, max(settings.curve_k, len(top)), held_out,
                                                                also=[len(top)])
  files.write_json(os.path.join(settings.output_dir, "ablation.json"), ablation)
  return files.jsonable(ablation)


def _confidence(settings: LocalizeSettings, method, context: methods.Context, found: confirm.Found,
                measuring: list[Measuring], excluded: np.ndarray, progress: bool) -> confidence.Confidence | None:
  """The bootstrap: every task re-estimated on resampled measurements, the run's selection re-run (its
  universal heads kept)."""
  plans = [method.bootstrap_plan(settings, context, r) for r in [found.ranking, *found.general_rankings]]

  def select(rankings):
    drops = np.stack([specificity.relative_drops(r, m.store.baseline) for r, m in zip(rankings, measuring)])
    return settings.selector.select([h for h in rankings[0].order if not excluded[h]],
                                    specificity.Effects(found.effects.tasks, drops), excluded, found.universal,
                                    settings.top_k)

  return confidence.bootstrap(plans, [m.store for m in measuring], select, settings.top_k, settings.bootstrap,
                              settings.seed, progress)
