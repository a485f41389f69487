"""Redraws every plot and report page under docs/ from the files committed beside them:

    python -m experiments.report --all

Git keeps docs/'s inputs (a run's heads.json or neurons.json and ablation.json, a benchmark's JSON) and its prose,
not the pictures drawn from them: a re-run would otherwise add another copy of each to the history.
docs/.gitignore names what this writes, so redrawing leaves `git status` clean, and the documentation tests accept
a link to any file `outputs` lists. What each directory's files give:

- ablation.json (a validated run): ablation_curve.png and specificity_curve.png;
- heads.json or neurons.json: report.html, and with coefficients.npy beside it heatmap.png or neurons_per_layer.png;
- efficiency.json (`experiments.benchmark_efficiency`): efficiency.png, and efficiency_diagnostics.png when a task
  has the noise-floor figures;
- cross_task.json (`experiments.cross_task`): cross_task.png; compare_units.json (`experiments.compare_units`):
  compare_units.png.

The tables drawn from the same files (efficiency.md, cross_task.md) stay committed: pages link them, and text is
small. Each picture comes from the module that draws it for the command that made the files.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.units import run_file
from jaxloc.report import cross_task, efficiency, heads_vs_neurons, plots
from jaxloc.report.page import PAGE, write_page

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs")

Draw = Callable[[str], Any]  # draws one file at the path it is given


def _run(directory: str, names: set[str]) -> list[tuple[str, Draw]]:
  """A localization run's page and plots (`plots.write_plots` draws the same set for a run that kept every file)."""
  out: list[tuple[str, Draw]] = []
  unit = next((u for u in ("heads", "neurons") if run_file(u) in names), None)
  if unit is not None:
    out.append((PAGE, lambda path: write_page(os.path.dirname(path))))
    if "coefficients.npy" in names:
      info = files.read_json(os.path.join(directory, run_file(unit)))
      coefficients = files.read_array(os.path.join(directory, "coefficients.npy"))
      draw = plots.heatmap if unit == "heads" else plots.neurons_per_layer
      out.append(("heatmap.png" if unit == "heads" else "neurons_per_layer.png",
                  lambda path: draw(coefficients, info, path)))
  if "ablation.json" in names:
    ablation = files.read_json(os.path.join(directory, "ablation.json"))
    out += [("ablation_curve.png", lambda path: plots.ablation_curve(ablation, path)),
            ("specificity_curve.png", lambda path: plots.specificity_curve(ablation, path))]
  return out


def _benchmarks(directory: str, names: set[str]) -> list[tuple[str, Draw]]:
  """The pictures of the comparison commands' JSON."""
  out: list[tuple[str, Draw]] = []
  if "efficiency.json" in names:
    report = files.read_json(os.path.join(directory, "efficiency.json"))
    k = efficiency.report_top_k(report)
    out.append(("efficiency.png", lambda path: efficiency.plot(report, path, k)))
    if any(t.get("noise_floor") for t in report["tasks"]):
      out.append(("efficiency_diagnostics.png", lambda path: efficiency.plot_diagnostics(report, path, k)))
  if "cross_task.json" in names:
    result = files.read_json(os.path.join(directory, "cross_task.json"))
    out.append(("cross_task.png", lambda path: cross_task.plot(result, path)))
  if "compare_units.json" in names:
    units = files.read_json(os.path.join(directory, "compare_units.json"))
    out.append(("compare_units.png", lambda path: heads_vs_neurons.plot(units, path)))
  return out


def plan(docs_dir: str = DOCS) -> list[tuple[str, Draw]]:
  """Every file `regenerate` writes under `docs_dir`, with what draws it, in directory order."""
  if not os.path.isdir(docs_dir):
    raise UserError(f"no docs directory at {docs_dir}: --all redraws a source checkout's docs/")
  out = []
  for directory, _, names in sorted(os.walk(docs_dir)):
    names = set(names)
    out += [(os.path.join(directory, name), draw)
            for name, draw in _run(directory, names) + _benchmarks(directory, names)]
  return out


def outputs(docs_dir: str = DOCS) -> list[str]:
  """The paths `regenerate` writes (reading the inputs, drawing nothing)."""
  return [path for path, _ in plan(docs_dir)]


def regenerate(docs_dir: str = DOCS) -> list[str]:
  """Draws every page and plot under `docs_dir` from its committed inputs; returns the paths written."""
  written = []
  for path, draw in plan(docs_dir):
    draw(path)
    written.append(path)
  return written
