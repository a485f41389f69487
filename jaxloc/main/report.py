"""Rebuild a finished run's report page (`report.html`; every run writes it) and, with --plots, its PNG plots; or,
with --runs, one page comparing several runs (tasks × models × methods: the cross-task matrix and shared heads).

    python -m experiments.report --run_dir=runs/smollm2_default
    python -m experiments.report --runs=runs/smollm2_default,runs/smollm2_arithmetic --output=runs/comparison.html
    python -m experiments.report --all  # every plot and page under docs/, from the files git keeps
    python -m experiments.report --runs=A,B --held_out_json=held_out.json  # and the held-out table of the runs

One self-contained HTML file beside the run's outputs: open it in a browser (no network, no server) to hover or
click any head for its value, interval, selection frequency and drops, beside the held-out curves and examples.
"""

from __future__ import annotations

import dataclasses
import os

from jaxloc import cli, files
from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.report import held_out, regenerate
from jaxloc.report.comparison import write_comparison
from jaxloc.report.page import write_page
from jaxloc.report.plots import write_plots


@dataclasses.dataclass
class ReportConfig:
  run_dir: str | None = setting(None, "A finished run (experiments.localize --output_dir): rebuild its page.",
                                type=str)
  plots: bool = setting(False, "With --run_dir: also redraw the PNG plots (heatmap, ablation and specificity curves).")
  runs: list = setting([], "Finished runs to compare on one page (instead of --run_dir).")
  output: str = setting("comparison.html", "With --runs: where the comparison page goes.")
  held_out_json: str = setting(None, "With --runs: also print the runs' held-out table (markdown: top-5, target and "
                               "largest general drop with intervals, what the confirmation cost) and write its rows "
                               "here as JSON (jaxloc/report/held_out.py).", type=str)
  all: bool = setting(False, "Instead: redraw every plot and report page under docs/ from the files committed "
                     "beside them (jaxloc/report/regenerate.py).")


def main(config: ReportConfig) -> str:
  if config.all:
    if config.run_dir is not None or config.runs:
      raise UserError("--all redraws docs/ on its own: give it without --run_dir and --runs")
    for written in regenerate.regenerate():
      print(written)
    return regenerate.DOCS
  if (config.run_dir is None) == (not config.runs):
    raise UserError("give either --run_dir=DIR (one run's page) or --runs=A,B,... (a comparison page), not "
                    f"{'both' if config.run_dir else 'neither'}")
  if config.held_out_json is not None and not config.runs:
    raise UserError("--held_out_json needs --runs=A,B,...")
  if config.runs:
    if config.held_out_json is not None:
      files.check_writable(config.held_out_json, "--held_out_json")
      rows = [held_out.summarize(directory) for directory in config.runs]
      files.write_json(config.held_out_json, rows)
      print(held_out.markdown(rows))
    path = write_comparison(config.runs, config.output)
    print(path)
    return path
  if not os.path.isdir(config.run_dir):
    raise UserError(f"run directory not found: --run_dir={config.run_dir}")
  with files.hold_run_directory(config.run_dir, "--run_dir"):  # not while a run writes it
    path = write_page(config.run_dir)
    for written in write_plots(config.run_dir) if config.plots else []:
      print(written)
  print(path)
  return path


def console() -> None:
  cli.console(ReportConfig, main)
