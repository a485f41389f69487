"""Evaluating a task with a fixed set of heads, or of MLP neurons, ablated: the library side of `experiments.evaluate`
(its contract below); tasks meet the engine in `tasks.evaluator`.

Result: {"model", "task", "heads", "ablation", "num_samples", "metrics": {name: value}} (a per-document metric's
mean over samples; a task's aggregate-only metrics, e.g. an lm-eval corpus F1, by the task's own aggregation);
for neurons "neurons" takes the place of "heads". With `curve`, the units are a ranking and the result gains
"curve": the unablated model and each prefix of the ranking (top-1, top-2, …, all), [{"heads" (or "neurons"),
"metrics"}], evaluated as one batch of k+1 masks; "metrics" is still the full set's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from numpy.typing import ArrayLike

from jaxloc.errors import UserError
from jaxloc.units import check_unit, keep_mask, parse_units, unit_name, units_per_layer
from jaxloc.tasks.base import Doc, Task
from jaxloc.tasks.evaluator import Evaluator, load_task

if TYPE_CHECKING:
  from jaxloc.engine.engine import Engine

ABLATIONS = ("zero", "mean")


def _evaluator(engine: Engine, task_name: str, ablation: str, unit: str, loaded: tuple[Task, list[Doc]]) -> Evaluator:
  """The task on its documents under `ablation` over `unit`, checked."""
  if ablation not in ABLATIONS:
    raise UserError(f"unknown ablation {ablation!r}; valid: {', '.join(ABLATIONS)}")
  check_unit(unit)
  return Evaluator.build(engine, task_name, *loaded, ablation, unit)


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
                   neurons: str | Sequence[str] | None = None) -> dict[str, Any]:
  """A task's metrics with `heads` (names, e.g. ["L8H1", "L20H5"] or "L8H1,L20H5") or `neurons` ("L3N117,...")
  ablated: the `experiments.evaluate` result (module docstring); with `curve`, also each prefix of the ranking.
  `loaded` as for `evaluate_masks`."""
  if heads and neurons:
    raise UserError("give heads or neurons to ablate, not both")
  unit, names = ("neurons", neurons) if neurons else ("heads", heads)
  config = engine.model_config
  per_layer = units_per_layer(config, unit)
  parsed = parse_units(names, config.num_layers, per_layer, unit)
  sets = [parsed[:k] for k in range(len(parsed) + 1)] if curve else [parsed]
  masks = np.stack([keep_mask(units, config.num_layers, per_layer) for units in sets])
  task, docs = loaded or load_task(task_name, task_options, num_samples=num_samples, seed=seed, data_dir=data_dir)
  metrics = _evaluator(engine, task_name, ablation if parsed else "zero", unit, (task, docs)).run(
      masks.astype(np.float32), progress=progress)
  rows = [{unit: [unit_name(layer, index, unit) for layer, index in units],
           "metrics": {name: float(values[row]) for name, values in metrics.items()}}
          for row, units in enumerate(sets)]
  result = {
      "model": engine.model.name,
      "task": task_name,
      unit: rows[-1][unit],
      "ablation": ablation,
      "num_samples": len(docs),
      "metrics": rows[-1]["metrics"],
  }
  if curve:
    result["curve"] = rows
  return result
