"""What a run concludes from its measurements (its confirm stage): the universal heads and the selection, specific
heads confirmed by measurement (the estimates only propose candidates). It decides; measuring is `validate`'s,
estimating `specificity`'s, the rule `selection`'s. The run (`localization.conclude`) and through it the efficiency
benchmark (`bench/judging.py`) call `find_heads`, so a benchmark judges each method by the heads a run would report.

Axes: N heads flattened (flat = layer * H + head); `tasks` = the target first, then the general tasks. Below,
"heads" stands for the run's units (neurons too).

Universal heads (`specificity`): flagged by the estimates, confirmed by single-head ablation on `confirming`
documents (held out when validating).

Confirmed selection (`selection.Specific` with general tasks): an estimate of a head's general-task effect (a Lasso
coefficient from a few dozen masks) cannot carry the claim that the head is specific, so before a head is called
specific it is ablated alone on the identification documents of the target and of every general task, and kept only when
no general task drops by more than `--specific_max_general_drop` (relative): each drop with its interval, more documents
of a general task where the interval straddles the bound or the task's power asks, a task that cannot detect the bound
unable to veto on noise (`decisions`: the rule, --specific_rule). Heads that each pass alone can still add up on a
general task, so the reported heads (the first --top_k) are also confirmed together: a candidate joins them only when
the selection so far with it, ablated as one mask, passes the same rule (a batch measures the selection grown by each
following candidate, as if each joined; a candidate turned away costs one more batch). Candidates are taken in the
target's ranking order (universal and excluded heads left out) and measured alone in small batches until enough pass:
max(--curve_k, --top_k) heads, so that the whole specificity curve is measured (a neuron selection of hundreds is
confirmed at its head, its first --curve_k, and continues with the estimated selection). A head the method already
measured alone on those documents (one-shot greedy, the confirmation methods) costs nothing more. The first --top_k that
pass alone are confirmed together in the order of their measured target drop alone, not the ranking's: a head ranked
first that does little for the target would otherwise spend the general tasks' margin and turn a stronger head away (a
Lasso ranking's order is an estimate; the drop alone is measured). Candidates that replace heads turned away follow in
ranking order.

Aliased heads (identical columns of a random design, `aliasing`) share one Lasso coefficient, so the ranking
cannot say which of them matters: when a candidate has twins, every member of its group is measured alone and
the members take the group's place in the order of their measured target drop; a member whose ablation alone
does not lower the target at all is left out (the group's effect was not its own).

Confirmations are saved in `confirmation.npz` with their per-document values (resumed runs reuse them and decide
them again under their rule; a file from before values were kept gives point decisions) and counted in
`num_evaluations`. The file
carries the digest of the settings of every task's measurements (`settings_digest`): a run with other settings
refuses it, and one saved before it carried them is reused only where the target's measurements were saved before
this run (their settings checked), never alone in a new directory. The bootstrap's re-selections stay estimated
(`Selection.select`: no model evaluation per resample).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import numpy as np

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.localize import aliasing, decisions, measurements, specificity, validate
from jaxloc.localize.methods.base import Measured, Ranking

FILE = "confirmation.npz"


@dataclasses.dataclass
class Confirmation:
  """What the confirmation measured: the decision (relative drop per task, target first, with its interval and the
  documents used: `decisions`) of each head ablated alone, and of the selection's first heads ablated together, on
  the identification documents (more of a general task's where its power or a straddling interval asked); and what it
  cost."""

  decided: dict[tuple[int, ...], decisions.Decision]  # (head,) alone, or the heads ablated together
  measured: list[int]  # heads this confirmation ablated alone (new masks, each scored on every task)
  reused: list[int]  # heads the method had already measured alone
  rejected: list[int]  # candidates whose measured general drop alone was too large
  regrouped: list[list[int]]  # aliased groups resolved by measurement (members in measured order)
  confirmed: int = 0  # heads of the selection confirmed (the rest, for neurons, continue the estimated selection)
  estimated: int = 0
  together: int = 0  # the first `together` heads of the selection were confirmed ablated together too
  measured_sets: list[tuple[int, ...]] = dataclasses.field(default_factory=list)  # new masks of several heads
  # Heads that passed alone but not with the selection so far (head -> the set that failed); they may still come
  # after the first `together` heads, where the single rule holds.
  rejected_together: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)
  judge: decisions.Judge | None = None  # how the decisions were measured and made
  consulted: list[tuple[int, ...]] = dataclasses.field(default_factory=list)  # decisions the selection read, in order

  @property
  def drops(self) -> dict[int, np.ndarray]:
    """head -> relative drop per task, ablated alone."""
    return {k[0]: d.drops for k, d in self.decided.items() if len(k) == 1}

  @property
  def set_drops(self) -> dict[tuple[int, ...], np.ndarray]:
    """heads -> relative drop per task, ablated together."""
    return {k: d.drops for k, d in self.decided.items() if len(k) > 1}

  @property
  def masks(self) -> int:
    """Masks this confirmation added to the method's (each scored on every task)."""
    return len(self.measured) + len(self.measured_sets)

  def extra_documents(self) -> int:
    """Documents of general tasks scored beyond their identification documents, over every decision read (each
    costs one document's evaluation under that decision's mask)."""
    if self.judge is None:
      return 0
    own = self.judge.own
    return int(sum(max(0, int(d.docs[t]) - own[t]) for k in self.consulted for d in [self.decided[k]]
                   for t in range(1, len(d))))

  def facts(self, name: Callable[[int], str], tasks: Sequence[str], max_general_drop: float) -> dict[str, Any]:
    judge = self.judge
    facts = {
        "rule": ("each selected unit ablated alone on the identification documents"
                 + (f", and the first {self.together} ablated together" if self.together else "")
                 + f": every general task drops by ≤ {100 * max_general_drop:.0f}% (relative)"),
        "masks": self.masks, "together": self.together, "masks_together": len(self.measured_sets),
        "reused_measurements": len(self.reused), "confirmed": self.confirmed, "estimated": self.estimated,
        "rejected": {name(h): {t: float(d) for t, d in zip(tasks, self.decided[(h,)].drops)} for h in self.rejected},
        "rejected_together": {name(h): {"with": [name(u) for u in heads[:-1]],
                                        **{t: float(d) for t, d in zip(tasks, self.decided[heads].drops)}}
                              for h, heads in self.rejected_together.items()},
        "aliased_groups_measured": [[name(h) for h in group] for group in self.regrouped],
    }
    if judge is not None:
      facts.update(
          decision_rule={"rule": judge.rule.how, "threshold": judge.rule.threshold, "confidence": judge.rule.level,
                         "text": judge.rule.describe(), "intervals": judge.per_doc},
          extra_documents=self.extra_documents(),
          decisions=[{"units": [name(h) for h in key], "together": len(key) > 1,
                      **judge.record(self.decided[key], tasks)} for key in self.consulted])
    return facts


def measured_alone(masks: np.ndarray, metrics: Sequence[np.ndarray], baselines: Sequence[float],
                   doc_metrics: Sequence[np.ndarray | None] | None = None,
                   doc_baselines: Sequence[np.ndarray | None] | None = None) -> dict[int, np.ndarray]:
  """head -> relative drop per task, from the saved masks that ablate exactly that head (the method's own
  single-head measurements). masks bool [M, L, U]; metrics: per task float [M]; baselines: per task. With every
  task's per-document metrics ([M, docs]) and baselines ([docs]): head -> the per-document values (per task
  [2, docs]: unablated, ablated) instead."""
  flat = np.asarray(masks).reshape(len(masks), int(np.prod(np.shape(masks)[1:])))
  single = np.flatnonzero(flat.sum(axis=1) == 1)
  heads = flat[single].argmax(axis=1)
  if doc_metrics is not None and doc_baselines is not None and all(
      m is not None for m in [*doc_metrics, *doc_baselines]):
    return {int(h): [np.stack([np.asarray(b, np.float64), np.asarray(m[i], np.float64)])
                     for m, b in zip(doc_metrics, doc_baselines)] for h, i in zip(heads, single)}
  return {int(h): np.array([validate.relative_drop(b, m[i]) for m, b in zip(metrics, baselines)], np.float64)
          for h, i in zip(heads, single)}


def confirm(order: Sequence[int], count: int, judge: decisions.Judge, known: dict[int, Any],
            groups: Callable[[int], list[int]], directory: str | None, together: int = 0,
            stamp: str | None = None, unstamped: bool = True) -> tuple[list[int], Confirmation]:
  """`count` heads of `order` (already without excluded and universal heads) that pass when measured alone, the first
  `together` of them also when ablated together, taken in the order of their target drop alone (module docstring);
  `judge` measures and decides (`decisions`). `known`: what the method already measured alone (reused): head -> relative
  drops per task, or per-document values (`measured_alone`); `groups(h)`: h's aliased group ([h] when none). `stamp`:
  the digest of the settings the measurements are made with, saved with them; a saved file with another is refused, one
  with none only reused when `unstamped`."""
  path = os.path.join(directory, FILE) if directory else None
  saved = files.read_arrays(path) if path else None
  _check_stamp(path, saved, stamp, unstamped)
  decided: dict[tuple[int, ...], decisions.Decision] = {}
  for h, v in known.items():
    decided[(h,)] = (judge.decide(v) if isinstance(v, list) else
                     v if isinstance(v, decisions.Decision) else decisions.Decision.point(v))
  settled: set[tuple[int, ...]] = set()  # decisions as the rule leaves them (more documents scored where it asked)
  measured: list[int] = []
  measured_sets: list[tuple[int, ...]] = []
  if saved is not None:
    for key, d in _read_saved(saved, judge):
      if len(key) == 1 and key[0] in known:  # a reused measurement with documents added
        decided[key] = d
      elif len(key) == 1:
        decided[key] = d
        measured.append(key[0])
      else:
        decided[key] = d
        measured_sets.append(key)
      settled.add(key)

  def save() -> None:
    if not path:
      return
    extended = [(h,) for h in known if (h,) in settled and decided[(h,)].values is not None
                and np.any(decided[(h,)].docs[1:] > judge.own[1:])]
    rows = [(h,) for h in measured] + extended + measured_sets
    stamped = {} if stamp is None else {measurements.SAVED_DIGEST: np.array(stamp)}
    files.save_arrays(path, {**stamped, **_saved_arrays(rows, decided, len(judge.scorer.names))})

  def measure(keys: list[tuple[int, ...]]) -> None:
    keys = list(dict.fromkeys(keys))
    todo = [k for k in keys if k not in decided]
    unsettled = [k for k in keys if k in decided and k not in settled]
    for k, d in zip(todo, judge.measure(todo)):
      decided[k] = d
    for k, d in zip(unsettled, judge.settle(unsettled, [decided[k] for k in unsettled])):
      decided[k] = d
    settled.update(keys)
    measured.extend(k[0] for k in todo if len(k) == 1)
    measured_sets.extend(k for k in todo if len(k) > 1)
    if todo or unsettled:
      save()

  consulted: list[tuple[int, ...]] = []

  def passes(key: tuple[int, ...]) -> bool:
    if key not in consulted:
      consulted.append(key)
    return judge.passes(decided[key])

  def target_drop(h: int) -> float:
    return float(decided[(h,)].drops[0])

  selected: list[int] = []
  rejected: list[int] = []
  rejected_together: dict[int, tuple[int, ...]] = {}
  regrouped: list[list[int]] = []
  seen: set[int] = set()

  def candidates(h: int) -> list[int]:
    """The heads that h's place in the order stands for: h, or its aliased group in measured order, members
    without a target drop of their own left out (`regrouped` records each group once)."""
    group = [m for m in groups(h) if m not in seen]
    if len(group) <= 1:
      return group
    group = sorted(group, key=lambda m: -target_drop(m))
    return [m for m in group if target_drop(m) > 0]

  def joins(m: int, upcoming: list[int]) -> bool:
    """Whether m, which passed alone, joins the selection: past its first `together` heads always, else when the
    selection with m passes ablated together. One batch measures the selection grown by m and by each following
    candidate (`upcoming`, each passed alone), as if each joined."""
    if not selected or len(selected) >= together:
      return True
    key = (*selected, m)
    if key not in decided:
      ahead = list(dict.fromkeys([m, *upcoming]))[:min(together, count) - len(selected)]
      measure([(*selected, *ahead[:i + 1]) for i in range(len(ahead))])
    measure([key])  # settled (the batch above settles what it measures)
    if passes(key):
      return True
    rejected_together[m] = key
    return False

  def add(m: int) -> None:
    selected.append(m)
    if len(selected) == together:  # past the heads confirmed together: those turned away pass on the single rule
      selected.extend(list(rejected_together)[:count - len(selected)])

  passing: list[int] = []  # candidates that passed alone, in the order's sequence (aliased groups resolved)
  position = 0

  def advance(needed: int, batch: int) -> None:
    """Walks on down the order, measuring candidates alone, until `needed` more pass alone (or the order ends). One
    batch measures enough candidates for `batch` (at least `needed`) to pass at the share that passed so far (all,
    before the first batch), plus one spare. A candidate that fails is read (rejected) at once, one that passes
    when it is taken."""
    nonlocal position
    goal = len(passing) + needed
    while len(passing) < goal and position < len(order):
      share = (len(passing) + 1) / (len(passing) + len(rejected) + 1)
      window = [int(h) for h in order[position:position + int(np.ceil(max(batch, goal - len(passing)) / share)) + 1]]
      batch = 0
      measure([(m,) for h in window if h not in seen for m in groups(h) if m not in seen])
      for h in window:
        position += 1
        if h in seen:
          continue
        group = candidates(h)
        if len(groups(h)) > 1 and len([m for m in groups(h) if m not in seen]) > 1:
          regrouped.append(sorted([m for m in groups(h) if m not in seen], key=lambda m: -target_drop(m)))
        seen.update(m for m in groups(h))
        for m in group:
          if judge.passes(decided[(m,)]):
            passing.append(m)
          elif not passes((m,)):
            rejected.append(m)
        if len(passing) >= goal:
          break

  def still_needed() -> int:
    """Heads the selection still needs from candidates not yet measured: while it is confirmed together, those that
    join it, and past it those that the heads turned away (which come back then, `add`) do not supply."""
    if len(selected) < first:
      return first - len(selected) + max(0, count - first - len(rejected_together))
    return count - len(selected)

  # The heads confirmed together are taken in the order of their measured target drop alone, among the first
  # `together` that passed alone: a weaker head ranked first would otherwise spend the general tasks' margin and turn
  # a stronger one away. Candidates that replace the ones turned away follow in the order's sequence.
  first = min(together, count) if together else count
  advance(first, count)
  queue = (sorted(passing[:first], key=lambda m: -target_drop(m)) if together else passing[:first]) + passing[first:]
  taken = 0
  while len(selected) < count:
    if taken == len(queue):
      known_passing = len(passing)
      advance(still_needed(), 0)
      queue += passing[known_passing:]
      if taken == len(queue):
        break
    m = queue[taken]
    taken += 1
    passes((m,))  # read: it passed alone
    if joins(m, queue[taken:]):
      add(m)
  used = set(selected) | set(rejected) | set(rejected_together) | {m for g in regrouped for m in g}
  return selected, Confirmation(decided, measured, [h for h in known if h in used], rejected, regrouped,
                                confirmed=len(selected), together=min(together, len(selected)) if len(selected) > 1
                                else 0, measured_sets=measured_sets, rejected_together=rejected_together,
                                judge=judge, consulted=consulted)


def _saved_arrays(rows: list[tuple[int, ...]], decided: dict[tuple[int, ...], decisions.Decision],
                  tasks: int) -> dict[str, np.ndarray]:
  """confirmation.npz: `heads`/`drops` (alone) and `set_heads`/`set_drops` (together, -1 padded), and per row (alone
  first) every task's per-document values `values` [rows, tasks, 2, docs] (NaN padded) on `value_docs` documents (0:
  means only)."""
  singles = [k for k in rows if len(k) == 1]
  sets = [k for k in rows if len(k) > 1]
  ordered = singles + sets
  width = max((len(k) for k in sets), default=0)
  docs = np.array([[0 if d.values is None or d.values[t] is None else d.values[t].shape[1] for t in range(tasks)]
                   for d in (decided[k] for k in ordered)], np.int64).reshape(len(ordered), tasks)
  values = np.full((len(ordered), tasks, 2, int(docs.max(initial=0))), np.nan)
  for i, k in enumerate(ordered):
    for t in range(tasks):
      if docs[i, t]:
        values[i, t, :, :docs[i, t]] = decided[k].values[t]
  return {
      "heads": np.asarray([k[0] for k in singles], np.int64),
      "drops": np.array([decided[k].drops for k in singles], np.float64).reshape(len(singles), tasks),
      "set_heads": np.array([[*k, *[-1] * (width - len(k))] for k in sets], np.int64).reshape(len(sets), width),
      "set_drops": np.array([decided[k].drops for k in sets], np.float64).reshape(len(sets), tasks),
      "values": values, "value_docs": docs}


def _read_saved(saved: dict[str, np.ndarray], judge: decisions.Judge
                ) -> list[tuple[tuple[int, ...], decisions.Decision]]:
  """The decisions of a saved confirmation (`_saved_arrays`), decided again under `judge`'s rule; a file saved before
  confirmations kept per-document values gives point decisions."""
  keys = [(int(h),) for h in saved["heads"].tolist()]
  keys += [tuple(int(h) for h in row if h >= 0) for row in (saved["set_heads"].tolist() if "set_heads" in saved
                                                             else [])]
  drops = [*saved["drops"], *saved.get("set_drops", [])]
  out = []
  for i, (key, d) in enumerate(zip(keys, drops)):
    point = decisions.Decision.point(np.asarray(d, np.float64))
    if "values" not in saved or not np.any(saved["value_docs"][i]):
      out.append((key, point))
      continue
    values = [saved["values"][i, t, :, :n] if n else None for t, n in enumerate(saved["value_docs"][i].tolist())]
    out.append((key, judge.decide(values, point)))
  return out


def check_saved(directory: str, stamp: str, unstamped: bool) -> None:
  """What `confirm` would refuse of the confirmation saved in `directory` (`stamp`, `unstamped` as there), found
  without measuring: a run checks it before its model loads."""
  path = os.path.join(directory, FILE)
  _check_stamp(path, files.read_arrays(path), stamp, unstamped)


def _check_stamp(path: str | None, saved: dict[str, np.ndarray] | None, stamp: str | None, unstamped: bool) -> None:
  if saved is None or stamp is None:
    return
  saved_stamp = str(saved[measurements.SAVED_DIGEST]) if measurements.SAVED_DIGEST in saved else None
  if saved_stamp != stamp and (saved_stamp is not None or not unstamped):
    why = (f"with other settings (settings digest {saved_stamp}, this run's {stamp})" if saved_stamp is not None
           else "before confirmations carried their settings, and this run's measurements were not saved before it")
    raise UserError(f"{path} was measured {why}: nothing says its measurements match this run's; move it away (or "
                    "delete it) to measure the confirmation again")


def settings_stamp(stores_settings: Sequence[dict[str, Any]]) -> str:
  """The stamp of a confirmation: the digest of every task's measurement settings, the target's first."""
  return measurements.settings_digest(list(stores_settings))


@dataclasses.dataclass
class Found:
  """What the run concluded from its measurements (flat head indices)."""

  ranking: Ranking  # the target's
  general_rankings: list[Ranking]
  effects: specificity.Effects
  order: list[int]  # the target's ranking without excluded heads
  candidates: list[int]  # flagged universal by the estimates
  universal: list[int]  # confirmed
  selected: list[int]  # max(curve_k, top_k) heads, in order
  alone: dict[int, np.ndarray]  # head -> relative drop per task ablated alone, on the confirming documents
  confirmation: Confirmation | None = None  # --selection=specific with general tasks: the selection as measured

  @property
  def confirmation_masks(self) -> int:
    """Masks the confirmation added to the method's (each scored on every task)."""
    return self.confirmation.masks if self.confirmation else 0


def find_heads(settings, ranking: Ranking, general_rankings: Sequence[Ranking], measured: Sequence[Measured],
               excluded: np.ndarray, confirming: validate.Measures, identification: validate.Measures,
               design: aliasing.DesignDiagnostics | None, directory: str | None = None) -> Found:
  """The universal heads and the selection of a run (`settings`: its LocalizeSettings) from the target's `ranking`,
  each general task's estimates under the same masks (`general_rankings`), the measurements (`measured`, target
  first, one metric each), `confirming` (where universal candidates are ablated alone: held-out documents when
  validating) and `identification` (the documents the design was scored on: where the selection is confirmed).
  `directory`: where confirmations are saved for a resume (None: not saved)."""
  baselines = [m.baselines[m.metric] for m in measured]
  effects = specificity.Effects(list(identification.names), np.stack(
      [specificity.relative_drops(r, b) for r, b in zip([ranking, *general_rankings], baselines)]))
  order = [int(h) for h in ranking.order if not excluded[h]]
  candidates = specificity.universal_candidates(effects, order, excluded, settings.universal_threshold,
                                                settings.universal_min_tasks, settings.universal_candidates)
  count = max(settings.curve_k, settings.top_k)

  selector = settings.selector

  def select(universal: list[int], how_many: int = count) -> list[int]:
    return selector.select(order, effects, excluded, universal, how_many)

  confirming_selection = selector.confirms(len(measured) - 1)
  # Without a confirmation, one batch of single-head ablations holds the candidates and the first --curve_k heads
  # selected if none is universal (the runner checks the selection alone too).
  first = candidates if confirming_selection else list(dict.fromkeys(candidates + select([])[:settings.curve_k]))
  alone = dict(zip(first, validate.single_head_drops(first, confirming)))
  universal = [h for h in candidates
               if specificity.breaks(alone[h], settings.universal_threshold, settings.universal_min_tasks)]
  if not confirming_selection:
    return Found(ranking, list(general_rankings), effects, order, candidates, universal, select(universal), alone)

  docs_of = lambda m: (m.doc_metrics or {}).get(m.metric)  # noqa: E731
  known = measured_alone(measured[0].masks, [m.scores for m in measured], baselines, [docs_of(m) for m in measured],
                         [(m.doc_baselines or {}).get(m.metric) for m in measured])
  judge = decisions.Judge(identification, rule(settings), powers(settings, identification, measured),
                          settings.general_max_samples)
  heads = settings.unit == "heads"
  skip = set(universal)
  # The stores' settings, where they carry them (a run's `MeasurementStore`s), stamp the saved confirmation.
  stores = [getattr(m, "settings", None) for m in measured]
  stamp = None if None in stores else settings_stamp(stores)
  selected, confirmation = confirm([h for h in order if h not in skip], count if heads else settings.curve_k,
                                   judge, known, design.group_of if design else lambda h: [h],
                                   directory, together=settings.top_k if heads else 0, stamp=stamp,
                                   unstamped=bool(getattr(measured[0], "resumed", False)))
  if not heads:  # the rest of a neuron selection comes from the estimates
    judged = set(selected) | set(confirmation.rejected)
    rest = [h for h in select(universal, len(order)) if h not in judged][:count - len(selected)]
    selected, confirmation.estimated = selected + rest, len(rest)
  return Found(ranking, list(general_rankings), effects, order, candidates, universal, selected, alone, confirmation)


def rule(settings) -> decisions.Rule:
  """The decision rule of a run's settings (LocalizeSettings)."""
  return decisions.Rule(settings.specific_max_general_drop, settings.specific_rule, settings.specific_confidence)


def powers(settings, identification: validate.Measures, measured: Sequence[Measured]) -> list[decisions.Power | None]:
  """Each general task's power to veto at its baseline on its identification documents (`decisions.plan_power`), at
  most --general_max_samples documents (those the scorer holds); None where the number of documents is not known."""
  out: list[decisions.Power | None] = []
  sets = getattr(identification, "eval_sets", None)
  for t, m in enumerate(measured[1:], start=1):
    docs = len(sets[t].docs) if sets is not None else m.num_docs
    if not docs:
      out.append(None)
      continue
    available = identification.available(t) if hasattr(identification, "available") else docs
    out.append(decisions.plan_power(identification.names[t], m.baselines[m.metric], docs,
                                    min(settings.general_max_samples, available), settings.specific_max_general_drop,
                                    settings.veto_alpha, settings.veto_power))
  return out
