"""Building the masks a prompt-level call runs under (`jaxloc.Model.logits`, `score`, `generate`, `run_with_cache`,
`patch`): many at once, each with a label.

    import jaxloc
    model = jaxloc.load("smollm2-135m")
    jaxloc.masks.heads(model, ["L8H1", "L20H5"])           # one mask ablating both heads
    jaxloc.masks.heads(model, ["L8H1", "L20H5"], each=True)  # two masks, one head each
    jaxloc.masks.single_heads(model)                         # every head alone: 270 masks for SmolLM2
    jaxloc.masks.random(model, 100, ablation_rate=0.1)       # a localization design's masks
    jaxloc.masks.none(model) + jaxloc.masks.single_heads(model, layers=[8])  # the baseline first, then a sweep

Axes: `masks` M, `layers` L, `heads` H, `mlp` F (neurons per layer). Masks here are keep-masks, the model's
convention (1 keep, 0 ablate); a localization design (True = ablated) is `from_design`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxloc import checks
from jaxloc.errors import UserError
from jaxloc.units import UnitName, parse_units, unit_name
from jaxloc.localize.designs import make_design
from jaxloc.models.config import ModelConfig

# Unit names ("L8H1,L20H5", ["L8H1", "L20H5"]) or (layer, index) pairs ([(8, 1), (20, 5)], or one pair (8, 1)).
Names = str | UnitName | Sequence[UnitName]


@dataclasses.dataclass
class MaskSet:
  """Keep-masks with a label each: heads float [M, L, H] and/or neurons float [M, L, F] (None: that kind of unit
  is never ablated), labels [M] (e.g. "L8H1", "none", "random 3"). `a + b` is a's masks then b's.

  Every value must be finite and in [0, 1] (1 keeps a unit, 0 ablates it, a value between scales it): construction
  refuses anything else with a `UserError` naming the mask, unit and value. An empty set (no masks) can be built, as
  the start of a sum, but no call runs one."""

  heads: np.ndarray | None
  neurons: np.ndarray | None
  labels: list[str]

  def __post_init__(self) -> None:
    self.labels = list(self.labels)
    for unit in ("heads", "neurons"):
      values = getattr(self, unit)
      if values is None:
        continue
      try:
        values = np.asarray(values, np.float32)
      except (TypeError, ValueError):
        raise UserError(f"{unit} keep-masks must be numbers [masks, layers, {unit}], not "
                        f"{type(getattr(self, unit)).__name__} of {np.asarray(getattr(self, unit)).dtype}") from None
      if values.ndim != 3 or len(values) != len(self.labels):
        raise UserError(f"{unit} keep-masks must be [masks, layers, {unit}] with one mask per label "
                        f"({len(self.labels)}), got {list(values.shape)}")
      checks.check_keep_masks(values, unit, self.labels)
      setattr(self, unit, values)

  def __len__(self) -> int:
    return len(self.labels)

  def __add__(self, other: "MaskSet") -> "MaskSet":
    def joined(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
      """a's masks then b's, a set without this kind of unit counting as unablated."""
      known = a if a is not None else b
      if known is None:
        return None
      shape = known.shape[1:]
      a = np.ones((len(self),) + shape, np.float32) if a is None else a
      b = np.ones((len(other),) + shape, np.float32) if b is None else b
      return np.concatenate([a, b])

    return MaskSet(joined(self.heads, other.heads), joined(self.neurons, other.neurons), self.labels + other.labels)

  def __getitem__(self, where: Any) -> "MaskSet":
    """The masks at `where` (an index array, a slice), labels included."""
    rows = np.arange(len(self))[where]
    rows = np.atleast_1d(rows)
    return MaskSet(None if self.heads is None else self.heads[rows],
                   None if self.neurons is None else self.neurons[rows], [self.labels[i] for i in rows])


def model_config(model: Any) -> ModelConfig:
  """The ModelConfig of a `jaxloc.Model`, a `LoadedModel`, an `Engine` or a ModelConfig itself."""
  if isinstance(model, ModelConfig):
    return model
  for attribute in ("config", "model_config"):
    config = getattr(model, attribute, None)
    if isinstance(config, ModelConfig):
      return config
  raise UserError(f"masks are built for a model: pass a jaxloc.Model, a LoadedModel or a ModelConfig, not "
                  f"{type(model).__name__}")


def none(model: Any) -> MaskSet:
  """One mask that ablates nothing (the unablated model), labelled "none"."""
  c = model_config(model)
  return MaskSet(np.ones((1, c.num_layers, c.num_heads), np.float32), None, ["none"])


def _units(model: Any, names: Names, unit: str, each: bool) -> tuple[np.ndarray, list[str]]:
  c = model_config(model)
  per_layer = c.num_heads if unit == "heads" else c.intermediate_size
  units = parse_units(names, c.num_layers, per_layer, unit)
  if not units:
    raise UserError(f"no {unit} named: give names like " + ("L8H1" if unit == "heads" else "L3N117"))
  groups = [[u] for u in units] if each else [units]
  masks = np.ones((len(groups), c.num_layers, per_layer), np.float32)
  for row, group in enumerate(groups):
    for layer, index in group:
      masks[row, layer, index] = 0.0
  labels = [unit_name(*u, unit) for u in units] if each else [",".join(unit_name(*u, unit) for u in units)]
  return masks, labels


def heads(model: Any, names: Names, *, each: bool = False) -> MaskSet:
  """A mask ablating the named heads ("L8H1,L20H5", a list, or (layer, head) pairs [(8, 1), (20, 5)]), or with
  `each` one mask per head."""
  masks, labels = _units(model, names, "heads", each)
  return MaskSet(masks, None, labels)


def neurons(model: Any, names: Names, *, each: bool = False) -> MaskSet:
  """A mask ablating the named MLP neurons ("L3N117,...", a list, or (layer, neuron) pairs [(3, 117)]), or with
  `each` one mask per neuron."""
  masks, labels = _units(model, names, "neurons", each)
  return MaskSet(None, masks, labels)


def single_heads(model: Any, layers: Sequence[int] | None = None) -> MaskSet:
  """One mask per head, ablating it alone, in layer-major order (every layer, or only `layers`)."""
  c = model_config(model)
  chosen = range(c.num_layers) if layers is None else [int(layer) for layer in layers]
  bad = [layer for layer in chosen if not 0 <= layer < c.num_layers]
  if bad:
    raise UserError(f"layers {bad} are out of range: this model has layers 0-{c.num_layers - 1}")
  return heads(model, [unit_name(layer, h) for layer in chosen for h in range(c.num_heads)], each=True)


def from_design(model: Any, ablated: np.ndarray, labels: Sequence[str] | None = None) -> MaskSet:
  """Head masks from a localization design, bool [M, L, H] with True = ablated (`jaxloc.read_run(...).masks`).

  A numeric design must lie in [0, 1]: 1 ablated, 0 kept, a value between a soft mask keeping 1 - value (NaN or a
  value outside [0, 1] is refused, where casting to bool would have made it an ablation)."""
  c = model_config(model)
  ablated = np.asarray(ablated)
  if ablated.ndim != 3 or ablated.shape[1:] != (c.num_layers, c.num_heads):
    raise UserError(f"a design must be [masks, {c.num_layers}, {c.num_heads}] for this model, got "
                    f"{list(ablated.shape)}")
  checks.check_design_values(ablated)
  labels = list(labels) if labels is not None else [f"design {i}" for i in range(len(ablated))]
  keep = ~ablated if ablated.dtype == bool else 1 - ablated.astype(np.float64)
  return MaskSet(keep.astype(np.float32), None, labels)


def random(model: Any, num_masks: int, ablation_rate: float = 0.1, *, seed: int = 0, kind: str = "stratified",
           exclude: Sequence[str] | None = None) -> MaskSet:
  """`num_masks` random head masks, each ablating `ablation_rate` of the heads: the localization designs
  (`kind`: "stratified", every mask ablating the same number of heads and every head ablated equally often, or
  "bernoulli"); `exclude`d heads are never ablated."""
  c = model_config(model)
  design = make_design(kind, c.num_layers, c.num_heads, num_masks=num_masks, ablation_rate=ablation_rate, seed=seed,
                       exclude=exclude)
  return from_design(c, design, [f"random {i}" for i in range(num_masks)])


def checked(model: Any, masks: MaskSet) -> MaskSet:
  """`masks`, refused unless a call can run it on `model`: at least one mask, head and/or neuron masks shaped
  for the model, every value finite and in [0, 1] (checked again here: a MaskSet's arrays can change after it was
  built)."""
  c = model_config(model)
  checks.require_masks(len(masks))
  if masks.heads is None and masks.neurons is None:
    raise UserError(f"a mask set of {len(masks)} masks with neither head nor neuron masks: build one with "
                    f"jaxloc.masks (none, heads, neurons, ...)")
  for unit, values, shape in (("heads", masks.heads, (c.num_layers, c.num_heads)),
                              ("neurons", masks.neurons, (c.num_layers, c.intermediate_size))):
    if values is None:
      continue
    if values.shape[1:] != shape:
      raise UserError(f"{unit} keep-masks must be [masks, {shape[0]}, {shape[1]}] for this model, got "
                      f"{list(values.shape)}")
    checks.check_keep_masks(values, unit, masks.labels)
  return masks


def resolve(model: Any, masks: Any = None, heads_: Names | None = None, neurons_: Names | None = None) -> MaskSet:
  """The masks of a call: a MaskSet, head keep-masks [M, L, H] (or one [L, H]), or the heads/neurons one mask
  ablates (names or (layer, index) pairs); none of them is the unablated model. Whatever the form, the result is
  `checked`: at least one mask, shaped for the model, every value finite and in [0, 1]."""
  given = [x is not None for x in (masks, heads_, neurons_)]
  if sum(given) > 1:
    if masks is not None:
      raise UserError("give masks=, or heads=/neurons=, not both")
  if masks is None and heads_ is None and neurons_ is None:
    return none(model)
  if masks is not None:
    if isinstance(masks, MaskSet):
      return checked(model, masks)
    c = model_config(model)
    try:
      array = np.asarray(masks, np.float32)
    except (TypeError, ValueError):
      raise UserError(f"masks= takes a jaxloc.masks.MaskSet or head keep-masks [masks, {c.num_layers}, "
                      f"{c.num_heads}] of numbers, not {type(masks).__name__}") from None
    array = array[None] if array.ndim == 2 else array
    if array.ndim != 3 or array.shape[1:] != (c.num_layers, c.num_heads):
      raise UserError(f"head keep-masks must be [masks, {c.num_layers}, {c.num_heads}] for this model (or a "
                      f"jaxloc.masks.MaskSet), got {list(np.shape(masks))}")
    checks.require_masks(len(array))
    return MaskSet(array, None, [f"mask {i}" for i in range(len(array))])
  head_set = heads(model, heads_) if heads_ is not None else None
  neuron_set = neurons(model, neurons_) if neurons_ is not None else None
  if head_set is None or neuron_set is None:
    return head_set if head_set is not None else neuron_set  # type: ignore[return-value]
  return MaskSet(head_set.heads, neuron_set.neurons, [head_set.labels[0] + "," + neuron_set.labels[0]])
