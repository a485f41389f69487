"""Capability generalization (the paper's Table 3) from runs already on disk: the held-out relative drop that
ablating the top-k heads found for task A causes on task B, for every run A and every task B any run measured.

Each run's `ablation.json` holds its top-k's held-out drops on its target and on its general tasks, so the
matrix needs no model: a cell is empty only where run A never measured task B. The same table in the shape
of the paper's Table 2 (per run: the task drop, the largest general drop, the heads) comes with it.

Axes of the matrix: `runs` (rows, one per target), `tasks` (columns, targets first, then other tasks).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxloc import files  # noqa: E402
from jaxloc.errors import UserError  # noqa: E402
from jaxloc.tasks.names import task_label  # noqa: E402


def load_run(directory: str) -> dict[str, Any]:
  """A run's target, heads and held-out drops per task, from its heads.json and ablation.json."""
  paths = [os.path.join(directory, name) for name in ("heads.json", "ablation.json")]
  for path in paths:
    if not os.path.exists(path):
      raise UserError(f"{path} does not exist: {directory} is not a finished localization run with validation")
  with open(paths[0]) as f:
    heads = json.load(f)
  with open(paths[1]) as f:
    ablation = json.load(f)
  if "held_out" not in ablation:
    raise UserError(f"{paths[1]} has no held-out drops (written before held-out validation existed): rerun it")
  held_out = ablation["held_out"]
  target = task_label(heads["task"])
  drops = {target: held_out["task_relative_drop"],
           **{task_label(name): d for name, d in held_out["general_relative_drop"].items()}}
  return {"directory": directory, "task": target, "model": heads["model"], "method": heads["method"],
          "evaluations": heads["num_evaluations"], "heads": held_out["heads"], "num_docs": held_out["num_docs"],
          "drops": drops, "universal_heads": heads.get("universal_heads", [])}


def cross_task(directories: Sequence[str]) -> dict[str, Any]:
  runs = [load_run(d) for d in directories]
  if len({r["task"] for r in runs}) != len(runs):
    raise UserError("two runs localize the same task: give one run per target task")
  models = {r["model"] for r in runs}
  if len(models) > 1:
    raise UserError(f"the runs are of different models ({', '.join(sorted(map(str, models)))})")
  tasks = [r["task"] for r in runs]
  tasks += sorted({t for r in runs for t in r["drops"]} - set(tasks))
  matrix = [[r["drops"].get(t) for t in tasks] for r in runs]
  table = []
  for r in runs:
    general = {t: d for t, d in r["drops"].items() if t != r["task"] and d is not None}
    worst = max(general, key=general.get) if general else None
    table.append({"task": r["task"], "task_relative_drop": r["drops"][r["task"]],
                  "largest_general_relative_drop": general.get(worst), "largest_general_task": worst,
                  "heads": r["heads"], "evaluations": r["evaluations"], "method": r["method"],
                  "universal_heads": r["universal_heads"], "num_docs": r["num_docs"]})
  return {"model": runs[0]["model"], "runs": [r["directory"] for r in runs], "rows": [r["task"] for r in runs],
          "columns": tasks, "relative_drop": matrix, "table": table}


def _cell(value) -> str:
  return "" if value is None else f"{100 * value:.0f}%"


def markdown(result: dict[str, Any]) -> str:
  lines = ["| heads of ↓ ablated, drop on → | " + " | ".join(result["columns"]) + " |",
           "|---|" + "---|" * len(result["columns"])]
  for row, values in zip(result["rows"], result["relative_drop"]):
    lines.append(f"| {row} | " + " | ".join(f"**{_cell(v)}**" if c == row else _cell(v)
                                           for c, v in zip(result["columns"], values)) + " |")
  lines += ["", "| task | task drop | largest general drop | heads (top-k, specific) | evaluations | universal heads |",
            "|---|---|---|---|---|---|"]
  for t in result["table"]:
    lines.append(f"| {t['task']} | {_cell(t['task_relative_drop'])} | {_cell(t['largest_general_relative_drop'])}"
                 f" ({t['largest_general_task']}) | {', '.join(t['heads'])} | {t['evaluations']} ({t['method']}) | "
                 f"{', '.join(t['universal_heads']) or 'none'} |")
  return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
  matrix = np.array([[np.nan if v is None else 100 * v for v in row] for row in result["relative_drop"]], float)
  fig, ax = plt.subplots(figsize=(1.3 * len(result["columns"]) + 2.5, 0.7 * len(result["rows"]) + 2))
  image = ax.imshow(matrix, cmap="Reds", vmin=0, vmax=100, aspect="auto")
  for i in range(matrix.shape[0]):
    for j in range(matrix.shape[1]):
      if not np.isnan(matrix[i, j]):
        ax.text(j, i, f"{matrix[i, j]:.0f}%", ha="center", va="center", fontsize=9,
                color="white" if matrix[i, j] > 60 else "black")
  ax.set_xticks(range(len(result["columns"])), result["columns"], rotation=30, ha="right")
  ax.set_yticks(range(len(result["rows"])), [f"{r} heads" for r in result["rows"]])
  fig.colorbar(image, ax=ax, label="held-out relative drop (%)")
  ax.set_title(f"Ablating one task's top heads: drop on every task ({os.path.basename(str(result['model']))})",
               fontsize=10)
  fig.tight_layout()
  files.save_figure(path, fig, dpi=130)
  plt.close(fig)
