"""Tables and plots of the measurement-efficiency benchmark (`experiments.benchmark_efficiency`): markdown
tables of recall and top-k ablation change per method and budget, the recall/change-vs-evaluations plot,
the diagnostics plot, and the combination of several saved reports.

Axes of a report: `tasks`, then per task `summary` rows (method, budget fraction) and `records`
(method, budget, seed); see `jaxloc.bench.sweep`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Sequence

import numpy as np

from jaxloc import files
from jaxloc.bench import sweep
from jaxloc.bench.variants import budget_masks
from jaxloc.errors import UserError


def _budget_label(fraction: float, n: int) -> str:
  return f"{fraction:.0%} ({budget_masks(fraction, n)})"


def format_tables(report: dict[str, Any], k: int) -> str:
  """Markdown: per task, mean recall ± sd over seeds (hits ≥ k-1 in how many seeds) and the top-k change."""
  lines = []
  for t in report["tasks"]:
    n = t["num_layers"] * t["num_heads"]
    metric = t["headline_metric"]
    summary = t["summary"]
    budgets = sorted({r["budget_fraction"] for r in summary})
    lines.append(f"### {t['task']} ({t['model']}, N = {n} heads, headline metric: {metric})")
    lines.append("")
    facts = []
    if "baseline" in t:
      facts.append("baseline " + ", ".join(f"{m} {v:.3f}" for m, v in t["baseline"].items()))
    gt = t.get("ground_truth", {})
    if metric in gt:
      facts.append(f"greedy top-{k} ({metric}): {', '.join(gt[metric]['top_k'])}; ablated together: "
                   + ", ".join(f"{m} {v:+.3f}" for m, v in gt["top_k_change"].items()))
    g = t.get("gradient", {})
    if g.get("available"):
      facts.append(f"mask gradient: {g['gradient_seconds']:.2f} s vs {g['mask_evaluation_seconds']:.3f} s per mask "
                   f"evaluation = {g['forward_equivalents']:.1f} evaluations; the gradient's own top-{k} "
                   f"({', '.join(g.get('top_k', []))}) recalls {g.get('recall', float('nan')):.1f} of greedy's")
    for name, per_seed in t.get("training", {}).items():
      facts.append(f"{name} training: " + ", ".join(f"seed {seed} {v['seconds']:.0f} s = {v['evaluations']:.1f} "
                                                     "evaluations" for seed, v in per_seed.items()))
    nf = t.get("noise_floor")
    if nf:
      facts.append(f"greedy top-{k} overlap between two disjoint halves of the docs: "
                   + ", ".join(f"{m} {v}/{k}" for m, v in nf["split_half_top_k_overlap"].items()))
    if nf and "context_effects" in nf:
      ce = nf["context_effects"]
      facts.append(f"isolated vs in-context effect (single-head change | mean Lasso coefficient at "
                   f"{ce['budget_masks']} masks; ranks): " + "; ".join(
                       f"{h} {a:+.2f} (#{ra}) | {b:+.3f} (#{rb})" for h, a, b, ra, rb in zip(
                           ce["heads"], ce["single_change"], ce["mean_lasso_coef"], ce["single_rank"],
                           ce["lasso_rank"])))
    if nf:
      add = nf["additivity"][metric]
      facts.append(f"greedy's top-{k} ablated together: {metric} {add['joint_change']:+.3f} vs the sum of their "
                   f"single changes {add['sum_of_single_changes']:+.3f} (saturation/interactions); masks at the "
                   "floor: " + ", ".join(f"{d['design']} rate {d['ablation_rate']:g}: "
                                         f"{100 * (d['fraction_at_floor'] or 0):.0f}%"
                                         for d in nf["design_saturation"]))
      facts.append(f"greedy's top-10 single-head changes ({metric}): "
                   + ", ".join(f"{v:+.2f}" for v in gt[metric]["single_changes_top10"]))
    if "greedy_vs_planted_top_k_overlap" in gt:
      facts.append(f"greedy top-{k} vs planted top-{k} overlap per seed: {gt['greedy_vs_planted_top_k_overlap']}")
    lines += [f"- {f}" for f in facts]
    lines.append("")
    methods = list(dict.fromkeys(r["method"] for r in summary))
    by = {(r["method"], r["budget_fraction"]): r for r in summary}
    header = "| method | " + " | ".join(_budget_label(b, n) for b in budgets) + " |"

    def table(title: str, cell: Callable[[dict[str, Any], float], str]) -> None:
      """One row per method, one column per budget (empty where the budget cannot run the method)."""
      lines.extend([title, "", header, "|" + "---|" * (len(budgets) + 1)])
      for m in methods:
        cells = ["" if by.get((m, b)) is None else cell(by[(m, b)], b) for b in budgets]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
      lines.append("")

    table(f"Recall of greedy's top-{k} ({metric}), mean ± sd over seeds [seeds with ≥ {k - 1}/{k}]:",
          lambda r, b: f"{r['recall_mean']:.2f} ± {r['recall_std']:.2f} [{r['seeds_with_hits_ge_k_minus_1']}/"
                       f"{r['seeds']}]")
    for other in [m for m in t.get("metrics", [metric]) if m != metric]:
      table(f"Recall of greedy's top-{k} by {other} (mean over seeds):",
            lambda r, b, other=other: f"{r[f'recall_mean_{other}']:.2f}")
    if any("recall_planted_mean" in r for r in summary):
      table(f"Recall of the planted top-{k} (the simulation's truth; mean over seeds):",
            lambda r, b: f"{r['recall_planted_mean']:.2f}")
    table(f"Change of {metric} when the method's top-{k} are ablated together (mean ± sd):",
          lambda r, b: f"{r['change_mean']:+.3f} ± {r['change_std']:.3f}")
    held = t.get("held_out")
    if held and any("held_out_relative_drop_mean" in r for r in summary):
      general = ", ".join(f"{g} ({v['metric']}, baseline {v['baseline']:.3f})" for g, v in held["general"].items())
      table(f"Held out: relative drop of {t['task']} ({metric}, {held['num_docs']} documents no method saw) when the "
            f"method's top-{k} are ablated together / the largest relative drop among the general tasks "
            f"({general or 'none'}), mean over seeds:",
            lambda r, b: f"{100 * r['held_out_relative_drop_mean']:.0f}% / "
                         + (f"{100 * r['max_general_relative_drop_mean']:.0f}%"
                            if "max_general_relative_drop_mean" in r else "–"))
    if held and any("selected_held_out_relative_drop_mean" in r for r in summary):
      table(f"Held out, the top-{k} a run reports ({held.get('selection', 'the runner selection')}): relative drop of "
            f"{t['task']} / the largest general drop (the task largest in most seeds) / masks the confirmation added "
            "to the method's (and general-task documents its decisions scored beyond the identification documents), "
            f"mean over seeds{'; decisions: ' + held['decision_rule'] if held.get('decision_rule') else ''}:",
            selected_cell)
      lines.extend([f"- power to veto: {line}" for line in held.get("power_to_veto", [])] + [""])
  return "\n".join(lines)


def selected_cell(row: dict[str, Any], fraction: float | None = None) -> str:
  """'task drop / largest general drop (task) / +confirmation masks (, +extra documents)' of a summary row's
  selection."""
  del fraction
  general = row.get("selected_max_general_relative_drop_mean")
  worst = row.get("selected_worst_general_task") or {}
  task = f" ({max(worst, key=worst.get)})" if worst else ""
  return (f"{100 * row['selected_held_out_relative_drop_mean']:.0f}% / "
          + ("–" if general is None else f"{100 * general:.0f}%{task}")
          + f" / +{row.get('confirmation_masks_mean', 0):.0f}"
          + (f", +{row['extra_documents_mean']:.0f} docs" if row.get("extra_documents_mean") else ""))


def cross_task_tables(report: dict[str, Any], k: int) -> str:
  """Markdown: one row per method, one column per (task, budget): recall of greedy's top-k (mean ± sd
  [seeds with ≥ k-1 hits]) and the headline change when the method's top-k are ablated together."""
  columns = [(t, b) for t in report["tasks"] for b in sorted({r["budget_fraction"] for r in t["summary"]})]
  methods = list(dict.fromkeys(r["method"] for t in report["tasks"] for r in t["summary"]))
  by = {(t["task"], r["method"], r["budget_fraction"]): r for t in report["tasks"] for r in t["summary"]}
  header = "| method | " + " | ".join(f"{t['task']} {b:.0%}" for t, b in columns) + " |"
  rule = "|" + "---|" * (len(columns) + 1)

  def rows(cell):
    return [f"| {m} | " + " | ".join(cell(by[t["task"], m, b]) if (t["task"], m, b) in by else ""
                                     for t, b in columns) + " |" for m in methods]

  recall = rows(lambda r: f"{r['recall_mean']:.2f} ± {r['recall_std']:.2f} [{r['seeds_with_hits_ge_k_minus_1']}/"
                          f"{r['seeds']}]")
  change = rows(lambda r: f"{r['change_mean']:+.3f}")
  return "\n".join([f"Recall of greedy's top-{k}:", "", header, rule, *recall, "",
                    f"Change of the headline metric when the method's top-{k} are ablated together:", "", header,
                    rule, *change])


