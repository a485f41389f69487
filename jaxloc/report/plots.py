"""Pictures of a localization run: the layer × head coefficient heatmap and the top-k ablation curve."""

from __future__ import annotations

import json
import os
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def heatmap(coefficients: np.ndarray, heads: dict[str, Any], path: str) -> None:
  """Coefficients [layers, heads], diverging around 0; the top-k heads boxed, universal heads crossed."""
  num_layers, num_heads = coefficients.shape
  limit = float(np.abs(coefficients).max()) or 1.0
  fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * num_heads + 2.5), max(4.0, 0.22 * num_layers + 1.5)))
  image = ax.imshow(coefficients, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
  top = {(h["layer"], h["head"]) for h in heads["heads"] if h["name"] in set(heads["top_k"])}
  for layer, head in top:
    ax.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
  by_name = {h["name"]: h for h in heads["heads"]}
  for name in heads.get("universal_heads", []):
    h = by_name[name]
    ax.plot(h["head"], h["layer"], marker="x", color="black", markersize=8)
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_xticks(range(0, num_heads, max(1, num_heads // 16)))
  ax.set_yticks(range(0, num_layers, max(1, num_layers // 16)))
  label = (heads.get("solver") or {}).get("value", "score")
  fig.colorbar(image, ax=ax, label=f"{label} ({heads['metric']})")
  ax.set_title(f"{heads['task']} on {os.path.basename(str(heads['model']))}: {heads['method']}, "
               f"{heads['num_evaluations']} evaluations\nboxed: top-{len(heads['top_k'])}"
               + (", x: universal" if heads.get("universal_heads") else ""), fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)


def ablation_curve(ablation: dict[str, Any], path: str) -> None:
  """Relative drop of the task and of each general task as the top-1..k heads are ablated together."""
  k = ablation["k"]
  task = ablation["task"]
  metric = task["default_metric"]
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  ax.plot(k, np.array(task["relative_drop"][metric]) * 100, marker="o", linewidth=2.5, color="black",
          label=f"{task['name']} ({metric})")
  for name, general in ablation["general"].items():
    ax.plot(k, np.array(general["relative_drop"]) * 100, marker=".", linewidth=1.2, alpha=0.8,
            label=f"{name} ({general['metric']})")
  ax.axhline(0, color="grey", linewidth=0.8)
  ax.set_xticks(k)
  ax.set_xticklabels(["none"] + [f"+{h}" for h in ablation["heads"]], rotation=30, ha="right", fontsize=8)
  ax.set_xlabel("heads ablated (cumulative, in rank order)")
  ax.set_ylabel("relative drop (%)")
  ax.legend(fontsize=8)
  ax.set_title("Top-k ablation: target task vs general tasks", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)


def write_plots(output_dir: str) -> list[str]:
  """Draws every plot a run's outputs allow; returns the paths written."""
  written = []
  with open(os.path.join(output_dir, "heads.json")) as f:
    heads = json.load(f)
  coefficients = np.load(os.path.join(output_dir, "coefficients.npy"))
  path = os.path.join(output_dir, "heatmap.png")
  heatmap(coefficients, heads, path)
  written.append(path)
  ablation_path = os.path.join(output_dir, "ablation.json")
  if os.path.exists(ablation_path):
    with open(ablation_path) as f:
      ablation = json.load(f)
    path = os.path.join(output_dir, "ablation_curve.png")
    ablation_curve(ablation, path)
    written.append(path)
  return written
