"""Capability generalization (the paper's Table 3) from runs already on disk: the held-out relative drop that
ablating the top-k heads found for task A causes on task B, for every run A and every task B any run measured,
per model; with runs of several models, the same targets side by side (does the claim hold on each architecture?).

Each run's `ablation.json` holds its top-k's held-out drops on its target and on its general tasks, so the
matrix needs no model: a cell is empty only where run A never measured task B. The same table in the shape
of the paper's Table 2 (per run: the task drop, the largest general drop, the heads) comes with it.

Result: `models`, one block per model in the order its first run was given (axes of its matrix: `runs`, rows,
one per target; `tasks`, columns, targets first, then other tasks), and `comparison`: targets (rows) × models
(columns), each cell a run's target drop, its interval and its largest general drop, or null where that model has
no run of that target.
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
  return {"directory": directory, "task": target, "model": str(heads["model"]),
          "method": heads["method"], "metric": heads.get("metric"), "baseline": heads.get("baseline"),
          "evaluations": heads["num_evaluations"], "heads": held_out["heads"], "num_docs": held_out["num_docs"],
          "drops": drops, "task_interval": held_out.get("task_relative_drop_interval"),
          "universal_heads": heads.get("universal_heads", [])}


def matrix(runs: list[dict[str, Any]]) -> dict[str, Any]:
  """One model's runs: the drop matrix and the Table 2 rows."""
  tasks = [r["task"] for r in runs]
  tasks += sorted({t for r in runs for t in r["drops"]} - set(tasks))
  table = []
  for r in runs:
    general = {t: d for t, d in r["drops"].items() if t != r["task"] and d is not None}
    worst = max(general, key=general.get) if general else None
    table.append({"task": r["task"], "task_relative_drop": r["drops"][r["task"]],
                  "task_relative_drop_interval": r["task_interval"],
                  "largest_general_relative_drop": general.get(worst), "largest_general_task": worst,
                  "heads": r["heads"], "evaluations": r["evaluations"], "method": r["method"],
                  "metric": r["metric"], "baseline": r["baseline"], "universal_heads": r["universal_heads"],
                  "num_docs": r["num_docs"]})
  return {"model": runs[0]["model"], "runs": [r["directory"] for r in runs], "rows": tasks[:len(runs)],
          "columns": tasks, "relative_drop": [[r["drops"].get(t) for t in tasks] for r in runs], "table": table}


def model_labels(models: Sequence[str]) -> dict[str, str]:
  """Each model's label: its file or directory name, or the whole name where two models share that."""
  short = {m: os.path.basename(m.rstrip("/")) or m for m in models}
  counts: dict[str, int] = {}
  for label in short.values():
    counts[label] = counts.get(label, 0) + 1
  return {m: label if counts[label] == 1 else m for m, label in short.items()}


def cross_task(directories: Sequence[str]) -> dict[str, Any]:
  runs = [load_run(d) for d in directories]
  labels = model_labels(list(dict.fromkeys(r["model"] for r in runs)))
  by_model: dict[str, list[dict[str, Any]]] = {}
  for r in runs:
    r["model"] = labels[r["model"]]
    by_model.setdefault(r["model"], []).append(r)
  for model, mine in by_model.items():
    tasks = [r["task"] for r in mine]
    if len(set(tasks)) != len(tasks):
      raise UserError(f"two runs of {model} localize the same task: give one run per model and target task")
  blocks = [matrix(mine) for mine in by_model.values()]
  targets = list(dict.fromkeys(r["task"] for r in runs))
  rows = {(b["model"], t["task"]): t for b in blocks for t in b["table"]}
  cells = [[rows.get((b["model"], task)) for b in blocks] for task in targets]
  return {"models": blocks, "comparison": {"tasks": targets, "models": [b["model"] for b in blocks],
                                           "cells": cells}}


def _cell(value) -> str:
  return "" if value is None else f"{100 * value:.0f}%"


def _interval(interval) -> str:
  if not interval or any(v is None for v in interval):  # no interval: a baseline of 0 has nothing to lose
    return ""
  return f" [{100 * interval[0]:.0f}, {100 * interval[1]:.0f}]"


