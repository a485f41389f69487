"""The prompt-level forward pass behind `jaxloc.Model`: prompts × masks in compiled calls, read out as logits, top-k
log-probabilities or the run's activations.

Axes: `masks` M (Mc per call), `prompts` P, `tokens` S (the longest prompt, right-padded; padding is never seen by a
real token), `layers` L, `heads` H, `head_dim` Dh, `embed` D, `mlp` F, `vocab` V, `top` K, `columns` T.

Every call is the decoder under `Ablation` data: a mask set is head and/or neuron keep-masks, and a fill is what an
ablated unit outputs instead, per unit ([L, H, Dh], mean ablation) or per prompt position ([L, P, S, H, Dh]: another
run's outputs, activation patching). Masks go through in chunks of one compiled shape (the last padded with
unablated masks); a chunk's size comes from a memory budget.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc import checks
from jaxloc.errors import UserError
from jaxloc.masks import MaskSet
from jaxloc.models import sites as sites_lib
from jaxloc.models.decoder import Ablation, ModelOutput, OutputSpec, Resume, lm_logits
from jaxloc.models.layers import Context
from jaxloc.models.sites import Edit
from jaxloc.models.loading import LoadedModel

Prompts = str | Sequence[str] | Sequence[Sequence[int]]

# Bytes of activations one call may hold (logits and captured activations included): chunks of masks stay under it.
CALL_BUDGET = 2 << 30
# Prompt lengths round up to a multiple of this, so that prompts of similar lengths share one compiled shape.
TOKEN_BUCKET = 8
# Rows of a call resumed at a layer round up to a multiple of this, and a resumed call over one prompt computes a
# multiple of RESUME_BUCKET tokens (`Forward.run`): few compiled shapes for a sweep.
ROW_BUCKET = 8
RESUME_BUCKET = 4
# Rows a call of a resumed run holds at least, gathered over consecutive first layers (`bands`).
BAND_ROWS = 64


@dataclasses.dataclass
class Batch:
  """Prompts as tokens: ids int [P, S] right-padded (S a multiple of TOKEN_BUCKET), lengths int [P]."""

  ids: np.ndarray
  lengths: np.ndarray

  @property
  def last(self) -> np.ndarray:
    """int [P], each prompt's last token."""
    return self.lengths - 1

  @property
  def width(self) -> int:
    """The longest prompt's token count: results are cut to it (`ids` run on to a multiple of TOKEN_BUCKET)."""
    return int(self.lengths.max())


