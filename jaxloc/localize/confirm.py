"""What a run concludes from its measurements: the universal heads and the selection, specific heads confirmed by
measurement (the estimates only propose candidates). The runner (`run.py`) and the efficiency benchmark
(`bench/sweep.py`) both call `find_heads`, so a benchmark judges each method by the heads a run would report.

Axes: N heads flattened (flat = layer * H + head); `tasks` = the target first, then the general tasks. Below,
"heads" stands for the run's units (neurons too).

Universal heads (`specificity`): flagged by the estimates, confirmed by single-head ablation on `confirming`
documents (held out when validating).

Confirmed selection (`--selection=specific` with general tasks): an estimate of a head's general-task effect (a
Lasso coefficient from a few dozen masks) cannot carry the claim that the head is specific, so before a head is
called specific it is ablated alone on the identification documents of the target and of every general task, and
kept only when no general task drops by more than `--specific_max_general_drop` (relative). Heads that each pass
alone can still add up on a general task, so the reported heads (the first --top_k) are also confirmed together: a
candidate joins them only when the selection so far with it, ablated as one mask, passes the same rule (a batch
measures the selection grown by each following candidate, as if each joined; a candidate turned away costs one more
batch). Candidates are taken in the target's ranking order (universal and excluded heads left out) and confirmed in
small batches until enough pass: max(--curve_k, --top_k) heads, so that the whole specificity curve is measured (a
neuron selection of hundreds is confirmed at its head, its first --curve_k, and continues with the estimated
selection). A head the method already measured alone on those documents (one-shot greedy, the confirmation methods)
costs nothing more.

Aliased heads (identical columns of a random design, `aliasing`) share one Lasso coefficient, so the ranking
cannot say which of them matters: when a candidate has twins, every member of its group is measured alone and
the members take the group's place in the order of their measured target drop; a member whose ablation alone
does not lower the target at all is left out (the group's effect was not its own).

Confirmations are saved in `confirmation.npz` (resumed runs reuse them) and counted in `num_evaluations`. The file
carries the digest of the settings of every task's measurements (`settings_digest`): a run with other settings
refuses it, and one saved before it carried them is reused only where the target's measurements were saved before
this run (their settings checked), never alone in a new directory. The bootstrap's re-selections stay estimated
(`specificity.select`: no model evaluation per resample).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import numpy as np

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.localize import aliasing, measurements, specificity, validate
from jaxloc.localize.methods.base import Measured, Ranking

FILE = "confirmation.npz"


@dataclasses.dataclass
class Confirmation:
  """What the confirmation measured: relative drop per task (target first) of each head ablated alone, and of the
  selection's first heads ablated together, on the identification documents; and what it cost."""

  drops: dict[int, np.ndarray]
  measured: list[int]  # heads this confirmation ablated alone (new masks, each scored on every task)
  reused: list[int]  # heads the method had already measured alone
  rejected: list[int]  # candidates whose measured general drop alone was too large
  regrouped: list[list[int]]  # aliased groups resolved by measurement (members in measured order)
  confirmed: int = 0  # heads of the selection confirmed (the rest, for neurons, continue the estimated selection)
  estimated: int = 0
  together: int = 0  # the first `together` heads of the selection were confirmed ablated together too
  set_drops: dict[tuple[int, ...], np.ndarray] = dataclasses.field(default_factory=dict)  # heads ablated together
  measured_sets: list[tuple[int, ...]] = dataclasses.field(default_factory=list)  # new masks of several heads
  # Heads that passed alone but not with the selection so far (head -> the set that failed); they may still come
  # after the first `together` heads, where the single rule holds.
  rejected_together: dict[int, tuple[int, ...]] = dataclasses.field(default_factory=dict)

  @property
  def masks(self) -> int:
    """Masks this confirmation added to the method's (each scored on every task)."""
    return len(self.measured) + len(self.measured_sets)

  def facts(self, name: Callable[[int], str], tasks: Sequence[str], max_general_drop: float) -> dict[str, Any]:
    return {
        "rule": ("each selected unit ablated alone on the identification documents"
                 + (f", and the first {self.together} ablated together" if self.together else "")
                 + f": every general task drops by ≤ {100 * max_general_drop:.0f}% (relative)"),
        "masks": self.masks, "together": self.together, "masks_together": len(self.measured_sets),
        "reused_measurements": len(self.reused), "confirmed": self.confirmed, "estimated": self.estimated,
        "rejected": {name(h): {t: float(d) for t, d in zip(tasks, self.drops[h])} for h in self.rejected},
        "rejected_together": {name(h): {"with": [name(u) for u in heads[:-1]],
                                        **{t: float(d) for t, d in zip(tasks, self.set_drops[heads])}}
                              for h, heads in self.rejected_together.items()},
        "aliased_groups_measured": [[name(h) for h in group] for group in self.regrouped],
    }


