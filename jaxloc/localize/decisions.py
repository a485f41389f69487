"""The confirmed selection's decisions with their uncertainty, and each general task's power to veto.

A *decision* says whether one unit, or a set of units ablated together, passes the confirmed selection's rule
(`confirm`): no general task drops by more than the threshold (--specific_max_general_drop, relative). Each task's
drop in a decision carries a central interval (--specific_confidence, 95% by default) from the paired bootstrap over
its documents that validation uses (`validate.paired_drops`), and the decision a confidence: the share of resamples
on the side it decided. Tasks are scored on independent documents, so the share of resamples in which every general
task passes is the product of each task's share.

Rules (--specific_rule):
  interval (default): a general task vetoes when its interval lies above the threshold, and lets the unit by when
      the interval lies at or below it; one whose interval straddles the threshold is scored on more of its
      documents (doubling, up to --general_max_samples per task) and judged again, unless another task vetoes
      already; still straddling at the cap, its point estimate decides, and the decision's confidence says how sure
      that is.
  upper_bound: as interval, but a task still straddling at the cap vetoes: a unit is kept only when every general
      task's interval lies at or below the threshold.
  point: the point estimate decides, on the documents the task's power planned (intervals are recorded, no
      documents are added for a straddling interval).

Power, before anything is measured: a general task with baseline accuracy p on n documents detects a relative drop d
when the one-sided exact binomial test at level alpha (--veto_alpha) -- reject "accuracy p" when the number of
documents still right under ablation is at most c, the largest c with P(X <= c | n, p) <= alpha -- rejects with
probability at least --veto_power when the accuracy is p (1 - d). `detectable_drop` is the smallest such d. A task
whose identification documents cannot detect the threshold starts its decisions on more documents (the first
doubling that can, up to the cap, and at most the documents its split holds beyond the identification and held-out
ones); one that cannot even at the cap is *unable to veto* at the threshold: a drop of its that straddles the
threshold, or has no interval, never turns a unit away (whatever the rule), and no documents are added for it; only a
drop whose whole interval lies above the threshold -- one that no noise of its documents explains -- still vetoes. A
metric that is no proportion (a baseline outside [0, 1]) has no binomial power: its task vetoes as the rule says.

Axes: `tasks` = the target first, then the general tasks; a decision's per-document values are [2, docs] per task
(row 0 unablated, row 1 ablated, on the same documents).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np
from scipy import stats

from jaxloc.localize import validate
from jaxloc.localize.specificity import BOUND_TOLERANCE

RULES = ("interval", "upper_bound", "point")


@dataclasses.dataclass(frozen=True)
class Rule:
  """How a decision is made: the largest relative general drop a unit may cause, how its interval is read (`RULES`),
  and the interval's level."""

  threshold: float
  how: str = "interval"
  level: float = 0.95

  def __post_init__(self) -> None:
    if self.how not in RULES:
      raise ValueError(f"unknown decision rule {self.how!r}; one of {', '.join(RULES)}")
    if not 0 < self.level < 1:
      raise ValueError(f"interval level {self.level} is not in (0, 1)")

  def describe(self) -> str:
    level = f"{100 * self.level:g}%"
    return {"interval": f"each general drop with its {level} interval (paired bootstrap over documents): above "
                        f"{100 * self.threshold:.0f}% vetoes, at or below passes; a straddling interval gets more "
                        "documents of its task up to the cap, where the point estimate decides",
            "upper_bound": f"every general drop's {level} interval (paired bootstrap over documents) at or below "
                           f"{100 * self.threshold:.0f}%; a straddling interval gets more documents of its task up "
                           "to the cap, where it vetoes",
            "point": f"every general drop's point estimate at or below {100 * self.threshold:.0f}% ({level} "
                     "intervals recorded, no documents added)"}[self.how]


# ---------------------------------------------------------------------------------------------------------------
# Power


