"""Evaluating a task with a fixed set of heads, or of MLP neurons, ablated: the library side of `experiments.evaluate`
(its contract below); tasks meet the engine in `tasks.evaluator`.

Result: {"model", "task", "heads", "ablation", "num_samples", "metrics": {name: value}} (a per-document metric's
mean over samples; a task's aggregate-only metrics, e.g. an lm-eval corpus F1, by the task's own aggregation);
for neurons "neurons" takes the place of "heads". With `curve`, the units are a ranking and the result gains
"curve": the unablated model and each prefix of the ranking (top-1, top-2, …, all), [{"heads" (or "neurons"),
"metrics", "relative_drop", "relative_drop_interval"}], evaluated as one batch of k+1 masks; "metrics" is still
the full set's. A row's "relative_drop" is {name: (unablated - value) / |unablated|} and "relative_drop_interval"
{name: [low, high]}, the 95% paired bootstrap over the documents that validation uses (`validate.drop_interval`;
None against an unablated value of 0), where every metric of the task is defined per document (a task with
aggregate-only metrics, e.g. an lm-eval corpus F1, gets its curve without drops). With `skip_samples` K the
documents are the `num_samples` that follow the first K of the seeded draw: the held-out documents of a localization
run with --num_samples=K, --validation_samples=`num_samples` and the same seed (the result gains "skip_samples").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from numpy.typing import ArrayLike

from jaxloc.errors import UserError
from jaxloc.localize.validate import drops_of
from jaxloc.units import check_unit, keep_mask, parse_units, unit_name, units_per_layer
from jaxloc.tasks.base import Doc, Task, mean_over_docs
from jaxloc.tasks.evaluator import Evaluator, load_task, load_task_split

if TYPE_CHECKING:
  from jaxloc.engine.engine import Engine

ABLATIONS = ("zero", "mean")


def _evaluator(engine: Engine, task_name: str, ablation: str, unit: str, loaded: tuple[Task, list[Doc]]) -> Evaluator:
  """The task on its documents under `ablation` over `unit`, checked."""
  if ablation not in ABLATIONS:
    raise UserError(f"unknown ablation {ablation!r}; valid: {', '.join(ABLATIONS)}")
  check_unit(unit)
  return Evaluator.build(engine, task_name, *loaded, ablation, unit)


def load_documents(task_name: str, task_options: dict[str, Any] | None = None, *, num_samples: int | None = None,
                   seed: int = 0, data_dir: str | None = None, skip_samples: int = 0) -> tuple[Task, list[Doc]]:
  """The task and the documents a fixed ablation is evaluated on: `load_task`'s seeded subset, or with
  `skip_samples` K the `num_samples` documents after the first K of the same seeded draw (a localization run's
  held-out documents; `tasks.evaluator.load_task_split`)."""
  if not skip_samples:
    return load_task(task_name, task_options, num_samples=num_samples, seed=seed, data_dir=data_dir)
  if num_samples is None:
    raise UserError("--skip_samples evaluates the documents after a run's identification documents: give how many "
                    "with --num_samples (the run's --validation_samples)")
  task, _, held_out = load_task_split(task_name, task_options, num_samples=skip_samples,
                                      validation_samples=num_samples, seed=seed, data_dir=data_dir)
  return task, held_out


def evaluate_masks(engine: Engine, task_name: str, keep_masks: ArrayLike, *, ablation: str = "zero",
                   num_samples: int | None = None, seed: int = 0, data_dir: str | None = None,
                   task_options: dict[str, Any] | None = None, progress: bool = False, per_doc: bool = False,
                   loaded: tuple[Task, list[Doc]] | None = None, unit: str = "heads") -> dict[str, np.ndarray]:
  """A task's metrics under every keep-mask (float [masks, layers, units] over `unit`, heads or neurons; 1 keep,
  0 ablate), evaluated as one batch: name -> float [masks] (with `per_doc`, the per-document metrics,
  [masks, docs]). With mean ablation an ablated unit outputs its mean over the evaluated documents' tokens.
  `loaded`: the task and its documents when already loaded (`tasks.evaluation.load_task`, before the model, as
  the CLI does)."""
  return _evaluator(engine, task_name, ablation, unit, loaded or load_task(
      task_name, task_options, num_samples=num_samples, seed=seed, data_dir=data_dir)).run(
          np.asarray(keep_masks, np.float32), progress=progress, per_doc=per_doc)


def evaluate_heads(engine: Engine, task_name: str, *, heads: str | Sequence[str] | None = None, ablation: str = "zero",
                   num_samples: int | None = None, seed: int = 0, data_dir: str | None = None,
                   task_options: dict[str, Any] | None = None, progress: bool = False,
                   curve: bool = False, loaded: tuple[Task, list[Doc]] | None = None,
                   neurons: str | Sequence[str] | None = None, skip_samples: int = 0) -> dict[str, Any]:
  """A task's metrics with `heads` (names, e.g. ["L8H1", "L20H5"] or "L8H1,L20H5") or `neurons` ("L3N117,...")
  ablated: the `experiments.evaluate` result (module docstring); with `curve`, also each prefix of the ranking and
  its drop with an interval. `loaded` as for `evaluate_masks`; `skip_samples` as for `load_documents`."""
  if heads and neurons:
    raise UserError("give heads or neurons to ablate, not both")
  unit, names = ("neurons", neurons) if neurons else ("heads", heads)
  config = engine.model_config
  per_layer = units_per_layer(config, unit)
  parsed = parse_units(names, config.num_layers, per_layer, unit)
  sets = [parsed[:k] for k in range(len(parsed) + 1)] if curve else [parsed]
  masks = np.stack([keep_mask(units, config.num_layers, per_layer) for units in sets])
  task, docs = loaded or load_documents(task_name, task_options, num_samples=num_samples, seed=seed,
                                       data_dir=data_dir, skip_samples=skip_samples)
  # A curve's intervals need per-document metrics; a task with aggregate-only metrics (an lm-eval corpus F1) is
  # evaluated by its own aggregation, its curve without drops.
  per_doc = curve and not task.aggregate_metric_names
  measured = _evaluator(engine, task_name, ablation if parsed else "zero", unit, (task, docs)).run(
      masks.astype(np.float32), progress=progress, per_doc=per_doc)
  metrics = mean_over_docs(measured) if per_doc else measured
  rows: list[dict[str, Any]] = [{unit: [unit_name(layer, index, unit) for layer, index in units],
                                  "metrics": {name: float(values[row]) for name, values in metrics.items()}}
                                 for row, units in enumerate(sets)]
  if per_doc:
    for name, values in measured.items():
      _, drops, intervals = drops_of(values)
      for row, drop, interval in zip(rows, drops, intervals):
        row.setdefault("relative_drop", {})[name] = None if np.isnan(drop) else float(drop)
        row.setdefault("relative_drop_interval", {})[name] = interval
  result = {
      "model": engine.model.name,
      "task": task_name,
      unit: rows[-1][unit],
      "ablation": ablation,
      "num_samples": len(docs),
      "metrics": rows[-1]["metrics"],
  }
  if skip_samples:
    result["skip_samples"] = skip_samples
  if curve:
    result["curve"] = rows
  return result