def tokenize(model: LoadedModel, prompts: Prompts, add_special_tokens: bool = True) -> tuple[Batch, list[list[int]]]:
  """The batch of `prompts` (strings, or token ids already) and each prompt's own ids.

  Checked here, the one way in for logits, run_with_cache and patch (`jaxloc.checks`): at least one prompt;
  strings valid Unicode; every id an integer inside the vocabulary (negative ids, bools, floats and ids past
  vocab_size refused, naming the prompt and position); a prompt longer than max_position_embeddings warns."""

  try:
    items: list[Any] = [prompts] if isinstance(prompts, str) else list(prompts)
  except TypeError:
    raise UserError(f"prompts must be a string, a list of strings or a list of token-id lists, not "
                    f"{type(prompts).__name__}") from None
  checks.require_prompts(items)
  if all(isinstance(p, str) for p in items):
    if model.tokenizer is None:
      raise UserError("this model has no tokenizer: pass prompts as token ids, or a tokenizer to jaxloc.from_hf")
    checks.check_texts(items)
    ids = model.tokenizer(items, add_special_tokens=add_special_tokens)["input_ids"]
  elif all(not isinstance(p, str) for p in items):
    ids = items
  else:
    raise UserError("prompts must be all strings or all token-id lists")
  ids = checks.token_ids(ids, model.config.vocab_size)
  empty = [i for i, p in enumerate(ids) if not p]
  if empty:
    raise UserError(f"prompts {empty} have no tokens")
  checks.warn_past_positions([len(p) for p in ids], model.config.max_position_embeddings, stacklevel=3)
  lengths = np.array([len(p) for p in ids], np.int32)
  width = -(-int(lengths.max()) // TOKEN_BUCKET) * TOKEN_BUCKET
  padded = np.zeros((len(ids), width), np.int32)
  for row, p in enumerate(ids):
    padded[row, :len(p)] = p
  return Batch(padded, lengths), ids


@dataclasses.dataclass(frozen=True)
class Readout:
  """What a call returns (static: each combination compiles once).

  last: logits at each prompt's last token only ([M, P, ...]) instead of every position ([M, P, S, ...]).
  top_k: the top-k tokens and their log-probabilities instead of logits (None: logits).
  columns: logits of these vocabulary columns only (None: all).
  sites: the named activations to return too (`sites.SITES` but `logits`, which the readout gives), a sorted tuple.
  residuals: the residual stream entering every layer (to resume later calls there, `Forward.run`'s `resume`).
  kv: every layer's keys and values (the earlier tokens' context of a resumed call).
  """

  last: bool = False
  top_k: int | None = None
  columns: bool = False
  sites: tuple[str, ...] = ()
  residuals: bool = False
  kv: bool = False


# Per-layer sites whose heads the decoder holds split (K, G): [.., K, G, x] -> [.., H, x].
_SPLIT_HEADS = ("q", "z", "head_out")
_SPLIT_PATTERN = ("scores", "pattern")  # [.., K, G, S, S] -> [.., H, S, S]


def _run(module: Any, config: Any, params: Any, ids: jax.Array, last: jax.Array, ablation: Ablation,
         columns: jax.Array | None, start: Resume | None, context: Context | None, *, readout: Readout,
         dtype: Any) -> dict[str, jax.Array]:
  """One compiled call: ids int [P, S], last int [P], ablation fields with a leading Mc (masks) axis; `start`
  resumes at a layer from a residual stream (`decoder.Resume`); `context` holds the keys and values [L, 1, C, ...] of
  C earlier tokens (the tokens of `ids` are then at positions C...), shared by every row."""
  masks = ablation.num_masks
  tokens = jnp.broadcast_to(ids[None], (masks,) + ids.shape)
  earlier = 0 if context is None else context.k.shape[2]
  positions = earlier + jnp.arange(ids.shape[1])[None, None]
  if context is not None:
    context = Context(jnp.broadcast_to(context.k, context.k.shape[:1] + (masks,) + context.k.shape[2:]),
                      jnp.broadcast_to(context.v, context.v.shape[:1] + (masks,) + context.v.shape[2:]),
                      jnp.broadcast_to(context.valid, (masks,) + context.valid.shape[1:]), context.positions)
  layer_sites = tuple(s for s in readout.sites if s != "final")
  spec = OutputSpec(kv=readout.kv, residuals=readout.residuals, sites=layer_sites)
  out: ModelOutput = module.apply({"params": params}, tokens, positions, ablation=ablation, outputs=spec, dtype=dtype,
                                  start=start, context=context)
  hidden = out.hidden
  result: dict[str, jax.Array] = {}
  if "final" in readout.sites:
    result["final"] = hidden
  if readout.last:
    hidden = jnp.take_along_axis(hidden, last[None, :, None, None], axis=2)[:, :, 0]  # [Mc, P, D]
  logits = lm_logits(config, params, hidden)
  if readout.top_k is not None:
    logprobs, tokens_ = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), readout.top_k)
    result["top_logprobs"], result["top_tokens"] = logprobs, tokens_
  elif columns is not None:
    result["logits"] = jnp.take(logits, columns, axis=-1)
  else:
    result["logits"] = logits
  if readout.residuals:
    assert out.residual is not None  # OutputSpec(residuals=True) asked for it
    result["residual"] = jnp.swapaxes(out.residual, 0, 1)  # [Mc, L, P, S, D]
  if readout.kv:
    assert out.k is not None and out.v is not None  # OutputSpec(kv=True) asked for them
    result["k"], result["v"] = jnp.swapaxes(out.k, 0, 1), jnp.swapaxes(out.v, 0, 1)  # [Mc, L, P, S, K, Dh]
  c = config
  for name, value in (out.sites or {}).items():
    if name == "embed":
      result[name] = value
      continue
    value = jnp.swapaxes(value, 0, 1)  # layers after masks: [Mc, L, P, ...]
    if name in _SPLIT_HEADS:
      value = value.reshape(value.shape[:4] + (c.num_heads, value.shape[-1]))
    elif name in _SPLIT_PATTERN:
      value = value.reshape(value.shape[:3] + (c.num_heads,) + value.shape[-2:])
    result[name] = value
  return result


