"""The registry of localization methods: every module of this package but `base` holds methods (its `METHODS`, a
tuple of `Method` instances), found by `discover` and registered by name (`register`) in their `listing_order`.

The protocol (`base.Method`, `base.Plan`), the loop that measures a plan (`base.drive`) and the ranking rule are in
`base.py`. A new method is one new file in this package: its settings become flags of `experiments.localize` (under
the prefix `Method.flag_prefix`, derived from its name) and keywords of `jaxloc.run_localization` (`flag_fields`),
the runner and the efficiency benchmark drive it through the protocol, help texts and error messages list it, and
the method tests run it on its own `example_options`.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from jaxloc.errors import UserError
from jaxloc.localize.methods.base import NEEDS, Context, Measured, Method, Plan, Ranking, drive

UNITS = ("heads", "neurons")
DEFAULT = "cs_stratified"  # --method's default: the paper's method
# The method the default flagfile runs, and any other caller that wants one gradient over every unit followed by a
# few single-unit confirmations (the scale rehearsal): the cheapest method that still measures what it selects.
DEFAULT_RUN = "gradient_confirm"

_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> None:
  """Adds `method` under its name. Its declarations must be known ones, and its flags free: no other method's flag
  from another field (methods that share a settings dataclass share its flags). The run settings
  (`LocalizeSettings`) refuse a method whose flag is one of theirs when they compose their flags."""
  if method.name in _REGISTRY:
    raise ValueError(f"a method named {method.name!r} is registered already")
  problems = []
  if set(method.needs) - set(NEEDS):
    problems.append(f"needs {sorted(set(method.needs) - set(NEEDS))} (known: {', '.join(NEEDS)})")
  if not method.units or set(method.units) - set(UNITS):
    problems.append(f"units {list(method.units)} (known: {', '.join(UNITS)})")
  taken = _flag_fields()
  for name, field in method.flag_fields().items():
    if name in taken and taken[name] is not field:
      problems.append(f"flag --{name} is taken by " + ", ".join(owners(name)))
  if problems:
    raise ValueError(f"cannot register method {method.name!r}: " + "; ".join(problems))
  _REGISTRY[method.name] = method


def discover(package_path=None, package: str = __name__) -> list[str]:
  """Registers the methods of every module of this package (or of the modules under `package_path`, imported as
  submodules of `package`) not registered yet, by `Method.listing_order` (the order `names()` lists them in: help
  texts, error messages, the efficiency benchmark's default variants), a method without one last, by name; returns
  their names."""
  new = []
  for module_info in pkgutil.iter_modules(__path__ if package_path is None else package_path):
    if module_info.name == "base":
      continue
    module = importlib.import_module(f"{package}.{module_info.name}")
    new += [method for method in getattr(module, "METHODS", ()) if _REGISTRY.get(method.name) is not method]
  ordered = sorted(new, key=lambda m: (m.listing_order, m.name))
  for method in ordered:
    register(method)
  return [method.name for method in ordered]


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
  fields: dict[str, dataclasses.Field] = {}
  for method in _REGISTRY.values():
    fields.update(method.flag_fields())
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
  return [name for name, method in _REGISTRY.items() if flag in method.flag_fields()]


def run_setting_meanings(setting: str) -> list[tuple[str, str]]:
  """(method, what run-wide `setting` means for it) for every registered method that reads it."""
  return [(name, method.run_settings[setting]) for name, method in _REGISTRY.items() if setting in method.run_settings]


discover()

__all__ = ["Context", "Measured", "Method", "Plan", "Ranking", "discover", "drive", "flag_fields", "get",
           "names", "names_for", "owners", "register", "unregister"]
