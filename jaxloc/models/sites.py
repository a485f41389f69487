"""The named activations of the decoder (sites), and edits of them: what a forward pass can return, and change.

A site is one activation of every layer (or of the model once), named in TransformerLens' vocabulary so that a
researcher's names carry over one to one. Axes are those of the API's results (`prompts` P, `tokens` S, `heads` H,
`kv_heads` K, `head_dim` Dh, `embed` D, `mlp` F, `vocab` V), per layer; a cache stacks layers in front ([L, ...]).

| site | axes (per layer) | TransformerLens | what it is |
|---|---|---|---|
| embed | [P, S, D] | hook_embed | token embeddings (scaled, for families that scale them); the model's, not per layer |
| resid_pre | [P, S, D] | blocks.{l}.hook_resid_pre | the residual stream entering layer l |
| q | [P, S, H, Dh] | blocks.{l}.attn.hook_q | query projection (+ bias), before q-norm and rotary |
| k, v | [P, S, K, Dh] | blocks.{l}.attn.hook_k / hook_v | key / value projections of the KV heads (not repeated) |
| scores | [P, H, S, S] | blocks.{l}.attn.hook_attn_scores | scaled (soft-capped) scores, query x key, -inf where unseen |
| pattern | [P, H, S, S] | blocks.{l}.attn.hook_pattern | attention probabilities, query x key |
| z | [P, S, H, Dh] | blocks.{l}.attn.hook_z | each head's output, the `o_proj` input (after head masks) |
| head_out | [P, S, H, D] | blocks.{l}.attn.hook_result | each head's output through `o_proj` (no bias) |
| attn_out | [P, S, D] | blocks.{l}.hook_attn_out | what attention adds to the residual (after a post-norm) |
| resid_mid | [P, S, D] | blocks.{l}.hook_resid_mid | the residual stream between attention and MLP |
| mlp_pre | [P, S, F] | blocks.{l}.mlp.hook_pre | the gate projection, before its activation |
| mlp_post | [P, S, F] | blocks.{l}.mlp.hook_post | the neurons: act(gate) * up, the `down_proj` input (after neuron masks) |
| mlp_out | [P, S, D] | blocks.{l}.hook_mlp_out | what the MLP adds to the residual (after a post-norm) |
| resid_post | [P, S, D] | blocks.{l}.hook_resid_post | the residual stream leaving layer l |
| final | [P, S, D] | ln_final.hook_out | the last residual stream after the final norm (the unembedding's input) |
| logits | [P, S, V] | (the model's output) | logits |

(TransformerLens 4's `TransformerBridge` names `final` `ln_final.hook_out`; its `ln_final.hook_normalized` is
x / rms(x) before the norm's weight.) Every per-layer site but `scores`, `pattern` and `head_out` can be edited (`Edit`): a batch of edits is a leading
`masks` axis like head masks, so hundreds run in one compiled call.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class Site:
  """One named activation: `axes` per layer as the API returns it, `units` the axis an edit selects ("heads",
  "kv_heads", "neurons", or None for one vector per position), `hook` its TransformerLens name ({l} the layer)."""

  name: str
  axes: str
  units: str | None
  hook: str
  per_layer: bool = True
  editable: bool = True


SITES: dict[str, Site] = {s.name: s for s in (
    Site("embed", "P S D", None, "hook_embed", per_layer=False, editable=False),
    Site("resid_pre", "P S D", None, "blocks.{l}.hook_resid_pre"),
    Site("q", "P S H Dh", "heads", "blocks.{l}.attn.hook_q"),
    Site("k", "P S K Dh", "kv_heads", "blocks.{l}.attn.hook_k"),
    Site("v", "P S K Dh", "kv_heads", "blocks.{l}.attn.hook_v"),
    Site("scores", "P H S S", "heads", "blocks.{l}.attn.hook_attn_scores", editable=False),
    Site("pattern", "P H S S", "heads", "blocks.{l}.attn.hook_pattern", editable=False),
    Site("z", "P S H Dh", "heads", "blocks.{l}.attn.hook_z"),
    Site("head_out", "P S H D", "heads", "blocks.{l}.attn.hook_result", editable=False),
    Site("attn_out", "P S D", None, "blocks.{l}.hook_attn_out"),
    Site("resid_mid", "P S D", None, "blocks.{l}.hook_resid_mid"),
    Site("mlp_pre", "P S F", "neurons", "blocks.{l}.mlp.hook_pre"),
    Site("mlp_post", "P S F", "neurons", "blocks.{l}.mlp.hook_post"),
    Site("mlp_out", "P S D", None, "blocks.{l}.hook_mlp_out"),
    Site("resid_post", "P S D", None, "blocks.{l}.hook_resid_post"),
    Site("final", "P S D", None, "ln_final.hook_out", per_layer=False, editable=False),
    Site("logits", "P S V", None, "logits", per_layer=False, editable=False),
)}
LAYER_SITES = tuple(name for name, s in SITES.items() if s.per_layer)
EDITABLE = tuple(name for name, s in SITES.items() if s.editable)
# Sites the decoder's layers record; `final` and `logits` come from the model's end, `embed` from its start.
_HOOK = {re.compile("^" + re.escape(s.hook).replace(r"\{l\}", r"(\d+)") + "$"): s.name for s in SITES.values()}

Filter = str | Iterable[str] | Callable[[str], bool] | None


def resolve_names(names: Filter, num_layers: int) -> dict[str, tuple[int, ...] | None]:
  """The sites (and layers) a names filter asks for: {site: layers, or None for every layer}.

  names: a site name ("z"), a TransformerLens hook name ("blocks.8.attn.hook_z": that layer only), a glob pattern
  over either ("resid_*", "blocks.*.attn.hook_pattern"), a list of those, or a callable taking a site name; None asks
  for every site. Raises ValueError naming what matched nothing (the API turns it into a UserError)."""
  if names is None:
    return {name: None for name in SITES}
  if callable(names):
    chosen_by = {name: None for name in SITES if names(name)}
    if not chosen_by:
      raise ValueError(f"the names filter {names!r} matches no site: sites are {', '.join(SITES)}")
    return chosen_by
  patterns = [names] if isinstance(names, str) else list(names)
  if not patterns:
    raise ValueError("an empty names filter asks for nothing; give site names such as 'z' or 'resid_pre'")
  chosen: dict[str, set[int] | None] = {}
  for pattern in patterns:
    if not isinstance(pattern, str):
      raise ValueError(f"a names filter holds site names (str), not {type(pattern).__name__}")
    found = False
    for name in SITES:
      if fnmatch.fnmatchcase(name, pattern):
        chosen[name] = None
        found = True
    for layer in range(num_layers):
      for name, site in SITES.items():
        hook = site.hook.replace("{l}", str(layer))
        if fnmatch.fnmatchcase(hook, pattern):
          if site.per_layer and chosen.get(name, set()) is not None:
            chosen.setdefault(name, set()).add(layer)  # type: ignore[union-attr]
          elif not site.per_layer:
            chosen[name] = None
          found = True
    if not found:
      raise ValueError(f"no site matches {pattern!r}: sites are {', '.join(SITES)} (or their TransformerLens names, "
                       f"e.g. blocks.0.attn.hook_z; layers 0-{num_layers - 1})")
  return {name: None if layers is None else tuple(sorted(layers)) for name, layers in chosen.items()}


@dataclasses.dataclass
class Edit:
  """An edit of one site, per row of a batch (the `masks` axis M): at the positions `where` selects, the site's value
  a becomes a * keep + (1 - keep) * fill + add, per unit.

  site: static, a name of `EDITABLE`. keep: float [M, L, U] (1 leaves a unit alone, 0 replaces it by the fill, c
    scales it; U is 1 for one vector per position); None: 1. where: bool [M|1, L, P|1, S], where the edit applies
    (None: everywhere). fill: [L, U, Dv] or [L, P, S, U, Dv] (None: zero). add: [M|1, L, P|1, S|1, U, Dv] added
    (None: nothing). Dv is the value axis (Dh, D, or 1 for neurons). Layers lead after the rows so that a forward
    pass scans them (`decoder.LayerInputs`).
  layer: static; set, the edit touches that layer only and its arrays have no layer axis (keep [M, U], where
    [M|1, P|1, S], fill [U, Dv] or [P, S, U, Dv], add [M|1, P|1, S|1, U, Dv]): a value per row at one layer, e.g.
    the second step of path patching, without a copy per layer."""

  site: str
  keep: Any = None  # jax or numpy arrays (the API builds them on the host), as the docstring lays them out
  where: Any = None
  fill: Any = None
  add: Any = None
  layer: int | None = None

  @property
  def num_rows(self) -> int:
    for a in (self.keep, self.where, self.add):
      if a is not None and a.shape[0] > 1:
        return int(a.shape[0])
    return 1

  def per_layer(self) -> "Edit":
    """The same edit with layers leading (every array but `fill` has its rows and layers swapped); an edit of one
    layer stays as it is (every layer reads it whole and applies it only at its layer, `Taps`)."""
    if self.layer is not None:
      return self
    swap = lambda a: None if a is None else jnp.swapaxes(a, 0, 1)  # noqa: E731
    return Edit(self.site, swap(self.keep), swap(self.where), self.fill, swap(self.add))


jax.tree_util.register_dataclass(Edit, data_fields=["keep", "where", "fill", "add"], meta_fields=["site", "layer"])


def apply_edit(value: Array, unit_ndim: int, keep: Array | None = None, fill: Array | None = None,
               where: Array | None = None, add: Array | None = None) -> Array:
  """value [M, R, S, *units, *v] (`unit_ndim` unit axes, then the value axes) with one layer's edit applied:
  a * keep + (1 - keep) * fill (+ add), at `where`.

  keep [M, U] (U the product of the unit axes, or the unit axes themselves); fill [U, Dv] or [R, S, U, Dv]; where bool [M|1, R|1, S];
  add [M|1, R|1, S|1, U, Dv]. The head and neuron masks of localization are this edit with no `where` or `add`, so
  their arithmetic stays what it was (multiply, then add the fill)."""
  units = value.shape[3:3 + unit_ndim]
  rest = value.shape[3 + unit_ndim:]
  dtype = value.dtype
  edited = value
  if keep is not None:
    kept = keep.astype(dtype).reshape(keep.shape[:1] + (1, 1) + units + (1,) * len(rest))
    edited = edited * kept
    if fill is not None:
      fill = fill.astype(dtype)  # per unit, or per request and position too
      per_unit = math.prod(units + rest)
      fill = fill.reshape(units + rest) if fill.size == per_unit else fill.reshape((1,) + fill.shape[:2] + units + rest)
      edited = edited + (1 - kept) * fill
  if add is not None:
    edited = edited + add.astype(dtype).reshape(add.shape[:3] + units + rest)
  if where is not None:
    where = where if where.ndim == 0 else where.reshape(where.shape + (1,) * (value.ndim - 3))
    edited = jnp.where(where, edited, value)
  return edited


class Taps:
  """One layer's edits and records while it runs: `tap(site, value)` applies the edits of that site in order and keeps
  the value when the call asked for the site. A Python object of the trace, made afresh in every layer's call."""

  UNIT_NDIM = {"resid_pre": 0, "resid_mid": 0, "resid_post": 0, "attn_out": 0, "mlp_out": 0, "q": 2, "z": 2,
               "k": 1, "v": 1, "mlp_pre": 1, "mlp_post": 1}

  def __init__(self, edits: tuple[Edit, ...] = (), record: Iterable[str] = (), index: Array | None = None):
    self.edits = edits  # this layer's slices; an edit of one layer (`Edit.layer`) whole
    self.record = frozenset(record)
    self.index = index  # the layer's number (int32 scalar), for edits of one layer
    self.values: dict[str, Array] = {}

  def __call__(self, site: str, value: Array) -> Array:
    for edit in self.edits:
      if edit.site != site:
        continue
      where = edit.where
      if edit.layer is not None:
        here = self.index == edit.layer
        where = here if where is None else where & here
      value = apply_edit(value, self.UNIT_NDIM[site], edit.keep, edit.fill, where, edit.add)
    if site in self.record:
      self.values[site] = value
    return value

  def wants(self, site: str) -> bool:
    return site in self.record