def _model_markdown(block: dict[str, Any]) -> list[str]:
  lines = ["| heads of ↓ ablated, drop on → | " + " | ".join(block["columns"]) + " |",
           "|---|" + "---|" * len(block["columns"])]
  for row, values in zip(block["rows"], block["relative_drop"]):
    lines.append(f"| {row} | " + " | ".join(f"**{_cell(v)}**" if c == row else _cell(v)
                                           for c, v in zip(block["columns"], values)) + " |")
  lines += ["", "| task | task drop | largest general drop | heads (top-k, specific) | evaluations | universal heads |",
            "|---|---|---|---|---|---|"]
  for t in block["table"]:
    lines.append(f"| {t['task']} | {_cell(t['task_relative_drop'])} | {_cell(t['largest_general_relative_drop'])}"
                 f" ({t['largest_general_task']}) | {', '.join(t['heads'])} | {t['evaluations']} ({t['method']}) | "
                 f"{', '.join(t['universal_heads']) or 'none'} |")
  return lines


def _comparison_cell(t: dict[str, Any] | None) -> str:
  if t is None:
    return "not run"
  baseline = t["baseline"]
  base = f"; baseline {baseline:.2f}" if isinstance(baseline, (int, float)) else ""
  general = (f"{_cell(t['largest_general_relative_drop'])} ({t['largest_general_task']})"
             if t["largest_general_task"] else "no general task")
  return f"{_cell(t['task_relative_drop'])}{_interval(t['task_relative_drop_interval'])} / {general}{base}"


def markdown(result: dict[str, Any]) -> str:
  """Per model its matrix and Table 2 rows; with several models each is headed by its name and the comparison
  follows (one model: the matrix and the rows alone, as its comparison says nothing more)."""
  blocks = result["models"]
  if len(blocks) == 1:
    return "\n".join(_model_markdown(blocks[0]))
  lines: list[str] = []
  for block in blocks:
    lines += [f"### {block['model']}", "", *_model_markdown(block), ""]
  comparison = result["comparison"]
  lines += ["### Each target on each model: held-out task drop [95% interval] / largest general drop (task); "
            "the target's baseline", "",
            "| target | " + " | ".join(comparison["models"]) + " |", "|---|" + "---|" * len(comparison["models"])]
  for task, cells in zip(comparison["tasks"], comparison["cells"]):
    lines.append(f"| {task} | " + " | ".join(_comparison_cell(c) for c in cells) + " |")
  return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
  """One heat map per model, stacked."""
  blocks = result["models"]
  heights = [0.55 * len(b["rows"]) + 1.3 for b in blocks]
  width = 1.3 * max(len(b["columns"]) for b in blocks) + 4
  fig, axes = plt.subplots(len(blocks), 1, figsize=(width, sum(heights) + 0.6), squeeze=False,
                           gridspec_kw={"height_ratios": heights}, layout="constrained")
  for ax, block in zip(axes[:, 0], blocks):
    matrix = np.array([[np.nan if v is None else 100 * v for v in row] for row in block["relative_drop"]], float)
    image = ax.imshow(matrix, cmap="Reds", vmin=0, vmax=100, aspect="auto")
    for i in range(matrix.shape[0]):
      for j in range(matrix.shape[1]):
        if not np.isnan(matrix[i, j]):
          ax.text(j, i, f"{matrix[i, j]:.0f}%", ha="center", va="center", fontsize=9,
                  color="white" if matrix[i, j] > 60 else "black")
    ax.set_xticks(range(len(block["columns"])), block["columns"], rotation=20, ha="right", fontsize=8)
    ax.set_yticks(range(len(block["rows"])), [f"{r} heads" for r in block["rows"]], fontsize=8)
    ax.set_title(block["model"], fontsize=10)
    fig.colorbar(image, ax=ax, label="held-out drop (%)")
  fig.suptitle("Ablating one task's top heads: held-out relative drop on every task", fontsize=10)
  files.save_figure(path, fig, dpi=130)
  plt.close(fig)
