"""The selection rule of a run (`--selection`): which of the target's ranked units it may report, as an object that
the run, the confirmation, the bootstrap and the efficiency benchmark ask instead of branching on a name.

Axes: N units flattened (flat = layer * U + unit); effects hold the target first, then the general tasks.

Every rule leaves out excluded and universal units and keeps the target's ranking order:
  Raw:      every other unit;
  Specific: units with an estimate on every general task whose largest estimated general drop is at most
            `max_general_drop`. With general tasks a run measures this rule instead of trusting the estimates
            (`confirmed`: `confirm` ablates each candidate alone, and the top-k together, on every task); the
            estimated rule is what the bootstrap re-selects with (no model evaluation per resample), and it
            continues a neuron selection past its confirmed head.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Sequence

import numpy as np

from jaxloc.localize.specificity import Effects, within

NAMES = ("specific", "raw")


class Selection(abc.ABC):
  """A selection rule (`of` builds one from the settings)."""

  name: ClassVar[str]  # the --selection value
  # Whether a run with general tasks confirms the rule by measurement (`confirm`), which may score more of a general
  # task's documents (the preflight loads them).
  confirmed: ClassVar[bool]

  @abc.abstractmethod
  def allowed(self, effects: Effects) -> np.ndarray:
    """bool [N]: the units the rule allows by their estimated effects (excluded and universal units aside)."""

  @abc.abstractmethod
  def describe(self) -> str:
    """The rule in words (heads.json `selection`)."""

  def confirms(self, num_general: int) -> bool:
    """Whether a run with `num_general` general tasks confirms its selection by measurement."""
    return self.confirmed and num_general > 0

  def select(self, order: Sequence[int], effects: Effects, excluded: np.ndarray, universal: Sequence[int],
             count: int) -> list[int]:
    """The first `count` units of the target's `order` that the rule allows, without excluded and universal ones."""
    allowed = ~np.asarray(excluded, bool).copy()
    allowed[list(universal)] = False
    allowed &= self.allowed(effects)
    return [int(h) for h in order if allowed[h]][:count]


@dataclasses.dataclass(frozen=True)
class Raw(Selection):
  name: ClassVar[str] = "raw"
  confirmed: ClassVar[bool] = False

  def allowed(self, effects: Effects) -> np.ndarray:
    return np.ones(effects.drops.shape[1], bool)

  def describe(self) -> str:
    return "raw: the target's ranking; excluded and universal units left out"


@dataclasses.dataclass(frozen=True)
class Specific(Selection):
  max_general_drop: float  # relative, as a fraction
  name: ClassVar[str] = "specific"
  confirmed: ClassVar[bool] = True

  def allowed(self, effects: Effects) -> np.ndarray:
    general = effects.general
    if not len(general):
      return np.ones(effects.drops.shape[1], bool)
    # Never estimated on a general task: not allowed (within() lets NaN by).
    return ~np.isnan(general).any(axis=0) & within(general.max(axis=0), self.max_general_drop)

  def describe(self) -> str:
    return (f"specific: the target's ranking, keeping units whose relative drop on every general task is "
            f"≤ {100 * self.max_general_drop:.0f}% when each is ablated alone on the identification documents "
            "(measured, not estimated); excluded and universal units left out")


RAW = Raw()


def of(name: str, max_general_drop: float) -> Selection:
  """The rule `--selection=name` names, with --specific_max_general_drop."""
  if name == Raw.name:
    return RAW
  if name == Specific.name:
    return Specific(float(max_general_drop))
  raise ValueError(f"unknown selection {name!r}; one of {', '.join(NAMES)}")
