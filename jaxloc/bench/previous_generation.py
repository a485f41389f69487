"""The engine's generator as it was before shared-prefix generation with continuous batching (jaxloc at cbf7c71),
kept whole as the baseline of `experiments.benchmark_throughput`'s generation workloads and as the reference of the
exactness tests (the new generator must emit the very same tokens).

Greedy decoding under head and/or neuron masks: one jitted prefill of every (mask, prompt) row, left-padded, plus a
`lax.while_loop` over new tokens in which every row keeps its whole prompt's keys/values. Rows whose masks ablate
nothing below layer l resume the prefill at l from the prompts' unablated prefill (`prompt_streams`, computed once
per prompt and shared by every mask).

Axes: `batch` B (one (mask, request) pair each; every sequence carries its own head mask), `seq` S
(left-padded prompt), `cache` C = S + max_new_tokens, `layers` L, `kv_heads` K, `head_dim` Dh,
`vocab` V, `states` Q (of the stop-string automaton).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.engine import batching, stops as stop_strings
from jaxloc.engine.masks import Fills, Masks, check_fills, check_masks, start_layers
from jaxloc.engine.mesh import to_host
from jaxloc.engine.planner import GIB
from jaxloc.engine.requests import GenerationRequest
from jaxloc.engine.resources import SharedResources
from jaxloc.errors import UserError
from jaxloc.models.layers import Context
from jaxloc.models.decoder import Ablation, OutputSpec, Resume, lm_logits

log = logging.getLogger(__name__)


def _positions(prompt_valid):
  return jnp.maximum(jnp.cumsum(prompt_valid, axis=-1) - 1, 0)


def prompt_streams(module, params, prompt, prompt_valid, *, dtype):
  """The unablated prefill of distinct left-padded prompts [P, S]: the residual stream entering every layer
  [L, P, S, D] and every layer's keys and values [L, P, S, K, Dh]. Rows whose masks ablate nothing below layer l
  resume from them at l (`prefill`)."""
  out = module.apply({"params": params}, prompt[None], _positions(prompt_valid)[None],
                     segments=jnp.where(prompt_valid, 0, -1)[None], outputs=OutputSpec(kv=True, residuals=True),
                     dtype=dtype)
  return out.residual[:, 0], out.k[:, 0], out.v[:, 0]


def prefill(module, params, ablation: Ablation, prompt, prompt_valid, shared, dtype):
  """The prompts' model output under each row's masks: final hidden states [B, 1, S, D], keys/values
  [L, B, 1, S, K, Dh].

  shared: None, or (start_layer, row_prompt [B], streams): `streams` are `prompt_streams` of distinct prompts (at
  least as wide), row b holds prompt row_prompt[b], and no row ablates anything below start_layer; every row then
  resumes from its prompt's residual stream at start_layer and takes the keys/values of the layers below from it.
  """
  segments = jnp.where(prompt_valid, 0, -1)[:, None]
  positions = _positions(prompt_valid)[:, None]
  if shared is None:
    return module.apply({"params": params}, prompt[:, None], positions, ablation=ablation, segments=segments,
                        outputs=OutputSpec(kv=True), dtype=dtype)
  start_layer, row_prompt, (residuals, keys, values) = shared
  seq = prompt.shape[1]  # left padding: a prompt's streams at a narrower width are the last `seq` columns
  out = module.apply({"params": params}, prompt[:, None], positions, ablation=ablation, segments=segments,
                     start=Resume(start_layer, residuals[start_layer][row_prompt][:, None, -seq:]),
                     outputs=OutputSpec(kv=True), dtype=dtype)
  below = (jnp.arange(out.k.shape[0]) < start_layer).reshape((-1,) + (1,) * (out.k.ndim - 1))
  per_row = lambda kv: kv[:, row_prompt][:, :, None, -seq:]  # noqa: E731  [L, P, W, ...] -> [L, B, 1, S, ...]
  return dataclasses.replace(out, k=jnp.where(below, per_row(keys), out.k), v=jnp.where(below, per_row(values), out.v))


def greedy_generate(module, config, params, ablation: Ablation, prompt, prompt_valid, active, eos_ids, stop_next,
                    stop_hit, shared=None, *, max_new_tokens: int, pad_id: int, dtype):
  """Greedy continuation of left-padded prompts.

  prompt, prompt_valid: [B, S]; ablation: head/neuron masks [B, L, H] / [B, L, F], one per row; active: bool [B],
  False on rows that only pad the batch (they start finished, so they never keep the loop running); eos_ids: [E];
  stop_next, stop_hit: [V, Q], the stop-string automaton of `stop_tables`.
  shared: None, or (start_layer int32 scalar, row_prompt [B], `prompt_streams` of the distinct prompts) when no
    row ablates anything below start_layer: the rows' prefill resumes there (`prefill`).
  Returns tokens [B, max_new_tokens] (pad_id after a sequence ends) and how many each emitted [B],
  its stop token included.
  """
  batch, seq = prompt.shape
  positions = _positions(prompt_valid)
  out = prefill(module, params, ablation, prompt, prompt_valid, shared, dtype)
  pad = ((0, 0), (0, 0), (0, max_new_tokens), (0, 0), (0, 0))
  cache_k = jnp.pad(out.k[:, :, 0], pad)  # [L, B, C, K, Dh]
  cache_v = jnp.pad(out.v[:, :, 0], pad)
  cache_valid = jnp.concatenate([prompt_valid, jnp.zeros((batch, max_new_tokens), bool)], axis=1)
  first = jnp.argmax(lm_logits(config, params, out.hidden[:, 0, -1]), axis=-1).astype(jnp.int32)
  next_pos = positions[:, -1] + 1
  # Every cache slot's position (the new tokens' are known ahead): sliding-window layers see the keys of the last
  # `window` positions only, however long the cache.
  cache_positions = jnp.concatenate([positions, next_pos[:, None] + jnp.arange(max_new_tokens)], axis=1)[:, None]

  def cond(state):
    step, done = state[0], state[7]
    return (step < max_new_tokens) & ~done.all()

  def body(state):
    step, tokens, current, pos, cache_k, cache_v, cache_valid, done, automaton, lengths = state
    tokens = tokens.at[:, step].set(jnp.where(done, pad_id, current))
    lengths = lengths + (~done).astype(jnp.int32)
    done = done | (current[:, None] == eos_ids[None]).any(-1) | stop_hit[current, automaton]
    automaton = stop_next[current, automaton]
    # Its cache holds values as the keys, [L, B, C, K, Dh]: moved positions-last in every step, as `Context` takes
    # them (the move XLA made inside the attention's product before `Context` held values that way).
    context = Context(cache_k, jnp.moveaxis(cache_v, 2, -1), cache_valid[:, None, :], cache_positions)
    out = module.apply({"params": params}, current[:, None, None], pos[:, None, None], ablation=ablation,
                       context=context, outputs=OutputSpec(kv=True), dtype=dtype)
    write = seq + step
    cache_k = jax.lax.dynamic_update_slice_in_dim(cache_k, out.k[:, :, 0], write, axis=2)
    cache_v = jax.lax.dynamic_update_slice_in_dim(cache_v, out.v[:, :, 0], write, axis=2)
    cache_valid = jax.lax.dynamic_update_slice_in_dim(cache_valid, jnp.ones((batch, 1), bool), write, axis=1)
    following = jnp.argmax(lm_logits(config, params, out.hidden[:, 0, 0]), axis=-1).astype(jnp.int32)
    return step + 1, tokens, following, pos + 1, cache_k, cache_v, cache_valid, done, automaton, lengths

  state = (jnp.int32(0), jnp.full((batch, max_new_tokens), pad_id, jnp.int32), first, next_pos, cache_k,
           cache_v, cache_valid, ~active, jnp.zeros((batch,), jnp.int32),
           jnp.zeros((batch,), jnp.int32))
  final = jax.lax.while_loop(cond, body, state)
  return final[1], final[9]


def generation_rows(planner, prompt_len: int, max_new: int, pairs: int, platform: str | None = None) -> int:
  """Rows of one generation call for `pairs` (mask, prompt) rows: each holds a key/value cache of the prompt and
  its new tokens, and the prefill's activations (capped at 64 rows on CPUs, 256 on accelerators; `platform`
  names the one whose cap applies, default this machine's); at most the power of two at or above `pairs` (a
  handful of shapes whatever the count); a multiple of the data-parallel size."""
  if planner.generation_batch:
    batch = planner.generation_batch
  else:
    c = planner.model
    cache = c.num_layers * (prompt_len + max_new) * c.num_kv_heads * c.head_dim * 2 * planner.dtype_bytes
    prefill = planner.activation_bytes(1, 1, prompt_len, 0, 1)
    batch = max(1, int(planner.budget // (cache + prefill)))
    batch = min(batch, 256 if (platform or jax.devices()[0].platform) != "cpu" else 64)
  batch = min(batch, batching.bucket_pow2(pairs))
  return max(planner.data_parallel, -(-batch // planner.data_parallel) * planner.data_parallel)


class PreviousGenerator:
  """The generator before shared-prefix generation: `generate` and `generate_tokens` as `Engine` had them."""

  def __init__(self, shared: SharedResources):
    self.shared = shared
    module, config, dtype = shared.module, shared.model_config, shared.placement.dtype
    self._generate_fn = shared.jit(functools.partial(greedy_generate, module, config, dtype=dtype),
                                   static_argnames=("max_new_tokens", "pad_id"))
    self._streams_fn = shared.jit(functools.partial(prompt_streams, module, dtype=dtype))
    self.jitted = (self._generate_fn, self._streams_fn)
    self._stop_cache: dict = {}
    self._token_strings: list[str] | None = None

  # What a benchmark reads of an engine, so that it times this generator as it times one.
  stats = property(lambda self: self.shared.stats)
  tokenizer = property(lambda self: self.shared.model.tokenizer)
  model_config = property(lambda self: self.shared.model_config)

  def _stop_tables(self, stops: tuple[str, ...]):
    """Device tables of the stop-string automaton for `stops` (cached; the vocabulary is decoded once)."""
    if stops not in self._stop_cache:
      vocab = self.shared.model_config.vocab_size
      if stops and self._token_strings is None:
        tok = self.shared.model.tokenizer
        known = len(tok)  # embedding rows past the tokenizer's vocabulary are never-emitted padding
        self._token_strings = [tok.decode([i], skip_special_tokens=True) if i < known else "" for i in range(vocab)]
      strings = self._token_strings if stops else [""] * vocab
      tables = stop_strings.stop_tables(strings, stops)
      self._stop_cache[stops] = tuple(self.shared.placement.put(t) for t in tables)
    return self._stop_cache[stops]

  def _eos_ids(self) -> list[int]:
    tok = self.shared.model.tokenizer
    extra = [tok.eos_token_id] if tok is not None and tok.eos_token_id is not None else []
    return sorted({*self.shared.model_config.eos_token_ids, *extra}) or [-1]

  def _generate_pairs(self, prompt_ids: Sequence[Sequence[int]], pairs: Sequence[tuple[int, int]],
                      masks: Masks, fill: Fills, stops: tuple[str, ...], max_new: int,
                      progress: Callable[[int], None] | None = None) -> Iterator[tuple[tuple[int, int], list[int]]]:
    """Greedy tokens for each (mask index, prompt index) pair, in left-padded batches of one compiled loop.

    Yields ((mask, prompt), generated ids up to and including the stop token) as batches finish.
    """
    if not pairs:
      return
    shared, place = self.shared, self.shared.placement
    num_layers, pad_id = shared.model_config.num_layers, shared.pad_id
    stop_next, stop_hit = self._stop_tables(stops)
    eos_ids = place.put(np.asarray(self._eos_ids(), np.int32))
    max_new_bucket = batching.bucket_pow2(max_new)
    longest = max(len(prompt_ids[i]) for _, i in pairs)
    batch = generation_rows(shared.planner, batching.bucket_coarse(longest), max_new_bucket, len(pairs))
    rows1, rows2, rows3 = (place.split(n) for n in (1, 2, 3))
    starts = (start_layers(shared.model_config, masks) if shared.planner.residual_cache
              else np.zeros(len(masks), np.int64))
    streams = None
    if starts.max() > 0:
      # Rows resume at their batch's lowest first ablated layer from the prompts' unablated prefill (computed once
      # per prompt) when that computes fewer prompt tokens × layers than every row prefilling itself. Batches pad
      # to their longest prompt: keep the callers' order (one prompt under many masks per batch, little padding)
      # or group rows by start layer, whichever costs less.
      by_start = sorted(pairs, key=lambda pair: starts[pair[0]])
      order = min((pairs, by_start), key=lambda o: self._prefill_cost(o, prompt_ids, starts, batch))
      distinct = sorted({i for _, i in pairs})
      shared_cost = (len(distinct) * batching.bucket_coarse(max(len(prompt_ids[i]) for i in distinct)) * num_layers
                     + self._prefill_cost(order, prompt_ids, starts, batch))
      if shared_cost < self._prefill_cost(pairs, prompt_ids, np.zeros_like(starts), batch):
        streams = self._prompt_streams(prompt_ids, distinct)
    if streams is not None:
      prompts, streams = streams
      pairs = order
    for begin in range(0, len(pairs), batch):
      start = time.perf_counter()
      chunk = pairs[begin:begin + batch]
      width = batching.bucket_coarse(max(len(prompt_ids[i]) for _, i in chunk))
      prompt = np.full((batch, width), pad_id, np.int32)
      valid = np.zeros((batch, width), bool)
      for row in range(batch):  # rows past the chunk repeat its first prompt (inactive, never read)
        ids = list(prompt_ids[(chunk[row] if row < len(chunk) else chunk[0])[1]])[-width:]
        prompt[row, width - len(ids):] = ids
        valid[row, width - len(ids):] = True
      row_masks = masks.rows(np.array([m for m, _ in chunk], np.int64)).padded(batch)
      layer = min(int(min(starts[m] for m, _ in chunk)), num_layers - 1)
      resume = None
      if streams is not None:  # even at layer 0: one compiled variant for every batch of these pairs
        row_prompt = np.array([prompts[(chunk[row] if row < len(chunk) else chunk[0])[1]] for row in range(batch)],
                              np.int32)
        resume = (place.put(np.int32(layer)), place.put(row_prompt, rows1), streams)
      tokens, lengths = self._generate_fn(
          place.params, place.ablation(row_masks, fill, rows3), place.put(prompt, rows2), place.put(valid, rows2),
          place.put(np.arange(batch) < len(chunk), rows1), eos_ids, stop_next, stop_hit, resume,
          max_new_tokens=max_new_bucket, pad_id=pad_id)
      tokens, lengths = to_host(tokens), np.minimum(to_host(lengths), max_new)
      shared.stats.calls += 1
      shared.stats.seconds += time.perf_counter() - start
      shared.stats.tokens += int(lengths[:len(chunk)].sum())
      for row, pair in enumerate(chunk):
        yield pair, tokens[row, :lengths[row]].tolist()
      if progress:
        progress(len(chunk))

  def _prefill_cost(self, pairs, prompt_ids, starts: np.ndarray, batch: int) -> int:
    """Prompt token rows × layers the prefill computes for `pairs` cut into batches in this order."""
    num_layers = self.shared.model_config.num_layers
    cost = 0
    for begin in range(0, len(pairs), batch):
      chunk = pairs[begin:begin + batch]
      layer = min(int(min(starts[m] for m, _ in chunk)), num_layers - 1)
      cost += batch * batching.bucket_coarse(max(len(prompt_ids[i]) for _, i in chunk)) * (num_layers - layer)
    return cost

  def _prompt_streams(self, prompt_ids, distinct: list[int]):
    """The unablated prefill (`prompt_streams`) of the prompts `distinct`, left-padded to one width, when
    it fits the residual cache: ({prompt: row}, device arrays); else None. Rows pad to a power of two (repeating the
    first prompt), so that prompt sets of similar sizes share a compiled shape."""
    shared, place = self.shared, self.shared.placement
    width = batching.bucket_coarse(max(len(prompt_ids[i]) for i in distinct))
    size = shared.planner.prompt_stream_bytes(batching.bucket_pow2(len(distinct)), width)
    if not shared.planner.fits_residual_cache(size):
      log.warning("the unablated prefill of %d prompts needs %.2f GiB, over the residual cache of %.2f GiB: every "
                  "generation row starts at layer 0 (raise --residual_cache_gb to share it)", len(distinct),
                  size / GIB, shared.planner.residual_cache / GIB)
      return None
    rows = batching.bucket_pow2(len(distinct))
    prompt = np.full((rows, width), shared.pad_id, np.int32)
    valid = np.zeros((rows, width), bool)
    for row in range(rows):
      ids = list(prompt_ids[distinct[row] if row < len(distinct) else distinct[0]])[-width:]
      prompt[row, width - len(ids):] = ids
      valid[row, width - len(ids):] = True
    start = time.perf_counter()
    streams = self._streams_fn(place.params, place.put(prompt), place.put(valid))
    shared.stats.calls += 1
    shared.stats.seconds += time.perf_counter() - start
    return {i: row for row, i in enumerate(distinct)}, streams

  def generate(self, requests: Sequence[GenerationRequest], head_masks=None, head_fill=None,
               progress: Callable[[int], None] | None = None, *, neuron_masks=None, neuron_fill=None
               ) -> list[list[str]]:
    """Greedy continuations [M][R] of every request under every mask, cut at the first stop string."""
    config = self.shared.model_config
    masks = check_masks(config, head_masks, neuron_masks)
    tok = self.shared.model.tokenizer
    if tok is None:
      raise UserError("this model directory ships no tokenizer; generation needs one")
    prompt_ids: dict[int, list[int]] = {}
    for add_special in (True, False):
      group = [i for i, r in enumerate(requests) if r.add_special_tokens == add_special]
      if group:
        ids = tok([requests[i].context for i in group], add_special_tokens=add_special)["input_ids"]
        prompt_ids.update(zip(group, ids))
    fill = self.shared.placement.fills(check_fills(config, head_fill, neuron_fill))
    texts = [[""] * len(requests) for _ in range(len(masks))]
    # Requests that share stop strings and a token budget share one compiled loop bound.
    groups: dict = {}
    for i, r in enumerate(requests):
      groups.setdefault((tuple(r.stop), r.max_new_tokens), []).append(i)
    for (stops, max_new), members in groups.items():
      members = sorted(members, key=lambda i: len(prompt_ids[i]))  # similar lengths pad together
      pairs = [(m, i) for i in members for m in range(len(masks))]
      for (m, i), ids in self._generate_pairs(prompt_ids, pairs, masks, fill, stops, max_new, progress):
        texts[m][i] = stop_strings.truncate_at_stop(tok.decode(ids, skip_special_tokens=True), stops)
    return texts

  def generate_tokens(self, prompt_ids: Sequence[Sequence[int]], head_masks, max_new_tokens: int,
                      head_fill=None, *, neuron_masks=None, neuron_fill=None) -> list[list[list[int]]]:
    """Greedy token ids [M][R] for pre-tokenized prompts, stopping at EOS only (for parity checks)."""
    config = self.shared.model_config
    masks = check_masks(config, head_masks, neuron_masks)
    out: list[list[list[int]]] = [[[] for _ in prompt_ids] for _ in range(len(masks))]
    pairs = [(m, i) for m in range(len(masks)) for i in range(len(prompt_ids))]
    fill = self.shared.placement.fills(check_fills(config, head_fill, neuron_fill))
    for (m, i), ids in self._generate_pairs(prompt_ids, pairs, masks, fill, (), max_new_tokens):
      out[m][i] = ids
    return out
