"""Heads against neurons at equal budgets: the test between the compressed-sensing paper ("sparse sets of attention
heads rather than individual neurons") and CNL ("capabilities can be localized" in MLP neurons).

A head's ablation zeroes its slice of `o_proj` (head_dim × hidden parameters); a neuron's zeroes its column of
`down_proj` (hidden parameters). So k heads and k × head_dim neurons zero the same number of parameters. For each
budget, on the held-out documents of a heads run and a neurons run of the same model and task, every task (the
target, then the general tasks) is measured with:
  - the heads run's top k heads ablated, and the neurons run's top k × head_dim neurons;
  - `draws` seeded random sets of k heads and of k × head_dim neurons (the chance level of each unit).

Axes: `budgets` B (head counts), `draws` R, `tasks` T (target first), `masks` (per unit: the unablated model, then
per budget the top set and the random draws).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxloc.errors import UserError
from jaxloc.units import parse_units, unit_name, units_per_layer
from jaxloc.localize import validate
from jaxloc.localize.localization import load_tasks
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.tasks.names import task_label
from jaxloc.tasks.evaluator import Evaluator


@dataclasses.dataclass
class RunUnits:
  """One finished run's ranking: its unit and every unit's flat index, best first, and the run's settings."""

  directory: str
  unit: str
  order: list[int]
  info: dict[str, Any]


def read_ranking(run, config) -> RunUnits:
  """The ranked units of a finished run (`jaxloc.read_run`), as flat indices in `config`'s layout."""
  per_layer = units_per_layer(config, run.unit)
  names = [u["name"] for u in run.units]
  order = [layer * per_layer + index for layer, index in parse_units(names, config.num_layers, per_layer, run.unit)]
  return RunUnits(run.directory, run.unit, order, run.info)


def check_pair(heads, neurons) -> None:
  """The two runs (`jaxloc.read_run`) must be a heads run and a neurons run of the same model and task (checked
  before any model loads)."""
  if heads.unit != "heads" or neurons.unit != "neurons":
    raise UserError(f"--heads_run must be a heads run and --neurons_run a neurons run; got {heads.unit} "
                    f"({heads.directory}) and {neurons.unit} ({neurons.directory})")
  for key in ("model", "task"):
    if heads.info[key] != neurons.info[key]:
      raise UserError(f"the runs localize different {key}s: {heads.info[key]} and {neurons.info[key]}")


def run_settings(info: dict[str, Any]) -> LocalizeSettings:
  """The settings a finished run was made with (its recorded flags; fields added since take their defaults)."""
  known = {f.name for f in dataclasses.fields(LocalizeSettings)}
  return LocalizeSettings(**{k: v for k, v in info["flags"].items() if k in known})


def held_out_tasks(info: dict[str, Any]) -> list[tuple[str, Any, list, str]]:
  """(name, task, held-out documents, metric) of the run's target and general tasks, drawn as the run drew them
  (`run.load_tasks` with the run's settings)."""
  settings = run_settings(info)
  if not settings.validate:
    raise UserError(f"{info['task']}: the heads run did not validate, so it kept no held-out documents to compare on")
  return [(t.name, t.task, t.held_out, t.metric) for t in load_tasks(settings).all]


def _sets(order: Sequence[int], counts: Sequence[int], total: int, draws: int, seed: int, excluded=()) -> list:
  """Per count: the top `count` of `order`, then `draws` seeded random sets of `count` units."""
  rng = np.random.default_rng([seed, 31])
  pool = np.setdiff1d(np.arange(total), np.asarray(list(excluded), np.int64))
  sets = []
  for count in counts:
    if count > len(order) or count > len(pool):
      raise UserError(f"a budget of {count} units is more than the {min(len(order), len(pool))} this run ranks")
    sets.append([list(order[:count])] + [list(rng.choice(pool, count, replace=False)) for _ in range(draws)])
  return sets