def plot_diagnostics(report: dict[str, Any], path: str, k: int) -> bool:
  """Per real task: greedy's top-20 single-head changes on all docs and on two disjoint halves (is the
  top-k well defined?), and the score distribution under each CS design (saturation). False if no task
  has the noise-floor figures."""
  tasks = [t for t in report["tasks"] if t.get("noise_floor")]
  if not tasks:
    return False
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(len(tasks), 2, figsize=(12, 3.6 * len(tasks)), squeeze=False)
  for row, t in enumerate(tasks):
    nf, metric = t["noise_floor"], t["headline_metric"]
    ax = axes[row][0]
    x = np.arange(len(nf["top20"]["names"]))
    ax.bar(x, nf["top20"]["full"], color="lightgrey", label=f"all {t['num_docs']} docs")
    ax.plot(x, nf["top20"]["half0"], "o", color="tab:blue", markersize=4, label="docs half 1")
    ax.plot(x, nf["top20"]["half1"], "s", color="tab:orange", markersize=4, label="docs half 2")
    ax.axvline(k - 0.5, color="black", linestyle=":", linewidth=1)
    ax.set_xticks(x)
    ax.set_xticklabels(nf["top20"]["names"], rotation=60, fontsize=7)
    ax.set_ylabel(f"{metric} change, head ablated alone")
    ax.set_title(f"{t['task']}: greedy's top 20 (split-half top-{k} overlap "
                 f"{nf['split_half_top_k_overlap'][metric]}/{k})", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[row][1]
    for d in nf["design_saturation"]:
      ax.hist(d["scores"], bins=25, alpha=0.5, label=f"{d['design']} rate {d['ablation_rate']:g} "
              f"({d['heads_per_mask']:.0f} heads/mask): {100 * (d['fraction_at_floor'] or 0):.0f}% at floor")
    ax.axvline(t["baseline"][metric], color="black", linestyle="--", linewidth=1, label="baseline")
    ax.set_xlabel(f"{metric} under a design mask")
    ax.set_ylabel("masks")
    ax.set_title(f"{t['task']}: saturation of the CS designs", fontsize=9)
    ax.legend(fontsize=7)
  fig.tight_layout()
  files.save_figure(path, fig, dpi=120)
  plt.close(fig)
  return True


PALETTE = ("black", "tab:blue", "tab:red", "tab:purple", "dimgrey", "tab:orange", "tab:green", "tab:cyan")


def _style(method: str, families: list[str], index: int) -> dict[str, Any]:
  """One colour per registered method (in order of appearance), a solid thick line for the method at its
  defaults and a thin dashed one for a variant with settings changed; one marker per line."""
  family, *tokens = method.split("-")
  plain = all(t.startswith("upto") for t in tokens)  # a cost limit is not a variant
  return dict(color=PALETTE[families.index(family) % len(PALETTE)], linewidth=2.4 if plain else 1.2,
              marker="os^vDP*Xhd"[index % 10], markersize=4, linestyle="-" if plain else "--")


def plot(report: dict[str, Any], path: str, k: int) -> None:
  """Per task: recall of greedy's top-k and the top-k ablation change against evaluations (log scale),
  mean over seeds with a ± sd band; one line per method."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import matplotlib.ticker

  tasks = report["tasks"]
  methods_seen = list(dict.fromkeys(r["method"] for t in tasks for r in t["summary"]))
  families = list(dict.fromkeys(m.split("-")[0] for m in methods_seen))
  fig, axes = plt.subplots(len(tasks), 2, figsize=(13.5, 3.6 * len(tasks) + 0.4), squeeze=False)
  for row, t in enumerate(tasks):
    n = t["num_layers"] * t["num_heads"]
    metric = t["headline_metric"]
    for col, (key, label) in enumerate((("recall", f"recall of greedy's top-{k}"),
                                        ("change", f"{metric} change, top-{k} ablated"))):
      ax = axes[row][col]
      for index, m in enumerate(methods_seen):
        rows = sorted([r for r in t["summary"] if r["method"] == m], key=lambda r: r["evaluations"])
        if not rows:
          continue
        x = np.array([r["evaluations"] for r in rows])
        mean = np.array([r[f"{key}_mean"] for r in rows])
        sd = np.array([r[f"{key}_std"] for r in rows])
        style = _style(m, families, index)
        ax.plot(x, mean, label=m, **style)
        ax.fill_between(x, mean - sd, mean + sd, color=style["color"], alpha=0.08, linewidth=0)
      if key == "change" and "top_k_change" in t.get("ground_truth", {}):
        ax.axhline(t["ground_truth"]["top_k_change"][metric], color="tab:blue", linestyle=":", linewidth=1.2,
                   label=f"greedy's top-{k} (N evaluations)")
      if key == "recall":
        ax.axhline((k - 1) / k, color="grey", linestyle=":", linewidth=1)
        ax.set_ylim(-0.03, 1.03)
      for fraction in (0.1, 0.25):
        ax.axvline(fraction * n, color="grey", linewidth=0.6, alpha=0.5)
        if key == "recall":
          ax.text(fraction * n, 1.0, f" {fraction:.0%}", fontsize=7, color="grey", va="top")
      ax.set_xscale("log")
      ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
      ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
      ax.set_xlabel("model evaluations (log scale; gradient pass counted in evaluations)", fontsize=8)
      ax.set_ylabel(label, fontsize=9)
      ax.set_title(f"{t['task']} (N = {n})", fontsize=9)
  handles, labels = axes[0][1].get_legend_handles_labels()
  fig.legend(handles, labels, loc="center right", fontsize=8, frameon=False)
  fig.tight_layout(rect=(0, 0, 0.78, 1))
  files.save_figure(path, fig, dpi=120)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------
# Entry point.


def write_outputs(report: dict[str, Any], output_dir: str, k: int) -> str:
  """efficiency.json, efficiency.md, efficiency.png (and efficiency_diagnostics.png when a task has the
  noise-floor figures) in output_dir; returns the tables."""
  files.write_json(os.path.join(output_dir, "efficiency.json"), report)
  tables = format_tables(report, k)
  files.write_text(os.path.join(output_dir, "efficiency.md"),
                   tables + "\n\n## All tasks\n\n" + cross_task_tables(report, k) + "\n")
  plot(report, os.path.join(output_dir, "efficiency.png"), k)
  plot_diagnostics(report, os.path.join(output_dir, "efficiency_diagnostics.png"), k)
  return tables + f"\noutputs in {output_dir}"


# What makes two reports of a task one problem: their methods' rows can share its table.
SAME_PROBLEM = ("task", "model", "num_docs", "num_layers", "num_heads", "headline_metric", "baseline", "held_out")


def report_top_k(report: dict[str, Any]) -> int:
  """The k an efficiency report was scored at: its config's, or its sources' for a combined report (UserError where
  they differ), else the benchmark's default."""
  ks = {c["top_k"] for c in [report.get("config")] + [s.get("config") for s in report.get("sources", [])]
        if c and "top_k" in c}
  if len(ks) > 1:
    raise UserError(f"an efficiency report combines runs scored at different top_k: {sorted(ks)}")
  return ks.pop() if ks else sweep.EfficiencyConfig().top_k


def combine_reports(paths: Sequence[str]) -> dict[str, Any]:
  """The tasks of several saved efficiency.json files as one report (each keeps its own config). Reports of one
  problem (`SAME_PROBLEM` and the same top-k: e.g. one run per method, or per seed, on the same documents and cache)
  whose runs (method, budget, seed) do not overlap become one task: their records together, summarized again over
  every seed of a method and budget (`sweep.summarize`), in one table. Others stay apart. A combined report is
  itself an input: its sources (the runs it was made of) are kept, and their common top-k is its own."""
  tasks: list[tuple[dict[str, Any], int]] = []  # each with its report's top-k
  configs = []
  for path in paths:
    try:
      with open(path) as f:
        report = json.load(f)
      combined = report.get("mode") == "combined"
      k = report_top_k(report)
      for task in report["tasks"]:
        _add_task(tasks, task, k)
      configs.extend(report["sources"] if combined else
                     [{"path": path, "mode": report.get("mode"), "config": report.get("config")}])
    except (OSError, ValueError, KeyError) as e:
      raise UserError(f"cannot read an efficiency report from {path}: {e}") from None
  return {"mode": "combined", "sources": configs, "tasks": [task for task, _ in tasks]}


def _runs(task: dict[str, Any]) -> set[tuple[Any, ...]]:
  return {(r["method"], r["budget_fraction"], r["seed"]) for r in task["records"]}


def _same(a: Any, b: Any) -> bool:
  """Equal, floats within 1e-5 (relative) of each other: the same documents scored on another CPU differ in the last
  digits of a baseline's log-probability."""
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
  if isinstance(a, list) and isinstance(b, list):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  if isinstance(a, float) or isinstance(b, float):
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-5)
  return a == b


def _add_task(tasks: list[tuple[dict[str, Any], int]], task: dict[str, Any], k: int) -> None:
  for other, other_k in tasks:
    if (other_k == k and all(_same(other.get(key), task.get(key)) for key in SAME_PROBLEM)
        and not _runs(other) & _runs(task)):
      other["records"] = other["records"] + task["records"]
      other["summary"] = sweep.summarize(other["records"], other["headline_metric"], k)
      return
  tasks.append((dict(task), k))
