"""The table printed at the end of a localization run."""

from __future__ import annotations

import math
import os
from typing import Any

from jaxloc.units import singular
from jaxloc.localize import decisions
from jaxloc.tasks.names import task_label


def _width(name: str) -> int:
  return max(12, len(task_label(name)))


def _percent(value) -> str:
  return "  n/a" if value is None else f"{100 * value:4.0f}%"


def _drop(value, interval=None) -> str:
  text = _percent(value).strip()
  if interval and None not in interval:
    text += f" [{100 * interval[0]:.0f}, {100 * interval[1]:.0f}]"
  return text


# Rows of the top-k table printed (a neuron selection holds hundreds).
MAX_ROWS = 20
# Rejected candidates named in the confirmation line.
MAX_REJECTED = 5


def _deciding(c: dict[str, Any], name: str, general: list[tuple[str, float]], *, together: bool) -> tuple[str, float]:
  """(task, drop) naming why `name` was turned away: the largest drop among the tasks whose verdict vetoed it (a task
  unable to veto never names it), else, for runs that recorded no decisions, the largest general drop."""
  vetoes = decisions.vetoing_drops(c, name, together=together)
  candidates = list(vetoes.items()) if vetoes else general
  return max(candidates, key=lambda item: -math.inf if math.isnan(item[1]) else item[1])


def _confirmation(c: dict[str, Any], evaluations: int, unit: str) -> str:
  """What confirming the selection cost and what it turned down."""
  together = f", the first {c['together']} together ({c['masks_together']} masks)" if c.get("together") else ""
  line = (f"confirmation: {c['masks']} extra masks of the {evaluations} evaluations ({unit} ablated alone on every "
          f"task's identification documents{together}; {c['reused_measurements']} of the method's own measurements "
          "reused)")
  if c.get("estimated"):
    line += f"; {c['confirmed']} selected {unit} confirmed, the next {c['estimated']} estimated"
  rejected = c.get("rejected") or {}
  if rejected:
    named = []
    for name, drops in list(rejected.items())[:MAX_REJECTED]:
      task, worst = _deciding(c, name, list(drops.items())[1:], together=False)
      named.append(f"{name} ({task} {_percent(worst).strip()})")
    more = f", {len(rejected) - MAX_REJECTED} more" if len(rejected) > MAX_REJECTED else ""
    line += f"; rejected {len(rejected)}: " + ", ".join(named) + more
  turned = c.get("rejected_together") or {}
  if turned:
    named = []
    for name, drops in list(turned.items())[:MAX_REJECTED]:
      task, worst = _deciding(c, name, [(t, d) for t, d in drops.items() if t != "with"][1:], together=True)
      named.append(f"{name} ({task} {_percent(worst).strip()} with {len(drops['with'])} selected)")
    more = f", {len(turned) - MAX_REJECTED} more" if len(turned) > MAX_REJECTED else ""
    line += f"; turned away together {len(turned)}: " + ", ".join(named) + more
  groups = c.get("aliased_groups_measured") or []
  if groups:
    line += "; aliased groups measured: " + ", ".join("/".join(g) for g in groups)
  if c.get("extra_documents"):
    line += f"; {c['extra_documents']} more general-task documents scored (power, straddling intervals)"
  return line


def _decisions(c: dict[str, Any]) -> list[str]:
  """The rule of the confirmation's decisions, then each decision: passed or vetoed, its confidence, and every general
  task's drop with its interval and documents (older runs recorded none: no lines)."""
  rule, made = c.get("decision_rule"), c.get("decisions") or []
  if not rule or not made:
    return []
  lines = [f"decisions ({rule['rule']}: {rule['text']}):"]
  for d in made[:MAX_ROWS]:
    confidence = "" if d.get("confidence") is None else f", confidence {100 * d['confidence']:.0f}%"
    tasks = []
    for task, t in list(d["tasks"].items())[1:]:
      text = f"{task_label(task)} {_drop(t['drop'], t.get('interval'))}"
      if t.get("docs"):
        text += f" on {t['docs']}"
      if t.get("verdict") == "unable" and (t.get("straddles") or (t["drop"] or 0) > rule["threshold"]):
        text += " (unable to veto)"  # where it would have counted
      elif t.get("verdict") == "veto":
        text += " (vetoes)"
      tasks.append(text)
    what = "+".join(d["units"]) + (" together" if d.get("together") else " alone")
    lines.append(f"  {what}: {'passed' if d['passed'] else 'vetoed'}{confidence}; " + ", ".join(tasks))
  if len(made) > MAX_ROWS:
    lines.append(f"  ... {len(made) - MAX_ROWS} more decisions (heads.json confirmation.decisions)")
  lines.append(f"  [ ]: {100 * rule['confidence']:g}% interval over the documents (paired bootstrap); on N: documents")
  return lines