def rejection_count(docs: int, baseline: float, alpha: float) -> int:
  """The largest count c of documents right with P(X <= c | docs, baseline) <= alpha (-1: no count is rare enough)."""
  c = int(stats.binom.ppf(alpha, docs, baseline))
  while c >= 0 and stats.binom.cdf(c, docs, baseline) > alpha:
    c -= 1
  while c + 1 < docs and stats.binom.cdf(c + 1, docs, baseline) <= alpha:
    c += 1
  return c


def power_at(docs: int, baseline: float, drop: float, alpha: float) -> float:
  """The probability that the one-sided binomial test (module docstring) rejects when the accuracy is
  baseline * (1 - drop)."""
  c = rejection_count(docs, baseline, alpha)
  return 0.0 if c < 0 else float(stats.binom.cdf(c, docs, baseline * (1 - drop)))


def detectable_drop(docs: int, baseline: float, alpha: float, power: float) -> float | None:
  """The smallest relative drop that `docs` documents at accuracy `baseline` detect with probability `power` (the
  module docstring's test); None when no drop can be (too few documents, or a baseline of 0)."""
  if docs < 1 or not 0 < baseline <= 1 or rejection_count(docs, baseline, alpha) < 0:
    return None
  low, high = 0.0, 1.0  # the power rises with the drop, and reaches 1 at a drop of 100%
  for _ in range(40):
    middle = (low + high) / 2
    low, high = (low, middle) if power_at(docs, baseline, middle, alpha) >= power else (middle, high)
  return high


def schedule(start: int, cap: int) -> list[int]:
  """The document counts a task's decisions may use: `start`, doubling, then `cap`."""
  counts = [start]
  while counts[-1] < cap:
    counts.append(min(cap, 2 * counts[-1]))
  return counts


@dataclasses.dataclass
class Power:
  """What one general task can detect, and the documents its decisions start on."""

  task: str
  baseline: float
  docs: int  # the run's identification documents
  cap: int  # at most this many documents per decision
  alpha: float
  power: float
  threshold: float
  detectable: float | None  # on `docs`; None: no drop (or no binomial power: see `proportion`)
  planned: int  # the documents decisions start on
  planned_detectable: float | None
  able: bool  # may veto
  proportion: bool  # the metric is a proportion (binomial power applies)

  def facts(self) -> dict[str, Any]:
    return {"test": "one-sided exact binomial", "alpha": self.alpha, "power": self.power, "baseline": self.baseline,
            "docs": self.docs, "detectable_relative_drop": self.detectable, "threshold": self.threshold,
            "planned_docs": self.planned, "planned_detectable_relative_drop": self.planned_detectable,
            "max_docs": self.cap, "able_to_veto": self.able, "binomial": self.proportion}


def plan_power(task: str, baseline: float, docs: int, cap: int, threshold: float, alpha: float,
               power: float) -> Power:
  """A general task's power on its `docs` documents, and the first count of `schedule(docs, cap)` that detects
  `threshold` (the task is unable to veto when none does)."""
  cap = max(cap, docs)
  proportion = bool(0 <= baseline <= 1)
  detectable = detectable_drop(docs, baseline, alpha, power) if proportion else None
  if not proportion:
    return Power(task, baseline, docs, cap, alpha, power, threshold, None, docs, None, True, False)
  for count in schedule(docs, cap):
    found = detectable if count == docs else detectable_drop(count, baseline, alpha, power)
    if found is not None and found <= threshold + BOUND_TOLERANCE:
      return Power(task, baseline, docs, cap, alpha, power, threshold, detectable, count, found, True, True)
  at_cap = detectable_drop(cap, baseline, alpha, power)
  return Power(task, baseline, docs, cap, alpha, power, threshold, detectable, docs, at_cap, False, True)


