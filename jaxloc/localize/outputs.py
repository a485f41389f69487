"""What a run writes about its heads: the heads.json (neurons.json) payload, built from the confirm and validate
stages' conclusions (`localization.Localization.report` adds the engine's facts and writes it). The file's fields are
a contract (docs/outputs.md).

Axes: N units flattened (flat = layer * U + unit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxloc.localize import confidence, confirm, specificity, validate
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.tasks.names import task_label
from jaxloc.units import singular, unit_name


def heads_json(settings: LocalizeSettings, per_layer: int, found: confirm.Found, excluded: np.ndarray,
                conf: confidence.Confidence | None, measuring: list[Any], confirming: validate.TaskMeasures
                ) -> dict[str, Any]:
  """heads.json (neurons.json) from the run's conclusions; `measuring`: each task's `localization.Measuring`, the
  target first. Without what only the run's engine knows (the report stage adds timing, machine,
  provenance, design, engine and power)."""
  unit = settings.unit
  one = singular(unit)
  name = lambda h: unit_name(*divmod(int(h), per_layer), unit)  # noqa: E731
  split = "held_out" if settings.validate else "in_sample"
  # Every unit: the selection first (in order), then the other ranked units, universal and excluded units last.
  chosen = set(found.selected) | set(found.universal)
  ordered = (found.selected + [h for h in found.order if h not in chosen] + found.universal
             + np.flatnonzero(excluded).tolist())
  units = []
  for h in ordered:
    entry = {"name": name(h), "layer": h // per_layer, one: h % per_layer, "score": float(found.ranking.values[h]),
             "estimated_relative_drop": {task_label(k): v for k, v in found.effects.of(h).items()}}
    if found.ranking.known is not None and not found.ranking.known[h]:
      entry["measured"] = False  # its value is a placeholder: the method never measured or estimated it
    if conf is not None:
      entry.update(selection_frequency=float(conf.selection_frequency[h]),
                   interval=[float(conf.low[h]), float(conf.high[h])])
    if h in found.alone:
      entry[f"{split}_single_{one}_drop"] = {task_label(e.name): float(d)
                                             for e, d in zip(confirming.eval_sets, found.alone[h])}
    units.append(entry)
  target = measuring[0].store
  return {
      "model": settings.model, "task": settings.task, "method": settings.method, "metric": target.metric,
      "unit": unit, f"num_{unit}": per_layer,
      "num_evaluations": len(target) + found.confirmation_masks,
      "baseline": target.baseline,
      "num_docs": len(measuring[0].evaluator.docs), unit: units,
      "confirmation": None if found.confirmation is None else found.confirmation.facts(
          name, [task_label(m.evaluator.name) for m in measuring], settings.specific_max_general_drop),
      "top_k": [name(h) for h in found.selected[:settings.top_k]],
      "selection": settings.selector.describe(),
      f"universal_{unit}": [name(h) for h in found.universal],
      "universal": {"rule": specificity.universal_rule(settings.universal_threshold, settings.universal_min_tasks),
                    "threshold": settings.universal_threshold, "min_tasks": settings.universal_min_tasks,
                    "confirmed_on": split, "candidates": [name(h) for h in found.candidates]},
      "general_tasks": {task_label(m.evaluator.name): {"metric": m.store.metric, "baseline": m.store.baseline,
                                                       "num_docs": len(m.evaluator.docs)} for m in measuring[1:]},
      "confidence": conf.facts() if conf is not None else None,
      "solver": found.ranking.facts, "flags": settings.flags(),
  }
