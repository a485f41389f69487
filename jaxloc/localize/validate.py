"""Measuring fixed ablations: units (heads, or neurons) ablated alone or together on a document set, every task
measured (`Measures`, and `TaskMeasures` over a run's evaluators), and the ablation curves of an order with their
intervals. Its job is measuring; what a run concludes from the measurements is elsewhere: `specificity` estimates
effects from the design and flags universal units, `selection` is the rule for which units may be reported,
`confirm` decides the selection by these measurements (identification documents), and the run's validate stage
reports them on held-out documents (`localization.Localization.validate`).

Axes: `k` (0 = unablated, then the first 1, 2, ... units of an order ablated together; past
`EVERY_K_UP_TO` a geometric ladder of k), `layers`, `units` (per layer).
An `eval_sets` list holds the target first, then the general tasks; each is measured in its own metric
(`metrics`, the target's localized metric and each general task's default metric).

Every relative drop of an ablation curve comes with a 95% interval from a paired bootstrap over the documents
(the same resampled documents scored unablated and ablated; `INTERVAL_RESAMPLES`, no model evaluations):
100 documents of a task the model gets half right move a relative drop by several percent. The confirmed selection's
decisions (`decisions`) use the same bootstrap (`paired_drops`).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np
from tqdm import tqdm

from jaxloc.units import unit_name
from jaxloc.tasks.evaluator import Evaluator
from jaxloc.tasks.names import task_label

INTERVAL_RESAMPLES = 1000
# A curve measures every k up to this, then about CURVE_LADDER more points spaced geometrically (a neuron curve
# to k = 320 costs ~30 masks, not 321).
EVERY_K_UP_TO = 12
CURVE_LADDER = 12


def relative_drop(baseline: float, values: np.ndarray) -> np.ndarray:
  """(baseline - value) / |baseline|; NaN where the baseline is 0."""
  values = np.asarray(values, np.float64)
  if baseline == 0:
    return np.full(values.shape, np.nan)
  return (baseline - values) / abs(baseline)


def curve_points(k: int, also: Sequence[int] = ()) -> list[int]:
  """The k of a curve to k: every k up to EVERY_K_UP_TO, then a geometric ladder to k, with `also` (≤ k) added."""
  points = set(range(min(k, EVERY_K_UP_TO) + 1))
  if k > EVERY_K_UP_TO:
    points.update(int(round(x)) for x in np.geomspace(EVERY_K_UP_TO, k, CURVE_LADDER + 1))
  points.update(int(a) for a in also if 0 <= a <= k)
  return sorted(points)


def _cumulative_masks(order: Sequence[int], points: Sequence[int], num_layers: int, per_layer: int) -> np.ndarray:
  """Keep-masks [len(points), L, U]: row j ablates the first points[j] units of `order`."""
  masks = np.ones((len(points), num_layers * per_layer), np.float32)
  for row, k in enumerate(points):
    masks[row, np.asarray(order[:k], np.int64)] = 0
  return masks.reshape(len(points), num_layers, per_layer)


class Measures(Protocol):
  """What single-unit checks need of a document split: each task's mean metric under keep-masks. A run's `TaskMeasures`;
  the efficiency benchmark's cached problems (`bench.judging.ProblemScorer`)."""

  names: list[str]  # the tasks, the target first
  num_layers: int
  units_per_layer: int

  def means(self, keep: np.ndarray) -> list[np.ndarray]:
    """Per task, float [masks]: its metric under each keep-mask [masks, L, U], averaged over the documents."""


