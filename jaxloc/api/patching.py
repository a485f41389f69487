"""Patching experiments over many cells in few compiled calls (`Model.patch_by_position`, `Model.path_patch`,
`Model.attribution_patch`): each cell is an intervention row (`jaxloc.interventions`), and rows that touch nothing
below a layer start there from the corrupted run's residual stream, computed once (`Forward.run`'s `resume`).

Conventions follow TransformerLens' `patching` utilities: clean activations are patched into the corrupted run, and
a metric of the patched logits says how much of the clean behaviour each patch restores (`Patching.recovered`).
Axes: `layers` L, `tokens` S, `units` U (heads, or 1 for a residual-type site), `prompts` P, `columns` T.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from jaxloc.api import interventions as iv
from jaxloc.api.forward import Readout, tokenize
from jaxloc.errors import UserError
from jaxloc.models import sites as sites_lib
from jaxloc.models.sites import Edit
from jaxloc.units import parse_units

Model = Any  # jaxloc.api.model.Model, which imports this module


@dataclasses.dataclass
class Patching:
  """A patching sweep: logits at each prompt's last token under each patch.

  logits: [N, P, V] (or [N, P, T] for `columns`); clean, corrupted: [P, V] (or [P, T]) unpatched; labels: [N];
  columns: the token id of each column (None: the whole vocabulary); grid: the sweep's axes, e.g. {"layer": [...],
  "position": [...], "head": [...]}, whose sizes multiply to N in that order (empty for a list of unit sets).
  """

  logits: np.ndarray
  clean: np.ndarray
  corrupted: np.ndarray
  labels: list[str]
  columns: list[int] | None = None
  grid: dict[str, list[int]] = dataclasses.field(default_factory=dict)

  def recovered(self, metric: Any, clean: Any, corrupted: Any) -> np.ndarray:
    """(metric - corrupted) / (clean - corrupted): 1 where patching restores the clean value, 0 where it changes
    nothing (any metric computed alike on `logits`, `clean` and `corrupted`)."""
    return (metric - corrupted) / np.where(clean == corrupted, np.nan, clean - corrupted)

  def metric(self, metric: Callable[..., Any]) -> tuple[np.ndarray, float, float]:
    """(metric of every patch laid out as `grid` [..grid sizes..], of the clean run, of the corrupted run) for a
    metric of logits [..., P, V] such as `LogitDiff` (given the columns when the sweep kept only some)."""
    values = np.asarray(metric(self.logits, self.columns))
    shape = tuple(len(v) for v in self.grid.values()) or values.shape
    return (values.reshape(shape), float(metric(self.clean[None], self.columns)[0]),
            float(metric(self.corrupted[None], self.columns)[0]))

  def recovered_fraction(self, metric: Callable[..., Any]) -> np.ndarray:
    """`recovered` of `metric` for every patch, laid out as `grid`."""
    values, clean, corrupted = self.metric(metric)
    return self.recovered(values, np.float32(clean), np.float32(corrupted))


def paired(model: Model, clean: Any, corrupted: Any) -> tuple[Any, Any]:
  """The clean and corrupted batches, checked to pair up token for token."""
  clean_batch, clean_ids = tokenize(model.loaded, clean)
  corrupted_batch, corrupted_ids = tokenize(model.loaded, corrupted)
  if len(clean_ids) != len(corrupted_ids):
    raise UserError(f"{len(clean_ids)} clean prompts but {len(corrupted_ids)} corrupted ones; pair them up")
  unequal = [i for i, (a, b) in enumerate(zip(clean_ids, corrupted_ids)) if len(a) != len(b)]
  if unequal:
    i = unequal[0]
    raise UserError(f"clean and corrupted prompts must have the same number of tokens to patch position by "
                    f"position: pair {i} has {len(clean_ids[i])} and {len(corrupted_ids[i])} (pairs {unequal})")
  return clean_batch, corrupted_batch


def _unpatched(model: Model, clean: Any, corrupted: Any, columns: Sequence[int] | None
               ) -> tuple[np.ndarray, np.ndarray]:
  """The clean and the corrupted run's last-token logits [P, V] (or [P, T])."""
  return model.logits(clean, last=True, columns=columns)[0], model.logits(corrupted, last=True, columns=columns)[0]


