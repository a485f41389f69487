"""The heads-versus-neurons comparison (`jaxloc.studies.heads_vs_neurons`) as a markdown table and a plot."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxloc import files  # noqa: E402
from jaxloc.tasks.names import task_label  # noqa: E402

_SERIES = (("top_heads", "top heads", "tab:blue", "-"), ("top_neurons", "top neurons", "tab:orange", "-"),
           ("random_heads", "random heads", "tab:blue", ":"), ("random_neurons", "random neurons", "tab:orange", ":"))


def _pct(value) -> str:
  return "n/a" if value is None else f"{100 * value:.1f}%"


def _with_interval(entry: dict[str, Any]) -> str:
  target = next(iter(entry["tasks"].values()))
  low, high = target.get("interval", [None, None])
  text = _pct(entry["target"])
  return text + (f" [{100 * low:.0f}, {100 * high:.0f}]" if low is not None and high is not None else "")


def markdown(result: dict[str, Any]) -> str:
  """One row per budget: the target's held-out relative drop and the largest general drop for the top and random
  heads and neurons that zero the same number of parameters."""
  lines = [f"{task_label(result['task'])} on {result['model']} ({result['metric']}, held out, {result['ablation']} "
           f"ablation): heads from {result['heads_method']}, neurons from {result['neurons_method']}; random: mean of "
           f"{result['draws']} draws",
           "",
           "| heads | neurons | parameters | target drop: top heads | top neurons | random heads | random neurons "
           "| largest general drop: top heads | top neurons |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for b in result["budgets"]:
    lines.append(f"| {b['heads']} | {b['neurons']} | {b['parameters']:,} | {_with_interval(b['top_heads'])} "
                 f"| {_with_interval(b['top_neurons'])} | {_pct(b['random_heads']['target'])} "
                 f"| {_pct(b['random_neurons']['target'])} | {_pct(b['top_heads']['max_general'])} "
                 f"| {_pct(b['top_neurons']['max_general'])} |")
  return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> None:
  """Target drop (left) and largest general drop (right) against the parameters zeroed, per series."""
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
  heads = [b["heads"] for b in result["budgets"]]
  for key, label, color, style in _SERIES:
    for ax, what in zip(axes, ("target", "max_general")):
      values = np.array([np.nan if b[key][what] is None else b[key][what] for b in result["budgets"]], float)
      ax.plot(heads, values * 100, style, marker="o", color=color, label=label)
  neurons_per_head = result["budgets"][0]["neurons"] // result["budgets"][0]["heads"]
  for ax, title in zip(axes, (f"{task_label(result['task'])} (target)", "largest general-task drop")):
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xticks(heads)
    ax.set_xticklabels([f"{k} / {k * neurons_per_head}" for k in heads], fontsize=8)
    ax.set_xlabel("heads / neurons ablated (equal parameters zeroed)")
    ax.set_title(title, fontsize=10)
  axes[0].set_ylabel("relative drop on held-out documents (%)")
  axes[0].legend(fontsize=8)
  fig.suptitle(f"Heads vs neurons on {result['model']}: {result['heads_method']} heads, {result['neurons_method']} "
               "neurons", fontsize=10)
  fig.tight_layout()
  files.save_figure(path, fig, dpi=130)
  plt.close(fig)