class TaskMeasures:
  """The tasks of a validation on one document split, each scored in its metric, every distinct keep-mask
  evaluated once: the unablated model, a head that is both checked alone and first in a curve, and the prefix
  two curves share are measured one time however many reports use them."""

  def __init__(self, eval_sets: Sequence[Evaluator], metrics: Sequence[str], progress: str | None = None,
               expected: int | None = None, reserves: Sequence[Sequence[Any]] | None = None):
    """`progress`: a description, to show a progress bar of the masks scored (per task), or None; `expected`: how many
    distinct masks the caller plans to score (`planned_masks`), the bar's total and ETA (raised if exceeded);
    `reserves`: per eval set, more documents of its task (disjoint from every other split) that `per_doc` may score
    after the set's own when asked for more (`available`)."""
    self.eval_sets, self.metrics = list(eval_sets), list(metrics)
    self.expected = expected
    self.reserves = [list(r) for r in reserves] if reserves is not None else [[] for _ in self.eval_sets]
    if len(self.reserves) != len(self.eval_sets):
      raise ValueError(f"{len(self.reserves)} reserves for {len(self.eval_sets)} eval sets")
    # mask bytes -> float [documents scored so far]: the set's own documents, then its reserve's first ones
    self._cache: list[dict[bytes, np.ndarray]] = [{} for _ in self.eval_sets]
    self._extra: dict[tuple[int, int, int], Evaluator] = {}  # (set, first, end) -> the set on reserve[first:end]
    self.progress = progress
    self._bar: tqdm | None = None
    first = self.eval_sets[0]
    self.unit = first.unit
    self.num_layers, self.units_per_layer = first.engine.model_config.num_layers, first.units_per_layer

  @property
  def names(self) -> list[str]:
    return [e.name for e in self.eval_sets]

  def name(self, flat: int) -> str:
    return unit_name(*divmod(int(flat), self.units_per_layer), self.unit)

  def available(self, task: int) -> int:
    """How many documents of eval set `task` `per_doc` can score: its own and its reserve."""
    return len(self.eval_sets[task].docs) + len(self.reserves[task])

  def remember(self, keep: np.ndarray, values: Sequence[np.ndarray]) -> None:
    """Per-document values already measured under one keep-mask [L, U] (per eval set, on its first documents; a
    method's own measurements), so that scoring it on more documents scores only the new ones."""
    key = np.asarray(keep, np.float32).tobytes()
    for cache, v in zip(self._cache, values):
      if v is not None and len(v) > len(cache.get(key, ())):
        cache[key] = np.asarray(v, np.float64)

  def per_doc(self, keep: np.ndarray, docs: Sequence[int] | None = None) -> list[np.ndarray]:
    """Per eval set, float [masks, docs] of its metric under each keep-mask [masks, L, U]; `docs[t]`: how many
    documents of set t (its own first, then its reserve's; default its own)."""
    keep = np.asarray(keep, np.float32)
    keys = [row.tobytes() for row in keep]
    first: dict[bytes, int] = {}
    for i, key in enumerate(keys):
      first.setdefault(key, i)
    out = []
    for t, (eval_set, metric, cache) in enumerate(zip(self.eval_sets, self.metrics, self._cache)):
      own = len(eval_set.docs)
      want = own if docs is None else int(docs[t])
      if want > self.available(t):
        raise ValueError(f"{eval_set.name}: {want} documents asked, {self.available(t)} available")
      by_start: dict[int, list[int]] = {}  # documents a mask has scored -> the masks (rows) that need more
      for key, i in first.items():
        have = len(cache.get(key, ()))
        if have < want:
          by_start.setdefault(have, []).append(i)
      for have, rows in sorted(by_start.items()):
        # The set's own documents are scored together (as the method scored them), the reserve's apart.
        start = have if have >= own else 0
        parts = ([eval_set] if start < own else []) + ([self._on_reserve(t, max(start, own), want)] if want > own
                                                       else [])
        values = [np.asarray(e.run(keep[rows], per_doc=True)[metric], np.float64) for e in parts]
        for j, i in enumerate(rows):
          cache[keys[i]] = np.concatenate([cache.get(keys[i], np.zeros(0))[:start], *(v[j] for v in values)])
        self._advance(len(rows), eval_set.name)
      out.append(np.stack([cache.get(key, np.zeros(0))[:want] for key in keys]) if keys else np.zeros((0, want)))
    return out

  def _on_reserve(self, task: int, start: int, end: int) -> Evaluator:
    own = len(self.eval_sets[task].docs)
    key = (task, start, end)
    if key not in self._extra:
      self._extra[key] = self.eval_sets[task].on(self.reserves[task][start - own:end - own])
    return self._extra[key]

  def _advance(self, masks: int, name: str) -> None:
    if not self.progress:
      return
    if self._bar is None:
      total = self.expected * len(self.eval_sets) if self.expected else None
      self._bar = tqdm(desc=self.progress, unit="task·mask", total=total, dynamic_ncols=True)
    if self._bar.total is not None and self._bar.n + masks > self._bar.total:
      self._bar.total = self._bar.n + masks  # more than planned: the total follows
    self._bar.update(masks)
    self._bar.set_postfix_str(task_label(name), refresh=True)

  def close(self) -> None:
    """Ends the progress bar (the scores stay cached)."""
    if self._bar is not None:
      if self._bar.total is not None:
        self._bar.total = self._bar.n  # the estimate met: the bar ends full
        self._bar.refresh()
      self._bar.close()
      self._bar = None

  def means(self, keep: np.ndarray) -> list[np.ndarray]:
    """Per eval set, float [masks]: its metric under each keep-mask, averaged over the documents."""
    return [values.mean(axis=1) for values in self.per_doc(keep)]


