"""What a localization run checks and loads before the model loads, so that anything the input alone decides is a
`UserError` first: the settings and every task's documents (`load_tasks`), the model's layout against the flags
(`check_layout`, from its config alone), and the measurement stores a run opens or resumes (`store_specs`,
`check_resume`, `saved_masks`), keyed by every setting that changes a score (`scoring_settings`). `run` then runs.

Axes: `masks` M, `layers` L, `heads` H, N = L * H flattened (flat = layer * H + head).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
import zipfile
from typing import Any

import numpy as np

from jaxloc.errors import UserError
from jaxloc.units import parse_units, units_per_layer
from jaxloc.localize import confirm, designs, measurements, methods
from jaxloc.localize.methods.base import SCORED_GENERAL_TASKS, SCORED_TARGET
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.tasks.evaluator import load_more_docs, load_task_split
from jaxloc.tasks.names import task_label

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TaskDocs:
  """A task with its identification and held-out documents, loaded before the model (`load_tasks`)."""

  name: str
  task: Any
  docs: list
  held_out: list
  metric: str
  # More documents, disjoint from both, that a general task's confirmation decisions may add (--general_max_samples).
  reserve: list = dataclasses.field(default_factory=list)


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
  method = settings.method_object
  if SCORED_TARGET in method.needs and task.output_type != "loglikelihood":
    raise UserError(f"--method={settings.method} needs a scored (loglikelihood) task; {settings.task} is a "
                    f"generation task: use {_methods_without(SCORED_TARGET, settings.unit)}")
  general = []
  for name in _general_task_names(settings):
    if not _same_task(name, settings.task):
      g_task, g_docs, g_held = load_task_split(name, {}, num_samples=settings.general_samples,
                                               validation_samples=held_out, seed=settings.seed,
                                               data_dir=settings.data_dir)
      if SCORED_GENERAL_TASKS in method.needs and g_task.output_type != "loglikelihood":
        raise UserError(f"--method={settings.method} needs every general task scored (loglikelihood); general task "
                        f"{name} is a generation task: leave it out of --general_tasks or use "
                        f"{_methods_without(SCORED_GENERAL_TASKS, settings.unit)}")
      reserve = []
      if settings.selector.confirmed:
        reserve = load_more_docs(g_task, g_docs + g_held, settings.general_max_samples - settings.general_samples,
                                 seed=settings.seed, data_dir=settings.data_dir)
      general.append(TaskDocs(name, g_task, g_docs, g_held, g_task.default_metric, reserve))
  return Tasks(TaskDocs(settings.task, task, docs, held, metric), general)


def _general_task_names(settings: LocalizeSettings) -> list[str]:
  """--general_tasks, each once, in order; a warning for a name given twice and for the target among them (it is
  measured as the target, so it is left out of the general tasks)."""
  names = list(dict.fromkeys(settings.general_tasks))
  twice = [name for name in names if settings.general_tasks.count(name) > 1]
  if twice:
    log.warning("--general_tasks names %s more than once: each is measured once", ", ".join(twice))
  target = [name for name in names if _same_task(name, settings.task)]
  if target:
    log.warning("--general_tasks includes the target, %s: it is left out of the general tasks (the target's own drop "
                "is measured anyway); %s", target[0],
                f"the general tasks are {', '.join(n for n in names if n not in target)}" if len(names) > 1
                else "no general task is left")
  return names


def _same_task(a: str, b: str) -> bool:
  """Whether two task names are the same task (two paths of one task file included)."""
  if a == b:
    return True
  try:
    return os.path.isfile(a) and os.path.isfile(b) and os.path.samefile(a, b)
  except OSError:
    return False


def _methods_without(need: str, unit: str) -> str:
  """The methods for `unit` that do without `need`."""
  return ", ".join(name for name in methods.names_for(unit) if need not in methods.get(name).needs)


def check_layout(settings: LocalizeSettings, tasks: Tasks, config) -> None:
  """What the model's layout refuses, found from its config alone (`jaxloc.models.loading.read_config`), so before
  the model loads: excluded units it does not have, a --top_k above the units there are to select, an
  --ablation_rate that ablates less than one of them per mask (for the methods whose design it sets), a --num_masks
  whose masks and measurements would not fit in host memory."""
  unit, per_layer = settings.unit, units_per_layer(config, settings.unit)
  total = config.num_layers * per_layer
  excluded = parse_units(settings.exclude_heads, config.num_layers, per_layer, unit)
  selectable = total - len(excluded)
  if settings.top_k > selectable:
    less = f" less {len(excluded)} excluded" if excluded else ""
    raise UserError(f"--top_k={settings.top_k} is more than the {selectable} {unit} there are to select "
                    f"({config.num_layers} layers × {per_layer}{less}): give at most {selectable}")
  rate = settings.flags().get("ablation_rate")  # the design's rate, whichever method sets it
  if rate is not None:
    designs.check_rate(rate, selectable)
  if "num_masks" in settings.method_object.run_settings:
    _check_memory(settings.num_masks, total, tasks, unit)


def _check_memory(num_masks: int, total: int, tasks: Tasks, unit: str) -> None:
  """--num_masks refused when its masks and measurements would take more than half the host's memory: per mask and
  task, its bool mask and every metric per document (float64), twice (a store is copied as it grows), and one float64
  row of the solver's design matrix."""
  docs = sum(len(t.task.metric_names) * len(t.docs) for t in tasks.all)
  per_mask = 2 * (len(tasks.all) * total + 8 * docs) + 8 * total
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  most = memory // 2 // per_mask
  if num_masks > most:
    raise UserError(f"--num_masks={num_masks:,} would need about {num_masks * per_mask / 2**30:,.0f} GiB of host "
                    f"memory ({per_mask:,} bytes per mask: {total:,} {unit} and {len(tasks.all)} tasks' metrics per "
                    f"document), more than half of this machine's {memory / 2**30:.0f} GiB: give at most {most:,}")


