"""Specific heads confirmed by measurement: the estimates only propose candidates.

`--selection=specific` keeps the target's best-ranked heads whose ablation leaves every general task intact. An
estimate of a head's general-task effect (a Lasso coefficient from a few dozen masks) cannot carry that claim, so
before a head is called specific it is ablated alone on the identification documents of the target and of every
general task, and kept only when no general task drops by more than `--specific_max_general_drop` (relative).
Candidates are taken in the target's ranking order and confirmed in small batches until enough pass; a head the
method already measured alone (one-shot greedy, the confirmation methods) costs nothing more.

Aliased heads (identical columns of a random design, `aliasing`) share one Lasso coefficient, so the ranking
cannot say which of them matters: when a candidate has twins, every member of its group is measured alone and
the members take the group's place in the order of their measured target drop; a member whose ablation alone
does not lower the target at all is left out (the group's effect was not its own).

Confirmations are saved in `confirmation.npz` (resumed runs reuse them) and counted in `num_evaluations`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import numpy as np

from jaxloc import files
from jaxloc.localize import validate

FILE = "confirmation.npz"


@dataclasses.dataclass
class Confirmation:
  """What the confirmation measured: relative drop per task (target first) of each head ablated alone on the
  identification documents, and what it cost."""

  drops: dict[int, np.ndarray]
  measured: list[int]  # heads this confirmation ablated alone (new masks, each scored on every task)
  reused: list[int]  # heads the method had already measured alone
  rejected: list[int]  # candidates whose measured general drop was too large
  regrouped: list[list[int]]  # aliased groups resolved by measurement (members in measured order)

  def facts(self, name: Callable[[int], str], tasks: Sequence[str], max_general_drop: float) -> dict[str, Any]:
    return {
        "rule": (f"each selected unit ablated alone on the identification documents: every general task drops by "
                 f"≤ {100 * max_general_drop:.0f}% (relative)"),
        "masks": len(self.measured), "reused_measurements": len(self.reused),
        "rejected": {name(h): {t: float(d) for t, d in zip(tasks, self.drops[h])} for h in self.rejected},
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
            scorer: validate.Scorer, groups: Callable[[int], list[int]], directory: str | None) -> tuple[
                list[int], Confirmation]:
  """The first `count` heads of `order` (already without excluded and universal heads) that pass when measured
  alone. `known`: drops already measured alone (reused); `groups(h)`: h's aliased group ([h] when none)."""
  path = os.path.join(directory, FILE) if directory else None
  saved = files.read_arrays(path) if path else None
  drops = dict(known)
  measured: list[int] = []
  if saved is not None:
    for h, d in zip(saved["heads"].tolist(), saved["drops"]):
      if int(h) not in drops:
        drops[int(h)] = np.asarray(d, np.float64)
        measured.append(int(h))

  def measure(heads: list[int]) -> None:
    todo = [h for h in dict.fromkeys(heads) if h not in drops]
    if not todo:
      return
    for h, d in zip(todo, validate.single_head_drops(todo, scorer)):
      drops[h] = d
    measured.extend(todo)
    if path:
      files.save_arrays(path, {"heads": np.asarray(measured, np.int64),
                               "drops": np.stack([drops[h] for h in measured])})

  selected: list[int] = []
  rejected: list[int] = []
  regrouped: list[list[int]] = []
  seen: set[int] = set()
  position = 0
  while len(selected) < count and position < len(order):
    # One batch: the candidates for the heads still missing (and their twins), plus a few spares.
    window = [int(h) for h in order[position:position + 2 * (count - len(selected)) + 2]]
    measure([m for h in window if h not in seen for m in groups(h) if m not in seen])
    for h in window:
      position += 1
      if h in seen:
        continue
      group = [m for m in groups(h) if m not in seen]
      seen.update(group)
      if len(group) > 1:
        group = sorted(group, key=lambda m: -drops[m][0])
        regrouped.append(group)
        group = [m for m in group if drops[m][0] > 0]
      for m in group:
        if len(selected) < count:
          (selected if passes(drops[m]) else rejected).append(m)
      if len(selected) == count:
        break
  used = set(selected) | set(rejected) | {m for g in regrouped for m in g}
  return selected, Confirmation(drops, measured, [h for h in known if h in used], rejected, regrouped)