def site_bytes(config: Any, site: str, prompts: int, seq: int) -> int:
  """Bytes one mask's value of `site` takes for `prompts` x `seq` tokens (float32), every layer."""
  c = config
  per_token = {"embed": c.hidden_size, "final": c.hidden_size, "logits": c.vocab_size,
               "q": c.num_heads * c.head_dim, "z": c.num_heads * c.head_dim, "k": c.num_kv_heads * c.head_dim,
               "v": c.num_kv_heads * c.head_dim, "scores": c.num_heads * seq, "pattern": c.num_heads * seq,
               "head_out": c.num_heads * c.hidden_size, "mlp_pre": c.intermediate_size,
               "mlp_post": c.intermediate_size}.get(site, c.hidden_size)
  layers = c.num_layers if sites_lib.SITES[site].per_layer else 1
  return layers * prompts * seq * per_token * 4


def call_size(model: LoadedModel, batch: Batch, readout: Readout, num_masks: int) -> int:
  """Masks per compiled call: as many as CALL_BUDGET holds (at least one, at most `num_masks`)."""
  c = model.config
  prompts, seq = batch.ids.shape
  itemsize = 4
  per_position = 4 * c.hidden_size + 3 * c.intermediate_size + 2 * c.num_heads * (c.head_dim + seq)
  per_mask = prompts * seq * per_position * itemsize
  per_mask += prompts * (1 if readout.last else seq) * c.vocab_size * itemsize * 2
  per_mask += sum(site_bytes(c, site, prompts, seq) for site in readout.sites)
  if readout.residuals:
    per_mask += site_bytes(c, "resid_pre", prompts, seq)
  return int(max(1, min(num_masks, CALL_BUDGET // per_mask)))


def _rows(array: np.ndarray | None, rows: np.ndarray, pad: int, value: float) -> np.ndarray | None:
  """`array`'s rows [rows] (a leading axis of 1 broadcasts and is kept), padded with `pad` rows of `value`."""
  if array is None or array.shape[0] == 1:
    return array
  taken = array[rows]
  if pad:
    taken = np.concatenate([taken, np.full((pad,) + taken.shape[1:], value, taken.dtype)])
  return taken


def first_touched(masks: MaskSet, edits: Sequence[Edit], num_layers: int, seq: int) -> tuple[np.ndarray, np.ndarray]:
  """int [M] twice: each row's lowest layer that a mask ablates or an edit changes (num_layers where none does), and
  its first token an edit changes at any layer (0 where a mask ablates anything; seq where nothing changes). The
  layers below the one, and the tokens before the other, compute what the unablated model computes."""
  layers = np.zeros((len(masks), num_layers), bool)
  tokens = np.full(len(masks), seq)
  for m in (masks.heads, masks.neurons):
    if m is not None:
      ablates = (np.asarray(m) != 1).any(axis=2)
      layers |= ablates
      tokens[ablates.any(axis=1)] = 0
  for edit in edits:
    # where the edit changes anything: [rows, layers] (or [rows] for an edit of one layer), and at which tokens
    axes = 1 if edit.layer is not None else 2
    changes = np.zeros((edit.num_rows,) + (() if axes == 1 else (num_layers,)), bool)
    if edit.keep is not None:
      changes |= (np.asarray(edit.keep) != 1).reshape(edit.keep.shape[:axes] + (-1,)).any(axis=-1)
    if edit.add is not None:
      changes |= (np.asarray(edit.add) != 0).reshape(edit.add.shape[:axes] + (-1,)).any(axis=-1)
    where = np.ones(changes.shape + (seq,), bool) if edit.where is None else \
        np.asarray(edit.where).reshape(edit.where.shape[:axes] + (-1, seq)).any(axis=-2)  # over prompts
    if edit.add is not None and edit.add.shape[axes + 1] > 1:  # an add of its own per token: where it is nonzero
      where = where & (np.asarray(edit.add) != 0).reshape(edit.add.shape[:axes + 2] + (-1,)).any(axis=-1).any(axis=axes)
    where = where & changes[..., None]
    if edit.layer is not None:
      layers[:, edit.layer] |= where.any(axis=-1)
    else:
      layers |= where.any(axis=-1)
    touched = np.asarray(np.asarray(where).reshape(where.shape[0], -1, seq).any(axis=1))  # [rows, S]
    first = np.where(touched.any(axis=1), touched.argmax(axis=1), seq)
    tokens = np.minimum(tokens, first)
  return np.where(layers.any(axis=1), layers.argmax(axis=1), num_layers), tokens


def bands(layers: np.ndarray, tokens: np.ndarray, rows: int) -> list[tuple[np.ndarray, int, np.ndarray]]:
  """The calls of a resumed run: rows with the same first token, in bands of consecutive first layers of at least
  `rows` rows each (a band's last may hold fewer), as (each member's first layer, the first token, the members).

  A call of a band starts at its lowest layer, each row entering the layers up to its own unablated: a band of
  several layers computes a few layers more than the rows need, in calls large enough to run at the matmuls' speed."""
  out = []
  for begin in np.unique(tokens):
    members = np.flatnonzero(tokens == begin)
    members = members[np.argsort(layers[members], kind="stable")]
    band: list[int] = []
    for layer in np.unique(layers[members]):
      band += members[layers[members] == layer].tolist()
      if len(band) >= rows:
        out.append((layers[band], int(begin), np.asarray(band)))
        band = []
    if band:
      out.append((layers[band], int(begin), np.asarray(band)))
  return out


def later(array: Any, begin: int, end: int, layer: int | None, fill: bool = False) -> Any:
  """An edit's array (`sites.Edit`) on tokens [begin, end) only: `where` [..., S], a per-token `fill` [(L,) P, S, U,
  Dv] or a per-token `add` [rows, (L,) P, S, U, Dv] cut along its tokens axis; per-unit ones (and None) as they are."""
  if array is None:
    return array
  array = np.asarray(array)
  if fill:
    axis = 2 if layer is None else 1
    return array[(slice(None),) * axis + (slice(begin, end),)] if array.ndim == axis + 3 else array
  if array.dtype == bool:  # where
    return array[..., begin:end]
  if array.ndim <= 3:  # keep
    return array
  axis = 3 if layer is None else 2
  return array if array.shape[axis] == 1 else array[(slice(None),) * axis + (slice(begin, end),)]


class Forward:
  """The compiled prompt-level forward pass of one model (one jit; a shape compiles once)."""

  def __init__(self, model: LoadedModel):
    self.model = model
    self._fn = jax.jit(functools.partial(_run, model.module, model.config), static_argnames=("readout", "dtype"))

  def run(self, batch: Batch, masks: MaskSet, readout: Readout, *, head_fill: np.ndarray | None = None,
          neuron_fill: np.ndarray | None = None, columns: Sequence[int] | None = None,
          edits: Sequence[Edit] = (), resume: bool = False) -> dict[str, np.ndarray]:
    """Every output of `_run` for every row, on the host, rows first: [M, ...].

    masks: the rows' head/neuron keep-masks. head_fill: float [L, H, Dh] or [L, P, S, H, Dh] (None: zero ablation);
    neuron_fill: [L, F] or [L, P, S, F]. edits: site edits with the same rows (`sites.Edit`, numpy arrays).
    resume: what a row cannot change is computed once, by an unablated run: the layers below the first it touches
    (rows start there from the residual stream entering it) and, for one prompt, the tokens before the first it
    touches, with a readout of the last tokens (rows then compute a multiple of RESUME_BUCKET tokens up to the
    prompt's end, attending to the earlier ones' keys and values). Rows are grouped by both (`first_touched`); outputs are those of a full pass up to float
    rounding. Needs a readout of no sites."""
    model = self.model
    if masks.heads is None and masks.neurons is None and not edits:
      raise UserError("a mask set with neither head nor neuron masks")
    num_rows = len(masks)
    most = call_size(model, batch, readout, num_rows)
    dtype = model.dtype
    fills = tuple(None if f is None else jnp.asarray(f, dtype) for f in (head_fill, neuron_fill))
    groups: list[tuple[np.ndarray, int, np.ndarray]] = [(np.zeros(num_rows, int), 0, np.arange(num_rows))]
    base: dict[str, jax.Array] = {}
    if resume:
      if readout.sites or readout.residuals:
        raise ValueError("a resumed call returns no sites: they need every layer")
      if any(f is not None and f.ndim > 3 for f in (head_fill, neuron_fill)):
        raise ValueError("per-token fills are site edits in a resumed call (`sites.Edit`), not mask fills")
      layers, tokens = first_touched(masks, edits, model.config.num_layers, batch.ids.shape[1])
      if len(batch.lengths) > 1 or not readout.last:
        tokens[:] = 0  # several prompts' earlier tokens differ; logits at every token need every token computed
      else:  # one prompt: a call computes a multiple of RESUME_BUCKET tokens up to its end (the last token stays in)
        width = batch.width
        tokens = np.maximum(0, width - -(-(width - np.minimum(tokens, width - 1)) // RESUME_BUCKET) * RESUME_BUCKET)
      layers = np.minimum(layers, model.config.num_layers - 1)  # a row touching nothing runs the last layer alone
      groups = bands(layers, tokens, max(BAND_ROWS, 1) if most >= BAND_ROWS else most)
      if any(starts.max() > 0 or begin > 0 for starts, begin, _ in groups):
        out = self._fn(model.params, jnp.asarray(batch.ids), jnp.asarray(batch.last),
                       Ablation(head_mask=jnp.ones((1,) + masks_shape(model), dtype)), None, None, None,
                       readout=Readout(last=True, residuals=True, kv=True), dtype=dtype)
        base = {name: out[name][0] for name in ("residual", "k", "v")}  # [L, P, S, ...]
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for row_starts, begin, members in groups:
      # A group's calls take the budget's size, or the group's own rounded up to a multiple of ROW_BUCKET: a sweep's
      # equal groups share one compiled shape, and a small group is not padded to a large call.
      per_call = min(most, -(-len(members) // ROW_BUCKET) * ROW_BUCKET)
      end = batch.width if len(batch.lengths) == 1 and resume else batch.ids.shape[1]
      start, context = self._resume(base, int(row_starts.min()), begin, end)
      ids, last = jnp.asarray(batch.ids[:, begin:end]), jnp.asarray(batch.last - begin)
      cols = None if columns is None else jnp.asarray(np.asarray(columns, np.int32))
      for offset in range(0, len(members), per_call):
        rows = members[offset:offset + per_call]
        pad = per_call - len(rows)

        def put(m: Any, value: float = 1.0) -> jax.Array | None:
          chosen = _rows(m, rows, pad, value)
          return None if chosen is None else jnp.asarray(chosen)

        heads, neurons = put(masks.heads), put(masks.neurons)
        if start is not None:  # each row enters the layers up to its own first one unablated (`Resume.starts`)
          own = np.concatenate([row_starts[offset:offset + per_call], np.full(pad, self.model.config.num_layers - 1)])
          start = dataclasses.replace(start, starts=jnp.asarray(own, jnp.int32))
        chunk_edits = tuple(Edit(e.site, put(later(e.keep, begin, end, e.layer)),
                                 put(later(e.where, begin, end, e.layer), False),
                                 None if e.fill is None else
                                 jnp.asarray(later(e.fill, begin, end, e.layer, fill=True), dtype),
                                 put(later(e.add, begin, end, e.layer), 0.0), e.layer) for e in edits)
        if heads is None and neurons is None and not any(e.num_rows > 1 for e in chunk_edits):
          heads = jnp.ones((len(rows) + pad,) + masks_shape(model), dtype)  # the rows axis, for edits that broadcast
        ablation = Ablation(None if heads is None else heads.astype(dtype), fills[0] if heads is not None else None,
                            None if neurons is None else neurons.astype(dtype),
                            fills[1] if neurons is not None else None, edits=chunk_edits)
        out = self._fn(model.params, ids, last, ablation, cols, start, context, readout=readout, dtype=dtype)
        for name, value in out.items():
          parts.setdefault(name, []).append((rows, np.asarray(value)[:len(rows)]))
    result = {}
    for name, pieces in parts.items():
      first_piece = pieces[0][1]
      full = np.empty((num_rows,) + first_piece.shape[1:], first_piece.dtype)
      for rows, value in pieces:
        full[rows] = value
      result[name] = full
    return result

  def _resume(self, base: dict[str, jax.Array], layer: int, begin: int, end: int
              ) -> tuple[Resume | None, Context | None]:
    """Where a group of rows starts: at `layer` from the unablated residual stream, and at token `begin` (up to
    `end`) with the earlier tokens' unablated keys and values as a context (`base`: the unablated run's residual
    stream, keys and values, [L, P, S, ...])."""
    if layer == 0 and begin == 0:
      return None, None
    stream = base["residual"][:, :, begin:end]  # [L, P, S', D]
    start = Resume(jnp.asarray(layer, jnp.int32), stream[layer][None], residuals=stream[:, None])
    if begin == 0:
      return start, None
    k = base["k"][:, 0, :begin][:, None]  # [L, 1, C, K, Dh]: one prompt, shared by the call's rows
    v = jnp.moveaxis(base["v"][:, 0, :begin], 1, -1)[:, None]  # [L, 1, K, Dh, C]
    return start, Context(k, v, jnp.ones((1, 1, begin), bool), jnp.arange(begin)[None, None])


def masks_shape(model: LoadedModel) -> tuple[int, int]:
  """(layers, heads) of a head keep-mask for one row."""
  return model.config.num_layers, model.config.num_heads