def scoring_settings(dtype: str, activation_dtype: str, share_prefix: bool, float32_matmuls: str) -> dict[str, Any]:
  """The engine settings saved scores depend on, as run.json records them (by flag name): the parameter and
  activation dtypes, --share_prefix, which in bfloat16 changes scores beyond rounding (SmolLM2 on plurals: a
  mask's mean log-probability by up to 0.82 and its accuracy by 0.07, more than bfloat16 against float32 changes the
  log-probability, 0.13; in float32 by 2e-5), and --float32_matmuls where activations are float32 (TF32 on a GPU moves
  logits by ~3e-4; None otherwise, as the engine then leaves matmul precision alone)."""
  return {"dtype": dtype, "activation_dtype": activation_dtype, "share_prefix": share_prefix,
          "float32_matmuls": float32_matmuls if activation_dtype == "float32" else None}


def engine_scoring_settings(engine) -> dict[str, Any]:
  """`scoring_settings` of an engine."""
  return scoring_settings(np.dtype(engine.model.dtype).name, np.dtype(engine.dtype).name,
                          engine.config.share_prefix, engine.config.float32_matmuls)


@dataclasses.dataclass
class StoreSpec:
  """Where a task's measurements go and the settings they are made with (`measurements.MeasurementStore`)."""

  directory: str
  settings: dict[str, Any]
  labels: dict[str, str]  # a setting's name in messages, when not --<key>


def store_specs(settings: LocalizeSettings, tasks: Tasks, scoring: dict[str, Any]) -> list[StoreSpec]:
  """The target's store in output_dir and each general task's in general/<task>/, with every setting that changes a
  score: the run's and its method's, the engine's `scoring_settings`, and a digest of the task's identification
  documents (an edited task file changes it). Packing, batch sizes and the residual cache are left out: they change
  scores at the level of rounding (--nopack: a mask's mean log-probability by 6e-6 in float32, 3e-3 in bfloat16,
  accuracy not at all)."""
  method = settings.method_object
  shared = {**settings.shared_measurement_settings(), **method.measurement_settings(settings), **scoring}
  specs = []
  for t in tasks.all:
    own = {"documents": _digest(t.docs)}
    labels = {"documents": f"the identification documents of {t.name} (digest)"}
    directory = settings.output_dir
    if t is not tasks.target:
      directory = os.path.join(settings.output_dir, "general", task_label(t.name))
      own.update(task=t.name, task_options={}, num_samples=settings.general_samples)
      labels["num_samples"] = "--general_samples"
    specs.append(StoreSpec(directory, {**shared, **own}, labels))
  return specs


def _digest(docs: list) -> str:
  return hashlib.sha256(json.dumps(docs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def saved_masks(output_dir: str) -> str:
  """What a run stopped in `output_dir` has saved, in words, read back from its stores (`measurements.npz`, each
  general task's in general/<task>/): the masks a re-run of the same command resumes from."""
  counts = {}
  for path in [os.path.join(output_dir, measurements.MEASUREMENTS),
               *sorted(glob.glob(os.path.join(output_dir, "general", "*", measurements.MEASUREMENTS)))]:
    try:  # this process's disk alone (no collective: the other processes may be gone)
      with np.load(path) as saved:
        counts[path] = len(saved["masks"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
      continue  # absent, or unreadable: a resumed run says which
  if not counts:
    return f"no masks were measured yet in {output_dir}"
  (first, count), *others = counts.items()
  return f"{count:,} masks saved in {first}" + "".join(f", {n:,} in {path}" for path, n in others)


def check_resume(settings: LocalizeSettings, tasks: Tasks, scoring: dict[str, Any]) -> None:
  """A UserError when output_dir holds measurements the run's stores would refuse (unreadable, or made with other
  settings: the message names the flag), or a confirmation it would refuse, found before the model loads; writes
  nothing."""
  specs = store_specs(settings, tasks, scoring)
  for spec in specs:
    measurements.check_resume(spec.directory, spec.settings, spec.labels)
  confirm.check_saved(settings.output_dir, confirm.settings_stamp([spec.settings for spec in specs]),
                      unstamped=os.path.isfile(os.path.join(settings.output_dir, measurements.MEASUREMENTS)))