def summary_table(heads: dict[str, Any], ablation: dict[str, Any] | None) -> str:
  """The run's summary from heads.json (or neurons.json: the same table over neurons) and ablation.json."""
  unit = heads.get("unit", "heads")
  one = singular(unit)
  t = heads["timing"]
  lines = [f"{task_label(heads['task'])} on {heads['model']} ({heads['method']}, metric {heads['metric']}): "
           f"{heads['num_evaluations']} evaluations, baseline {heads['baseline']:.4f}"
           + (f" on {heads['num_docs']} documents" if heads.get("num_docs") else "")
           + f", {t['total_seconds']:.0f}s total ({t['measure_seconds']:.0f}s measuring"
           + (f", {t['attribution_seconds']:.0f}s integrated gradients" if "attribution_seconds" in t else "") + ")"]
  general = heads.get("general_tasks") or {}
  if general:
    lines.append("general tasks scored under the same masks: " + ", ".join(
        f"{name} ({g['metric']} {g['baseline']:.3f})" for name, g in general.items()))
    lines.extend(f"power to veto: {decisions.describe_power(task_label(name), g['power'])}"
                 for name, g in general.items() if g.get("power"))
  engine = heads.get("engine") or {}
  if engine.get("compilations") is not None and engine.get("seconds_per_mask"):
    lines.append(f"engine: {engine['seconds_per_mask']:.3f}s per mask (all tasks), {engine['compilations']} "
                 "compiled shapes")
  solver = heads.get("solver") or {}
  if "located_neurons" in solver:
    rate = solver.get("overlap_rate")
    lines.append(f"cnl: {solver['located_neurons']} commonality neurons ({100 * solver['located_fraction_of_neurons']:.2f}%"
                 f" of all) selected by ≥ {100 * solver['commonality']:.0f}% of {solver['documents']} documents "
                 f"(threshold {solver['threshold']:g} of each document's largest attribution, "
                 f"{solver['integrated_gradient_steps']} integrated-gradient steps); overlap rate between two halves "
                 + ("n/a" if rate is None else f"{100 * rate:.1f}%")
                 + f" ({solver['shared_neurons']} shared of {solver['half_neurons']})")
  if "lasso_alpha" in solver:
    line = (f"Lasso alpha {solver['lasso_alpha']:.3g} ({solver['alpha_selection']}), {solver['nonzero']} nonzero "
            f"coefficients")
    if "sklearn_max_abs_diff" in solver:
      line += f", max |coef - sklearn| {solver['sklearn_max_abs_diff']:.2e}"
    lines.append(line)
  design = heads.get("design") or {}
  if design:
    per_head = design["ablations_per_head"]
    lines.append(f"design: {design['num_masks']} masks, each {one} ablated in {per_head['min']}–{per_head['max']} "
                 f"(median {per_head['median']:g}); {len(design['identical_groups'])} groups always ablated together, "
                 f"{len(design['collinear_pairs'])} nearly collinear pairs, rank {design['rank']}")
    if design.get("warning"):
      lines.append(f"warning: {design['warning']}")
  if heads.get("selection"):
    lines.append(f"selection: {heads['selection']}")
  confirmation = heads.get("confirmation")
  if confirmation:
    lines.append(_confirmation(confirmation, heads["num_evaluations"], unit))
    lines.extend(_decisions(confirmation))
  by_name = {h["name"]: h for h in heads[unit]}
  universal = heads.get("universal") or {}
  split = universal.get("confirmed_on", "held_out")
  drop_key = f"{split}_single_{one}_drop"
  if universal:
    lines.append(f"universal {unit} (ablated alone, ≥ {100 * universal['threshold']:.0f}% drop on ≥ "
                 f"{universal['min_tasks']} tasks, {split.replace('_', '-')}): "
                 + (", ".join(heads[f"universal_{unit}"]) or "none"))
  for name in heads.get(f"universal_{unit}", []):
    drops = by_name[name].get(drop_key, {})
    lines.append(f"  {name}: " + ", ".join(f"{task} {_percent(d).strip()}" for task, d in drops.items()))
  tasks = [task_label(heads["task"])] + list(general)
  columns = "  ".join(f"{n:>{max(9, len(n))}s}" for n in tasks)
  confident = heads.get("confidence") is not None
  head = f"{'rank':>4s}  {one:7s} {'value':>8s}" + (f" {'selected':>8s} {'95% interval':>17s}" if confident else "")
  lines.append(f"{head}   ablated alone ({split.replace('_', '-')}), relative drop:")
  lines.append(" " * (len(head) + 3) + columns)
  for rank, name in enumerate(heads["top_k"][:MAX_ROWS], start=1):
    h = by_name[name]
    placeholder = h.get("measured") is False  # the method never measured it (the confirmation may have)
    line = f"{rank:4d}  {name:7s} " + (f"{'n/a':>8s}" if placeholder else f"{h['score']:8.4f}")
    if confident:
      low, high = h["interval"]
      line += f" {100 * h['selection_frequency']:7.0f}% " + (f"{'n/a':>17s}" if placeholder
                                                              else f"[{low:7.3f},{high:7.3f}]")
    drops = h.get(drop_key, {})
    lines.append(line + "   " + "  ".join(f"{_percent(drops.get(n)):>{max(9, len(n))}s}" for n in tasks))
  if len(heads["top_k"]) > MAX_ROWS:
    lines.append(f"  ... {len(heads['top_k']) - MAX_ROWS} more {unit} in the top-{len(heads['top_k'])} "
                 f"({'neurons' if unit == 'neurons' else 'heads'}.json)")
  if confident:
    lines.append(f"selected: share of {heads['confidence']['resamples']} bootstrap resamples "
                 f"({heads['confidence']['resampled']}) whose top-{len(heads['top_k'])} holds the {one}")
  if ablation:
    for key, label in (("held_out", "held-out"), ("in_sample", "in-sample")):
      record = ablation.get(key)
      if not record:
        continue
      intervals = record.get("general_relative_drop_interval", {})
      general_drops = ", ".join(f"{task_label(n)} {_drop(d, intervals.get(n))}"
                                for n, d in record["general_relative_drop"].items())
      lines.append(f"top-{record['k']} ablated together, {label} ({record['num_docs']} documents per task), relative drop: "
                   f"{task_label(heads['task'])} {_drop(record['task_relative_drop'], record.get('task_relative_drop_interval'))}"
                   + (f"; general: {general_drops}" if general_drops else ""))
    if ablation.get("held_out", {}).get("task_relative_drop_interval"):
      lines.append("[ ]: 95% interval over the documents (paired bootstrap)")
  return "\n".join(lines)
