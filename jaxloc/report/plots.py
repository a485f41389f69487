"""Pictures of a localization run: the layer × head coefficient heatmap (top-k boxed with their bootstrap
selection frequency, universal heads crossed) or, for neurons, the per-layer plot (top-k neurons per layer and
each layer's share of the ranking's value), the held-out ablation curve of every task for the selected units,
and the specificity curve (target drop against the largest general drop, selected vs raw ranking)."""

from __future__ import annotations

import os
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from jaxloc import files  # noqa: E402
from jaxloc.units import run_file  # noqa: E402
from jaxloc.tasks.names import task_label  # noqa: E402


def heatmap(coefficients: np.ndarray, heads: dict[str, Any], path: str) -> None:
  """Coefficients [layers, heads], diverging around 0; the top-k heads boxed, universal heads crossed."""
  num_layers, num_heads = coefficients.shape
  limit = float(np.abs(coefficients).max()) or 1.0
  fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * num_heads + 2.5), max(4.0, 0.22 * num_layers + 1.5)))
  image = ax.imshow(coefficients, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
  for h in heads["heads"]:
    if h["name"] in set(heads["top_k"]):
      ax.add_patch(plt.Rectangle((h["head"] - 0.5, h["layer"] - 0.5), 1, 1, fill=False, edgecolor="black",
                                 linewidth=2))
      if "selection_frequency" in h:  # inside the box, so that heads at the edge keep their label
        ax.text(h["head"], h["layer"], f"{100 * h['selection_frequency']:.0f}%", fontsize=6, va="center",
                ha="center", color="black")
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
  ax.set_title(f"{task_label(heads['task'])} on {os.path.basename(str(heads['model']))}: {heads['method']}, "
               f"{heads['num_evaluations']} evaluations\nboxed: top-{len(heads['top_k'])}"
               + (" (bootstrap selection frequency)" if heads.get("confidence") else "")
               + (", x: universal" if heads.get("universal_heads") else ""), fontsize=9)
  fig.tight_layout()
  files.save_figure(path, fig, dpi=130)
  plt.close(fig)


def neurons_per_layer(coefficients: np.ndarray, neurons: dict[str, Any], path: str) -> None:
  """Per layer: how many of the top-k neurons it holds (bars) and its share of the ranking's total value (line;
  the value of a cnl ranking is minus the fraction of documents selecting the neuron)."""
  num_layers = coefficients.shape[0]
  counts = np.zeros(num_layers, int)
  layer_of = {n["name"]: n["layer"] for n in neurons["neurons"]}
  for name in neurons["top_k"]:
    counts[layer_of[name]] += 1
  mass = -np.minimum(coefficients, 0).sum(axis=1) if (coefficients < 0).any() else np.abs(coefficients).sum(axis=1)
  share = mass / mass.sum() if mass.sum() else mass
  fig, ax = plt.subplots(figsize=(7.5, 4.0))
  ax.bar(np.arange(num_layers), counts, color="tab:blue", alpha=0.8, label=f"top-{len(neurons['top_k'])} neurons")
  ax.set_xlabel("layer")
  ax.set_ylabel("neurons in the top-k", color="tab:blue")
  twin = ax.twinx()
  twin.plot(np.arange(num_layers), share * 100, color="black", marker=".", label="share of the ranking's value")
  twin.set_ylabel("share of |value| (%)")
  label = (neurons.get("solver") or {}).get("value", "score")
  ax.set_title(f"{task_label(neurons['task'])} on {os.path.basename(str(neurons['model']))}: {neurons['method']} "
               f"over {num_layers} x {coefficients.shape[1]} neurons\nbars: top-{len(neurons['top_k'])} per layer; "
               f"line: {label}", fontsize=9)
  fig.tight_layout()
  files.save_figure(path, fig, dpi=130)
  plt.close(fig)


def ablation_curve(ablation: dict[str, Any], path: str) -> None:
  """Held-out relative drop of the target and of each general task as the selected units are ablated together, each
  with its 95% interval over the documents (shaded) where the run recorded one: the paper's Figure 1 for one run."""
  curve = ablation["specificity_curve"]
  unit = ablation.get("unit", "heads")
  k = curve["k"]
  task = curve["task"]
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  lines = [(task, dict(marker="o", linewidth=2.5, color="black"), task["name"])]
  lines += [(general, dict(marker=".", linewidth=1.2, alpha=0.8), name) for name, general in curve["general"].items()]
  for entry, style, name in lines:
    label = f"{task_label(name)} ({entry['metric']})"
    (drawn,) = ax.plot(k, np.array(entry["relative_drop"], float) * 100, label=label, **style)
    if "relative_drop_interval" in entry:
      ax.fill_between(k, *_band(entry["relative_drop_interval"]), color=drawn.get_color(), alpha=0.1, linewidth=0)
  ax.axhline(0, color="grey", linewidth=0.8)
  if k == list(range(len(k))) and len(k) <= 16:  # every k: name the unit each step adds
    ax.set_xticks(k)
    ax.set_xticklabels(["none"] + [f"+{h}" for h in curve[unit][:k[-1]]], rotation=30, ha="right", fontsize=8)
  else:
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, k[-1] * 1.1)
  ax.set_xlabel(f"{unit} ablated (cumulative, {ablation['selection']} selection order)")
  ax.set_ylabel("relative drop on held-out documents (%)")
  ax.legend(fontsize=8)
  ax.set_title(f"Ablating the selected {unit}: target task vs general tasks", fontsize=10)
  fig.tight_layout()
  files.save_figure(path, fig, dpi=130)
  plt.close(fig)


