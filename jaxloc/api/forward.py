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

from jaxloc.errors import UserError
from jaxloc.masks import MaskSet
from jaxloc.models.decoder import Ablation, ModelOutput, OutputSpec, lm_logits
from jaxloc.models.loading import LoadedModel

Prompts = str | Sequence[str] | Sequence[Sequence[int]]

# Bytes of activations one call may hold (logits and captured activations included): chunks of masks stay under it.
CALL_BUDGET = 2 << 30
# Prompt lengths round up to a multiple of this, so that prompts of similar lengths share one compiled shape.
TOKEN_BUCKET = 8


@dataclasses.dataclass
class Batch:
  """Prompts as tokens: ids int [P, S] right-padded (S a multiple of TOKEN_BUCKET), lengths int [P]."""

  ids: np.ndarray
  lengths: np.ndarray

  @property
  def last(self) -> np.ndarray:
    """int [P], each prompt's last token."""
    return self.lengths - 1


def tokenize(model: LoadedModel, prompts: Prompts, add_special_tokens: bool = True) -> tuple[Batch, list[list[int]]]:
  """The batch of `prompts` (strings, or token ids already) and each prompt's own ids."""
  items: list[Any] = [prompts] if isinstance(prompts, str) else list(prompts)
  if not items:
    raise UserError("no prompts given")
  if all(isinstance(p, str) for p in items):
    if model.tokenizer is None:
      raise UserError("this model has no tokenizer: pass prompts as token ids, or a tokenizer to jaxloc.from_hf")
    ids = model.tokenizer(items, add_special_tokens=add_special_tokens)["input_ids"]
  elif all(not isinstance(p, str) for p in items):
    ids = [[int(t) for t in p] for p in items]
  else:
    raise UserError("prompts must be all strings or all token-id lists")
  empty = [i for i, p in enumerate(ids) if not p]
  if empty:
    raise UserError(f"prompts {empty} have no tokens")
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
  capture: the run's activations too (`OutputSpec.activations` and `residuals`).
  """

  last: bool = False
  top_k: int | None = None
  columns: bool = False
  capture: bool = False


def _run(module: Any, config: Any, params: Any, ids: jax.Array, last: jax.Array, ablation: Ablation,
         columns: jax.Array | None, *, readout: Readout, dtype: Any) -> dict[str, jax.Array]:
  """One compiled call: ids int [P, S], last int [P], ablation fields with a leading Mc (masks) axis."""
  masks = ablation.num_masks
  tokens = jnp.broadcast_to(ids[None], (masks,) + ids.shape)
  positions = jnp.arange(ids.shape[1])[None, None]
  spec = OutputSpec(residuals=readout.capture, activations=readout.capture)
  out: ModelOutput = module.apply({"params": params}, tokens, positions, ablation=ablation, outputs=spec, dtype=dtype)
  hidden = out.hidden
  if readout.last:
    hidden = jnp.take_along_axis(hidden, last[None, :, None, None], axis=2)[:, :, 0]  # [Mc, P, D]
  logits = lm_logits(config, params, hidden)
  result: dict[str, jax.Array] = {}
  if readout.top_k is not None:
    logprobs, tokens_ = jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), readout.top_k)
    result["top_logprobs"], result["top_tokens"] = logprobs, tokens_
  elif columns is not None:
    result["logits"] = jnp.take(logits, columns, axis=-1)
  else:
    result["logits"] = logits
  if readout.capture:
    # layers after masks: [Mc, L, ...]; heads [.., P, S, K, G, Dh] -> [.., P, S, H, Dh];
    # attention [.., P, K, G, S, S] -> [.., P, H, S, S]
    c = config
    assert out.residual is not None and out.heads is not None and out.neurons is not None \
        and out.attention is not None  # OutputSpec(residuals=True, activations=True) asked for them
    result["residual"] = jnp.swapaxes(out.residual, 0, 1)
    result["hidden"] = out.hidden
    heads = jnp.swapaxes(out.heads, 0, 1)
    result["heads"] = heads.reshape(heads.shape[:4] + (c.num_heads, c.head_dim))
    result["neurons"] = jnp.swapaxes(out.neurons, 0, 1)
    attention = jnp.swapaxes(out.attention, 0, 1)
    result["attention"] = attention.reshape(attention.shape[:3] + (c.num_heads,) + attention.shape[-2:])
  return result


def call_size(model: LoadedModel, batch: Batch, readout: Readout, num_masks: int) -> int:
  """Masks per compiled call: as many as CALL_BUDGET holds (at least one, at most `num_masks`)."""
  c = model.config
  prompts, seq = batch.ids.shape
  itemsize = 4
  per_position = 4 * c.hidden_size + 3 * c.intermediate_size + 2 * c.num_heads * (c.head_dim + seq)
  per_mask = prompts * seq * per_position * itemsize
  per_mask += prompts * (1 if readout.last else seq) * c.vocab_size * itemsize * 2
  if readout.capture:
    per_mask += c.num_layers * prompts * seq * (c.hidden_size + c.num_heads * (c.head_dim + seq)
                                                + c.intermediate_size) * itemsize
  return int(max(1, min(num_masks, CALL_BUDGET // per_mask)))


class Forward:
  """The compiled prompt-level forward pass of one model (one jit; a shape compiles once)."""

  def __init__(self, model: LoadedModel):
    self.model = model
    self._fn = jax.jit(functools.partial(_run, model.module, model.config), static_argnames=("readout", "dtype"))

  def run(self, batch: Batch, masks: MaskSet, readout: Readout, *, head_fill: np.ndarray | None = None,
          neuron_fill: np.ndarray | None = None, columns: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """Every output of `_run` for every mask, on the host, masks first: [M, ...].

    head_fill: float [L, H, Dh] or [L, P, S, H, Dh] (None: zero ablation); neuron_fill: [L, F] or [L, P, S, F]."""
    model = self.model
    per_call = call_size(model, batch, readout, len(masks))
    ids, last = jnp.asarray(batch.ids), jnp.asarray(batch.last)
    cols = None if columns is None else jnp.asarray(np.asarray(columns, np.int32))
    dtype = model.dtype
    fills = tuple(None if f is None else jnp.asarray(f, dtype) for f in (head_fill, neuron_fill))
    heads, neurons = masks.heads, masks.neurons
    if heads is None and neurons is None:
      raise UserError("a mask set with neither head nor neuron masks")
    parts: dict[str, list[np.ndarray]] = {}
    for begin in range(0, len(masks), per_call):
      real = min(per_call, len(masks) - begin)

      def chunk(m: np.ndarray | None) -> jax.Array | None:
        if m is None:
          return None
        rows = m[begin:begin + per_call]
        if real < per_call:  # one compiled shape: pad with unablated masks
          rows = np.concatenate([rows, np.ones((per_call - real,) + rows.shape[1:], rows.dtype)])
        return jnp.asarray(rows, dtype)

      ablation = Ablation(chunk(heads), fills[0] if heads is not None else None, chunk(neurons),
                          fills[1] if neurons is not None else None)
      out = self._fn(model.params, ids, last, ablation, cols, readout=readout, dtype=dtype)
      for name, value in out.items():
        parts.setdefault(name, []).append(np.asarray(value)[:real])
    return {name: np.concatenate(values) for name, values in parts.items()}