def by_position(model: Model, clean: Any, corrupted: Any, site: str = "z", *, layers: Sequence[int] | None = None,
                positions: Sequence[int] | None = None, each_unit: bool = True,
                columns: Sequence[int] | None = None, skip_unchanged: bool = True) -> Patching:
  """Every (layer, position[, unit]) cell of `site` patched alone from the clean run into the corrupted one; cells
  whose clean value is the corrupted one patch nothing and are not run."""
  if site not in sites_lib.EDITABLE:
    raise UserError(f"site {site!r} cannot be patched; editable sites: {', '.join(sites_lib.EDITABLE)}")
  clean_batch, _ = paired(model, clean, corrupted)
  c = model.config
  width = clean_batch.width
  bad_layers = [x for x in (layers or []) if isinstance(x, bool) or not isinstance(x, (int, np.integer))
                or not 0 <= x < c.num_layers]
  if bad_layers:
    raise UserError(f"layers {bad_layers} are out of range: this model has layers 0-{c.num_layers - 1}")
  bad_positions = [p for p in (positions or []) if isinstance(p, bool) or not isinstance(p, (int, np.integer))
                   or not -width <= p < width]
  if bad_positions:
    raise UserError(f"positions {bad_positions} are outside these prompts of {width} tokens (0-{width - 1}, or "
                    f"-{width} to -1 from the end)")
  if len(set(clean_batch.lengths.tolist())) != 1:
    raise UserError(f"patching by position needs prompts of one length (a position is the same token in every "
                    f"prompt); these have {sorted(set(clean_batch.lengths.tolist()))} tokens")
  layers = list(range(c.num_layers)) if layers is None else [int(x) for x in layers]
  positions = list(range(width)) if positions is None else [p + width if p < 0 else int(p) for p in positions]
  has_units = sites_lib.SITES[site].units is not None and each_unit
  units: list[int | None] = list(range(iv.site_shape(c, site)[0])) if has_units else [None]
  source = model.run_with_cache(clean, names=[site])
  clean_logits, corrupted_logits = _unpatched(model, clean, corrupted, columns)
  # A cell whose clean value equals its corrupted value bit for bit (a token before the first that differs) patches
  # nothing: its logits are the corrupted run's, and it is not run.
  same = np.isclose(source.stacked(site), model.run_with_cache(corrupted, names=[site]).stacked(site), rtol=0, atol=0,
                    equal_nan=True)  # [L, P, S, ...]
  rows = [iv.patch(site, layer, source, unit=u, positions=[p]) for layer in layers for p in positions for u in units]
  changes = [not (skip_unchanged and same[layer, :, p, ...][(Ellipsis,) if u is None else (slice(None), u)].all())
             for layer in layers for p in positions for u in units]
  logits = np.broadcast_to(corrupted_logits, (len(rows),) + corrupted_logits.shape).copy()
  run = [r for r, change in zip(rows, changes) if change]
  if run:
    logits[np.flatnonzero(changes)] = model.logits(corrupted, interventions=run, last=True, columns=columns)
  grid = {"layer": layers, "position": positions}
  if has_units:
    grid[str(sites_lib.SITES[site].units).rstrip("s")] = [int(u) for u in units if u is not None]
  labels = [r.label() for r in rows]
  return Patching(logits, clean_logits, corrupted_logits, labels, None if columns is None else list(columns), grid)


