"""Keep-masks and mean-ablation values as every job of the engine takes them, checked in one place.

Axes: `masks` M, `layers` L, `heads` H, `mlp` F (neurons per layer), `head_dim` Dh. Masks here are keep-masks (1 keep,
0 ablate), the model's convention; localization designs (True = ablated) convert with `keep = 1 - ablated`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from numpy.typing import ArrayLike

from jaxloc.errors import UserError
from jaxloc.models.config import ModelConfig


@dataclasses.dataclass
class Masks:
  """The keep-masks of one engine call, float32: heads [M, L, H] and/or neurons [M, L, F] (1 keep, 0 ablate)."""

  heads: np.ndarray | None
  neurons: np.ndarray | None

  def __len__(self) -> int:
    given = self.heads if self.heads is not None else self.neurons
    return 0 if given is None else len(given)

  def rows(self, where: Any) -> "Masks":
    return Masks(*(None if m is None else m[where] for m in (self.heads, self.neurons)))

  def padded(self, size: int) -> "Masks":
    """Padded to `size` masks with unablated ones (one shape for the whole run)."""
    pad = lambda m: m if m is None or len(m) >= size else np.concatenate(  # noqa: E731
        [m, np.ones((size - len(m),) + m.shape[1:], m.dtype)])
    return Masks(pad(self.heads), pad(self.neurons))


@dataclasses.dataclass
class Fills:
  """Mean-ablation values, heads [L, H, Dh] and neurons [L, F] (None: zero ablation); float32 on the host from
  `check_fills`, in the activation dtype on the devices from `Placement.fills`."""

  heads: np.ndarray | jax.Array | None = None
  neurons: np.ndarray | jax.Array | None = None


def check_masks(config: ModelConfig, head_masks: ArrayLike | None, neuron_masks: ArrayLike | None = None) -> Masks:
  """Head masks [M, L, H] and/or neuron masks [M, L, F] (a single [L, units] mask counts as one) as float32, or a
  UserError naming the shape this model needs."""
  c = config
  checked: list[np.ndarray | None] = []
  for kind, given, units in (("head", head_masks, c.num_heads), ("neuron", neuron_masks, c.intermediate_size)):
    if given is None:
      checked.append(None)
      continue
    masks = np.asarray(given, np.float32)
    if masks.ndim == 2:
      masks = masks[None]
    if masks.ndim != 3 or masks.shape[1:] != (c.num_layers, units):
      raise UserError(f"{kind} masks must be [masks, {c.num_layers}, {units}] for this model, "
                      f"got {list(np.shape(given))}")
    checked.append(masks)
  if checked[0] is None and checked[1] is None:
    raise UserError("no head or neuron masks given")
  if checked[0] is not None and checked[1] is not None and len(checked[0]) != len(checked[1]):
    raise UserError(f"{len(checked[0])} head masks but {len(checked[1])} neuron masks; give one of each per mask")
  return Masks(*checked)


def check_fills(config: ModelConfig, head_fill: ArrayLike | None, neuron_fill: ArrayLike | None = None) -> Fills:
  """Mean-ablation values as float32, or a UserError naming the shape this model needs."""
  c = config
  fills: list[np.ndarray | None] = []
  for kind, given, expected in (("head", head_fill, (c.num_layers, c.num_heads, c.head_dim)),
                                ("neuron", neuron_fill, (c.num_layers, c.intermediate_size))):
    if given is None:
      fills.append(None)
      continue
    fill = np.asarray(given, np.float32)
    if fill.shape != expected:
      raise UserError(f"{kind} mean-ablation values must be {list(expected)}, got {list(fill.shape)}")
    fills.append(fill)
  return Fills(*fills)


def start_layers(config: ModelConfig, masks: Masks) -> np.ndarray:
  """First layer each mask ablates anything in (int [M]; num_layers for a mask that ablates nothing): a mask can
  start there from the unablated model's residual stream."""
  touched = np.zeros((len(masks), config.num_layers), bool)
  for given in (masks.heads, masks.neurons):
    if given is not None:
      touched |= (given != 1).any(axis=2)
  return np.where(touched.any(axis=1), touched.argmax(axis=1), config.num_layers)


def random_masks(config: ModelConfig, num_masks: int, ablated: int, seed: int = 0) -> np.ndarray:
  """Keep-masks [M, L, H], each with `ablated` random heads zeroed (the benchmarks' workloads)."""
  rng = np.random.default_rng(seed)
  masks = np.ones((num_masks, config.num_layers * config.num_heads), np.float32)
  for row in masks:
    row[rng.choice(row.size, ablated, replace=False)] = 0
  return masks.reshape(num_masks, config.num_layers, config.num_heads)