def _keep(sets_per_budget, num_layers: int, per_layer: int) -> np.ndarray:
  """Keep-masks [1 + B * (1 + R), L, U]: the unablated model, then each budget's sets."""
  flat = [s for sets in sets_per_budget for s in sets]
  keep = np.ones((1 + len(flat), num_layers * per_layer), np.float32)
  for row, units in enumerate(flat, start=1):
    keep[row, np.asarray(units, np.int64)] = 0
  return keep.reshape(-1, num_layers, per_layer)


def compare(engine, heads: RunUnits, neurons: RunUnits, tasks, head_counts: Sequence[int], draws: int, seed: int,
            ablation: str = "zero") -> dict[str, Any]:
  """Every task's relative drop (held out) under the top and random heads and neurons at each budget; `tasks` are
  `held_out_tasks(heads.info)`."""
  c = engine.model_config
  if not head_counts or min(head_counts) < 1:
    raise UserError(f"--head_counts must be positive, got {list(head_counts)}")
  neuron_counts = [k * c.head_dim for k in head_counts]
  excluded_heads = parse_units(heads.info["flags"].get("exclude_heads") or [], c.num_layers, c.num_heads, "heads")
  per_unit = {}
  for unit, run, counts in (("heads", heads, head_counts), ("neurons", neurons, neuron_counts)):
    per_layer = units_per_layer(c, unit)
    excluded = [layer * per_layer + i for layer, i in excluded_heads] if unit == "heads" else []
    sets = _sets(run.order, counts, c.num_layers * per_layer, draws, seed, excluded)
    evaluators = [Evaluator.build(engine, name, task, docs, ablation, unit) for name, task, docs, _ in tasks]
    scorer = validate.TaskMeasures(evaluators, [metric for *_, metric in tasks])
    per_doc = scorer.per_doc(_keep(sets, c.num_layers, per_layer))
    per_unit[unit] = (sets, per_doc)
  budgets = []
  for b, (k_heads, k_neurons) in enumerate(zip(head_counts, neuron_counts)):
    entry = {"heads": int(k_heads), "neurons": int(k_neurons), "parameters": int(k_heads * c.head_dim * c.hidden_size)}
    for unit, (sets, per_doc) in per_unit.items():
      rows = 1 + b * (1 + draws) + np.arange(1 + draws)
      top, random = {}, {}
      for (name, _, docs, metric), values in zip(tasks, per_doc):
        means = values.mean(axis=1)
        drops = validate.relative_drop(float(means[0]), means[rows])
        interval = ([None, None] if means[0] == 0
                    else validate.drop_interval(values[np.concatenate([[0], rows[:1]])])[1])
        finite = drops[1:][np.isfinite(drops[1:])]
        label = task_label(name)
        top[label] = {"relative_drop": _num(drops[0]), "interval": [_num(x) for x in interval], "metric": metric,
                      "num_docs": len(docs)}
        random[label] = {"mean": _num(finite.mean()) if len(finite) else None, "draws": [_num(d) for d in drops[1:]]}
      entry[f"top_{unit}"] = {"units": _names(sets[b][0], unit, c), **_summary(top)}
      entry[f"random_{unit}"] = _summary(random, key="mean")
    budgets.append(entry)
  return {"model": heads.info["model"], "task": heads.info["task"], "metric": heads.info["metric"],
          "heads_run": heads.directory, "neurons_run": neurons.directory,
          "neurons_method": neurons.info["method"], "heads_method": heads.info["method"], "ablation": ablation,
          "draws": draws, "seed": seed, "head_dim": c.head_dim, "hidden_size": c.hidden_size,
          "tasks": [task_label(name) for name, *_ in tasks], "budgets": budgets}


def _summary(per_task: dict[str, dict], key: str = "relative_drop") -> dict[str, Any]:
  """Per task, and the target's value and the largest general value under `key`."""
  names = list(per_task)
  general = [per_task[n][key] for n in names[1:] if per_task[n][key] is not None]
  return {"tasks": per_task, "target": per_task[names[0]][key], "max_general": max(general) if general else None}


def _names(units, unit: str, config) -> list[str]:
  per_layer = units_per_layer(config, unit)
  return [unit_name(*divmod(int(u), per_layer), unit) for u in units]


def _num(x) -> float | None:
  return None if x is None or not np.isfinite(x) else float(x)

