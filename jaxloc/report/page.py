"""The report page of a localization run: one self-contained `report.html` beside its outputs (no network, no
server: the run's data, the script and the style are inline), to open in any browser or send to a colleague.

It shows the layer × head heatmap (for a neuron run, the per-layer view and the ranked neurons) where hovering or
clicking a unit shows its value, interval, bootstrap selection frequency, and its estimated and held-out drop on
every task; the held-out ablation and specificity curves; the confirmation's decisions (each general task's power to
veto, and every decision with its drops, intervals, documents and verdicts); the universal units; the design
diagnostics; the run's settings and timings. Every run writes it (`jaxloc.api.run_localization`); `python -m experiments.report
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
from jaxloc.units import run_file, singular
from jaxloc.localize import decisions, examples
from jaxloc.models import packaged
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
      "unmeasured": unmeasured(info),  # hatched, no value
      "placeholder": [u["name"] for u in info[unit] if u.get("measured") is False],  # no value from the method
      "reasons": reasons(info),
      "power_lines": power_lines(info),  # each general task's power to veto, as the run's summary prints it
      "examples": files.read_json(os.path.join(output_dir, examples.FILE)),  # None for runs before examples.json
      "packaged_model": _packaged(str(info["model"])),
  }


def power_lines(info: dict[str, Any]) -> list[str]:
  """Each general task's power to veto (`decisions.describe_power`), for runs that recorded it."""
  return [decisions.describe_power(task, g["power"]) for task, g in (info.get("general_tasks") or {}).items()
          if g.get("power")]


def _packaged(model: str) -> dict[str, str] | None:
  """What the registry says of a packaged alias (`jaxloc.models.packaged`): for runs that predate the run file's
  "model_provenance", the page still names the file and its packages (not its SHA-256: the run did not record it)."""
  entry = packaged.PACKAGED.get(model)
  return None if entry is None else {"file": entry.file_name, "install": entry.install}


def unmeasured(info: dict[str, Any]) -> list[str]:
  """The units whose value is a placeholder (never measured nor estimated): marked `"measured": false` in the run
  file, or, in a run file from before that mark, those of a single-unit method (its solver names an
  "unmeasured_value") with no estimated drop on any task and no measured drop."""
  unit = info.get("unit", "heads")
  placeholder = "unmeasured_value" in (info.get("solver") or {})
  confirmation = info.get("confirmation") or {}
  checked = set(confirmation.get("rejected") or {}) | set(confirmation.get("rejected_together") or {})
  names = []
  for u in info[unit]:
    drops = [k for k in u if k.endswith(f"_single_{singular(unit)}_drop")]
    if drops or u["name"] in checked:  # ablated alone (or with others) after the method: measured after all
      continue
    legacy = placeholder and all(v is None for v in (u.get("estimated_relative_drop") or {}).values())
    if u.get("measured") is False or ("measured" not in u and legacy):
      names.append(u["name"])
  return names


def _percent(value) -> str:
  return "n/a" if value is None else f"{100 * value:.0f}%"


def reasons(info: dict[str, Any]) -> dict[str, list[str]]:
  """name -> why the unit is where it is, in words with rounded numbers: rejected alone or turned away together by
  the confirmation (the general tasks it broke beyond the bound), universal (the tasks it broke), excluded."""
  unit = info.get("unit", "heads")
  one = singular(unit)
  bound = (info.get("flags") or {}).get("specific_max_general_drop")
  general = set(info.get("general_tasks") or {})
  why: dict[str, list[str]] = {}
  confirmation = info.get("confirmation") or {}
  for name, drops in (confirmation.get("rejected") or {}).items():
    over = decisions.vetoing_drops(confirmation, name, together=False)
    if not over:  # a run that recorded no decisions: every general drop over the bound
      over = {t: d for t, d in drops.items() if t in general and d is not None and (bound is None or d > bound)}
    broken = ", ".join(f"{t} {_percent(d)}" for t, d in sorted(over.items(), key=lambda x: -x[1]))
    why.setdefault(name, []).append(
        f"rejected: ablated alone on the identification documents it drops {broken or 'a general task'}"
        + (f" (more than the {_percent(bound)} allowed)" if bound is not None else ""))
  for name, record in (confirmation.get("rejected_together") or {}).items():
    others = record.get("with") or []
    over = decisions.vetoing_drops(confirmation, name, together=True)
    if not over:
      over = {t: d for t, d in record.items() if t in general and isinstance(d, (int, float))
              and (bound is None or d > bound)}
    broken = ", ".join(f"{t} {_percent(d)}" for t, d in sorted(over.items(), key=lambda x: -x[1]))
    why.setdefault(name, []).append(
        f"turned away: passes alone, but ablated together with {'+'.join(others)} it drops "
        f"{broken or 'a general task'} beyond the bound")
  by_name = {u["name"]: u for u in info[unit]}
  universal = info.get("universal") or {}
  threshold, least = universal.get("threshold"), universal.get("min_tasks")
  for name in info.get(f"universal_{unit}") or []:
    u = by_name.get(name, {})
    key = next((k for k in u if k.endswith(f"_single_{one}_drop")), "")
    broken = {t: d for t, d in (u.get(key) or {}).items() if d is not None and (threshold is None or d >= threshold)}
    drops = ", ".join(f"{t} {_percent(d)}" for t, d in sorted(broken.items(), key=lambda x: -x[1]))
    where = key.split("_single_")[0].replace("_", "-") or "measured"
    rule = f" (≥ {_percent(threshold)} on ≥ {least} tasks)" if threshold is not None else ""
    why.setdefault(name, []).append(f"universal: ablated alone ({where}) it drops {drops or 'several tasks'}{rule}; "
                                    "left out of the selection")
  for name in (info.get("flags") or {}).get("exclude_heads") or []:
    why.setdefault(name, []).append("excluded by --exclude_heads")
  return why


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