def path(model: Model, clean: Any, corrupted: Any, senders: Any, receivers: Any = None, receiver_site: str = "q",
         columns: Sequence[int] | None = None) -> Patching:
  """Path patching, sender -> receiver: each sender head's clean output reaches the receivers through the residual
  stream only.

  For each sender (one row): the corrupted run with the sender's `z` from the clean run at every position, and
  every later component frozen at its corrupted value (the `z` of every head in later layers, the MLP outputs of
  the sender's layer and later); the receivers' `receiver_site` ("q", "k" or "v" of each receiver head) is read
  there. Then the corrupted run again with only the receivers' site set to what was read, everything else
  recomputed: the logits say what the path sender -> receivers does. With no receivers, the first run's logits are
  the sender's direct effect on the logits."""
  paired(model, clean, corrupted)
  c = model.config
  sender_units = parse_units(senders, c.num_layers, c.num_heads)
  if not sender_units:
    raise UserError("no sender heads named: give names like L8H1")
  caches = {name: model.run_with_cache(p, names=["z", "mlp_out", receiver_site])
            for name, p in (("clean", clean), ("corrupted", corrupted))}
  rows = []
  for layer, head in sender_units:
    row = [iv.patch("z", layer, caches["clean"], unit=head), iv.patch("mlp_out", list(range(layer, c.num_layers)),
                                                                     caches["corrupted"])]
    if layer + 1 < c.num_layers:
      row.append(iv.patch("z", list(range(layer + 1, c.num_layers)), caches["corrupted"]))
    rows.append(row)
  labels = [f"L{layer}H{head}" for layer, head in sender_units]
  clean_logits, corrupted_logits = _unpatched(model, clean, corrupted, columns)
  if receivers is None:
    logits = model.logits(corrupted, interventions=rows, last=True, columns=columns)
    return Patching(logits, clean_logits, corrupted_logits, labels, None if columns is None else list(columns),
                    {"sender": list(range(len(labels)))})
  if receiver_site not in ("q", "k", "v"):
    raise UserError(f"receiver_site is q, k or v (the receiver heads' input), not {receiver_site!r}")
  receiver_units = parse_units(receivers, c.num_layers, c.num_heads)
  early = [(s, r) for s in sender_units for r in receiver_units if s[0] >= r[0]]
  if early:
    raise UserError(f"a sender must sit below its receivers: L{early[0][0][0]}H{early[0][0][1]} is not below "
                    f"L{early[0][1][0]}H{early[0][1][1]}")
  read = model.run_with_cache(corrupted, names=[receiver_site], interventions=rows)
  group = c.queries_per_kv
  batch, _ = tokenize(model.loaded, corrupted)
  edits = []
  for layer in sorted({r[0] for r in receiver_units}):
    heads = [h for lr, h in receiver_units if lr == layer]
    units = heads if receiver_site == "q" else sorted({h // group for h in heads})
    value = np.nan_to_num(read[receiver_site, layer])  # [N, P, S, U, Dh]: what each sender's row read
    pad = [(0, 0)] * value.ndim
    pad[2] = (0, batch.ids.shape[1] - value.shape[2])
    chosen = np.zeros(value.shape[3], bool)
    chosen[units] = True
    # Set, not added: a receiver in a higher layer takes what was read whatever the lower receivers changed.
    add = np.pad(value.astype(np.float32), pad) * chosen[:, None]  # padded to the call's tokens
    edits.append(Edit(receiver_site, keep=(~chosen).astype(np.float32)[None], add=add, layer=layer))
  unablated = model.masks()
  out = model._forward.run(batch, unablated[np.zeros(len(rows), int)], Readout(last=True, columns=columns is not None),
                           columns=columns, edits=tuple(edits), resume=True)
  return Patching(out["logits"], clean_logits, corrupted_logits, labels, None if columns is None else list(columns),
                  {"sender": list(range(len(labels)))})


def attribution(model: Model, clean: Any, corrupted: Any, metric: Callable[[Any], Any], site: str = "z"
                ) -> tuple[np.ndarray, dict[str, list[int]]]:
  """Attribution patching (AtP): the linear estimate of patching each (layer, position, unit) of `site` from the
  clean run into the corrupted one, (clean - corrupted) . d metric / d site at the corrupted run, from one forward
  and one backward pass, summed over prompts (a cell patches that position of every prompt).

  Returns:
    (estimate [L, S, U] (or [L, S] for a residual-type site) of the change in `metric`, its grid)."""
  clean_batch, _ = paired(model, clean, corrupted)
  caches = [model.run_with_cache(p, names=[site]).stacked(site) for p in (clean, corrupted)]
  _, grads = model.gradients(corrupted, metric, sites=[site])
  difference = np.nan_to_num(caches[0] - caches[1])  # [L, P, S, ...]
  grad = grads[site]
  units = sites_lib.SITES[site].units
  estimate = difference * grad
  estimate = estimate.sum(axis=-1) if units != "neurons" else estimate  # over the value axis
  estimate = estimate.sum(axis=1)  # over prompts
  grid = {"layer": list(range(model.config.num_layers)), "position": list(range(clean_batch.width))}
  if units is not None:
    grid[units.rstrip("s")] = list(range(estimate.shape[-1]))
  return estimate, grid
