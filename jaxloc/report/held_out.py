"""The held-out table of finished runs: per run, the top-k it reports, the target's held-out drop with its interval,
the largest held-out general drop with its interval, and what the confirmation's decisions cost (masks, general-task
documents beyond the identification documents, seconds). Read from the run files alone (heads.json, ablation.json);
`summarize` keeps what the table needs as a small JSON that docs/ commits instead of the runs.

    python -m experiments.report --runs=runs/a,runs/b --held_out_json=held_out.json   # prints the table too

Drops are relative, as fractions (0.6 = 60%); intervals are the held-out paired bootstrap's 95% (`validate`).
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from jaxloc.errors import UserError
from jaxloc.tasks.names import task_label


def summarize(directory: str) -> dict[str, Any]:
  """One run's row: what the held-out table shows, from its heads.json and ablation.json."""
  paths = {name: os.path.join(directory, f"{name}.json") for name in ("heads", "ablation")}
  loaded = {}
  for name, path in paths.items():
    if not os.path.isfile(path):
      raise UserError(f"{path} does not exist: {directory} is not a finished head localization run with validation")
    with open(path, encoding="utf-8") as f:
      loaded[name] = json.load(f)
  heads, ablation = loaded["heads"], loaded["ablation"]
  if "held_out" not in ablation:
    raise UserError(f"{paths['ablation']} has no held-out drops: rerun it")
  held = ablation["held_out"]
  general = {task_label(t): d for t, d in held.get("general_relative_drop", {}).items()}
  intervals = {task_label(t): i for t, i in held.get("general_relative_drop_interval", {}).items()}
  worst = max((t for t, d in general.items() if d is not None), key=lambda t: general[t], default=None)
  confirmation = heads.get("confirmation") or {}
  flags = heads.get("flags", {})
  return {
      "directory": directory, "task": task_label(heads["task"]), "method": heads["method"],
      # A run from before decisions carried intervals compared point estimates on the identification documents.
      "rule": (confirmation.get("decision_rule") or {}).get("rule", flags.get("specific_rule", "point estimates")),
      "evaluations": heads["num_evaluations"], "top_k": held["heads"], "num_docs": held["num_docs"],
      "task_drop": held["task_relative_drop"], "task_interval": held.get("task_relative_drop_interval"),
      "worst_general": worst, "general_drop": general.get(worst), "general_interval": intervals.get(worst),
      "general_drops": general, "confirmation_masks": confirmation.get("masks", 0),
      "extra_documents": confirmation.get("extra_documents", 0),
      "confirm_seconds": heads.get("timing", {}).get("confirm_seconds"),
      "total_seconds": heads.get("timing", {}).get("total_seconds"),
  }


def _pct(value: float | None) -> str:
  return "—" if value is None else f"{100 * value:.0f}%"


def _interval(interval: Sequence[float] | None) -> str:
  return "" if not interval else f" [{_pct(interval[0])}, {_pct(interval[1])}]"


def markdown(rows: Sequence[dict[str, Any]]) -> str:
  """The table (a row per run, in the order given)."""
  lines = ["| method (evaluations) | rule | top-5 | task drop | largest general drop | confirmation: masks, "
           "extra documents, seconds |", "|---|---|---|---|---|---|"]
  for r in rows:
    general = (f"{_pct(r['general_drop'])}{_interval(r['general_interval'])} ({r['worst_general']})"
               if r["worst_general"] else "—")
    seconds = "—" if r["confirm_seconds"] is None else f"{r['confirm_seconds']:.0f} s"
    lines.append(f"| {r['method']} ({r['evaluations']}) | {r['rule']} | {', '.join(r['top_k'])} | "
                 f"{_pct(r['task_drop'])}{_interval(r['task_interval'])} | {general} | "
                 f"{r['confirmation_masks']}, {r['extra_documents']}, {seconds} |")
  return "\n".join(lines)
