"""The registry of localization methods: every method is registered here once, by name (`register`).

The protocol (`base.Method`, `base.Plan`), the loop that measures a plan (`base.drive`) and the ranking rule are in
`base.py`; one file per method. Registering is all a new method needs: its settings become flags of
`experiments.localize` and keywords of `jaxloc.run_localization` (`flag_fields`), the runner and the efficiency
benchmark drive it through the protocol, and help texts and error messages list it.
"""

from __future__ import annotations

import dataclasses

from jaxloc.errors import UserError
from jaxloc.localize.methods.base import NEEDS, Context, Measured, Method, Plan, Ranking, drive
from jaxloc.localize.methods.cnl import CommonalityNeurons
from jaxloc.localize.methods.compressed_sensing import CompressedSensing
from jaxloc.localize.methods.gradient_confirm import GradientConfirm
from jaxloc.localize.methods.greedy import IterativeGreedy, OneShotGreedy
from jaxloc.localize.methods.learned_mask import LearnedMask
from jaxloc.localize.methods.two_stage import TwoStage

UNITS = ("heads", "neurons")
DEFAULT = "cs_stratified"  # --method's default: the paper's method

_REGISTRY: dict[str, Method] = {}
# The method the default flagfile runs, and any other caller that wants one gradient over every unit followed by a
# few single-unit confirmations (the scale rehearsal): the cheapest method that still measures what it selects.
DEFAULT_RUN = "gradient_confirm"


def register(method: Method) -> None:
  """Adds `method` under its name. Its declarations must be known ones, and its flags free: no run-wide setting's
  name, no other method's flag from another field (methods that share a settings dataclass share its flags)."""
  from jaxloc.localize.settings import LocalizeSettings, declared_flag_fields, flag_fields as fields_of

  if method.name in _REGISTRY:
    raise ValueError(f"a method named {method.name!r} is registered already")
  run_wide = declared_flag_fields(LocalizeSettings)
  problems = []
  if set(method.needs) - set(NEEDS):
    problems.append(f"needs {sorted(set(method.needs) - set(NEEDS))} (known: {', '.join(NEEDS)})")
  if not method.units or set(method.units) - set(UNITS):
    problems.append(f"units {list(method.units)} (known: {', '.join(UNITS)})")
  problems += [f"run setting {name!r} is no LocalizeSettings field" for name in method.run_settings
               if name not in run_wide]
  taken = _flag_fields()
  for name, field in fields_of(method.settings_class).items():
    if name in run_wide or (name in taken and taken[name] is not field):
      problems.append(f"flag --{name} is taken by " + (", ".join(owners(name)) or "the run-wide settings"))
  if problems:
    raise ValueError(f"cannot register method {method.name!r}: " + "; ".join(problems))
  _REGISTRY[method.name] = method


def unregister(name: str) -> Method:
  """Removes the method registered as `name` (and its flags from what `flag_fields` lists); returns it."""
  return _REGISTRY.pop(name)


def names() -> list[str]:
  return list(_REGISTRY)


def names_for(unit: str) -> list[str]:
  """The methods that localize `unit` ("heads" or "neurons")."""
  return [name for name, method in _REGISTRY.items() if unit in method.units]


def get(name: str) -> Method:
  if name not in _REGISTRY:
    raise UserError(f"unknown method {name!r}; valid: {', '.join(_REGISTRY)}")
  return _REGISTRY[name]


def flag_fields() -> dict[str, dataclasses.Field]:
  """Every registered method's flags, by name (a settings dataclass several methods share gives its flags once),
  each field's help prefixed with the methods that take it."""
  return {name: _with_owners(name, field) for name, field in _flag_fields().items()}


def _flag_fields() -> dict[str, dataclasses.Field]:
  from jaxloc.localize.settings import flag_fields as fields_of

  fields: dict[str, dataclasses.Field] = {}
  for method in _REGISTRY.values():
    fields.update(fields_of(method.settings_class))
  return fields


def _with_owners(name: str, field: dataclasses.Field) -> dataclasses.Field:
  """A copy of the field with `owners(name): ` before its help (the settings class keeps its own)."""
  labelled = dataclasses.field(default=field.default, default_factory=field.default_factory,
                               metadata={**field.metadata, "help": f"{', '.join(owners(name))}: "
                                                                   f"{field.metadata.get('help', '')}"})
  labelled.name, labelled.type = field.name, field.type
  return labelled


def owners(flag: str) -> list[str]:
  """The registered methods that take flag `flag`."""
  from jaxloc.localize.settings import flag_fields as fields_of

  return [name for name, method in _REGISTRY.items() if flag in fields_of(method.settings_class)]


def run_setting_meanings(setting: str) -> list[tuple[str, str]]:
  """(method, what run-wide `setting` means for it) for every registered method that reads it."""
  return [(name, method.run_settings[setting]) for name, method in _REGISTRY.items() if setting in method.run_settings]


# Registration order is the order of help texts, error messages and the efficiency benchmark's default variants.
for _method in (
    OneShotGreedy(),
    CompressedSensing("cs_stratified", "stratified", efficiency_variants=(
        "", "logprob", "nonpositive", "r0.03-upto{cap}", "logprob-r0.03-upto{cap}")),
    CompressedSensing("cs_bernoulli", "bernoulli", efficiency_variants=("upto{cap}",)),
    IterativeGreedy(),
    TwoStage(),
    GradientConfirm(),
    LearnedMask(),
    CommonalityNeurons(),
):
  register(_method)


__all__ = ["Context", "Measured", "Method", "Plan", "Ranking", "drive", "flag_fields", "get", "names", "names_for",
           "owners", "register", "unregister"]
