"""The scoring kernels: pure, jittable functions that score many requests teacher-forced under many head and/or
neuron masks (`models.decoder.Ablation`). The scoring job that compiles and pipelines them is `scorer.py`.

Axes: `masks` M (Mb per call), `requests` R (Rb rows per call), `seq` S (suffix tokens per row),
`context` P (the shared prefix), `targets` T (continuation tokens of a call), `slots` N (requests of a call),
`layers` L, `heads` H, `mlp` F, `embed` D.

Requests are tokenized once (the lm-eval convention in `requests.py`). The longest token prefix that
every request shares (a few-shot preamble) is computed once per mask and kept as keys/values; each
request then runs only its own suffix against them; short suffixes are packed several to a row, each seeing only
itself and the prefix, so compute follows real tokens rather than padding. The LM head runs only at positions that
predict continuation tokens. A batch of masks that ablates nothing below layer l can resume at l from the unablated
model's residual stream (`unablated_residuals`), computed once per request set.

These are pure functions over pytrees; `scorer.py` jits and pipelines them, `attribution.py` differentiates through
them.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from jaxloc.engine.batching import bucket, bucket_pow2
from jaxloc.engine.requests import ScoringRequest
from jaxloc.errors import UserError
from jaxloc.models.layers import Context
from jaxloc.models.config import ModelConfig
from jaxloc.models.decoder import Ablation, OutputSpec, Resume, lm_logits

log = logging.getLogger(__name__)

# Sharing a prefix shorter than this saves less than the extra call costs.
MIN_SHARED_PREFIX = 4


@dataclasses.dataclass
class TokenizedRequests:
  """sequences: token ids of context + continuation, one array per request.
  target_start: [R] index of the first continuation token in its sequence.
  """

  sequences: list[np.ndarray]
  target_start: np.ndarray

  @property
  def num_targets(self) -> np.ndarray:
    return np.array([len(s) for s in self.sequences]) - self.target_start


def _encode(tokenizer: Any, texts: Sequence[tuple[str, bool]]) -> list[list[int]]:
  """Token ids of each (text, add_special_tokens), one tokenizer call per special-token setting."""
  ids: list[list[int]] = [[] for _ in texts]
  for add_special in {flag for _, flag in texts}:
    members = [i for i, (_, flag) in enumerate(texts) if flag == add_special]
    encoded = tokenizer([texts[i][0] for i in members], add_special_tokens=add_special)["input_ids"]
    for i, token_ids in zip(members, encoded):
      ids[i] = list(token_ids)
  return ids


def _split_pairs(tokenizer: Any, requests: Sequence[ScoringRequest],
                 fallback: int) -> list[tuple[list[int], list[int]]]:
  """(context ids, continuation ids) of every request, by its own encoding (`ScoringRequest`)."""
  separate = [i for i, r in enumerate(requests) if not r.joint]
  joint = [i for i, r in enumerate(requests) if r.joint and r.context]
  empty = [i for i, r in enumerate(requests) if r.joint and not r.context]
  contexts = _encode(tokenizer, [(requests[i].context, requests[i].add_special_tokens) for i in separate])
  continuations = _encode(tokenizer, [(requests[i].continuation, False) for i in separate])
  pairs_of = dict(zip(separate, zip(contexts, continuations)))
  # lm-eval's causal encoding: trailing context whitespace joins the continuation; the whole is split at the
  # context's own token count.
  moved = []
  for i in joint:
    r = requests[i]
    stripped = r.context.rstrip()
    moved.append((stripped, r.context[len(stripped):] + r.continuation, r.add_special_tokens))
  wholes = _encode(tokenizer, [(ctx + cont, flag) for ctx, cont, flag in moved])
  joint_contexts = _encode(tokenizer, [(ctx, flag) for ctx, _, flag in moved])
  pairs_of.update((i, (ctx, whole[len(ctx):])) for i, ctx, whole in zip(joint, joint_contexts, wholes))
  for i, cont in zip(empty, _encode(tokenizer, [(requests[i].continuation, False) for i in empty])):
    pairs_of[i] = (cont[:1], cont[1:]) if cont and cont[0] == fallback else ([fallback], cont)
  return [pairs_of[i] for i in range(len(requests))]


def tokenize(tokenizer: Any, requests: Sequence[ScoringRequest], max_length: int) -> TokenizedRequests:
  """tokens = tokenizer(context) + tokenizer(continuation, add_special_tokens=False), as lm-eval does
  (or lm-eval's HF encoding of the pair as one string, for `joint` requests).

  An empty context becomes the BOS (else EOS) token so the first continuation token has a predictor.
  Sequences over `max_length` lose context tokens from the left, as lm-eval truncates (a warning says how many).
  """
  if tokenizer is None:
    raise UserError("this model directory ships no tokenizer; text requests need one")
  sequences, starts, cut = [], [], {}
  fallback = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
  for index, (request, (ctx, cont)) in enumerate(zip(requests, _split_pairs(tokenizer, requests, fallback))):
    if not cont:
      raise UserError(f"request {index}: continuation {request.continuation!r} tokenizes to nothing")
    if not ctx:
      ctx = [fallback]
    if len(cont) >= max_length:
      raise UserError(f"request {index}: continuation of {len(cont)} tokens does not fit the model's "
                      f"{max_length} positions")
    if len(ctx) + len(cont) > max_length:
      cut[index] = len(ctx) + len(cont)
    ctx = ctx[-(max_length - len(cont)):]
    sequences.append(np.asarray(ctx + list(cont), np.int32))
    starts.append(len(ctx))
  if cut:
    longest = max(cut, key=lambda i: cut[i])
    log.warning("%d of %d requests are longer than the model's %s positions: each keeps only the end of its context "
                "(cut from the left, as lm-eval does); the longest, request %d (context %s), has %s tokens",
                len(cut), len(requests), f"{max_length:,}", longest, _opening(requests[longest].context),
                f"{cut[longest]:,}")
  return TokenizedRequests(sequences, np.asarray(starts))


def _opening(text: str, length: int = 40) -> str:
  """The start of a long text, for a message."""
  return repr(text[:length] + "…" if len(text) > length else text)


def shared_prefix_length(tokenized: TokenizedRequests) -> int:
  """Longest token prefix of every sequence that still leaves each request's first predictor position
  (the last context token) outside it; 0 when shorter than MIN_SHARED_PREFIX or for one request."""
  if len(tokenized.sequences) < 2:
    return 0
  cap = int(tokenized.target_start.min()) - 1
  first = tokenized.sequences[0][:cap]
  length = len(first)
  for seq in tokenized.sequences[1:]:
    n = min(length, len(seq))
    mismatch = np.nonzero(seq[:n] != first[:n])[0]
    length = int(mismatch[0]) if mismatch.size else n
    if length < MIN_SHARED_PREFIX:
      return 0
  return length if length >= MIN_SHARED_PREFIX else 0


# Packed row widths tried, as multiples of the longest suffix (each rounded up to the bucket ladder).
PACK_WIDTHS = (1, 1.5, 2, 3, 4, 6, 8)
MAX_PACK_WIDTH = 1024


# A `Rows` array: numpy on the host (`layout`), a jax.Array once placed (`Placement.rows`), and None where a call
# reads no targets (the residual streams' rows, `Scorer._residual_streams`).
RowArray = Any


@dataclasses.dataclass
class Rows:
  """The device arrays of one scoring call (a pytree).

  tokens, positions, segments: [Rb, S]; a row holds one request's suffix, or several packed one after another; a
    token's segment is its request's slot in the chunk (-1 on padding), and tokens see only their own segment (and
    the shared prefix).
  target_pos: [T] flat positions into the Rb * S tokens whose logits predict target_ids [T].
  target_slots: [T, N] float one-hot: the slot whose continuation each target belongs to (a zero row for padding).
  """

  tokens: RowArray
  positions: RowArray
  segments: RowArray
  target_pos: RowArray
  target_ids: RowArray
  target_slots: RowArray


jax.tree_util.register_dataclass(
    Rows, data_fields=["tokens", "positions", "segments", "target_pos", "target_ids", "target_slots"], meta_fields=[])


@dataclasses.dataclass
class Chunk:
  """Requests scored together in one call: `index` [N], the request in each slot (-1 pads), and their `rows`."""

  index: np.ndarray
  rows: Rows

  def row_targets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Targets per row, for chunks of one request per row: positions within the row [Rb, T'], ids, valid."""
    width = self.rows.tokens.shape[1]
    slot = np.where(self.rows.target_slots.any(1), self.rows.target_slots.argmax(1), -1)
    if not np.array_equal(slot[slot >= 0], self.rows.target_pos[slot >= 0] // width):
      raise ValueError("row_targets needs one request per row")
    counts = np.bincount(slot[slot >= 0], minlength=len(self.index))
    size = bucket_pow2(int(counts.max(initial=1)))
    pos = np.zeros((len(self.index), size), np.int32)
    ids = np.zeros((len(self.index), size), np.int32)
    valid = np.zeros((len(self.index), size), bool)
    for row in range(len(self.index)):
      mine = np.nonzero(slot == row)[0]
      pos[row, :len(mine)] = self.rows.target_pos[mine] % width
      ids[row, :len(mine)] = self.rows.target_ids[mine]
      valid[row, :len(mine)] = True
    return pos, ids, valid


@dataclasses.dataclass
class ScoringLayout:
  """A tokenized request set cut into chunks after its shared prefix (prefix tokens [P])."""

  prefix: np.ndarray
  chunks: list[Chunk]
  num_requests: int
  num_targets: np.ndarray
  suffix_tokens: int  # real (unpadded) suffix tokens computed over all requests (each but its last token)

  @property
  def tokens_per_mask(self) -> int:
    """Tokens computed per mask, padding excluded: the prefix once plus every suffix but its last token (the end
    of a continuation predicts nothing)."""
    return len(self.prefix) + self.suffix_tokens

  @property
  def padded_tokens_per_mask(self) -> int:
    return len(self.prefix) + sum(c.rows.tokens.size for c in self.chunks)


def first_fit(lengths: np.ndarray, width: int) -> list[list[int]]:
  """Requests (indices) into rows of `width` tokens, longest first, each into the first row with room."""
  rows: list[list[int]] = []
  free = np.zeros(len(lengths), np.int64)  # room left in each row opened so far (at most one row per request)
  for i in np.argsort(-lengths, kind="stable"):
    fits = free[:len(rows)] >= lengths[i]
    row = int(fits.argmax()) if fits.any() else len(rows)
    if row == len(rows):
      rows.append([])
      free[row] = width
    rows[row].append(int(i))
    free[row] -= lengths[i]
  return rows


def arrange(tokenized: TokenizedRequests, prefix_len: int, pack: bool, key_cost: float = 0.0
            ) -> tuple[list[list[int]], int]:
  """Rows of requests (indices) and the row width.

  With `pack`, suffixes share rows (first fit, longest first) of the width, among a few multiples of the longest
  suffix, that computes least: rows × width tokens, each costing 1 + key_cost × (width + prefix) (attention scores
  every key of its row and the prefix; key_cost is a key's cost relative to a token's weight FLOPs). Without, one
  request per row, shortest first (chunks then pad to their own width).
  """
  lengths = np.array([len(s) - prefix_len - 1 for s in tokenized.sequences])  # the last token is never computed
  longest = int(lengths.max())
  if not pack:
    return [[int(i)] for i in np.argsort(lengths, kind="stable")], bucket(longest)

  def cost(width: int, rows: list[list[int]]) -> float:
    return len(rows) * width * (1 + key_cost * (width + prefix_len))

  widths = sorted({bucket(min(int(np.ceil(longest * k)), max(longest, MAX_PACK_WIDTH))) for k in PACK_WIDTHS})
  options = [(width, first_fit(lengths, width)) for width in widths]
  width, rows = min(options, key=lambda option: cost(*option))
  return rows, width


def chunk_sizes(tokenized: TokenizedRequests, rows: list[list[int]], rows_per_chunk: int) -> tuple[int, int]:
  """The most slots (requests) and continuation tokens any chunk of `rows_per_chunk` rows holds."""
  groups = [rows[begin:begin + rows_per_chunk] for begin in range(0, len(rows), rows_per_chunk)]
  return (max(sum(len(r) for r in group) for group in groups),
          max(sum(int(tokenized.num_targets[i]) for r in group for i in r) for group in groups))


def layout(tokenized: TokenizedRequests, rows: list[list[int]], rows_per_chunk: int, prefix_len: int, pad_id: int,
           width: int | None = None, *, slots: int | None = None, targets: int | None = None) -> ScoringLayout:
  """Cuts `rows` (from `arrange`) into chunks of `rows_per_chunk` rows. Every chunk has `width` columns when given
  (packed rows), else the bucketed width of its longest row; slots and targets pad to one size per layout: `slots`
  and `targets` when given (a compiled shape's, at least what the chunks hold), else what the fullest chunk holds
  (targets bucketed)."""
  prefix = tokenized.sequences[0][:prefix_len] if prefix_len else np.zeros((0,), np.int32)
  suffixes = [seq[prefix_len:] for seq in tokenized.sequences]
  inputs = [suffix[:-1] for suffix in suffixes]  # a request's last token predicts nothing: it is never computed
  groups = [rows[begin:begin + rows_per_chunk] for begin in range(0, len(rows), rows_per_chunk)]
  most_slots, most_targets = chunk_sizes(tokenized, rows, rows_per_chunk)
  num_slots = slots or most_slots
  num_targets = targets or bucket(most_targets)
  if num_slots < most_slots or num_targets < most_targets:
    raise ValueError(f"chunks hold {most_slots} slots and {most_targets} targets, over {num_slots} and {num_targets}")
  chunks = []
  for group in groups:
    seq_len = width or bucket(max(sum(len(inputs[i]) for i in r) for r in group))
    tokens = np.full((rows_per_chunk, seq_len), pad_id, np.int32)
    positions = np.full((rows_per_chunk, seq_len), prefix_len, np.int32)
    segments = np.full((rows_per_chunk, seq_len), -1, np.int32)
    target_pos = np.zeros((num_targets,), np.int32)
    target_ids = np.zeros((num_targets,), np.int32)
    target_slots = np.zeros((num_targets, num_slots), np.float32)
    index = np.full((num_slots,), -1, np.int64)
    slot = target = 0
    for row, members in enumerate(group):
      offset = 0
      for i in members:
        suffix = suffixes[i]
        end = offset + len(inputs[i])
        tokens[row, offset:end] = inputs[i]
        positions[row, offset:end] = np.arange(prefix_len, prefix_len + len(inputs[i]))
        segments[row, offset:end] = slot
        start = int(tokenized.target_start[i]) - prefix_len
        n = len(suffix) - start
        target_pos[target:target + n] = row * seq_len + offset + np.arange(start - 1, start - 1 + n)
        target_ids[target:target + n] = suffix[start:]
        target_slots[target:target + n, slot] = 1
        index[slot] = i
        slot += 1
        target += n
        offset = end
    chunks.append(Chunk(index, Rows(tokens, positions, segments, target_pos, target_ids, target_slots)))
  return ScoringLayout(prefix, chunks, len(tokenized.sequences), tokenized.num_targets,
                       sum(len(s) for s in inputs))


def prefix_context(module: Any, params: Any, ablation: Ablation, prefix_tokens: jax.Array,
                   start_layer: jax.Array | None = None, residuals: jax.Array | None = None,
                   mask_starts: jax.Array | None = None, *, dtype: DTypeLike) -> Context:
  """Keys [L, Mb, P, K, Dh] and values [L, Mb, K, Dh, P] of the shared prefix under each mask (the mask changes them
  too).

  With `start_layer` (int32 scalar), the layers below it are skipped: `residuals` [L, P, D] holds the unablated
  prefix's residual stream entering every layer (`unablated_residuals`); their keys/values come out as zeros, read
  by no query since the requests skip those layers too. With `mask_starts` (int32 [Mb]), each mask takes the
  unablated stream up to its own first layer (`Resume.starts`), as the requests do.
  """
  masks = ablation.num_masks
  prefix_len = prefix_tokens.shape[0]
  tokens = jnp.broadcast_to(prefix_tokens[None, None], (masks, 1, prefix_len))
  start = None
  if start_layer is not None:
    assert residuals is not None, "start_layer resumes from residuals"
    start = Resume(start_layer, residuals[start_layer][None, None], mask_starts,
                   None if mask_starts is None else residuals[:, None, None])
  out = module.apply({"params": params}, tokens, jnp.arange(prefix_len)[None, None], ablation=ablation, start=start,
                     outputs=OutputSpec(kv=True), dtype=dtype)
  k = out.k[:, :, 0]
  v = jnp.moveaxis(out.v[:, :, 0], 2, -1)  # [L, M, K, Dh, P], as a `Context` holds values
  return Context(k, v, jnp.ones((masks, 1, prefix_len), bool), jnp.arange(prefix_len)[None, None])


def unablated_residuals(module: Any, params: Any, prefix_tokens: jax.Array | None, rows: Rows, *,
                        dtype: DTypeLike) -> tuple[jax.Array | None, jax.Array]:
  """The unablated model's residual stream entering every layer: prefix [L, P, D] (None without a prefix) and the
  rows' tokens [L, Rb, S, D]. A batch of masks that ablates nothing below layer l resumes from them at l."""
  context = prefix_residuals = None
  if prefix_tokens is not None:
    prefix_len = prefix_tokens.shape[0]
    out = module.apply({"params": params}, prefix_tokens[None, None], jnp.arange(prefix_len)[None, None],
                       outputs=OutputSpec(kv=True, residuals=True), dtype=dtype)
    context = Context(out.k[:, :, 0], jnp.moveaxis(out.v[:, :, 0], 2, -1), jnp.ones((1, 1, prefix_len), bool),
                      jnp.arange(prefix_len)[None, None])
    prefix_residuals = out.residual[:, 0, 0]
  out = module.apply({"params": params}, rows.tokens[None], rows.positions[None], context=context,
                     segments=rows.segments[None], outputs=OutputSpec(residuals=True), dtype=dtype)
  return prefix_residuals, out.residual[:, 0]


def target_logprob(config: ModelConfig, params: Any, hidden: jax.Array, target_pos: jax.Array,
                   target_ids: jax.Array, target_slots: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Summed log-probability of each slot's targets and whether every one is the argmax, both [M, N].

  hidden: [M, R, S, D]; target_pos: [M|1, T] flat positions into R * S; target_ids: [M|1, T];
  target_slots: [M|1, T, N] one-hot (zero rows for padding targets).
  """
  m, r, s, d = hidden.shape
  target_pos = jnp.broadcast_to(target_pos, (m, target_pos.shape[-1]))
  hidden = jnp.take_along_axis(hidden.reshape(m, r * s, d), target_pos[..., None], axis=1)  # [M, T, D]
  logits = lm_logits(config, params, hidden)  # [M, T, V] float32
  # One max over the vocabulary serves both the log-normalizer and greedy exactness (an argmax costs more on CPUs;
  # a target tied for the top logit counts as greedy).
  top = jax.lax.stop_gradient(logits.max(axis=-1))
  log_norm = top + jnp.log(jnp.exp(logits - top[..., None]).sum(axis=-1))
  target_ids = jnp.broadcast_to(target_ids, target_pos.shape)
  target_logit = jnp.take_along_axis(logits, target_ids[..., None], axis=-1)[..., 0]
  slots = jnp.broadcast_to(target_slots, (m,) + target_slots.shape[1:])
  exact = jax.lax.Precision.HIGHEST
  logprob = jnp.einsum("mt,mtn->mn", target_logit - log_norm, slots, precision=exact)
  wrong = (target_logit < top).astype(jnp.float32)
  is_greedy = jnp.einsum("mt,mtn->mn", wrong, slots, precision=exact) == 0
  return logprob, is_greedy


def score_chunk(module: Any, config: ModelConfig, params: Any, ablation: Ablation, context: Context | None,
                rows: Rows, start_layer: jax.Array | None = None, residuals: jax.Array | None = None,
                mask_starts: jax.Array | None = None, *, dtype: DTypeLike) -> tuple[jax.Array, jax.Array]:
  """Summed continuation log-probability and greedy exactness of each slot, both [Mb, N].

  With `start_layer`, resumes there from `residuals` [L, Rb, S, D] (`unablated_residuals`; exact when no mask of
  the batch ablates anything below it). With `mask_starts` (int32 [Mb], each mask's first ablated layer, none below
  `start_layer`), each mask resumes at its own (`Resume.starts`): its scores do not depend on the masks it shares
  the call with.
  """
  masks = ablation.num_masks
  tokens = jnp.broadcast_to(rows.tokens[None], (masks,) + rows.tokens.shape)
  start = None
  if start_layer is not None:
    assert residuals is not None, "start_layer resumes from residuals"
    start = Resume(start_layer, residuals[start_layer][None], mask_starts,
                   None if mask_starts is None else residuals[:, None])
  out = module.apply({"params": params}, tokens, rows.positions[None], ablation=ablation, context=context,
                     segments=rows.segments[None], start=start, dtype=dtype)
  return target_logprob(config, params, out.hidden, rows.target_pos[None], rows.target_ids[None],
                        rows.target_slots[None])
