"""Rebuild a finished run's report page (`report.html`; every run writes it) and, with --plots, its PNG plots.

    python -m experiments.report --run_dir=runs/smollm2_default

One self-contained HTML file beside the run's outputs: open it in a browser (no network, no server) to hover or
click any head for its value, interval, selection frequency and drops, beside the held-out curves.
"""

from __future__ import annotations

import dataclasses
import os

from jaxloc import cli, files
from jaxloc.errors import UserError
from jaxloc.localize.settings import setting
from jaxloc.report.page import write_page
from jaxloc.report.plots import write_plots


@dataclasses.dataclass
class ReportConfig:
  run_dir: str = setting(None, "A finished run (experiments.localize --output_dir).", type=str, required=True)
  plots: bool = setting(False, "Also redraw the PNG plots (heatmap, ablation and specificity curves).")


def main(config: ReportConfig) -> str:
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
