"""How a generation step picks each row's next token: greedy (the argmax, `decoder.greedy_tokens`) or a draw from the
logits at a temperature, filtered by top-k then top-p (nucleus) as transformers' logits warpers filter them.

A generation job's settings (`requests.Sampling`) come in here as device arrays (`Sampler`, None for greedy), and
`next_tokens` is the one function the generation kernels pick tokens with: without a `Sampler` it is exactly the greedy
path, so that greedy decoding compiles and computes what it did before sampling existed.

Every draw takes a key of its own, folded from the seed's key, the row's mask index, its prompt index and the token's
index within the row's generated tokens (`token_keys`): a (mask, prompt) row draws the same tokens whichever other rows
or masks share the call, whichever slot it is decoded in and however the job is cut into calls.

Axes: `rows` N (any leading axes, flattened), `vocab` V.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.engine.requests import Sampling
from jaxloc.models.config import ModelConfig
from jaxloc.models.decoder import greedy_tokens, lm_logits

Array = jax.Array


@dataclasses.dataclass
class Sampler:
  """A sampling job's settings as the kernels take them (a pytree; None in a field leaves its filter out of the
  compiled step).

  key: uint32 key data of the seed's key (`jax.random.key_data`); temperature: float32 scalar, above 0;
  top_k: int32 scalar or None; top_p: float32 scalar or None.
  """

  key: Array
  temperature: Array
  top_k: Array | None
  top_p: Array | None


jax.tree_util.register_dataclass(Sampler, data_fields=[f.name for f in dataclasses.fields(Sampler)], meta_fields=[])


def make_sampler(sampling: Sampling, put: Any = jnp.asarray) -> Sampler | None:
  """The `Sampler` of `sampling` (None where it is greedy), its arrays placed by `put` (e.g. replicated over a mesh).

  Args:
    sampling: the job's settings, already checked.
    put: makes a device array of a host array.

  Returns:
    None for greedy decoding, else the settings as arrays; a filter that keeps every token (top_k None, top_p 1) is
    None, so that the step computes no sort for it.
  """
  if sampling.greedy:
    return None
  key = np.asarray(jax.random.key_data(jax.random.key(sampling.seed)))
  return Sampler(put(key), put(np.float32(sampling.temperature)),
                 None if sampling.top_k is None else put(np.int32(sampling.top_k)),
                 None if sampling.top_p >= 1 else put(np.float32(sampling.top_p)))


def token_keys(key: Array, row_ids: Array, index: Array) -> Array:
  """The keys of one draw per row: the seed's key (uint32 key data) folded with each row's mask index and prompt index
  (row_ids int32 [..., 2]) and the index of the token drawn among the row's generated tokens (index int32 [...]).

  Returns:
    typed keys [...], one per row, each a function of those three numbers and the seed alone.
  """
  base = jax.random.wrap_key_data(key)

  def one(ids: Array, position: Array) -> Array:
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(base, ids[0]), ids[1]), position)

  return jax.vmap(one)(row_ids.reshape(-1, 2), index.reshape(-1)).reshape(index.shape)


def filter_logits(logits: Array, top_k: Array | None = None, top_p: Array | None = None) -> Array:
  """Logits [..., V] with every token that top-k, then top-p, leaves out set to -inf (transformers' TopKLogitsWarper
  then TopPLogitsWarper).

  Top-k keeps the tokens whose logit reaches the k-th largest; top-p then keeps, of those, the smallest set of the
  likeliest whose probability (softmax of the logits top-k kept) reaches p, always the likeliest token. Both cut at a
  value, so a token tied with the last one kept is kept too (transformers' top-p splits such ties by sort order).

  Args:
    logits: float [..., V], already divided by the temperature.
    top_k: int32 scalar in [1, V], or None for no top-k filter.
    top_p: float32 scalar in (0, 1], or None for no top-p filter.

  Returns:
    float32 [..., V], the kept logits unchanged.
  """
  logits = logits.astype(jnp.float32)
  if top_k is None and top_p is None:
    return logits
  ordered = -jnp.sort(-logits, axis=-1)  # descending
  floor = jnp.full(logits.shape[:-1] + (1,), -jnp.inf, jnp.float32)
  if top_k is not None:
    floor = jnp.take(ordered, top_k - 1, axis=-1)[..., None]
    ordered = jnp.where(ordered >= floor, ordered, -jnp.inf)
  if top_p is not None:
    probs = jax.nn.softmax(ordered, axis=-1)
    above = jnp.cumsum(probs, axis=-1) - probs  # the probability of the tokens ranked before each
    kept = jnp.maximum(jnp.sum(above < top_p, axis=-1, keepdims=True), 1)
    floor = jnp.maximum(floor, jnp.take_along_axis(ordered, kept - 1, axis=-1))
  return jnp.where(logits >= floor, logits, -jnp.inf)


def sample(logits: Array, keys: Array, temperature: Array, top_k: Array | None = None,
           top_p: Array | None = None) -> Array:
  """One token per row drawn from softmax(logits / temperature) over the tokens `filter_logits` keeps.

  Args:
    logits: float [..., V].
    keys: typed keys [...], one per row (`token_keys`).
    temperature: float32 scalar, above 0.
    top_k, top_p: as `filter_logits` takes them.

  Returns:
    int32 [...], the tokens drawn.
  """
  lead, vocab = logits.shape[:-1], logits.shape[-1]
  kept = filter_logits(logits.astype(jnp.float32) / temperature, top_k, top_p)
  tokens = jax.vmap(jax.random.categorical)(keys.reshape(-1), kept.reshape(-1, vocab))
  return tokens.astype(jnp.int32).reshape(lead)


def next_tokens(config: ModelConfig, params: Any, hidden: Array, sampler: Sampler | None = None,
                row_ids: Array | None = None, index: Array | None = None) -> Array:
  """The next token of each row of final-normed hidden states [..., D]: greedy without a sampler (exactly
  `decoder.greedy_tokens`), else drawn (`sample`) with each row's key (`token_keys`).

  Args:
    config, params: the model's.
    hidden: [..., D], one row per (mask, prompt) row.
    sampler: the job's `Sampler`, or None for greedy decoding.
    row_ids: int32 [..., 2], each row's (mask index, prompt index); with a sampler only.
    index: int32 [...], the index among the row's generated tokens of the token picked here; with a sampler only.

  Returns:
    int32 [...], the tokens.
  """
  if sampler is None:
    return greedy_tokens(config, params, hidden)
  assert row_ids is not None and index is not None, "a draw needs each row's ids and token index"
  logits = lm_logits(config, params, hidden)
  return sample(logits, token_keys(sampler.key, row_ids, index), sampler.temperature, sampler.top_k, sampler.top_p)
