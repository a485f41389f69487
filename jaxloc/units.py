"""The units a run localizes, heads or neurons: their names (`L15H13` = layer 15, query head 13; `L3N117` = layer 3,
MLP neuron 117), counts per layer, run files, and keep-masks built from names.

Axes: `layers` L, `units` U per layer (query heads H, or MLP intermediate units F). A keep-mask is float [L, U]
with 1 keep, 0 ablate.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np

from jaxloc.errors import UserError

UNITS = ("heads", "neurons")
_LETTER = {"heads": "H", "neurons": "N"}
_SINGULAR = {"heads": "head", "neurons": "neuron"}
_NAME = {unit: re.compile(rf"^L(\d+){letter}(\d+)$") for unit, letter in _LETTER.items()}


def singular(unit: str) -> str:
  """"head" or "neuron"."""
  return _SINGULAR[unit]


def run_file(unit: str) -> str:
  """The ranked-units file of a localization run over `unit`: heads.json or neurons.json."""
  return f"{unit}.json"


def check_unit(unit: str) -> None:
  if unit not in UNITS:
    raise UserError(f"unknown unit {unit!r}; valid: {', '.join(UNITS)}")


def units_per_layer(config, unit: str) -> int:
  """Query heads or MLP intermediate units per layer of a model config."""
  check_unit(unit)
  return config.num_heads if unit == "heads" else config.intermediate_size


def unit_name(layer: int, index: int, unit: str = "heads") -> str:
  return f"L{int(layer)}{_LETTER[unit]}{int(index)}"


def head_name(layer: int, head: int) -> str:
  return unit_name(layer, head, "heads")


# A unit given by position instead of name: (layer, index), e.g. (15, 13) for L15H13.
UnitName = str | tuple[int, int]


def _integer(value: object) -> int | None:
  """`value` as an int where it is one (Python or NumPy integers), else None: bools and floats are not indices."""
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    return None
  return int(value)


def parse_unit(name: UnitName, num_layers: int, per_layer: int, unit: str = "heads") -> tuple[int, int]:
  """(layer, index) of a unit named "L15H13" (heads) or "L3N117" (neurons), or given as a (layer, index) pair of
  integers; either form must lie inside the model (`num_layers` layers, `per_layer` units each)."""
  letter, singular = _LETTER[unit], _SINGULAR[unit]
  if isinstance(name, str):
    match = _NAME[unit].match(name.strip())
    if not match:
      raise UserError(f"bad {singular} name {name!r}: expected L<layer>{letter}<index>, e.g. L15{letter}13")
    layer, index = int(match.group(1)), int(match.group(2))
    shown = name
  else:
    pair = tuple(name) if isinstance(name, (tuple, list)) else ()
    numbers = [n for n in (_integer(v) for v in pair) if n is not None]
    if len(pair) != 2 or len(numbers) != 2:
      raise UserError(f"bad {singular} {name!r} ({type(name).__name__}): expected a name L<layer>{letter}<index>, "
                      f"e.g. L15{letter}13, or a (layer, index) pair of integers, e.g. (15, 13)")
    layer, index = numbers
    shown = f"({layer}, {index})"
  if not (0 <= layer < num_layers and 0 <= index < per_layer):
    what = "query heads" if unit == "heads" else "MLP neurons"
    raise UserError(f"{singular} {shown} is out of range: this model has layers 0-{num_layers - 1} and "
                    f"{what} 0-{per_layer - 1}")
  return layer, index


def parse_units(names: str | UnitName | Sequence[UnitName] | None, num_layers: int, per_layer: int,
                unit: str = "heads") -> list[tuple[int, int]]:
  """Units from 'L1H2,L3H4' (or 'L1N2,...'), a list of names and/or (layer, index) pairs, or one pair (1, 2);
  duplicates are an error."""
  given: list[UnitName]
  if names is None:
    return []
  if isinstance(names, str):
    given = [n for n in names.split(",") if n.strip()]
  elif isinstance(names, tuple) and len(names) == 2 and all(_integer(v) is not None for v in names):
    given = [names]  # type: ignore[list-item]  # one (layer, index) pair, not two names
  else:
    try:
      given = list(names)  # type: ignore[arg-type]  # whatever it holds, parse_unit checks each item
    except TypeError:
      raise UserError(f"{unit} must be names like L15{_LETTER[unit]}13 (a list, or one comma-separated string) or "
                      f"(layer, index) pairs, not {type(names).__name__}") from None
  units = [parse_unit(n, num_layers, per_layer, unit) for n in given]
  if len(set(units)) != len(units):
    raise UserError(f"duplicate {unit} in {','.join(unit_name(*u, unit) for u in units)}")
  return units


def parse_heads(names: str | Sequence[str] | None, num_layers: int, num_heads: int) -> list[tuple[int, int]]:
  return parse_units(names, num_layers, num_heads, "heads")


def keep_mask(units: Iterable[tuple[int, int]], num_layers: int, per_layer: int) -> np.ndarray:
  """[L, U] float keep-mask with the given units ablated."""
  mask = np.ones((num_layers, per_layer), np.float32)
  for layer, index in units:
    mask[layer, index] = 0.0
  return mask
