"""The table printed at the end of a localization run."""

from __future__ import annotations

import os
from typing import Any


def task_label(name: str) -> str:
  """A registered task's name, or a custom task file's stem (not a truncated path)."""
  return os.path.splitext(os.path.basename(name))[0] if name.endswith(".jsonl") else name


def _width(name: str) -> int:
  return max(12, len(task_label(name)))


def _percent(value) -> str:
  return "  n/a" if value is None else f"{100 * value:4.0f}%"


def summary_table(heads: dict[str, Any], ablation: dict[str, Any] | None) -> str:
  t = heads["timing"]
  lines = [f"{task_label(heads['task'])} on {heads['model']} ({heads['method']}, metric {heads['metric']}): "
           f"{heads['num_evaluations']} evaluations, baseline {heads['baseline']:.4f}"
           + (f" on {heads['num_docs']} documents" if heads.get("num_docs") else "")
           + f", {t['total_seconds']:.0f}s total ({t['measure_seconds']:.0f}s measuring)"]
  general = heads.get("general_tasks") or {}
  if general:
    lines.append("general tasks scored under the same masks: " + ", ".join(
        f"{name} ({g['metric']} {g['baseline']:.3f})" for name, g in general.items()))
  engine = heads.get("engine") or {}
  if engine.get("compilations") is not None and engine.get("seconds_per_mask"):
    lines.append(f"engine: {engine['seconds_per_mask']:.3f}s per mask (all tasks), {engine['compilations']} "
                 "compiled shapes")
  solver = heads.get("solver") or {}
  if "lasso_alpha" in solver:
    line = (f"Lasso alpha {solver['lasso_alpha']:.3g} ({solver['alpha_selection']}), {solver['nonzero']} nonzero "
            f"coefficients")
    if "sklearn_max_abs_diff" in solver:
      line += f", max |coef - sklearn| {solver['sklearn_max_abs_diff']:.2e}"
    lines.append(line)
  if heads.get("selection"):
    lines.append(f"selection: {heads['selection']}")
  by_name = {h["name"]: h for h in heads["heads"]}
  universal = heads.get("universal") or {}
  if universal:
    lines.append(f"universal heads ({universal['rule']}): " + (", ".join(heads["universal_heads"]) or "none"))
  split = (universal.get("confirmed_on") or "held_out").replace("_", "-")
  for name in heads.get("universal_heads", []):
    drops = by_name[name].get(f"{universal.get('confirmed_on')}_single_head_drop", {})
    lines.append(f"  {name}: " + ", ".join(f"{task} {_percent(d).strip()}" for task, d in drops.items()))
  tasks = [task_label(heads["task"])] + list(general)
  width = [max(9, len(n)) for n in tasks]
  confident = heads.get("confidence") is not None
  header = f"{'rank':>4s}  {'head':7s} {'value':>8s}"
  if confident:
    header += f" {'selected':>8s} {'95% interval':>17s}"
  header += f"   ablated alone ({split}), relative drop: " + " ".join(f"{n:>{w}s}" for n, w in zip(tasks, width))
  lines.append(header)
  for rank, name in enumerate(heads["top_k"], start=1):
    h = by_name[name]
    line = f"{rank:4d}  {name:7s} {h['score']:8.4f}"
    if confident:
      low, high = h["interval"]
      line += f" {100 * h['selection_frequency']:7.0f}% [{low:7.3f},{high:7.3f}]"
    drops = h.get(f"{universal.get('confirmed_on', 'held_out')}_single_head_drop", {})
    line += " " * (len(header) - len(line) - len(" ".join(f"{n:>{w}s}" for n, w in zip(tasks, width))))
    line += " ".join(f"{_percent(drops.get(n)):>{w}s}" for n, w in zip(tasks, width))
    lines.append(line)
  if confident:
    lines.append(f"selected: share of {heads['confidence']['resamples']} bootstrap resamples "
                 f"({heads['confidence']['resampled']}) whose top-{len(heads['top_k'])} holds the head")
  if ablation:
    for key, label in (("held_out", "held-out"), ("in_sample", "in-sample")):
      record = ablation.get(key)
      if not record:
        continue
      general_drops = ", ".join(f"{task_label(n)} {_percent(d).strip()}" for n, d in record["general_relative_drop"]
                                .items())
      lines.append(f"top-{record['k']} ablated together, {label} ({record['num_docs']} documents per task): "
                   f"{task_label(heads['task'])} {_percent(record['task_relative_drop']).strip()} drop"
                   + (f"; general: {general_drops}" if general_drops else ""))
  return "\n".join(lines)
