"""Evaluate a task with a fixed set of heads ablated (the `experiments.evaluate` contract).

Result: {"model", "task", "heads", "ablation", "num_samples", "metrics": {name: mean over samples}}.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxloc.errors import UserError
from jaxloc.heads import head_name, keep_mask, parse_heads
from jaxloc.tasks.evaluation import Evaluator, load_task

ABLATIONS = ("zero", "mean")


def evaluate_heads(engine, task_name: str, *, heads: str | Sequence[str] | None = None, ablation: str = "zero",
                   num_samples: int | None = None, seed: int = 0, data_dir: str | None = None,
                   task_options: dict[str, Any] | None = None, progress: bool = False) -> dict[str, Any]:
  if ablation not in ABLATIONS:
    raise UserError(f"unknown ablation {ablation!r}; valid: {', '.join(ABLATIONS)}")
  config = engine.config
  parsed = parse_heads(heads, config.num_layers, config.num_heads)
  task, docs = load_task(task_name, task_options, num_samples=num_samples, seed=seed, data_dir=data_dir)
  mask = keep_mask(parsed, config.num_layers, config.num_heads)[None]
  evaluator = Evaluator.build(engine, task_name, task, docs, ablation if parsed else "zero")
  metrics = evaluator.run(mask, progress=progress)
  return {
      "model": engine.model.name,
      "task": task_name,
      "heads": [head_name(layer, head) for layer, head in parsed],
      "ablation": ablation,
      "num_samples": len(docs),
      "metrics": {name: float(np.asarray(values)[0]) for name, values in metrics.items()},
  }