def _band(intervals) -> tuple[np.ndarray, np.ndarray]:
  rows = np.array([[np.nan if x is None else x for x in row] for row in intervals], float) * 100
  return rows[:, 0], rows[:, 1]


def specificity_curve(ablation: dict[str, Any], path: str) -> None:
  """For k = 1..K heads ablated together (held out): the target drop and the largest general drop, for the run's
  selection (shaded: 95% intervals over the documents) and, when it is not raw, for the raw ranking."""
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  curves = [(ablation["selection"], ablation["specificity_curve"], "-")]
  if "raw_specificity_curve" in ablation:
    curves.append(("raw", ablation["raw_specificity_curve"], "--"))
  for label, curve, style in curves:
    k = curve["k"]
    ax.plot(k, np.array(curve["task"]["relative_drop"], float) * 100, style, marker="o", color="black",
            label=f"{label}: {task_label(curve['task']['name'])} drop")
    general = np.array([np.nan if v is None else v for v in curve["max_general_relative_drop"]], float)
    ax.plot(k, general * 100, style, marker=".", color="tab:red", label=f"{label}: largest general drop")
    if style == "-" and "relative_drop_interval" in curve["task"]:  # 95% intervals of the run's selection
      ax.fill_between(k, *_band(curve["task"]["relative_drop_interval"]), color="black", alpha=0.12, linewidth=0)
      worst = [max(curve["general"].values(), key=lambda g: np.nan_to_num(g["relative_drop"][j], nan=-np.inf))
               for j in range(len(k))] if curve["general"] else []
      if worst:
        ax.fill_between(k, *_band([g["relative_drop_interval"][j] for j, g in enumerate(worst)]), color="tab:red",
                        alpha=0.12, linewidth=0)
  ax.axhline(0, color="grey", linewidth=0.8)
  points = curves[0][1]["k"]
  if len(points) <= 16:
    ax.set_xticks(points)
  else:
    ax.set_xscale("symlog", linthresh=10)
    ax.set_xlim(0, points[-1] * 1.1)
  ax.set_xlabel(f"top-k {ablation.get('unit', 'heads')} ablated together")
  ax.set_ylabel("relative drop on held-out documents (%)")
  ax.legend(fontsize=8)
  ax.set_title("Specificity curve: target drop vs the largest general-task drop", fontsize=10)
  fig.tight_layout()
  files.save_figure(path, fig, dpi=130)
  plt.close(fig)


def write_plots(output_dir: str) -> list[str]:
  """Draws every plot a run's outputs allow; returns the paths written."""
  written = []
  heads = files.read_json(os.path.join(output_dir, run_file("heads")))
  neurons = None if heads is not None else files.read_json(os.path.join(output_dir, run_file("neurons")))
  coefficients = files.read_array(os.path.join(output_dir, "coefficients.npy"))
  if heads is not None:
    path = os.path.join(output_dir, "heatmap.png")
    heatmap(coefficients, heads, path)
  else:
    path = os.path.join(output_dir, "neurons_per_layer.png")
    neurons_per_layer(coefficients, neurons, path)
  written.append(path)
  ablation = files.read_json(os.path.join(output_dir, "ablation.json"))
  if ablation is not None:
    for draw, file in ((ablation_curve, "ablation_curve.png"), (specificity_curve, "specificity_curve.png")):
      path = os.path.join(output_dir, file)
      draw(ablation, path)
      written.append(path)
  return written