def describe_power(task: str, facts: dict[str, Any]) -> str:
  """One line: what the task's documents can detect, and what the run does about it."""

  def drop(value: float | None) -> str:
    if value is None:
      return "no drop"
    # One decimal where the rounded drop would read as the threshold it misses (10.4% against 10%).
    above = value > facts["threshold"] + BOUND_TOLERANCE and round(100 * value) <= round(100 * facts["threshold"])
    return f"a {100 * value:.{1 if above else 0}f}% drop"

  if facts["baseline"] == 0:
    return f"{task}: baseline 0 on {facts['docs']} documents: nothing to lose, so it cannot veto"
  if not facts.get("binomial", True):
    return (f"{task}: no binomial power (its metric is no proportion: baseline {facts['baseline']:.3g}); vetoes as "
            "the rule says")
  line = (f"{task}: {facts['docs']} documents at baseline {facts['baseline']:.3f} detect "
          f"{drop(facts['detectable_relative_drop'])} (one-sided binomial, alpha {facts['alpha']:g}, power "
          f"{100 * facts['power']:.0f}%)")
  if not facts["able_to_veto"]:
    more = (f"even {facts['max_docs']} detect {drop(facts['planned_detectable_relative_drop'])}"
            if facts["max_docs"] > facts["docs"] else "it has no more documents")
    return (line + f"; {more}, not {100 * facts['threshold']:.0f}%: UNABLE TO VETO (only a drop whose whole interval "
            f"lies above {100 * facts['threshold']:.0f}% turns a unit away)")
  if facts["planned_docs"] > facts["docs"]:
    return (line + f", not {100 * facts['threshold']:.0f}%: decisions start on {facts['planned_docs']} documents "
            f"(detect {drop(facts['planned_detectable_relative_drop'])})")
  return line


def vetoing_drops(confirmation: dict[str, Any], name: str, *, together: bool) -> dict[str, float] | None:
  """task -> drop of the general tasks whose verdict turned `name` away, alone or (`together`) with the units kept
  before it, from a run's recorded decisions (heads.json -> confirmation -> decisions); None where the run recorded
  no such decision (runs from before decisions were recorded). A task unable to veto is never among them."""
  for decision in confirmation.get("decisions") or []:
    units = decision.get("units") or []
    if (not decision.get("passed", True) and bool(decision.get("together")) == together and units
        and units[-1] == name):
      return {task: facts["drop"] for task, facts in decision["tasks"].items() if facts.get("verdict") == "veto"}
  return None


# ---------------------------------------------------------------------------------------------------------------
# Decisions


@dataclasses.dataclass
class Decision:
  """Every task's relative drop under one ablation (target first), with what the decision knows of its
  uncertainty."""

  drops: np.ndarray  # float [tasks]
  low: np.ndarray  # float [tasks]: the interval (NaN: none)
  high: np.ndarray
  docs: np.ndarray  # int [tasks]: documents used (0: not known)
  within: np.ndarray  # float [tasks]: share of resamples with the drop at or below the threshold (NaN: none)
  values: list[np.ndarray | None] | None = None  # per task float [2, docs] (None: means only)

  @classmethod
  def point(cls, drops: Sequence[float], docs: Sequence[int] | None = None) -> "Decision":
    drops = np.asarray(drops, np.float64)
    nan = np.full(drops.shape, np.nan)
    return cls(drops, nan, nan.copy(), np.zeros(drops.shape, np.int64) if docs is None else np.asarray(docs),
               nan.copy(), None)

  def __len__(self) -> int:
    return len(self.drops)

  def straddles(self, task: int, threshold: float) -> bool:
    return bool(self.low[task] <= threshold + BOUND_TOLERANCE < self.high[task])


