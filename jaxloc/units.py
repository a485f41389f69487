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


def parse_unit(name: str, num_layers: int, per_layer: int, unit: str = "heads") -> tuple[int, int]:
  match = _NAME[unit].match(name.strip())
  letter, singular = _LETTER[unit], _SINGULAR[unit]
  if not match:
    raise UserError(f"bad {singular} name {name!r}: expected L<layer>{letter}<index>, e.g. L15{letter}13")
  layer, index = int(match.group(1)), int(match.group(2))
  if layer >= num_layers or index >= per_layer:
    what = "query heads" if unit == "heads" else "MLP neurons"
    raise UserError(f"{singular} {name} is out of range: this model has layers 0-{num_layers - 1} and "
                    f"{what} 0-{per_layer - 1}")
  return layer, index


def parse_units(names: str | Sequence[str] | None, num_layers: int, per_layer: int, unit: str = "heads"
                ) -> list[tuple[int, int]]:
  """Units from 'L1H2,L3H4' (or 'L1N2,...') or a list of names; duplicates are an error."""
  if not names:
    return []
  if isinstance(names, str):
    names = [n for n in names.split(",") if n.strip()]
  units = [parse_unit(n, num_layers, per_layer, unit) for n in names]
  if len(set(units)) != len(units):
    raise UserError(f"duplicate {unit} in {','.join(names)}")
  return units


def parse_heads(names: str | Sequence[str] | None, num_layers: int, num_heads: int) -> list[tuple[int, int]]:
  return parse_units(names, num_layers, num_heads, "heads")


def keep_mask(units: Iterable[tuple[int, int]], num_layers: int, per_layer: int) -> np.ndarray:
  """[L, U] float keep-mask with the given units ablated."""
  mask = np.ones((num_layers, per_layer), np.float32)
  for layer, index in units:
    mask[layer, index] = 0.0
  return mask
