"""One page across finished runs (`python -m experiments.report --runs=A,B,... --output=comparison.html`): tasks ×
models × methods side by side, what no single run's page shows.

- every run in one table: target, model, method, evaluations, top-k, the held-out target drop with its interval
  and the largest general drop, and a link to the run's own page;
- the cross-task matrix (`jaxloc.report.cross_task.matrix`) of each model and method: the held-out drop on task B of
  ablating the top-k found for task A;
- shared heads, within a model (heads of different models are different heads): every head in the top-k of two
  or more runs, and how many top-k heads each pair of runs shares; universal heads and the runs that found them.

Static HTML with the report page's style inline (no script, no network).
"""

from __future__ import annotations

import html
import itertools
import os
from importlib import resources
from typing import Any, Sequence

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.report.cross_task import load_run, matrix, model_labels


def _pct(value) -> str:
  return "" if value is None else f"{100 * value:.0f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
  head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
  body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
  return f"<table class=\"{cls}\"><tr>{head}</tr>{body}</table>"


def _label(run: dict[str, Any]) -> str:
  return f"{run['task']} · {run['model']} · {run['method']}"


def compare(directories: Sequence[str]) -> dict[str, Any]:
  """The comparison's content: the runs (`cross_task.load_run`, model labelled by its base name, or its whole name
  where two models share one: `cross_task.model_labels`), the cross-task matrix of each (model, method) whose runs
  have distinct targets, and the shared heads per model."""
  if len(directories) < 2:
    raise UserError(f"--runs needs at least two run directories, got {len(directories)}: {','.join(directories)}")
  runs = [load_run(d) for d in directories]
  labels = model_labels(list(dict.fromkeys(r["model"] for r in runs)))
  for r in runs:
    r["model"] = labels[r["model"]]
    r["label"] = _label(r)
  groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for r in runs:
    groups.setdefault((r["model"], r["method"]), []).append(r)
  matrices = [{"model": model, "method": method, **matrix(mine)} for (model, method), mine in groups.items()
              if len({r["task"] for r in mine}) == len(mine)]
  shared = []
  for model in dict.fromkeys(r["model"] for r in runs):
    mine = [r for r in runs if r["model"] == model]
    holders: dict[str, list[str]] = {}
    for r in mine:
      for head in r["heads"]:
        holders.setdefault(head, []).append(r["label"])
    universal: dict[str, list[str]] = {}
    for r in mine:
      for head in r["universal_heads"]:
        universal.setdefault(head, []).append(r["label"])
    pairs = [{"a": a["label"], "b": b["label"], "shared": sorted(set(a["heads"]) & set(b["heads"]))}
             for a, b in itertools.combinations(mine, 2)]
    shared.append({"model": model, "heads": {h: who for h, who in holders.items() if len(who) > 1},
                   "universal": universal, "pairs": pairs})
  return {"runs": runs, "matrices": matrices, "shared": shared}


def render(result: dict[str, Any], output: str) -> str:
  """The comparison page's HTML; links to each run's report.html are relative to `output`'s directory."""
  where = os.path.dirname(os.path.abspath(output))
  parts = [f"<h1>jaxloc: {len(result['runs'])} runs compared</h1>",
           "<p class=\"hint\">Held-out relative drops with the top-k of each run ablated together; heads are compared "
           "within a model only.</p>", "<h2>Runs</h2>"]
  rows = []
  for r in result["runs"]:
    general = {t: d for t, d in r["drops"].items() if t != r["task"] and d is not None}
    worst = max(general, key=general.get) if general else None
    interval = r["task_interval"] or [None, None]
    page = os.path.relpath(os.path.join(os.path.abspath(r["directory"]), "report.html"), where)
    rows.append([html.escape(r["task"]), html.escape(r["model"]), html.escape(r["method"]), r["evaluations"],
                 html.escape(", ".join(r["heads"])),
                 f"<b>{_pct(r['drops'][r['task']])}</b> [{_pct(interval[0])}, {_pct(interval[1])}]",
                 f"{_pct(general.get(worst))} ({html.escape(worst)})" if worst else "",
                 f"<a href=\"{html.escape(page)}\">report</a>"])
  parts.append(_table(["target", "model", "method", "evaluations", "top-k", "target drop [95%]",
                       "largest general drop", "page"], rows, "runs"))
  parts.append("<h2>Cross-task matrix: heads of ↓ ablated, held-out drop on →</h2>")
  if not result["matrices"]:
    parts.append("<p>No model and method has runs of two or more targets.</p>")
  for m in result["matrices"]:
    cells = [[f"<b>{html.escape(row)}</b>"] + [f"<b>{_pct(v)}</b>" if col == row else _pct(v)
                                                for col, v in zip(m["columns"], values)]
             for row, values in zip(m["rows"], m["relative_drop"])]
    parts.append(f"<h3>{html.escape(m['model'])} · {html.escape(m['method'])}</h3>"
                 + _table(["", *map(html.escape, m["columns"])], cells, "matrix"))
  parts.append("<h2>Shared heads</h2>")
  for s in result["shared"]:
    parts.append(f"<h3>{html.escape(s['model'])}</h3>")
    if s["heads"]:
      parts.append(_table(["head", "in the top-k of"], [[h, html.escape("; ".join(who))]
                                                          for h, who in s["heads"].items()], "shared"))
    else:
      parts.append("<p>No head is in the top-k of two of these runs.</p>")
    sharing = [p for p in s["pairs"] if p["shared"]]
    if sharing:
      parts.append(_table(["run", "run", "shared top-k heads"],
                          [[html.escape(p["a"]), html.escape(p["b"]), html.escape(", ".join(p["shared"]))]
                           for p in sharing], "pairs"))
    if len(sharing) < len(s["pairs"]):
      parts.append(f"<p>The other {len(s['pairs']) - len(sharing)} pairs of runs share no top-k head.</p>")
    if s["universal"]:
      parts.append("<p>universal heads: " + "; ".join(
          f"{h} ({len(who)} of {sum(1 for r in result['runs'] if r['model'] == s['model'])} runs)"
          for h, who in s["universal"].items()) + "</p>")
  style = resources.files("jaxloc.report").joinpath("page.css").read_text(encoding="utf-8")
  return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>jaxloc: runs compared</title>\n"
          f"<style>{style}</style></head>\n<body>{''.join(parts)}</body></html>\n")


def write_comparison(directories: Sequence[str], output: str) -> str:
  """Writes the comparison page of `directories` to `output`; returns its path."""
  files.write_text(output, render(compare(directories), output))
  return output