def planned_masks(top_k: int, curve_k: int, candidates: int, raw_curve: bool) -> int:
  """About how many distinct masks a run's checks score on the held-out documents: the unablated model, `candidates`
  universal candidates and the first `curve_k` selected units alone, the selection's curve and half of the raw
  ranking's (whose first units are mostly the selection's). An estimate for a progress bar's total and ETA."""
  curve = len(curve_points(max(curve_k, top_k), [top_k]))
  return 1 + candidates + curve_k + curve + (curve // 2 if raw_curve else 0)


def paired_drops(per_doc: np.ndarray, seed: int = 0) -> np.ndarray:
  """float [k+1, INTERVAL_RESAMPLES]: the relative drop of each row of per_doc [k+1, docs] against row 0 on each
  paired resample of the documents (the same documents for every row; NaN where a resample's baseline is 0)."""
  per_doc = np.asarray(per_doc, np.float64)
  rng = np.random.default_rng(seed)
  docs = per_doc.shape[1]
  means = per_doc[:, rng.integers(0, docs, (INTERVAL_RESAMPLES, docs))].mean(axis=2)  # [k+1, resamples]
  with np.errstate(invalid="ignore", divide="ignore"):
    return (means[:1] - means) / np.abs(means[:1])


def drop_interval(per_doc: np.ndarray, seed: int = 0, level: float = 0.95) -> np.ndarray:
  """float [k+1, 2]: the central `level` interval (2.5th and 97.5th percentiles at 0.95) of the relative drop of each
  row against row 0 of per_doc [k+1, docs], over paired resamples of the documents (`paired_drops`)."""
  if not 0 < level < 1:
    raise ValueError(f"interval level {level} is not in (0, 1)")
  tail = 50 * (1 - level)
  with np.errstate(invalid="ignore"):
    return np.nanpercentile(paired_drops(per_doc, seed), [tail, 100 - tail], axis=1).T


def drops_of(per_doc: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[list[float | None]]]:
  """From per_doc [k+1, docs] (row 0 unablated): each row's mean, its relative drop against row 0 (NaN against 0),
  and the drop's 95% interval (`drop_interval`) as JSON numbers (None where undefined)."""
  scores = np.asarray(per_doc, np.float64).mean(axis=1)
  interval = np.full((len(scores), 2), np.nan) if scores[0] == 0 else drop_interval(per_doc)
  return (scores, relative_drop(float(scores[0]), scores),
          [[None if np.isnan(x) else float(x) for x in row] for row in interval])


def single_head_drops(heads: Sequence[int], scorer: Measures) -> np.ndarray:
  """Relative drop [units, tasks] of each task's metric with one unit (head or neuron) ablated."""
  return set_drops([[h] for h in heads], scorer)


def set_drops(sets: Sequence[Sequence[int]], scorer: Measures) -> np.ndarray:
  """Relative drop [sets, tasks] of each task's metric with each set of units ablated together (one mask each)."""
  drops = np.zeros((len(sets), len(scorer.names)))
  if not len(sets):
    return drops
  keep = np.ones((len(sets) + 1, scorer.num_layers * scorer.units_per_layer), np.float32)
  for i, units in enumerate(sets):
    keep[i + 1, np.asarray(units, np.int64)] = 0
  for j, means in enumerate(scorer.means(keep.reshape(-1, scorer.num_layers, scorer.units_per_layer))):
    drops[:, j] = relative_drop(float(means[0]), means[1:])
  return drops


def ablation_curve(order: Sequence[int], k: int, scorer: TaskMeasures, also: Sequence[int] = ()) -> dict[str, Any]:
  """Every task's metric and relative drop (with its 95% interval) with the first k' units of `order` ablated
  together, for every k' of `curve_points(k, also)`, and the largest general drop at each (the specificity curve
  when `order` is a selection). "k" lists the k' measured; the unit names are the first k of `order`."""
  eval_sets, metrics = scorer.eval_sets, scorer.metrics
  k = min(k, len(order))
  points = curve_points(k, also)
  per_doc = scorer.per_doc(_cumulative_masks(order, points, scorer.num_layers, scorer.units_per_layer))

  def entry(eval_set, metric, values):
    scores, drops, intervals = drops_of(values)
    return {"metric": metric, "num_docs": len(eval_set.docs), "scores": scores.tolist(),
            "relative_drop": drops.tolist(), "relative_drop_interval": intervals}

  entries = [entry(s, m, v) for s, m, v in zip(eval_sets, metrics, per_doc)]
  general = np.array([e["relative_drop"] for e in entries[1:]], float).reshape(-1, len(points))
  return {
      scorer.unit: [scorer.name(h) for h in order[:k]],
      "k": points,
      "task": {"name": eval_sets[0].name, **entries[0]},
      "general": {s.name: e for s, e in zip(eval_sets[1:], entries[1:])},
      "max_general_relative_drop": [None if np.all(np.isnan(col)) else float(np.nanmax(col)) for col in general.T],
  }


def curve_unit(curve: dict[str, Any]) -> str:
  """"heads" or "neurons": which units a curve ablates."""
  return "neurons" if "neurons" in curve else "heads"


def drops_at(curve: dict[str, Any], k: int) -> dict[str, Any]:
  """The `held_out`/`in_sample` record of ablation.json: the drops with the first k units of a curve ablated (k
  must be one of the curve's points)."""
  j = curve["k"].index(k)
  unit = curve_unit(curve)
  return {"num_docs": curve["task"]["num_docs"], "k": k, unit: curve[unit][:k],
          "task_relative_drop": curve["task"]["relative_drop"][j],
          "task_relative_drop_interval": curve["task"]["relative_drop_interval"][j],
          "general_relative_drop": {name: g["relative_drop"][j] for name, g in curve["general"].items()},
          "general_relative_drop_interval": {name: g["relative_drop_interval"][j]
                                             for name, g in curve["general"].items()},
          "general_num_docs": {name: g["num_docs"] for name, g in curve["general"].items()}}
