"""The registry of localization methods: every method is registered here once, by name.

The protocol (`base.Method`, `base.Plan`) and the ranking rule are in `base.py`; one file per method.
"""

from __future__ import annotations

from jaxloc.errors import UserError
from jaxloc.localize.methods.base import Context, Measured, Method, Plan, Ranking
from jaxloc.localize.methods.cnl import CommonalityNeurons
from jaxloc.localize.methods.compressed_sensing import CompressedSensing
from jaxloc.localize.methods.gradient_confirm import GradientConfirm
from jaxloc.localize.methods.greedy import IterativeGreedy, OneShotGreedy
from jaxloc.localize.methods.learned_mask import LearnedMask
from jaxloc.localize.methods.two_stage import TwoStage

_REGISTRY: dict[str, Method] = {m.name: m for m in (
    CompressedSensing("cs_stratified", "stratified"),
    CompressedSensing("cs_bernoulli", "bernoulli"),
    OneShotGreedy(),
    IterativeGreedy(),
    GradientConfirm(),
    TwoStage(),
    LearnedMask(),
    CommonalityNeurons(),
)}


def names() -> list[str]:
  return list(_REGISTRY)


def names_for(unit: str) -> list[str]:
  """The methods that localize `unit` ("heads" or "neurons")."""
  return [name for name, method in _REGISTRY.items() if unit in method.units]


def get(name: str) -> Method:
  if name not in _REGISTRY:
    raise UserError(f"unknown method {name!r}; valid: {', '.join(_REGISTRY)}")
  return _REGISTRY[name]


__all__ = ["Context", "Measured", "Method", "Plan", "Ranking", "get", "names"]
