"""Interventions as data: what a row of a batch changes in a forward pass, and their translation into the decoder's
site edits (`jaxloc.models.sites.Edit`).

    import jaxloc
    from jaxloc import interventions as iv
    clean = model.run_with_cache(["When Mary and John went out, John gave it to"], names=["z"])
    rows = [iv.patch("z", layer=8, unit=1, positions=[-1], source=clean),       # one head at the last token
            iv.zero("mlp_post", layer=3, unit=117),                            # one neuron, every position
            [iv.scale("z", layer=9, unit=6, factor=2.0), iv.add("resid_pre", 4, vector)]]  # two changes together
    model.logits(corrupted, interventions=rows, last=True)                   # [3 rows, prompts, vocab], one call

An intervention is a site (`sites.SITES`) x a layer (a list of layers, or None for every layer) x a unit (a head of `q`/`z`, a KV head of
`k`/`v`, a neuron of `mlp_pre`/`mlp_post`; None for every unit and for the residual-type sites) x positions (None for
every real token; negative positions count from each prompt's end, so -1 is each prompt's last token, never padding)
x an operation: zero, mean (over a reference run's real tokens), patch (set from another run's cache, position by
position), add (a vector), scale (a factor). A row is one intervention or a list applied together.

Axes: rows N, `layers` L, `prompts` P, `tokens` S, `units` U, value Dv.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxloc.api.cache import Cache
from jaxloc.errors import UserError
from jaxloc.models import sites as sites_lib
from jaxloc.models.config import ModelConfig
from jaxloc.models.sites import Edit

OPS = ("zero", "mean", "patch", "add", "scale")
Layers = int | Sequence[int] | None  # one layer, several, or every layer


@dataclasses.dataclass(frozen=True, eq=False)
class Intervention:
  """One change of a forward pass (module docstring). `value`: the source `Cache` of a patch or a mean, the vector
  [Dv] of an add (Dh for a head, D for the residual-type sites, a number for a neuron), the factor of a scale."""

  site: str
  layer: int | tuple[int, ...] | None
  unit: int | None = None
  positions: tuple[int, ...] | None = None
  op: str = "zero"
  value: Any = None

  def label(self) -> str:
    where = "" if self.positions is None else "@" + ",".join(map(str, self.positions))
    layer = "*" if self.layer is None else ",".join(map(str, np.atleast_1d(self.layer)))
    unit = "" if self.unit is None else f"[{self.unit}]"
    return f"{self.op} {self.site} L{layer}{unit}{where}"


Row = Intervention | Sequence[Intervention]


def _layers(layer: Layers) -> int | tuple[int, ...] | None:
  return layer if layer is None or isinstance(layer, (int, np.integer)) else tuple(layer)


def _positions(positions: int | Sequence[int] | None) -> tuple[int, ...] | None:
  if positions is None:
    return None
  items = [positions] if isinstance(positions, (int, np.integer)) else list(positions)
  if not items:
    raise UserError("positions=[] selects no token; give positions (negative ones count from each prompt's end) or "
                    "None for every token")
  for p in items:
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
      raise UserError(f"positions are integers, not {p!r}")
  return tuple(int(p) for p in items)


def zero(site: str, layer: Layers, unit: int | None = None, positions: int | Sequence[int] | None = None
         ) -> Intervention:
  """Zero `site` at `layer` (None: every layer), `unit` (None: every unit) and `positions` (None: every token)."""
  return Intervention(site, _layers(layer), unit, _positions(positions), "zero")


def mean(site: str, layer: Layers, reference: Any, unit: int | None = None,
         positions: int | Sequence[int] | None = None) -> Intervention:
  """Replace `site` by its mean over the real tokens of every prompt of `reference` (a `Cache` holding the site,
  its first row)."""
  return Intervention(site, _layers(layer), unit, _positions(positions), "mean", reference)


def patch(site: str, layer: Layers, source: Any, unit: int | None = None,
          positions: int | Sequence[int] | None = None) -> Intervention:
  """Set `site` to its value in `source` (a `Cache` of another run over prompts of the same lengths, its first row),
  position by position: activation patching."""
  return Intervention(site, _layers(layer), unit, _positions(positions), "patch", source)


def add(site: str, layer: Layers, vector: Any, unit: int | None = None,
        positions: int | Sequence[int] | None = None) -> Intervention:
  """Add `vector` ([Dh] for a head's `q`/`z`, [Dh] for a KV head's `k`/`v`, [D] for a residual-type site, a number
  for a neuron) to `site` (steering)."""
  return Intervention(site, _layers(layer), unit, _positions(positions), "add", vector)


def scale(site: str, layer: Layers, factor: float, unit: int | None = None,
          positions: int | Sequence[int] | None = None) -> Intervention:
  """Multiply `site` by `factor`."""
  return Intervention(site, _layers(layer), unit, _positions(positions), "scale", factor)


def site_shape(config: ModelConfig, site: str) -> tuple[int, int]:
  """(units U, value Dv) of an editable site: how an edit lays out its keep, fill and add."""
  c = config
  units = sites_lib.SITES[site].units
  if units == "heads":
    return c.num_heads, c.head_dim
  if units == "kv_heads":
    return c.num_kv_heads, c.head_dim
  if units == "neurons":
    return c.intermediate_size, 1
  return 1, c.hidden_size


def _check(iv: Intervention, config: ModelConfig) -> None:
  if not isinstance(iv, Intervention):
    raise UserError(f"an intervention row holds jaxloc.interventions (zero, mean, patch, add, scale), not "
                    f"{type(iv).__name__}")
  if iv.site not in sites_lib.EDITABLE:
    raise UserError(f"site {iv.site!r} cannot be edited; editable sites: {', '.join(sites_lib.EDITABLE)}")
  if iv.op not in OPS:
    raise UserError(f"unknown operation {iv.op!r}; valid: {', '.join(OPS)}")
  if iv.layer is not None and not np.atleast_1d(np.asarray(iv.layer, dtype=object)).size:
    raise UserError("layer=[] selects no layer; give layers, or None for every layer")
  for layer in [] if iv.layer is None else np.atleast_1d(np.asarray(iv.layer, dtype=object)).tolist():
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < config.num_layers:
      raise UserError(f"layer {layer!r} is out of range: this model has layers 0-{config.num_layers - 1}")
  units, _ = site_shape(config, iv.site)
  if iv.unit is not None:
    if sites_lib.SITES[iv.site].units is None:
      raise UserError(f"site {iv.site} has one vector per token: give unit=None")
    if isinstance(iv.unit, bool) or not isinstance(iv.unit, (int, np.integer)) or not 0 <= iv.unit < units:
      raise UserError(f"unit {iv.unit!r} is out of range for {iv.site}: 0-{units - 1}")
  if iv.op == "scale" and (isinstance(iv.value, bool) or not isinstance(iv.value, (int, float, np.integer, np.floating))
                           or not np.isfinite(iv.value)):
    raise UserError(f"scale takes a finite factor, not {iv.value!r}")


def _source(cache: Any, site: str, lengths: np.ndarray, op: str) -> np.ndarray:
  """The fill a patch or a mean reads from `cache`: [L, P, S, U, Dv] (patch) or [L, U, Dv] (mean), zeros where a
  prompt has no token."""
  if not isinstance(cache, Cache):
    raise UserError(f"{op} reads a jaxloc Cache (model.run_with_cache(..., names=[{site!r}])), not "
                    f"{type(cache).__name__}")
  values = cache.stacked(site)  # [L, P, S, ...] of the cache's first row, every layer
  if op == "patch":
    if len(cache.lengths) != len(lengths) or np.any(cache.lengths != lengths):
      raise UserError(f"a patch sets each token from the same token of the source: the source's prompts have "
                      f"{cache.lengths.tolist()} tokens, these {lengths.tolist()}")
    if values.shape[2] < int(lengths.max()):
      raise UserError("the source cache is shorter than these prompts")
  values = np.nan_to_num(values.astype(np.float32), nan=0.0)
  units = sites_lib.SITES[site].units
  if units is None:  # one vector per token: [L, P, S, D] -> [L, P, S, 1, D]
    values = values[..., None, :]
  elif units == "neurons":  # [L, P, S, F] -> [L, P, S, F, 1]
    values = values[..., None]
  if op == "mean":
    real = np.arange(values.shape[2])[None, :] < cache.lengths[:, None]  # [P, S]
    return (values * real[None, :, :, None, None]).sum(axis=(1, 2)) / real.sum()
  return values


def compile_rows(rows: Sequence[Row], config: ModelConfig, lengths: np.ndarray, seq: int
                 ) -> tuple[tuple[Edit, ...], list[str]]:
  """The decoder's edits (numpy arrays, rows leading) and a label per row for a batch of intervention rows over
  prompts of `lengths` padded to `seq` tokens.

  Each intervention of a row takes its own edit (the k-th intervention of a row at a site shares one with the k-th
  of other rows of the same operation and source), so that its units and positions never mix with another's, and
  a row's interventions at one site apply in the row's order."""
  if isinstance(rows, Intervention):
    rows = [rows]
  batch: list[list[Intervention]] = [[r] if isinstance(r, Intervention) else list(r) for r in rows]
  if not batch:
    raise UserError("no intervention rows given")
  num_rows, num_layers, prompts = len(batch), config.num_layers, len(lengths)
  slots: dict[tuple, dict[str, Any]] = {}
  labels = []
  for r, row in enumerate(batch):
    if not row:
      raise UserError(f"intervention row {r} is empty; give at least one intervention (or use masks=none)")
    seen: dict[str, int] = {}
    for iv in row:
      _check(iv, config)
      source = id(iv.value) if iv.op in ("patch", "mean") else None
      # The k-th intervention of a row at a site takes an edit of the k-th rank: edits apply rank by rank, so each
      # row's interventions at one site apply in its own order, whatever the other rows hold.
      key = (iv.site, seen.get(iv.site, 0), iv.op, source)
      seen[iv.site] = seen.get(iv.site, 0) + 1
      units, width = site_shape(config, iv.site)
      slot = slots.get(key)
      if slot is None:
        slot = {"keep": np.ones((num_rows, num_layers, units), np.float32),
                "where": np.zeros((num_rows, num_layers, prompts, seq), bool), "add": None, "fill": None}
        if iv.op in ("patch", "mean"):
          fill = _source(iv.value, iv.site, lengths, iv.op)
          if iv.op == "patch":  # the source's tokens laid out as these prompts' (padded to `seq`)
            fill = np.pad(fill[:, :, :seq], [(0, 0), (0, 0), (0, seq - min(seq, fill.shape[2])), (0, 0), (0, 0)])
          slot["fill"] = fill
        slots[key] = slot
      layers = list(range(num_layers)) if iv.layer is None else [int(x) for x in np.atleast_1d(iv.layer)]
      chosen = slice(None) if iv.unit is None else [int(iv.unit)]
      where = _where(iv.positions, lengths, seq, r)
      for layer in layers:
        slot["where"][r, layer] |= where
        if iv.op == "add":
          if slot["add"] is None:
            slot["add"] = np.zeros((num_rows, num_layers, 1, 1, units, width), np.float32)
          try:
            vector = np.asarray(iv.value, np.float32).reshape(-1)
          except (TypeError, ValueError):
            raise UserError(f"add at {iv.site} takes a vector of numbers, not {type(iv.value).__name__}") from None
          if vector.size != width or not np.all(np.isfinite(vector)):
            raise UserError(f"add at {iv.site} takes a finite vector of {width} values, got {vector.size}"
                            + ("" if np.all(np.isfinite(vector)) else " with non-finite entries"))
          slot["add"][r, layer, 0, 0, chosen] += vector
        else:
          slot["keep"][r, layer, chosen] = float(iv.value) if iv.op == "scale" else 0.0
    labels.append(" + ".join(iv.label() for iv in row))
  edits = []
  for (site, _, op, _), slot in sorted(slots.items(), key=lambda item: item[0][1]):  # rank by rank, stable
    keep = None if op == "add" else slot["keep"]
    edits.append(Edit(site, keep, slot["where"], slot["fill"], slot["add"]))
  return tuple(edits), labels


def _where(positions: tuple[int, ...] | None, lengths: np.ndarray, seq: int, row: int) -> np.ndarray:
  """bool [P, S]: the real tokens `positions` selects in each prompt (negative from its end)."""
  real = np.arange(seq)[None, :] < lengths[:, None]
  if positions is None:
    return real
  where = np.zeros((len(lengths), seq), bool)
  for p, length in enumerate(lengths):
    for position in positions:
      index = position + length if position < 0 else position
      if not 0 <= index < length:
        raise UserError(f"intervention row {row}: position {position} is outside prompt {p}, which has {length} "
                        f"tokens (positions 0-{length - 1}, or -{length} to -1 from its end)")
      where[p, index] = True
  return where
