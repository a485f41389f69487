"""What a notebook needs, behind `import jaxloc`: run a localization with settings, read a finished run.

    import jaxloc
    engine = jaxloc.Engine(jaxloc.load_model("smollm2-135m"))
    jaxloc.evaluate_heads(engine, "plurals", heads=["L8H1", "L20H5"], num_samples=50)["metrics"]
    run = jaxloc.run_localization(engine, "plurals", "runs/plurals", num_masks=60, general_tasks=["counting"])
    run.top_k, run.coefficients  # or later: jaxloc.read_run("runs/plurals")

Loading models, building engines and evaluating tasks under masks are the library's own functions, re-exported
by `jaxloc/__init__.py`; this module adds the two that compose several steps.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import numpy as np

from jaxloc import files
from jaxloc.engine.engine import Engine
from jaxloc.errors import UserError
from jaxloc.units import run_file
from jaxloc.localize.preflight import engine_scoring_settings
from jaxloc.localize.localization import Localization, Tasks
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.report.page import write_page
from jaxloc.report.plots import write_plots


@dataclasses.dataclass
class Run:
  """A finished localization run, read from its output directory (the output contract: measurements.npz, heads.json,
  ablation.json).

  info: heads.json (model, task, method, metric, heads ranked most important first, top_k, flags, timing, ...), or
  neurons.json for a `--unit=neurons` run (the same with "neurons" for "heads").
  ablation: ablation.json (held-out validation), None when the run did not validate.
  coefficients: float [layers, heads], each head's estimated change in the metric when it is ablated; masks: bool
  [masks, layers, heads] (True = ablated), scores: float [masks] and baseline: the target's measurements. These
  four are None for a directory that keeps only the reports. metrics: every metric the task reported under those
  masks, name -> float [masks] (the localization metric is `scores`).
  """

  directory: str
  info: dict[str, Any]
  ablation: dict[str, Any] | None
  coefficients: np.ndarray | None
  masks: np.ndarray | None
  scores: np.ndarray | None
  baseline: float | None
  metrics: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  @property
  def unit(self) -> str:
    """"heads" or "neurons"."""
    return self.info.get("unit", "heads")

  @property
  def top_k(self) -> list[str]:
    """The selected heads (neurons), most important first (e.g. ["L8H1", "L20H5", ...])."""
    return list(self.info["top_k"])

  @property
  def units(self) -> list[dict[str, Any]]:
    """Every unit ranked: {"name", "layer", "head" (or "neuron"), "score"}."""
    return list(self.info[self.unit])

  @property
  def heads(self) -> list[dict[str, Any]]:
    """Every head ranked (a head run's `units`)."""
    if self.unit != "heads":
      raise UserError(f"{self.directory} localized {self.unit}: read run.units")
    return self.units


def finished_run(localization: Localization) -> Run:
  """The `Run` a localization just made, from what it holds in memory (equal to `read_run` of its directory)."""
  store = localization.stores[0]
  solution, payload, baseline = localization.solution, localization.payload, store.baseline
  if solution is None or payload is None or baseline is None:
    raise ValueError("this localization has not reported yet: run its stages first (Localization.run)")
  coefficients = solution.ranking.values.reshape(localization.config.num_layers, localization.per_layer)
  return Run(localization.settings.output_dir, payload, localization.ablation, np.asarray(coefficients),
             store.masks.copy(), np.asarray(store.scores).copy(), float(baseline),
             {k: v.copy() for k, v in store.metrics.items()})


def read_run(output_dir: str) -> Run:
  """The outputs of a finished `experiments.localize` or `run_localization` run in `output_dir` (in a
  multi-process run, as process 0 wrote them)."""
  path = functools.partial(os.path.join, output_dir)
  info = files.read_json(path(run_file("heads")))
  if info is None:
    info = files.read_json(path(run_file("neurons")))
  measured = files.read_arrays(path("measurements.npz"))
  if info is None:
    raise UserError(f"{output_dir} holds no finished run (no heads.json or neurons.json"
                    + ("; its measurements.npz is a run in progress: run the same command again to resume it)"
                       if measured is not None else ")"))
  masks = scores = baseline = None
  metrics = {}
  if measured is not None:
    masks, scores, baseline = measured["masks"], measured["scores"], float(measured["baseline"])
    metrics = {k[len("metric_"):]: v for k, v in measured.items() if k.startswith("metric_")}
  return Run(output_dir, info, files.read_json(path("ablation.json")), files.read_array(path("coefficients.npy")),
             masks, scores, baseline, metrics)


def run_localization(engine: Engine, task: str | None = None, output_dir: str | None = None, *,
                     settings: LocalizeSettings | None = None, tasks: Tasks | None = None, progress: bool = True,
                     **fields: Any) -> Run:
  """Localizes `task` on `engine`'s model, writes the outputs and plots to `output_dir`, and returns them.

  Settings are the flags of `experiments.localize` (`--helpfull` lists them with their defaults): give them as keywords,
  the method's own included (`method=..., num_masks=60, general_tasks=["plurals"]`, a learned mask's `mask_steps=30`),
  or as a whole `settings` object (`LocalizeSettings.make(...)`). A keyword that is neither a run-wide setting nor one
  of the method's is an error naming the valid ones. Re-running with the same settings resumes an interrupted run.
  `tasks` are the run's documents when already loaded (`jaxloc.localize.preflight.load_tasks(settings)`). The stages
  (`jaxloc.localize.localization.Localization`) run in order; the returned `Run` is the one made in memory, not read
  back."""
  if settings is None:
    settings = LocalizeSettings.make(**{"model": engine.model.name, "task": task, "output_dir": output_dir, **fields})
  elif task is not None or output_dir is not None or fields:
    raise UserError("give the settings either as a LocalizeSettings object or as task, output_dir and keywords")
  with files.hold_run_directory(settings.output_dir):
    localization = Localization.preflight(settings, tasks=tasks, config=engine.model_config,
                                          scoring=engine_scoring_settings(engine))
    return execute(localization, engine, progress=progress)


def execute(localization: Localization, engine: Engine, *, progress: bool = True) -> Run:
  """Runs a preflighted localization (`Localization.preflight`) on `engine`: every stage, then its plots and report
  page; the run as it holds it in memory. `experiments.localize` preflights before the model loads, then calls this."""
  directory = localization.settings.output_dir
  with files.hold_run_directory(directory):
    localization.run(engine, progress)
    write_plots(directory)
    write_page(directory)
  return finished_run(localization)
