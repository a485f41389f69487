"""A localization run end to end: measure (resumably), rank, validate, write the outputs.

Outputs in `output_dir` (contract, ARCHITECTURE.md): `measurements.npz`, `heads.json`,
`coefficients.npy` [layers, heads], and after validation `ablation.json`; `jaxloc.report` draws
`heatmap.png` and `ablation_curve.png` from them. The runner drives the method through its plan
(`methods.base`) and never asks which method it runs.

Axes: `masks` M, `layers` L, `heads` H, N = L * H flattened (flat = layer * H + head).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import numpy as np
from tqdm import tqdm

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.heads import head_name, parse_heads
from jaxloc.localize import designs, methods, validate
from jaxloc.localize.measurements import MeasurementStore
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.tasks.evaluation import Evaluator, load_task

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Tasks:
  """The target and general tasks with their documents, loaded before the model (`load_tasks`)."""

  target: tuple[Any, list]  # (task, docs)
  general: dict[str, tuple[Any, list]]  # name -> (task, docs)
  metric: str


def load_tasks(settings: LocalizeSettings) -> Tasks:
  """Checks the settings and loads every task the run needs, so that an unknown task or metric, a missing
  dataset or bad method options are reported before the model loads."""
  settings.check()
  target = load_task(settings.task, settings.task_options, num_samples=settings.num_samples, seed=settings.seed,
                     data_dir=settings.data_dir)
  task = target[0]
  metric = settings.metric or task.default_metric
  if metric not in task.metric_names:
    raise UserError(f"--metric={metric} is not a metric of {settings.task}; it has {', '.join(task.metric_names)}")
  if methods.get(settings.method).uses_gradient and task.output_type != "loglikelihood":
    raise UserError(f"--method={settings.method} needs a scored (loglikelihood) task; {settings.task} is a "
                    "generation task: use cs_stratified, two_stage or one_shot_greedy")
  general = {}
  if settings.validate:
    general = {name: load_task(name, {}, num_samples=settings.general_samples, seed=settings.seed,
                               data_dir=settings.data_dir)
               for name in settings.general_tasks if name != settings.task}
  return Tasks(target, general, metric)


def measure(store: MeasurementStore, plan: methods.Plan, target: Evaluator, progress: bool = True) -> None:
  """Measures what `plan` asks for, saving after every engine batch; resumes from `store`."""
  total = plan.expected_total()
  bar = tqdm(total=total, initial=min(len(store), total), desc=f"measuring {target.name}", unit="mask",
             disable=not progress, dynamic_ncols=True)
  try:
    while (todo := plan.next_masks(store)) is not None:
      for where, metrics in target.batches((~todo).astype(np.float32)):
        store.append(todo[where], metrics)
        bar.update(where.stop - where.start)
        bar.set_postfix({store.metric: f"{float(np.mean(metrics[store.metric])):.3f}"})
  finally:
    bar.close()


def localize(engine, settings: LocalizeSettings, tasks: Tasks | None = None, *, progress: bool = True
             ) -> dict[str, Any]:
  """Runs (or resumes) a localization and writes its outputs; returns the heads.json payload."""
  tasks = tasks or load_tasks(settings)
  method = methods.get(settings.method)
  timing: dict[str, float] = {}
  start = time.perf_counter()
  compiled_before = engine.compile_count
  c = engine.config
  exclude = parse_heads(settings.exclude_heads, c.num_layers, c.num_heads)
  settings.exclude_heads = [head_name(*h) for h in exclude]
  excluded = designs.excluded_heads(settings.exclude_heads, c.num_layers * c.num_heads, num_heads=c.num_heads)
  target = Evaluator.build(engine, settings.task, *tasks.target, settings.ablation)
  store = MeasurementStore(settings.output_dir, {**settings.shared_measurement_settings(),
                                                 **method.measurement_settings(settings)},
                           tasks.metric, c.num_layers, c.num_heads)
  resumed = len(store)
  if store.baseline is None:
    baseline = target.run(np.ones((1, c.num_layers, c.num_heads), np.float32))
    store.set_baseline({k: float(v[0]) for k, v in baseline.items()})
  log.info("%s baseline %s = %.4f (%d samples)%s", settings.task, tasks.metric, store.baseline, len(target.docs),
           f"; resuming after {resumed} saved masks" if resumed else "")
  timing["setup_seconds"] = time.perf_counter() - start

  def gradient() -> np.ndarray:
    t = time.perf_counter()
    change = target.first_order_change()
    timing["gradient_seconds"] = time.perf_counter() - t
    return change

  context = methods.Context(c.num_layers, c.num_heads, excluded, gradient, directory=settings.output_dir)
  plan = method.plan(settings, context)
  t = time.perf_counter()
  measure(store, plan, target, progress)
  timing["measure_seconds"] = time.perf_counter() - t
  timing["measured_this_run"] = len(store) - resumed
  if timing["measured_this_run"]:
    timing["seconds_per_mask"] = timing["measure_seconds"] / timing["measured_this_run"]

  t = time.perf_counter()
  ranking = plan.rank(store)
  timing["solve_seconds"] = time.perf_counter() - t
  files.save_array(os.path.join(settings.output_dir, "coefficients.npy"),
                   ranking.values.reshape(c.num_layers, c.num_heads))
  order = [int(h) for h in ranking.order if not excluded[h]]

  universal: list[int] = []
  if settings.validate:
    t = time.perf_counter()
    general = [Evaluator.build(engine, name, task, docs, settings.ablation)
               for name, (task, docs) in tasks.general.items()]
    candidates = order[:settings.universal_candidates]
    universal, universal_detail = validate.find_universal_heads(candidates, target, general,
                                                                settings.universal_threshold)
    filtered = [h for h in order if h not in universal]
    ablation = validate.ablation_curve(filtered, settings.top_k, target, general)
    ablation.update(universal_heads=[head_name(*divmod(h, c.num_heads)) for h in universal],
                    universal_threshold=settings.universal_threshold, single_head_drops=universal_detail,
                    metric=tasks.metric)
    files.write_json(os.path.join(settings.output_dir, "ablation.json"), ablation)
    timing["validate_seconds"] = time.perf_counter() - t
  timing["total_seconds"] = time.perf_counter() - start

  # Every head, most important first; universal heads (filtered from the top-k) and excluded heads last.
  ordered = [h for h in order if h not in universal] + universal + np.flatnonzero(excluded).tolist()
  heads = [{"name": head_name(*divmod(h, c.num_heads)), "layer": h // c.num_heads, "head": h % c.num_heads,
            "score": float(ranking.values[h])} for h in ordered]
  payload = {
      "model": settings.model, "task": settings.task, "method": settings.method, "metric": tasks.metric,
      "num_layers": c.num_layers, "num_heads": c.num_heads, "num_evaluations": len(store),
      "baseline": store.baseline, "heads": heads,
      "top_k": [h["name"] for h in heads[:settings.top_k]],
      "universal_heads": [head_name(*divmod(h, c.num_heads)) for h in universal],
      "solver": ranking.facts, "flags": dataclasses.asdict(settings), "timing": timing,
      "engine": {"compilations": engine.compile_count - compiled_before,
                 "seconds_per_mask": timing.get("seconds_per_mask")},
  }
  files.write_json(os.path.join(settings.output_dir, "heads.json"), payload)
  return payload
