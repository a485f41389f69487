"""A run's named activations (`Model.run_with_cache`): only the sites a names filter asked for, on real tokens.

    cache = model.run_with_cache(prompts, names=["z", "pattern", "resid_post"])
    cache["z"]                        # [masks, layers, prompts, tokens, heads, head_dim]
    cache["z", 8]                     # layer 8: [masks, prompts, tokens, heads, head_dim]
    cache["blocks.8.attn.hook_z"]     # the same, by its TransformerLens name
    cache.get("z", layer=8, prompt=1) # one prompt's real tokens only: [tokens of prompt 1, heads, head_dim]
    cache.pattern("L8H1")             # [tokens, tokens] of prompt 0

The tokens axis runs to the longest prompt's length; a shorter prompt's positions past its end hold NaN (on every
tokens axis of a site), so no read of padding passes for a value. `lengths` holds each prompt's token count.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxloc.errors import UserError
from jaxloc.models import sites as sites_lib
from jaxloc.models.config import ModelConfig
from jaxloc.units import parse_unit


@dataclasses.dataclass
class Cache:
  """Named activations of every row (mask or intervention row) of a run, rows first.

  values: {site: array}: per-layer sites [M, L', P, S, ...] over the layers in `layers[site]` (all unless the
    names filter named some), the others [M, P, S, ...] (`sites.SITES` gives each site's axes after M and L).
  layers: {site: the layers held, in order}. tokens: each prompt's ids. lengths: int [P]. labels: [M].
  """

  values: dict[str, np.ndarray]
  layers: dict[str, tuple[int, ...]]
  tokens: list[list[int]]
  lengths: np.ndarray
  labels: list[str]
  config: ModelConfig = dataclasses.field(repr=False)

  def __repr__(self) -> str:
    shapes = ", ".join(f"{name} {list(value.shape)}" for name, value in self.values.items())
    return (f"Cache({len(self.labels)} rows x {len(self.lengths)} prompts of {self.lengths.tolist()} tokens: "
            f"{shapes}; {self.nbytes / 2**20:.1f} MiB)")

  @property
  def nbytes(self) -> int:
    return sum(v.nbytes for v in self.values.values())

  def keys(self) -> list[str]:
    return list(self.values)

  def __contains__(self, name: object) -> bool:
    return name in self.values

  def _key(self, key: Any) -> tuple[str, int | None]:
    if isinstance(key, tuple):
      if len(key) != 2:
        raise UserError(f"index a cache by a site, (site, layer) or a TransformerLens name, not {key!r}")
      return str(key[0]), int(key[1])
    if not isinstance(key, str):
      raise UserError(f"index a cache by a site name, not {type(key).__name__}")
    if key in self.values or key in sites_lib.SITES:
      return key, None
    for pattern, site in sites_lib._HOOK.items():
      match = pattern.match(key)
      if match:
        return site, int(match.group(1)) if match.groups() else None
    raise UserError(f"unknown site {key!r}; this cache holds {', '.join(self.values)}")

  def __getitem__(self, key: Any) -> np.ndarray:
    site, layer = self._key(key)
    if site not in self.values:
      raise UserError(f"this cache does not hold {site!r} (it holds {', '.join(self.values) or 'nothing'}): ask "
                      f"run_with_cache(..., names=[..., {site!r}])")
    value = self.values[site]
    if layer is None:
      return value
    if not sites_lib.SITES[site].per_layer:
      raise UserError(f"{site} has no layers")
    held = self.layers[site]
    if layer not in held:
      raise UserError(f"this cache holds {site} at layers {list(held)}, not layer {layer}")
    return value[:, held.index(layer)]

  def get(self, site: str, layer: int | None = None, *, mask: int = 0, prompt: int = 0) -> np.ndarray:
    """One row's value of `site` (at `layer`, or every held layer first) for one prompt, cut to its real tokens on
    every tokens axis."""
    if not 0 <= prompt < len(self.lengths):
      raise UserError(f"prompt {prompt} is out of range: this cache holds prompts 0-{len(self.lengths) - 1}")
    if not 0 <= mask < len(self.labels):
      raise UserError(f"row {mask} is out of range: this cache holds rows 0-{len(self.labels) - 1}")
    value = self[site] if layer is None else self[site, layer]
    value = value[mask]
    per_layer = sites_lib.SITES[site].per_layer and layer is None
    if per_layer:
      value = np.moveaxis(value, 0, 1)  # [P, L, ...]
    value = value[prompt]
    n = int(self.lengths[prompt])
    axes = sites_lib.SITES[site].axes.split()[1:]  # after P
    index = [slice(None)] * value.ndim
    offset = 1 if per_layer else 0
    for i, axis in enumerate(axes):
      if axis == "S":
        index[offset + i] = slice(0, n)
    return value[tuple(index)]

  def stacked(self, site: str) -> np.ndarray:
    """The first row's value of a per-layer site over every layer: [L, P, S, ...]."""
    value = self[site]
    if not sites_lib.SITES[site].per_layer:
      raise UserError(f"{site} is not a per-layer site")
    if self.layers[site] != tuple(range(self.config.num_layers)):
      raise UserError(f"this cache holds {site} at layers {list(self.layers[site])} only; an intervention reads "
                      f"every layer: cache names=[{site!r}]")
    return value[0]

  def pattern(self, head: str, mask: int = 0, prompt: int = 0) -> np.ndarray:
    """Attention pattern [S, S] (query, key) of one head ("L8H1") for one prompt under one row, cut to the
    prompt's length."""
    layer, index = parse_unit(head, self.config.num_layers, self.config.num_heads)
    return self.get("pattern", layer, mask=mask, prompt=prompt)[index]


def blank_padding(value: np.ndarray, axes: str, lengths: np.ndarray, leading: int) -> np.ndarray:
  """`value` [..leading axes.., P, ...] (site axes `axes`, starting with P) with NaN at every token past each prompt's
  length, on every tokens axis; float arrays only."""
  names = axes.split()
  seq = [leading + i for i, a in enumerate(names) if a == "S"]
  prompt_axis = leading + names.index("P")
  out = value.astype(np.float32, copy=True)
  for axis in seq:
    width = out.shape[axis]
    beyond = np.arange(width)[None, :] >= lengths[:, None]  # [P, S]
    shape = [1] * out.ndim
    shape[prompt_axis], shape[axis] = len(lengths), width
    out = np.where(beyond.reshape(shape), np.nan, out)
  return out
