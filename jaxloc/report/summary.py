"""The table printed at the end of a localization run."""

from __future__ import annotations

import os
from typing import Any


def task_label(name: str) -> str:
  """A registered task's name, or a custom task file's stem (not a truncated path)."""
  return os.path.splitext(os.path.basename(name))[0] if name.endswith(".jsonl") else name


def _width(name: str) -> int:
  return max(12, len(task_label(name)))


def summary_table(heads: dict[str, Any], ablation: dict[str, Any] | None) -> str:
  t = heads["timing"]
  lines = [f"{task_label(heads['task'])} on {heads['model']} ({heads['method']}, metric {heads['metric']}): "
           f"{heads['num_evaluations']} evaluations, baseline {heads['baseline']:.4f}, "
           f"{t['total_seconds']:.0f}s total ({t['measure_seconds']:.0f}s measuring)"]
  engine = heads.get("engine") or {}
  if engine.get("compilations") is not None and engine.get("seconds_per_mask"):
    lines.append(f"engine: {engine['seconds_per_mask']:.3f}s per mask, {engine['compilations']} compiled shapes")
  solver = heads.get("solver") or {}
  if "lasso_alpha" in solver:
    line = (f"Lasso alpha {solver['lasso_alpha']:.3g} ({solver['alpha_selection']}), {solver['nonzero']} nonzero "
            f"coefficients")
    if "sklearn_max_abs_diff" in solver:
      line += f", max |coef - sklearn| {solver['sklearn_max_abs_diff']:.2e}"
    lines.append(line)
  alone = (ablation or {}).get("single_head_drops", {})
  general_names = ([ablation["task"]["name"]] + list(ablation["general"])) if ablation else []
  header = f"{'rank':>4s}  {'head':8s} {'score':>10s}"
  if alone:
    header += "   ablated alone, relative drop: " + "  ".join(f"{task_label(n):>{_width(n)}s}" for n in general_names)
  lines.append(header)
  for rank, h in enumerate(heads["heads"][:len(heads["top_k"])], start=1):
    line = f"{rank:4d}  {h['name']:8s} {h['score']:10.4f}"
    if h["name"] in alone:
      line += " " * 31 + "  ".join(f"{100 * alone[h['name']].get(n, float('nan')):{_width(n) - 1}.0f}%"
                                   for n in general_names)
    lines.append(line)
  if heads.get("universal_heads"):
    lines.append(f"universal heads (filtered out): {', '.join(heads['universal_heads'])}")
  if ablation:
    task = ablation["task"]
    metric = task["default_metric"]
    values, drops = task["metrics"][metric], task["relative_drop"][metric]
    lines.append(f"ablating the top-{len(ablation['heads'])}: {task_label(task['name'])} {metric} {values[0]:.3f} -> "
                 f"{values[-1]:.3f} ({100 * drops[-1]:+.1f}% drop)")
    for name, general in ablation["general"].items():
      lines.append(f"  general {name:22s} {general['metric']:9s} {general['scores'][0]:.3f} -> "
                   f"{general['scores'][-1]:.3f} ({100 * general['relative_drop'][-1]:+.1f}% drop)")
  return "\n".join(lines)
