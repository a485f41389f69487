"""Teacher-forced scoring of many requests under many head and/or neuron masks (`llama.Ablation`).

Axes: `masks` M (Mb per call), `requests` R (Rb per call), `seq` S (suffix tokens per request),
`context` P (the shared prefix), `targets` T (continuation tokens), `layers` L, `heads` H, `mlp` F.

Requests are tokenized once (the lm-eval convention in `requests.py`). The longest token prefix that
every request shares (a few-shot preamble) is computed once per mask and kept as keys/values; each
request then runs only its own suffix against them. The LM head runs only at positions that predict
continuation tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.engine.batching import bucket, bucket_pow2
from jaxloc.engine.requests import ScoringRequest
from jaxloc.errors import UserError
from jaxloc.models.layers import Context
from jaxloc.models.llama import Ablation, lm_logits

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


def _encode(tokenizer, texts: Sequence[tuple[str, bool]]) -> list[list[int]]:
  """Token ids of each (text, add_special_tokens), one tokenizer call per special-token setting."""
  ids: list[list[int]] = [[] for _ in texts]
  for add_special in {flag for _, flag in texts}:
    members = [i for i, (_, flag) in enumerate(texts) if flag == add_special]
    encoded = tokenizer([texts[i][0] for i in members], add_special_tokens=add_special)["input_ids"]
    for i, token_ids in zip(members, encoded):
      ids[i] = list(token_ids)
  return ids


def _split_pairs(tokenizer, requests: Sequence[ScoringRequest], fallback: int) -> list[tuple[list[int], list[int]]]:
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


def tokenize(tokenizer, requests: Sequence[ScoringRequest], max_length: int) -> TokenizedRequests:
  """tokens = tokenizer(context) + tokenizer(continuation, add_special_tokens=False), as lm-eval does
  (or lm-eval's HF encoding of the pair as one string, for `joint` requests).

  An empty context becomes the BOS (else EOS) token so the first continuation token has a predictor.
  Sequences over `max_length` lose context tokens from the left, as lm-eval truncates.
  """
  if tokenizer is None:
    raise UserError("this model directory ships no tokenizer; text requests need one")
  sequences, starts = [], []
  fallback = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
  for index, (request, (ctx, cont)) in enumerate(zip(requests, _split_pairs(tokenizer, requests, fallback))):
    if not cont:
      raise UserError(f"request {index}: continuation {request.continuation!r} tokenizes to nothing")
    if not ctx:
      ctx = [fallback]
    if len(cont) >= max_length:
      raise UserError(f"request {index}: continuation of {len(cont)} tokens does not fit the model's "
                      f"{max_length} positions")
    ctx = ctx[-(max_length - len(cont)):]
    sequences.append(np.asarray(ctx + list(cont), np.int32))
    starts.append(len(ctx))
  return TokenizedRequests(sequences, np.asarray(starts))


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


@dataclasses.dataclass
class Chunk:
  """Requests scored together in one call, padded to bucketed shapes.

  index: [Rb] request indices (-1 for padding rows). tokens, positions: [Rb, S].
  target_pos: [Rb, T] suffix positions whose logits predict target_ids [Rb, T]; target_valid [Rb, T].
  """

  index: np.ndarray
  tokens: np.ndarray
  positions: np.ndarray
  target_pos: np.ndarray
  target_ids: np.ndarray
  target_valid: np.ndarray


@dataclasses.dataclass
class ScoringLayout:
  """A tokenized request set cut into chunks after its shared prefix (prefix tokens [P])."""

  prefix: np.ndarray
  chunks: list[Chunk]
  num_requests: int
  num_targets: np.ndarray
  suffix_tokens: int  # real (unpadded) suffix tokens over all requests

  @property
  def tokens_per_mask(self) -> int:
    """Tokens computed per mask, padding excluded: the prefix once plus every suffix."""
    return len(self.prefix) + self.suffix_tokens

  @property
  def padded_tokens_per_mask(self) -> int:
    return len(self.prefix) + sum(c.tokens.size for c in self.chunks)


def layout(tokenized: TokenizedRequests, requests_per_chunk: int, share_prefix: bool, pad_id: int) -> ScoringLayout:
  """Sorts requests by suffix length and cuts them into chunks of `requests_per_chunk`."""
  prefix_len = shared_prefix_length(tokenized) if share_prefix else 0
  prefix = tokenized.sequences[0][:prefix_len] if prefix_len else np.zeros((0,), np.int32)
  suffixes = [seq[prefix_len:] for seq in tokenized.sequences]
  order = np.argsort([len(s) for s in suffixes], kind="stable")
  chunks = []
  for begin in range(0, len(order), requests_per_chunk):
    members = order[begin:begin + requests_per_chunk]
    seq_len = bucket(max(len(suffixes[i]) for i in members))
    num_targets = bucket_pow2(max(int(tokenized.num_targets[i]) for i in members))
    rows = requests_per_chunk
    tokens = np.full((rows, seq_len), pad_id, np.int32)
    positions = np.tile(np.arange(prefix_len, prefix_len + seq_len, dtype=np.int32), (rows, 1))
    target_pos = np.zeros((rows, num_targets), np.int32)
    target_ids = np.zeros((rows, num_targets), np.int32)
    target_valid = np.zeros((rows, num_targets), bool)
    index = np.full((rows,), -1, np.int64)
    for row, i in enumerate(members):
      suffix = suffixes[i]
      tokens[row, :len(suffix)] = suffix
      start = int(tokenized.target_start[i]) - prefix_len
      n = len(suffix) - start
      target_pos[row, :n] = np.arange(start - 1, start - 1 + n)
      target_ids[row, :n] = suffix[start:]
      target_valid[row, :n] = True
      index[row] = i
    chunks.append(Chunk(index, tokens, positions, target_pos, target_ids, target_valid))
  return ScoringLayout(prefix, chunks, len(tokenized.sequences), tokenized.num_targets,
                       sum(len(s) for s in suffixes))


def prefix_context(module, params, ablation: Ablation, prefix_tokens, dtype) -> Context:
  """Keys/values [L, Mb, P, K, Dh] of the shared prefix under each mask (the mask changes them too)."""
  masks = ablation.num_masks
  prefix_len = prefix_tokens.shape[0]
  tokens = jnp.broadcast_to(prefix_tokens[None, None], (masks, 1, prefix_len))
  out = module.apply({"params": params}, tokens, jnp.arange(prefix_len)[None, None], ablation, return_kv=True,
                     dtype=dtype)
  k = out.k[:, :, 0]
  v = out.v[:, :, 0]
  return Context(k, v, jnp.ones((masks, 1, prefix_len), bool))


def _target_logprob(config, params, hidden, target_pos, target_ids, target_valid):
  """Summed log-probability of the targets and whether each is the argmax, [M, R], from hidden [M, R, S, D]."""
  hidden = jnp.take_along_axis(hidden, target_pos[..., None], axis=2)  # [M, R, T, D]
  logits = lm_logits(config, params, hidden)  # [M, R, T, V] float32
  log_norm = jax.nn.logsumexp(logits, axis=-1)
  target_logit = jnp.take_along_axis(logits, target_ids[..., None], axis=-1)[..., 0]
  logprob = jnp.where(target_valid, target_logit - log_norm, 0.0).sum(-1)
  is_greedy = jnp.where(target_valid, jnp.argmax(logits, axis=-1) == target_ids, True).all(-1)
  return logprob, is_greedy


def score_chunk(module, config, params, ablation: Ablation, context: Context | None, tokens, positions,
                target_pos, target_ids, target_valid, dtype):
  """Summed continuation log-probability and greedy exactness, both [Mb, Rb]."""
  masks = ablation.num_masks
  tokens = jnp.broadcast_to(tokens[None], (masks,) + tokens.shape)
  out = module.apply({"params": params}, tokens, positions[None], ablation, context, dtype=dtype)
  return _target_logprob(config, params, out.hidden, target_pos[None], target_ids[None], target_valid[None])


def mask_objective(module, config, params, ablation: Ablation, prefix_tokens, tokens, positions, target_pos,
                   target_ids, target_valid, weights, offsets, dtype, retained: bool = False):
  """Per mask [Mb]: sum over requests of weights[r] * f(logprob[m, r] - offsets[r]), where f is the identity, or
  with `retained` the probability kept relative to the offsets, exp(min(., 0)) (in [0, 1]: a request that loses
  everything counts 1, however many nats it loses).

  Differentiable in the ablation's masks (the prefix keys/values are recomputed inside, so the gradient flows
  through them too): at an all-ones mask with zero offsets its gradient is mask-gradient attribution; at soft
  masks it is what a learned mask trains on.
  """
  context = None
  if prefix_tokens is not None:
    context = prefix_context(module, params, ablation, prefix_tokens, dtype)
  logprob, _ = score_chunk(module, config, params, ablation, context, tokens, positions, target_pos,
                           target_ids, target_valid, dtype)
  change = logprob - offsets[None]
  values = jnp.exp(jnp.minimum(change, 0.0)) if retained else change
  return values @ weights


def mask_objective_and_grad(module, config, params, ablation: Ablation, *args, dtype, retained: bool = False):
  """`mask_objective` [Mb] and its gradients in the head mask [Mb, L, H] and the neuron mask [Mb, L, F] (None
  for a kind the ablation does not hold; masks are independent: the gradient of the sum over masks is each
  mask's own)."""

  def total(masks):
    values = mask_objective(module, config, params, dataclasses.replace(ablation, head_mask=masks[0],
                                                                        neuron_mask=masks[1]),
                            *args, dtype=dtype, retained=retained)
    return values.sum(), values

  (_, values), grads = jax.value_and_grad(total, has_aux=True)((ablation.head_mask, ablation.neuron_mask))
  return values, grads[0], grads[1]


def neuron_integrated_gradients(module, config, params, neuron_fill, prefix_tokens, tokens, positions, target_pos,
                                target_ids, target_valid, *, steps: int, dtype):
  """Integrated-gradients attribution [Rb, L, F] of every neuron at each request's last context position (the
  position predicting its first target token) for the probability of the request's target.

  The neurons of every layer at that position are scaled together from 0 (from their mean `neuron_fill`, when
  given) to their value along `steps` points (alpha = k / steps, k = 1..steps); a neuron's attribution is its
  value (minus the fill) times the mean gradient of the target probability along the path, which is the mean
  gradient in a neuron mask that scales that position only. One
  forward and backward pass over requests × steps rows, each row its own mask. The shared prefix is computed
  once, unablated (the scaled position is never in it).
  """
  rows, seq = tokens.shape
  cfg = config
  alphas = jnp.arange(1, steps + 1, dtype=jnp.float32) / steps
  width = rows * steps
  repeat = lambda a: jnp.repeat(a, steps, axis=0)[:, None]  # noqa: E731  [Rb, ...] -> [Rb * steps, 1, ...]
  context = None
  if prefix_tokens is not None:
    one = Ablation(neuron_mask=jnp.ones((1, cfg.num_layers, cfg.intermediate_size), dtype))
    prefix = prefix_context(module, params, one, prefix_tokens, dtype)
    expand = lambda a: jnp.broadcast_to(a, (a.shape[0], width) + a.shape[2:])  # noqa: E731
    context = Context(expand(prefix.k), expand(prefix.v), jnp.ones((width, 1, prefix_tokens.shape[0]), bool))
  where = (jnp.arange(seq)[None, :] == target_pos[:, :1])  # [Rb, S]: the first predictor position
  masks = jnp.broadcast_to(jnp.tile(alphas, rows)[:, None, None], (width, cfg.num_layers, cfg.intermediate_size))

  def probability(mask):
    ablation = Ablation(neuron_mask=mask, neuron_fill=neuron_fill, neuron_where=repeat(where))
    out = module.apply({"params": params}, repeat(tokens), repeat(positions), ablation, context, dtype=dtype)
    logprob, _ = _target_logprob(config, params, out.hidden, repeat(target_pos), repeat(target_ids),
                                 repeat(target_valid))
    return jnp.exp(logprob).sum()

  grad = jax.grad(probability)(masks.astype(dtype))
  return grad.astype(jnp.float32).reshape(rows, steps, cfg.num_layers, cfg.intermediate_size).mean(axis=1)
