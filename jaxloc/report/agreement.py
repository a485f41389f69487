"""How far two localization runs of the same question agree: bfloat16 against float32, two seeds, two machines.

Takes two finished runs (`jaxloc.read_run`) and compares what a researcher would act on: the ranked heads (top-k
overlap), the coefficients (Spearman rank correlation, largest difference), the scores (and every other metric)
of every mask both runs measured, the baselines, and the held-out drop of each run's selection.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxloc.bench.diagnostics import spearman


def agreement(a, b, ks: Sequence[int] = (5, 10)) -> dict[str, Any]:
  """a, b: `jaxloc.api.Run`s (read_run) of the same model, task and metric."""
  ranked = [[h["name"] for h in run.units] for run in (a, b)]
  result: dict[str, Any] = {
      "runs": [a.directory, b.directory],
      "dtypes": [_dtype(run) for run in (a, b)],
      "top_k": [a.top_k, b.top_k],
      "top_k_overlap": {str(k): len(set(ranked[0][:k]) & set(ranked[1][:k])) for k in ks},
      "selection_overlap": len(set(a.top_k) & set(b.top_k)),
      "baseline_difference": _difference(a.info["baseline"], b.info["baseline"]),
  }
  if a.coefficients is not None and b.coefficients is not None:
    ca, cb = np.ravel(a.coefficients), np.ravel(b.coefficients)
    result["coefficient_spearman"] = spearman(ca, cb)
    result["max_coefficient_difference"] = float(np.abs(ca - cb).max())
    result["max_abs_coefficient"] = float(max(np.abs(ca).max(), np.abs(cb).max()))
  if a.masks is not None and b.masks is not None:
    pairs = _common_masks(a, b)
    result["common_masks"] = len(pairs)
    if len(pairs):
      ia, ib = pairs.T
      result["max_score_difference"] = float(np.abs(np.asarray(a.scores)[ia] - np.asarray(b.scores)[ib]).max())
      # Every metric both runs measured (e.g. the log-probability beside a discrete accuracy), mean and largest.
      result["metric_difference"] = {}
      for name in sorted(set(a.metrics) & set(b.metrics)):
        difference = np.abs(np.asarray(a.metrics[name])[ia] - np.asarray(b.metrics[name])[ib])
        result["metric_difference"][name] = {"mean": float(difference.mean()), "max": float(difference.max())}
  drops = [(run.ablation or {}).get("held_out", {}).get("task_relative_drop") for run in (a, b)]
  result["held_out_task_relative_drop"] = drops
  result["seconds_per_mask"] = [(run.info.get("timing") or {}).get("seconds_per_mask") for run in (a, b)]
  return result


def _dtype(run) -> str | None:
  """"bfloat16", or "bfloat16 weights, float32 activations" where they differ."""
  engine = run.info.get("engine") or {}
  weights, activations = engine.get("dtype"), engine.get("activation_dtype")
  return weights if activations in (None, weights) else f"{weights} weights, {activations} activations"


def _difference(x, y) -> float | None:
  return None if x is None or y is None else float(abs(x - y))


def _common_masks(a, b) -> np.ndarray:
  """[pairs, 2]: (index in a, index in b) of every mask both runs measured."""
  index = {m.tobytes(): i for i, m in enumerate(np.asarray(b.masks, bool))}
  pairs = [(i, index[m.tobytes()]) for i, m in enumerate(np.asarray(a.masks, bool)) if m.tobytes() in index]
  return np.array(pairs, np.int64).reshape(-1, 2)


def markdown(result: dict[str, Any]) -> str:
  """The comparison as a two-column table."""
  names = [label or run for label, run in zip(result["dtypes"], result["runs"])]
  rows = [("selected heads", *[", ".join(t) for t in result["top_k"]])]
  rows += [(f"top-{k} overlap", f"{v} of {k}", "") for k, v in result["top_k_overlap"].items()]
  rows.append(("selection overlap", f"{result['selection_overlap']} of {len(result['top_k'][0])}", ""))
  if "coefficient_spearman" in result:
    rows.append(("coefficient rank correlation (Spearman)", f"{result['coefficient_spearman']:.3f}", ""))
    rows.append(("largest coefficient difference", f"{result['max_coefficient_difference']:.4g}",
                 f"(largest absolute coefficient {result['max_abs_coefficient']:.4g})"))
  if result.get("common_masks"):
    rows.append(("largest score difference, same mask", f"{result['max_score_difference']:.4g}",
                 f"over {result['common_masks']} masks both measured"))
    for name, value in result["metric_difference"].items():
      rows.append((f"{name} difference, same mask: mean / largest", f"{value['mean']:.4g} / {value['max']:.4g}", ""))
  if result["baseline_difference"] is not None:
    rows.append(("baseline difference", f"{result['baseline_difference']:.4g}", ""))
  drops = result["held_out_task_relative_drop"]
  if all(d is not None for d in drops):
    rows.append(("held-out task drop of the selection", *[f"{100 * d:.1f}%" for d in drops]))
  spm = result["seconds_per_mask"]
  if all(s is not None for s in spm):
    rows.append(("seconds per mask", *[f"{s:.2f}" for s in spm]))
  header = f"| | {names[0]} | {names[1]} |\n|---|---|---|"
  return header + "\n" + "\n".join(f"| {r[0]} | {r[1]} | {r[2]} |" for r in rows)