def measured_alone(masks: np.ndarray, metrics: Sequence[np.ndarray], baselines: Sequence[float]
                   ) -> dict[int, np.ndarray]:
  """head -> relative drop per task, from the saved masks that ablate exactly that head (the method's own
  single-head measurements). masks bool [M, L, U]; metrics: per task float [M]; baselines: per task."""
  flat = np.asarray(masks).reshape(len(masks), int(np.prod(np.shape(masks)[1:])))
  single = np.flatnonzero(flat.sum(axis=1) == 1)
  heads = flat[single].argmax(axis=1)
  return {int(h): np.array([validate.relative_drop(b, m[i]) for m, b in zip(metrics, baselines)], np.float64)
          for h, i in zip(heads, single)}


def confirm(order: Sequence[int], count: int, passes: Callable[[np.ndarray], bool], known: dict[int, np.ndarray],
            scorer: validate.Measures, groups: Callable[[int], list[int]], directory: str | None, together: int = 0,
            stamp: str | None = None, unstamped: bool = True) -> tuple[list[int], Confirmation]:
  """The first `count` heads of `order` (already without excluded and universal heads) that pass when measured
  alone, the first `together` of them also when ablated together (module docstring). `known`: drops already
  measured alone (reused); `groups(h)`: h's aliased group ([h] when none). `stamp`: the digest of the settings the
  measurements are made with, saved with them; a saved file with another is refused, one with none only reused when
  `unstamped`."""
  path = os.path.join(directory, FILE) if directory else None
  saved = files.read_arrays(path) if path else None
  _check_stamp(path, saved, stamp, unstamped)
  drops = dict(known)
  sets: dict[tuple[int, ...], np.ndarray] = {}
  measured: list[int] = []
  measured_sets: list[tuple[int, ...]] = []
  if saved is not None:
    for h, d in zip(saved["heads"].tolist(), saved["drops"]):
      if int(h) not in drops:
        drops[int(h)] = np.asarray(d, np.float64)
        measured.append(int(h))
    for row, d in zip(saved["set_heads"].tolist() if "set_heads" in saved else [], saved.get("set_drops", [])):
      key = tuple(int(h) for h in row if h >= 0)
      sets[key] = np.asarray(d, np.float64)
      measured_sets.append(key)

  def save() -> None:
    if not path:
      return
    width = max((len(k) for k in measured_sets), default=0)
    tasks = len(next(iter([*drops.values(), *sets.values()])))
    stamped = {} if stamp is None else {measurements.SAVED_DIGEST: np.array(stamp)}
    files.save_arrays(path, {
        **stamped,
        "heads": np.asarray(measured, np.int64),
        "drops": np.array([drops[h] for h in measured], np.float64).reshape(len(measured), tasks),
        "set_heads": np.array([[*k, *[-1] * (width - len(k))] for k in measured_sets], np.int64).reshape(
            len(measured_sets), width),
        "set_drops": np.array([sets[k] for k in measured_sets], np.float64).reshape(len(measured_sets), tasks)})

  def measure(heads: list[int]) -> None:
    todo = [h for h in dict.fromkeys(heads) if h not in drops]
    if not todo:
      return
    for h, d in zip(todo, validate.single_head_drops(todo, scorer)):
      drops[h] = d
    measured.extend(todo)
    save()

  def measure_sets(keys: list[tuple[int, ...]]) -> None:
    todo = [k for k in dict.fromkeys(keys) if k not in sets]
    if not todo:
      return
    for k, d in zip(todo, validate.set_drops(todo, scorer)):
      sets[k] = d
    measured_sets.extend(todo)
    save()

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
    group = sorted(group, key=lambda m: -drops[m][0])
    return [m for m in group if drops[m][0] > 0]

  def joins(m: int, upcoming: list[int]) -> bool:
    """Whether m, which passed alone, joins the selection: past its first `together` heads always, else when the
    selection with m passes ablated together. One batch measures the selection grown by m and by each following
    candidate (`upcoming`) that passed alone, as if each joined."""
    if not selected or len(selected) >= together:
      return True
    key = (*selected, m)
    if key not in sets:
      ahead = [m] + [h for h in upcoming if h in drops and passes(drops[h])]
      ahead = list(dict.fromkeys(ahead))[:min(together, count) - len(selected)]
      measure_sets([(*selected, *ahead[:i + 1]) for i in range(len(ahead))])
    if passes(sets[key]):
      return True
    rejected_together[m] = key
    return False

  def add(m: int) -> None:
    selected.append(m)
    if len(selected) == together:  # past the heads confirmed together: those turned away pass on the single rule
      selected.extend(list(rejected_together)[:count - len(selected)])

  position = 0
  while len(selected) < count and position < len(order):
    # One batch: as many candidates as the heads still missing need at the share that passed so far (all, before
    # the first batch), plus one spare.
    share = (len(selected) + 1) / (len(selected) + len(rejected) + len(rejected_together) + 1)
    window = [int(h) for h in order[position:position + int(np.ceil((count - len(selected)) / share)) + 1]]
    measure([m for h in window if h not in seen for m in groups(h) if m not in seen])
    for i, h in enumerate(window):
      position += 1
      if h in seen:
        continue
      group = candidates(h)
      if len(groups(h)) > 1 and len([m for m in groups(h) if m not in seen]) > 1:
        regrouped.append(sorted([m for m in groups(h) if m not in seen], key=lambda m: -drops[m][0]))
      seen.update(m for m in groups(h))
      # What follows m, for a speculative batch: the rest of its group, then the window's next candidates.
      following = [u for later in window[i + 1:] if later not in seen for u in candidates(later)]
      for j, m in enumerate(group):
        if len(selected) >= count:
          break
        if not passes(drops[m]):
          rejected.append(m)
        elif joins(m, group[j + 1:] + following):
          add(m)
      if len(selected) == count:
        break
  used = set(selected) | set(rejected) | set(rejected_together) | {m for g in regrouped for m in g}
  return selected, Confirmation(drops, measured, [h for h in known if h in used], rejected, regrouped,
                                confirmed=len(selected), together=min(together, len(selected)) if len(selected) > 1
                                else 0, set_drops=sets,
                                measured_sets=measured_sets, rejected_together=rejected_together)


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

  def select(universal: list[int], how_many: int = count) -> list[int]:
    return specificity.select(order, effects, excluded, universal, settings.selection,
                              settings.specific_max_general_drop, how_many)

  confirming_selection = settings.selection == "specific" and len(measured) > 1
  # Without a confirmation, one batch of single-head ablations holds the candidates and the first --curve_k heads
  # selected if none is universal (the runner checks the selection alone too).
  first = candidates if confirming_selection else list(dict.fromkeys(candidates + select([])[:settings.curve_k]))
  alone = dict(zip(first, validate.single_head_drops(first, confirming)))
  universal = [h for h in candidates
               if specificity.breaks(alone[h], settings.universal_threshold, settings.universal_min_tasks)]
  if not confirming_selection:
    return Found(ranking, list(general_rankings), effects, order, candidates, universal, select(universal), alone)

  known = measured_alone(measured[0].masks, [m.scores for m in measured], baselines)
  limit = settings.specific_max_general_drop

  def passes(drops: np.ndarray) -> bool:
    return bool(np.all(specificity.within(drops[1:], limit)))

  heads = settings.unit == "heads"
  skip = set(universal)
  # The stores' settings, where they carry them (a run's `MeasurementStore`s), stamp the saved confirmation.
  stores = [getattr(m, "settings", None) for m in measured]
  stamp = None if None in stores else settings_stamp(stores)
  selected, confirmation = confirm([h for h in order if h not in skip], count if heads else settings.curve_k,
                                   passes, known, identification, design.group_of if design else lambda h: [h],
                                   directory, together=settings.top_k if heads else 0, stamp=stamp,
                                   unstamped=bool(getattr(measured[0], "resumed", False)))
  if not heads:  # the rest of a neuron selection comes from the estimates
    judged = set(selected) | set(confirmation.rejected)
    rest = [h for h in select(universal, len(order)) if h not in judged][:count - len(selected)]
    selected, confirmation.estimated = selected + rest, len(rest)
  return Found(ranking, list(general_rankings), effects, order, candidates, universal, selected, alone, confirmation)