class Judge:
  """Measures decisions on a scorer (`validate.Measures`; with `per_doc`, as a run's `validate.TaskMeasures`, every drop
  gets its interval and a straddling task more documents) and decides them under a rule. `powers`: per general task
  (None: no power known, the task starts on its own documents and may veto); `max_docs`: at most this many documents
  of a general task per decision (None: all the scorer holds)."""

  def __init__(self, scorer: validate.Measures, rule: Rule, powers: Sequence[Power | None] | None = None,
               max_docs: int | None = None, seed: int = 0):
    self.scorer, self.rule, self.seed = scorer, rule, seed
    self.per_doc = hasattr(scorer, "per_doc") and hasattr(scorer, "eval_sets")
    tasks = len(scorer.names)
    powers = list(powers) if powers is not None else [None] * (tasks - 1)
    if len(powers) != tasks - 1:
      raise ValueError(f"{len(powers)} powers for {tasks - 1} general tasks")
    self.powers = powers
    own = [len(e.docs) for e in scorer.eval_sets] if self.per_doc else [0] * tasks
    self.own = own
    self.able = [True] + [p is None or p.able for p in powers]
    available = [scorer.available(t) if hasattr(scorer, "available") else own[t] for t in range(tasks)]
    self.start = [own[0]] + [min(p.planned, available[t + 1]) if p is not None and self.per_doc else own[t + 1]
                             for t, p in enumerate(powers)]
    self.cap = [own[0]] + [max(own[t], min(available[t], max_docs if max_docs is not None else available[t]))
                           for t in range(1, tasks)]

  # -- one task's verdict --------------------------------------------------------------------------------------

  def verdict(self, decision: Decision, task: int) -> str:
    """"pass", "veto" or "unable" (a task unable to veto at the threshold, whose drop does not clear it) of general
    task `task`, as the decision stands."""
    drop, threshold = decision.drops[task], self.rule.threshold
    if not self.able[task]:  # only a drop no noise explains
      return "veto" if decision.low[task] > threshold + BOUND_TOLERANCE else "unable"
    if np.isnan(drop):
      return "pass"  # a task with nothing to lose (baseline 0)
    within = bool(drop <= threshold + BOUND_TOLERANCE)
    if self.rule.how == "point" or np.isnan(decision.low[task]):
      return "pass" if within else "veto"
    if decision.high[task] <= threshold + BOUND_TOLERANCE:
      return "pass"
    if decision.low[task] > threshold + BOUND_TOLERANCE:
      return "veto"
    return "pass" if within and self.rule.how == "interval" else "veto"

  def wants_more(self, decision: Decision, task: int) -> int:
    """How many documents general task `task` should be scored on next (0: none): the planned start when the
    decision used fewer, then the next count of the task's schedule while its interval straddles the threshold."""
    if not self.per_doc or not self.able[task] or decision.values is None or decision.values[task] is None:
      return 0
    docs = int(decision.docs[task])
    if docs < self.start[task]:
      return self.start[task]
    if self.rule.how == "point" or not decision.straddles(task, self.rule.threshold) or docs >= self.cap[task]:
      return 0
    return next(n for n in schedule(self.own[task], self.cap[task]) if n > docs)

  def passes(self, decision: Decision) -> bool:
    return all(self.verdict(decision, t) != "veto" for t in range(1, len(decision)))

  def confidence(self, decision: Decision) -> float | None:
    """The share of resamples on the side decided: every general task that may veto within the threshold for a
    pass, some task above it for a veto; None without intervals."""
    shares = [decision.within[t] for t in range(1, len(decision))
              if self.verdict(decision, t) != "unable" and not np.isnan(decision.within[t])]
    if not shares:
      return None
    passing = float(np.prod(shares))
    return passing if self.passes(decision) else 1.0 - passing

  # -- measuring -----------------------------------------------------------------------------------------------

  def decide(self, values: Sequence[np.ndarray | None], fallback: Decision | None = None) -> Decision:
    """The decision from per-document values (per task [2, docs], or None: `fallback`'s point drop)."""
    tasks = len(values)
    drops, low, high = np.full(tasks, np.nan), np.full(tasks, np.nan), np.full(tasks, np.nan)
    within, docs = np.full(tasks, np.nan), np.zeros(tasks, np.int64)
    for t, v in enumerate(values):
      if v is None:
        if fallback is not None:
          drops[t], docs[t] = fallback.drops[t], fallback.docs[t]
        continue
      v = np.asarray(v, np.float64)
      docs[t] = v.shape[1]
      baseline = float(v[0].mean())
      drops[t] = validate.relative_drop(baseline, v[1].mean())
      if baseline != 0 and docs[t]:
        low[t], high[t] = validate.drop_interval(v, self.seed, self.rule.level)[1]
        resampled = validate.paired_drops(v, self.seed)[1]
        resampled = resampled[~np.isnan(resampled)]
        within[t] = float(np.mean(resampled <= self.rule.threshold + BOUND_TOLERANCE)) if len(resampled) else np.nan
    return Decision(drops, low, high, docs, within, [None if v is None else np.asarray(v, np.float64) for v in values])

  def _keep(self, keys: Sequence[Sequence[int]]) -> np.ndarray:
    s = self.scorer
    keep = np.ones((len(keys) + 1, s.num_layers * s.units_per_layer), np.float32)
    for i, units in enumerate(keys):
      keep[i + 1, np.asarray(units, np.int64)] = 0
    return keep.reshape(-1, s.num_layers, s.units_per_layer)

  def measure(self, keys: Sequence[tuple[int, ...]]) -> list[Decision]:
    """Each set of units (a tuple) ablated together (one mask each), decided: every task on its planned documents,
    then more documents where a straddling interval asks for them."""
    if not keys:
      return []
    if not self.per_doc:  # means only (the efficiency benchmark's simulated problems): point decisions
      if all(len(k) == 1 for k in keys):
        drops = validate.single_head_drops([k[0] for k in keys], self.scorer)
      else:
        drops = validate.set_drops([list(k) for k in keys], self.scorer)
      return [Decision.point(d) for d in drops]
    per = self.scorer.per_doc(self._keep(keys), self.start)
    made = [self.decide([np.stack([p[0], p[i + 1]]) for p in per]) for i in range(len(keys))]
    return self.settle(keys, made)

  def settle(self, keys: Sequence[tuple[int, ...]], made: list[Decision]) -> list[Decision]:
    """`made` (decisions of `keys`, e.g. a method's own measurements) with more documents scored wherever
    `wants_more` asks, until none does; a decision some task vetoes outright adds none."""
    made = list(made)
    while True:
      asks: dict[tuple[int, int], list[int]] = {}
      for i, d in enumerate(made):
        general = range(1, len(d))
        if any(self.verdict(d, t) == "veto" and not d.straddles(t, self.rule.threshold) and
               int(d.docs[t]) >= self.start[t] for t in general):
          continue
        for t in general:
          more = self.wants_more(d, t)
          if more:
            asks.setdefault((t, more), []).append(i)
      if not asks:
        return made
      for (t, count), rows in asks.items():
        keep = self._keep([keys[i] for i in rows])
        remember = getattr(self.scorer, "remember", None)
        if remember is not None:  # what is known already is not scored again
          remember(keep[0], [None] * t + [made[rows[0]].values[t][0]])
          for j, i in enumerate(rows):
            remember(keep[j + 1], [None] * t + [made[i].values[t][1]])
        docs = [0] * len(made[rows[0]])
        docs[t] = count
        per = self.scorer.per_doc(keep, docs)[t]
        for j, i in enumerate(rows):
          values = list(made[i].values)
          values[t] = np.stack([per[0], per[j + 1]])
          made[i] = self.decide(values, made[i])

  def record(self, decision: Decision, names: Sequence[str]) -> dict[str, Any]:
    """A decision for heads.json: passed, confidence, and per task the drop, interval, documents and verdict."""

    def number(x: float) -> float | None:
      return None if x is None or math.isnan(x) else float(x)

    tasks = {}
    for t, name in enumerate(names):
      interval = None if np.isnan(decision.low[t]) else [float(decision.low[t]), float(decision.high[t])]
      tasks[name] = {"drop": number(decision.drops[t]), "interval": interval,
                     "docs": int(decision.docs[t]) or None}
      if t:
        tasks[name]["verdict"] = self.verdict(decision, t)
        tasks[name]["straddles"] = decision.straddles(t, self.rule.threshold)
    return {"passed": self.passes(decision), "confidence": number(self.confidence(decision)), "tasks": tasks}
