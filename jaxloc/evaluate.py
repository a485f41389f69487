"""Evaluate a task with a fixed set of heads ablated (the `experiments.evaluate` contract).

Result: {"model", "task", "heads", "ablation", "num_samples", "metrics": {name: mean over samples}}.
With `curve`, the heads are a ranking and the result gains "curve": the unablated model and each prefix
of the ranking (top-1, top-2, …, all), [{"heads", "metrics"}], evaluated as one batch of k+1 masks;
"metrics" is still the full set's.
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
                   task_options: dict[str, Any] | None = None, progress: bool = False,
                   curve: bool = False) -> dict[str, Any]:
  if ablation not in ABLATIONS:
    raise UserError(f"unknown ablation {ablation!r}; valid: {', '.join(ABLATIONS)}")
  config = engine.config
  parsed = parse_heads(heads, config.num_layers, config.num_heads)
  task, docs = load_task(task_name, task_options, num_samples=num_samples, seed=seed, data_dir=data_dir)
  sets = [parsed[:k] for k in range(len(parsed) + 1)] if curve else [parsed]
  masks = np.stack([keep_mask(heads, config.num_layers, config.num_heads) for heads in sets])
  evaluator = Evaluator.build(engine, task_name, task, docs, ablation if parsed else "zero")
  metrics = evaluator.run(masks, progress=progress)
  rows = [{"heads": [head_name(layer, head) for layer, head in heads],
           "metrics": {name: float(np.asarray(values)[row]) for name, values in metrics.items()}}
          for row, heads in enumerate(sets)]
  result = {
      "model": engine.model.name,
      "task": task_name,
      "heads": rows[-1]["heads"],
      "ablation": ablation,
      "num_samples": len(docs),
      "metrics": rows[-1]["metrics"],
  }
  if curve:
    result["curve"] = rows
  return result

