"""The report page of a localization run: one self-contained `report.html` beside its outputs (no network, no
server: the run's data, the script and the style are inline), to open in any browser or send to a colleague.

It shows the layer × head heatmap (for a neuron run, the per-layer view and the ranked neurons) where hovering or
clicking a unit shows its value, interval, bootstrap selection frequency, and its estimated and held-out drop on
every task; the held-out ablation and specificity curves; the universal units; the design diagnostics; the run's
settings and timings. Every run writes it (`jaxloc.api.run_localization`); `python -m experiments.report
--run_dir=DIR` rebuilds it for an old run.
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from typing import Any

import numpy as np

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.heads import run_file
from jaxloc.tasks.names import task_label

PAGE = "report.html"
# Units a neuron page lists (the run file already keeps the best-ranked ones; a page stays a few hundred KB).
MAX_UNITS = 1000


def page_data(output_dir: str) -> dict[str, Any]:
  """What the page shows, read from a run directory: the run file (heads.json or neurons.json), ablation.json when
  the run validated, and the coefficients [layers, units] when they were kept."""
  # Read as process 0 sees them (a multi-process run's other processes hold no files).
  info = files.read_json(os.path.join(output_dir, run_file("heads")))
  if info is None:
    info = files.read_json(os.path.join(output_dir, run_file("neurons")))
  if info is None and not os.path.isdir(output_dir):
    raise UserError(f"run directory not found: {output_dir}")
  if info is None:
    raise UserError(f"{output_dir} holds no heads.json or neurons.json: not a finished localization run "
                    "(experiments.localize --output_dir)")
  unit = info.get("unit", "heads")
  coefficients = files.read_array(os.path.join(output_dir, "coefficients.npy"))
  return {
      "unit": unit,
      "title": f"{task_label(info['task'])} on {os.path.basename(str(info['model']))}",
      "info": {**info, unit: info[unit][:MAX_UNITS]},
      "ablation": files.read_json(os.path.join(output_dir, "ablation.json")),
      "coefficients": None if coefficients is None or unit != "heads" else np.asarray(coefficients).tolist(),
  }


def render(data: dict[str, Any]) -> str:
  """The page's HTML with `data` inline."""
  assets = resources.files("jaxloc.report")
  script = assets.joinpath("page.js").read_text(encoding="utf-8")
  style = assets.joinpath("page.css").read_text(encoding="utf-8")
  # Inline JSON must not close its <script> element early.
  payload = json.dumps(data, allow_nan=False, default=_plain).replace("</", "<\\/")
  return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
          f"<title>jaxloc: {html.escape(data['title'])}</title>\n<style>{style}</style></head>\n"
          f"<body><div id=\"app\"></div>\n<script type=\"application/json\" id=\"run-data\">{payload}</script>\n"
          f"<script>{script}</script></body></html>\n")


def write_page(output_dir: str) -> str:
  """Writes `report.html` into a run directory; returns its path."""
  path = os.path.join(output_dir, PAGE)
  files.write_text(path, render(_finite(page_data(output_dir))))
  return path


def _plain(value):
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f"{type(value).__name__} is not JSON")


def _finite(value):
  """NaN and infinities (a drop from a zero baseline) become null, which JSON can hold."""
  if isinstance(value, float):
    return value if np.isfinite(value) else None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_finite(v) for v in value]
  return value
