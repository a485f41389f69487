"""The engine: evaluate a model under a stack of head masks [masks, layers, heads] and/or neuron masks
[masks, layers, mlp] in compiled batches.

Masks here are keep-masks (1 keep, 0 ablate), the model's convention; localization designs (True =
ablated) convert with `keep = 1 - ablated`.

    engine = Engine(load_model("smollm2-135m"))
    out = engine.score(requests, head_masks)     # ScoreOutputs, logprob/is_greedy [M, R]
    out = engine.score(requests, neuron_masks=neuron_masks)  # the same under neuron masks
    texts = engine.generate(requests, head_masks)  # [M][R] strings, cut at stop strings

Everything per call is one jitted function; shapes are bucketed (see `batching.py`) so a run compiles
a handful of times; `compile_count` reports how many. Short requests are packed several to a row (`scoring.arrange`),
and masks are grouped by the first layer they ablate: a batch starts there from the unablated model's residual
streams, kept per request set within `residual_cache_bytes` (generation rows likewise share their prompts'
unablated prefill below that layer).
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

from jaxloc.engine import batching, generation, mesh as mesh_lib, scoring
from jaxloc.engine.requests import GenerationRequest, ScoreOutputs, ScoringRequest
from jaxloc.errors import UserError
from jaxloc.models.llama import Ablation, OutputSpec
from jaxloc.models.loading import LoadedModel

log = logging.getLogger(__name__)

# Request layouts kept (oldest dropped first): a localization reuses a handful, a trained mask one per step.
MAX_LAYOUTS = 32


@dataclasses.dataclass
class EngineStats:
  """What the engine did, for throughput reports."""

  calls: int = 0
  mask_evaluations: int = 0
  tokens: int = 0  # real tokens computed (shared prefix counted once per mask), padding excluded
  padded_tokens: int = 0
  layer_tokens: int = 0  # scoring: real tokens times the layers computed for them (fewer past a batch's start layer)
  targets: int = 0  # scoring: real continuation tokens scored (the LM head runs at each)
  seconds: float = 0.0


@dataclasses.dataclass
class Masks:
  """The keep-masks of one engine call, float32: heads [M, L, H] and/or neurons [M, L, F] (1 keep, 0 ablate)."""

  heads: np.ndarray | None
  neurons: np.ndarray | None

  def __len__(self) -> int:
    return len(self.heads if self.heads is not None else self.neurons)

  def rows(self, where) -> "Masks":
    return Masks(*(None if m is None else m[where] for m in (self.heads, self.neurons)))

  def padded(self, size: int) -> "Masks":
    """Padded to `size` masks with unablated ones (one shape for the whole run)."""
    pad = lambda m: m if m is None or len(m) >= size else np.concatenate(  # noqa: E731
        [m, np.ones((size - len(m),) + m.shape[1:], m.dtype)])
    return Masks(pad(self.heads), pad(self.neurons))


@dataclasses.dataclass
class Fills:
  """Mean-ablation values on the devices: heads [L, H, Dh] and neurons [L, F] (None: zero ablation)."""

  heads: jax.Array | None = None
  neurons: jax.Array | None = None


class Engine:
  """Scores and generates for many head and/or neuron masks × requests on every device of a mesh."""

  def __init__(self, model: LoadedModel, *, mesh: jax.sharding.Mesh | None = None,
               memory_budget_bytes: int | None = None, tokens_per_batch: int | None = None,
               share_prefix: bool = True, pack: bool = True, residual_cache_bytes: int | None = None,
               generation_batch: int | None = None, activation_dtype=None):
    """memory_budget_bytes: activations of one call plus the residual cache (default `batching.default_memory_budget`).
    pack: several short requests share a row (`scoring.arrange`); False gives one request per row.
    residual_cache_bytes: room for the unablated residual streams that let a batch of masks start at its first
      ablated layer (default a quarter of the memory budget; 0 starts every mask at layer 0). A request set whose
      streams do not fit is scored from layer 0, with a warning.
    """
    self.model = model
    self.config = model.config
    self.mesh = mesh or mesh_lib.make_mesh()
    self.data_parallel = self.mesh.shape[mesh_lib.DATA]
    self.memory_budget = memory_budget_bytes or batching.default_memory_budget()
    self.tokens_per_batch = tokens_per_batch or batching.default_tokens_per_batch()
    self.share_prefix = share_prefix
    self.pack = pack
    self.residual_cache_bytes = self.memory_budget // 4 if residual_cache_bytes is None else residual_cache_bytes
    if not 0 <= self.residual_cache_bytes < self.memory_budget:
      raise UserError(f"the residual cache ({self.residual_cache_bytes / batching.GIB:.2f} GiB) must be under the "
                      f"memory budget ({self.memory_budget / batching.GIB:.2f} GiB)")
    self.generation_batch = generation_batch
    # Activations (residual stream, every matmul's inputs) in `activation_dtype`; the parameters stay in the model's
    # dtype in memory and are cast per layer (bfloat16 weights with a float32 residual stream).
    self.dtype = activation_dtype or model.dtype
    self.params = mesh_lib.shard_params(model.params, self.mesh)
    self.stats = EngineStats()
    self._layouts: dict = {}
    self._residuals: dict = {}  # (requests, chunk shape) -> (unablated residual streams per chunk, bytes), LRU first
    self._too_big: set = set()  # layout keys whose streams did not fit the residual cache
    self._stop_cache: dict = {}
    self._token_strings: list[str] | None = None
    module, config, dtype = model.module, model.config, self.dtype
    self._prefix_fn = jax.jit(functools.partial(scoring.prefix_context, module, dtype=dtype))
    self._score_fn = jax.jit(functools.partial(scoring.score_chunk, module, config, dtype=dtype))
    self._residuals_fn = jax.jit(functools.partial(scoring.unablated_residuals, module, dtype=dtype))
    self._generate_fn = jax.jit(functools.partial(generation.greedy_generate, module, config, dtype=dtype),
                                static_argnames=("max_new_tokens", "pad_id"))
    self._streams_fn = jax.jit(functools.partial(generation.prompt_streams, module, dtype=dtype))
    self._sums_fn = jax.jit(functools.partial(_unit_sums, module, dtype=dtype))
    self._objective_fn = jax.jit(functools.partial(scoring.mask_objective_and_grad, module, config, dtype=dtype),
                                 static_argnames=("retained",))
    self._attribution_fn = jax.jit(functools.partial(scoring.neuron_integrated_gradients, module, config,
                                                     dtype=dtype), static_argnames=("steps",))

  # -- bookkeeping ----------------------------------------------------------------------------

  @property
  def compile_count(self) -> int:
    """Distinct compiled shapes so far, over all of the engine's jitted functions."""
    return sum(fn._cache_size() for fn in (self._prefix_fn, self._score_fn, self._residuals_fn,  # noqa: SLF001
                                           self._generate_fn, self._streams_fn, self._sums_fn, self._objective_fn,
                                           self._attribution_fn))

  @property
  def tokenizer(self):
    return self.model.tokenizer

  @property
  def pad_id(self) -> int:
    tok = self.model.tokenizer
    for candidate in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None),
                      self.config.pad_token_id):
      if candidate is not None:
        return int(candidate)
    return 0

  def _check_masks(self, head_masks, neuron_masks=None) -> Masks:
    c = self.config
    checked = []
    for kind, given, units in (("head", head_masks, c.num_heads), ("neuron", neuron_masks, c.intermediate_size)):
      if given is None:
        checked.append(None)
        continue
      masks = np.asarray(given, np.float32)
      if masks.ndim == 2:
        masks = masks[None]
      if masks.ndim != 3 or masks.shape[1:] != (c.num_layers, units):
        raise UserError(f"{kind} masks must be [masks, {c.num_layers}, {units}] for this model, "
                        f"got {list(np.shape(given))}")
      checked.append(masks)
    if checked[0] is None and checked[1] is None:
      raise UserError("no head or neuron masks given")
    if checked[0] is not None and checked[1] is not None and len(checked[0]) != len(checked[1]):
      raise UserError(f"{len(checked[0])} head masks but {len(checked[1])} neuron masks; give one of each per mask")
    return Masks(*checked)

  def _fill(self, head_fill, neuron_fill=None) -> Fills:
    c = self.config
    fills = []
    for kind, given, expected in (("head", head_fill, (c.num_layers, c.num_heads, c.head_dim)),
                                  ("neuron", neuron_fill, (c.num_layers, c.intermediate_size))):
      if given is None:
        fills.append(None)
        continue
      fill = np.asarray(given, np.float32)
      if fill.shape != expected:
        raise UserError(f"{kind} mean-ablation values must be {list(expected)}, got {list(fill.shape)}")
      fills.append(mesh_lib.put(fill.astype(self.dtype), mesh_lib.replicated(self.mesh)))
    return Fills(*fills)

  def _ablation(self, masks: Masks, fills: Fills, sharding) -> Ablation:
    """The model's `Ablation` for a batch of masks, placed with `sharding`."""
    put = lambda m: None if m is None else mesh_lib.put(m.astype(self.dtype), sharding)  # noqa: E731
    return Ablation(put(masks.heads), fills.heads if masks.heads is not None else None,
                    put(masks.neurons), fills.neurons if masks.neurons is not None else None)

  # -- scoring --------------------------------------------------------------------------------

  def prepare(self, requests: Sequence[ScoringRequest], num_masks: int) -> tuple[scoring.ScoringLayout,
                                                                                 batching.ScoringBatches]:
    """Tokenizes and lays out a request set (cached: localization scores the same set many times)."""
    key = (tuple(requests), num_masks)
    if key in self._layouts:
      return self._layouts[key]
    if not requests:
      raise UserError("no requests to score")
    tokenized = scoring.tokenize(self.model.tokenizer, requests, self.config.max_position_embeddings)
    prefix_len = scoring.shared_prefix_length(tokenized) if self.share_prefix else 0
    c = self.config
    key_cost = 4 * c.num_heads * c.head_dim * c.num_layers / c.flops_per_token(with_lm_head=False)
    rows, width = scoring.arrange(tokenized, prefix_len, self.pack, key_cost)
    row_tokens = [sum(len(tokenized.sequences[i]) - prefix_len - 1 for i in row) for row in rows]
    plan = batching.plan_scoring(
        self.config, num_masks=num_masks, num_requests=len(rows),
        mean_seq=float(width if self.pack else np.mean(row_tokens)), max_seq=width, context=prefix_len,
        max_targets=max(int(tokenized.num_targets[row].sum()) for row in rows),
        dtype_bytes=jnp.dtype(self.dtype).itemsize, tokens_per_batch=self.tokens_per_batch,
        memory_budget=self.memory_budget - self.residual_cache_bytes, data_parallel=self.data_parallel)
    # Equal chunks: 100 rows at 97 per call would pad the second call to 97 rows for 3.
    num_chunks = -(-len(rows) // plan.requests_per_call)
    rows_per_chunk = -(-len(rows) // num_chunks)
    if plan.masks_per_call % self.data_parallel:  # masks cannot be split: split rows instead
      rows_per_chunk = -(-rows_per_chunk // self.data_parallel) * self.data_parallel
    lay = scoring.layout(tokenized, rows, rows_per_chunk, prefix_len, self.pad_id, width if self.pack else None)
    log.info("scoring %d requests: shared prefix %d tokens, %d rows (%s), %d chunks of %d rows, %d masks per call, "
             "~%.2f GiB per call", len(requests), prefix_len, len(rows),
             f"packed, {width} wide" if self.pack else "one request each", len(lay.chunks), rows_per_chunk,
             plan.masks_per_call, plan.estimated_bytes / batching.GIB)
    if len(self._layouts) >= MAX_LAYOUTS:  # a learned mask lays out a new minibatch of requests every step
      self._layouts.pop(next(iter(self._layouts)))
    self._layouts[key] = lay, plan
    return lay, plan

  def masks_per_call(self, requests: Sequence[ScoringRequest], num_masks: int) -> int:
    return self.prepare(requests, num_masks)[1].masks_per_call

  def start_layers(self, masks: Masks) -> np.ndarray:
    """First layer each mask ablates anything in (int [M]; num_layers for a mask that ablates nothing)."""
    touched = np.zeros((len(masks), self.config.num_layers), bool)
    for given in (masks.heads, masks.neurons):
      if given is not None:
        touched |= (given != 1).any(axis=2)
    return np.where(touched.any(axis=1), touched.argmax(axis=1), self.config.num_layers)

  def _residual_streams(self, requests: Sequence[ScoringRequest], lay: scoring.ScoringLayout, chunks: list):
    """The unablated residual streams of a laid-out request set, per chunk (computed once per request set and chunk
    shape, whatever the number of masks; kept while the residual cache has room, least recently used dropped
    first); None when they cannot fit it."""
    key = (tuple(requests), len(lay.chunks), lay.chunks[0].rows.tokens.shape)
    if key in self._residuals:
      self._residuals[key] = self._residuals.pop(key)  # most recently used last
      return self._residuals[key][0]
    c = self.config
    size = (c.num_layers * c.hidden_size * jnp.dtype(self.dtype).itemsize
            * (len(lay.prefix) + sum(chunk.rows.tokens.size for chunk in lay.chunks)))
    if size > self.residual_cache_bytes:
      if key not in self._too_big:
        self._too_big.add(key)
        log.warning("the unablated residual streams of %d requests need %.2f GiB, over the residual cache of %.2f "
                    "GiB: every mask of them starts at layer 0 (raise --residual_cache_gb to skip unablated layers)",
                    len(requests), size / batching.GIB, self.residual_cache_bytes / batching.GIB)
      return None
    while self._residuals and sum(b for _, b in self._residuals.values()) + size > self.residual_cache_bytes:
      self._residuals.pop(next(iter(self._residuals)))
    start = time.perf_counter()
    prefix = mesh_lib.put(lay.prefix, mesh_lib.replicated(self.mesh)) if len(lay.prefix) else None
    streams = [self._residuals_fn(self.params, prefix, rows) for _, rows in chunks]
    self._residuals[key] = streams, size
    self.stats.calls += len(chunks)
    self.stats.seconds += time.perf_counter() - start
    return streams

  def score_batches(self, requests: Sequence[ScoringRequest], head_masks=None, head_fill=None, *,
                    neuron_masks=None, neuron_fill=None) -> Iterator[tuple[slice, ScoreOutputs]]:
    """Yields (mask slice, outputs for those masks) in mask order as batches finish, so callers can checkpoint.

    Masks are evaluated grouped by the first layer they ablate (a stable sort, so masks already in that order keep
    it): a batch starts at its lowest first ablated layer, from the unablated residual streams, when they fit the
    residual cache."""
    masks = self._check_masks(head_masks, neuron_masks)
    lay, plan = self.prepare(requests, len(masks))
    fill = self._fill(head_fill, neuron_fill)
    per_call = plan.masks_per_call
    shard_masks = per_call % self.data_parallel == 0
    mask_sharding = (mesh_lib.data_sharding(self.mesh, 3) if shard_masks else mesh_lib.replicated(self.mesh))
    row_sharding = (mesh_lib.replicated(self.mesh) if shard_masks else mesh_lib.data_sharding(self.mesh, 2))
    replicated = mesh_lib.replicated(self.mesh)
    prefix = mesh_lib.put(lay.prefix, replicated) if len(lay.prefix) else None
    chunks = [(chunk, self._put_rows(chunk.rows, row_sharding)) for chunk in lay.chunks]
    starts = self.start_layers(masks) if self.residual_cache_bytes else np.zeros(len(masks), np.int64)
    streams = self._residual_streams(requests, lay, chunks) if starts.max() > 0 else None
    if streams is None:
      starts = np.zeros(len(masks), np.int64)
    order = np.argsort(starts, kind="stable")
    num_layers = self.config.num_layers

    def dispatch(begin: int):
      """Starts one batch of masks on the devices (asynchronously) and returns its handles."""
      start = time.perf_counter()
      members = order[begin:begin + per_call]
      ablation = self._ablation(masks.rows(members).padded(per_call), fill, mask_sharding)
      layer = min(int(starts[members].min()), num_layers - 1)
      if streams is None:
        context = self._prefix_fn(self.params, ablation, prefix) if prefix is not None else None
        results = [self._score_fn(self.params, ablation, context, rows) for _, rows in chunks]
      else:
        at = mesh_lib.put(np.int32(layer), replicated)
        context = (self._prefix_fn(self.params, ablation, prefix, at, streams[0][0]) if prefix is not None
                   else None)
        results = [self._score_fn(self.params, ablation, context, rows, at, chunk_streams[1])
                   for (_, rows), chunk_streams in zip(chunks, streams)]
      return members, layer, results, time.perf_counter() - start

    logprob = np.zeros((len(masks), lay.num_requests), np.float32)
    is_greedy = np.zeros((len(masks), lay.num_requests), bool)
    done = np.zeros(len(masks), bool)

    def collect(members: np.ndarray, layer: int, results, seconds: float):
      start = time.perf_counter()
      real = len(members)
      for (chunk, _), (lp, greedy) in zip(chunks, results):
        slots = chunk.index >= 0
        requests_of = chunk.index[slots]
        logprob[np.ix_(members, requests_of)] = mesh_lib.to_host(lp)[:real, slots]
        is_greedy[np.ix_(members, requests_of)] = mesh_lib.to_host(greedy)[:real, slots]
      done[members] = True
      self.stats.calls += len(chunks) + (prefix is not None)
      self.stats.mask_evaluations += real
      self.stats.tokens += real * lay.tokens_per_mask
      self.stats.padded_tokens += per_call * lay.padded_tokens_per_mask
      self.stats.layer_tokens += real * lay.tokens_per_mask * (num_layers - layer)
      self.stats.targets += real * int(lay.num_targets.sum())
      self.stats.seconds += seconds + time.perf_counter() - start

    # The next batch is dispatched before the caller gets (and saves) the previous one, so the devices never
    # wait for the host's bookkeeping.
    ready = 0
    pending = dispatch(0)
    for begin in range(per_call, len(masks) + per_call, per_call):
      following = dispatch(begin) if begin < len(masks) else None
      collect(*pending)
      pending = following
      finished = ready + int(np.argmin(np.append(done[ready:], False)))
      if finished > ready:
        yield slice(ready, finished), ScoreOutputs(logprob[ready:finished], is_greedy[ready:finished], lay.num_targets)
        ready = finished

  def _put_rows(self, rows: scoring.Rows, row_sharding) -> scoring.Rows:
    """A chunk's arrays on the devices: token rows with `row_sharding`, targets replicated."""
    replicated = mesh_lib.replicated(self.mesh)
    return scoring.Rows(*(mesh_lib.put(getattr(rows, f.name), row_sharding if f.name in ("tokens", "positions",
                                                                                         "segments") else replicated)
                          for f in dataclasses.fields(rows)))

  def score(self, requests: Sequence[ScoringRequest], head_masks=None, head_fill=None,
            progress: Callable[[int], None] | None = None, *, neuron_masks=None, neuron_fill=None) -> ScoreOutputs:
    """Teacher-forced scores of every request under every mask (head masks [M, L, H] and/or neuron masks
    [M, L, F], 1 keep / 0 ablate)."""
    masks = self._check_masks(head_masks, neuron_masks)
    logprob = np.zeros((len(masks), len(requests)), np.float32)
    is_greedy = np.zeros((len(masks), len(requests)), bool)
    num_targets = None
    for where, out in self.score_batches(requests, masks.heads, head_fill, neuron_masks=masks.neurons,
                                         neuron_fill=neuron_fill):
      logprob[where], is_greedy[where], num_targets = out.logprob, out.is_greedy, out.num_tokens
      if progress:
        progress(where.stop - where.start)
    return ScoreOutputs(logprob, is_greedy, num_targets)

  # -- generation -----------------------------------------------------------------------------

  def _generation_batch(self, prompt_len: int, max_new: int, pairs: int) -> int:
    if self.generation_batch:
      batch = self.generation_batch
    else:
      c = self.config
      dtype_bytes = jnp.dtype(self.dtype).itemsize
      cache = c.num_layers * (prompt_len + max_new) * c.num_kv_heads * c.head_dim * 2 * dtype_bytes
      prefill = batching.activation_bytes(c, 1, 1, prompt_len, 0, 1, dtype_bytes)
      batch = max(1, int(self.memory_budget // (cache + prefill)))
      batch = min(batch, 256 if jax.devices()[0].platform != "cpu" else 64)
    batch = min(batch, max(pairs, 1))
    return max(self.data_parallel, -(-batch // self.data_parallel) * self.data_parallel)

  def _stop_tables(self, stops: tuple[str, ...]):
    """Device tables of the stop-string automaton for `stops` (cached; the vocabulary is decoded once)."""
    if stops not in self._stop_cache:
      if stops and self._token_strings is None:
        tok = self.model.tokenizer
        known = len(tok)  # embedding rows past the tokenizer's vocabulary are never-emitted padding
        self._token_strings = [tok.decode([i], skip_special_tokens=True) if i < known else ""
                               for i in range(self.config.vocab_size)]
      strings = self._token_strings if stops else [""] * self.config.vocab_size
      tables = generation.stop_tables(strings, stops)
      self._stop_cache[stops] = tuple(mesh_lib.put(t, mesh_lib.replicated(self.mesh)) for t in tables)
    return self._stop_cache[stops]

  def _eos_ids(self) -> list[int]:
    tok = self.model.tokenizer
    extra = [tok.eos_token_id] if tok is not None and tok.eos_token_id is not None else []
    return sorted({*self.config.eos_token_ids, *extra}) or [-1]

  def _generate_pairs(self, prompt_ids: Sequence[Sequence[int]], pairs: Sequence[tuple[int, int]],
                      masks: Masks, fill: Fills, stops: tuple[str, ...], max_new: int,
                      progress: Callable[[int], None] | None = None) -> Iterator[tuple[tuple[int, int], list[int]]]:
    """Greedy tokens for each (mask index, prompt index) pair, in left-padded batches of one compiled loop.

    Yields ((mask, prompt), generated ids up to and including the stop token) as batches finish.
    """
    if not pairs:
      return
    stop_next, stop_hit = self._stop_tables(stops)
    eos_ids = mesh_lib.put(np.asarray(self._eos_ids(), np.int32), mesh_lib.replicated(self.mesh))
    max_new_bucket = batching.bucket_pow2(max_new)
    longest = max(len(prompt_ids[i]) for _, i in pairs)
    batch = self._generation_batch(batching.bucket(longest), max_new_bucket, len(pairs))
    rows1, rows2, rows3 = (mesh_lib.data_sharding(self.mesh, n) for n in (1, 2, 3))
    replicated = mesh_lib.replicated(self.mesh)
    starts = self.start_layers(masks) if self.residual_cache_bytes else np.zeros(len(masks), np.int64)
    streams = None
    if starts.max() > 0:
      # Rows resume at their batch's lowest first ablated layer from the prompts' unablated prefill (computed once
      # per prompt) when that computes fewer prompt tokens × layers than every row prefilling itself. Batches pad
      # to their longest prompt: keep the callers' order (one prompt under many masks per batch, little padding)
      # or group rows by start layer, whichever costs less.
      by_start = sorted(pairs, key=lambda pair: starts[pair[0]])
      order = min((pairs, by_start), key=lambda o: self._prefill_cost(o, prompt_ids, starts, batch))
      distinct = sorted({i for _, i in pairs})
      shared_cost = (len(distinct) * batching.bucket(max(len(prompt_ids[i]) for i in distinct))
                     * self.config.num_layers + self._prefill_cost(order, prompt_ids, starts, batch))
      if shared_cost < self._prefill_cost(pairs, prompt_ids, np.zeros_like(starts), batch):
        streams = self._prompt_streams(prompt_ids, distinct)
    if streams is not None:
      prompts, streams = streams
      pairs = order
    for begin in range(0, len(pairs), batch):
      start = time.perf_counter()
      chunk = pairs[begin:begin + batch]
      width = batching.bucket(max(len(prompt_ids[i]) for _, i in chunk))
      prompt = np.full((batch, width), self.pad_id, np.int32)
      valid = np.zeros((batch, width), bool)
      for row in range(batch):  # rows past the chunk repeat its first prompt (inactive, never read)
        ids = list(prompt_ids[(chunk[row] if row < len(chunk) else chunk[0])[1]])[-width:]
        prompt[row, width - len(ids):] = ids
        valid[row, width - len(ids):] = True
      row_masks = masks.rows(np.array([m for m, _ in chunk], np.int64)).padded(batch)
      layer = min(int(min(starts[m] for m, _ in chunk)), self.config.num_layers - 1)
      shared = None
      if streams is not None and layer > 0:
        row_prompt = np.array([prompts[(chunk[row] if row < len(chunk) else chunk[0])[1]] for row in range(batch)],
                              np.int32)
        shared = (mesh_lib.put(np.int32(layer), replicated), mesh_lib.put(row_prompt, rows1), streams)
      tokens, lengths = self._generate_fn(
          self.params, self._ablation(row_masks, fill, rows3), mesh_lib.put(prompt, rows2),
          mesh_lib.put(valid, rows2), mesh_lib.put(np.arange(batch) < len(chunk), rows1),
          eos_ids, stop_next, stop_hit, shared, max_new_tokens=max_new_bucket, pad_id=self.pad_id)
      tokens, lengths = mesh_lib.to_host(tokens), np.minimum(mesh_lib.to_host(lengths), max_new)
      self.stats.calls += 1
      self.stats.seconds += time.perf_counter() - start
      self.stats.tokens += int(lengths[:len(chunk)].sum())
      for row, pair in enumerate(chunk):
        yield pair, tokens[row, :lengths[row]].tolist()
      if progress:
        progress(len(chunk))

  def _prefill_cost(self, pairs, prompt_ids, starts: np.ndarray, batch: int) -> int:
    """Prompt token rows × layers the prefill computes for `pairs` cut into batches in this order."""
    cost = 0
    for begin in range(0, len(pairs), batch):
      chunk = pairs[begin:begin + batch]
      layer = min(int(min(starts[m] for m, _ in chunk)), self.config.num_layers - 1)
      cost += batch * batching.bucket(max(len(prompt_ids[i]) for _, i in chunk)) * (self.config.num_layers - layer)
    return cost

  def _prompt_streams(self, prompt_ids, distinct: list[int]):
    """The unablated prefill (`generation.prompt_streams`) of the prompts `distinct`, left-padded to one width, when
    it fits the residual cache: ({prompt: row}, device arrays); else None."""
    c = self.config
    width = batching.bucket(max(len(prompt_ids[i]) for i in distinct))
    size = (c.num_layers * len(distinct) * width * (c.hidden_size + 2 * c.num_kv_heads * c.head_dim)
            * jnp.dtype(self.dtype).itemsize)
    if size > self.residual_cache_bytes:
      log.warning("the unablated prefill of %d prompts needs %.2f GiB, over the residual cache of %.2f GiB: every "
                  "generation row starts at layer 0 (raise --residual_cache_gb to share it)", len(distinct),
                  size / batching.GIB, self.residual_cache_bytes / batching.GIB)
      return None
    prompt = np.full((len(distinct), width), self.pad_id, np.int32)
    valid = np.zeros((len(distinct), width), bool)
    for row, i in enumerate(distinct):
      ids = list(prompt_ids[i])[-width:]
      prompt[row, width - len(ids):] = ids
      valid[row, width - len(ids):] = True
    replicated = mesh_lib.replicated(self.mesh)
    start = time.perf_counter()
    streams = self._streams_fn(self.params, mesh_lib.put(prompt, replicated), mesh_lib.put(valid, replicated))
    self.stats.calls += 1
    self.stats.seconds += time.perf_counter() - start
    return {i: row for row, i in enumerate(distinct)}, streams

  def generate(self, requests: Sequence[GenerationRequest], head_masks=None, head_fill=None,
               progress: Callable[[int], None] | None = None, *, neuron_masks=None, neuron_fill=None
               ) -> list[list[str]]:
    """Greedy continuations [M][R] of every request under every mask, cut at the first stop string."""
    masks = self._check_masks(head_masks, neuron_masks)
    tok = self.model.tokenizer
    if tok is None:
      raise UserError("this model directory ships no tokenizer; generation needs one")
    prompt_ids: dict[int, list[int]] = {}
    for add_special in (True, False):
      group = [i for i, r in enumerate(requests) if r.add_special_tokens == add_special]
      if group:
        ids = tok([requests[i].context for i in group], add_special_tokens=add_special)["input_ids"]
        prompt_ids.update(zip(group, ids))
    fill = self._fill(head_fill, neuron_fill)
    texts = [[""] * len(requests) for _ in range(len(masks))]
    # Requests that share stop strings and a token budget share one compiled loop bound.
    groups: dict = {}
    for i, r in enumerate(requests):
      groups.setdefault((tuple(r.stop), r.max_new_tokens), []).append(i)
    for (stops, max_new), members in groups.items():
      members = sorted(members, key=lambda i: len(prompt_ids[i]))  # similar lengths pad together
      pairs = [(m, i) for i in members for m in range(len(masks))]
      for (m, i), ids in self._generate_pairs(prompt_ids, pairs, masks, fill, stops, max_new, progress):
        texts[m][i] = generation.truncate_at_stop(tok.decode(ids, skip_special_tokens=True), stops)
    return texts

  def generate_tokens(self, prompt_ids: Sequence[Sequence[int]], head_masks, max_new_tokens: int,
                      head_fill=None, *, neuron_masks=None, neuron_fill=None) -> list[list[list[int]]]:
    """Greedy token ids [M][R] for pre-tokenized prompts, stopping at EOS only (for parity checks)."""
    masks = self._check_masks(head_masks, neuron_masks)
    out: list[list[list[int]]] = [[[] for _ in prompt_ids] for _ in range(len(masks))]
    pairs = [(m, i) for m in range(len(masks)) for i in range(len(prompt_ids))]
    fill = self._fill(head_fill, neuron_fill)
    for (m, i), ids in self._generate_pairs(prompt_ids, pairs, masks, fill, (), max_new_tokens):
      out[m][i] = ids
    return out

  # -- attribution ----------------------------------------------------------------------------

  def mask_objective(self, requests: Sequence[ScoringRequest], head_masks=None, weights: Sequence[float] | None = None,
                     offsets: Sequence[float] | None = None, *, retained: bool = False, head_fill=None,
                     neuron_masks=None, neuron_fill=None) -> tuple[np.ndarray, np.ndarray]:
    """Per keep-mask m (soft values allowed): sum_r weights[r] * f(logprob[m, r] - offsets[r]) and its gradient
    in the mask, float [M] and [M, L, H] (head masks) or [M, L, F] (neuron masks; give one kind); f is the identity,
    or with `retained` exp(min(., 0)), the probability a request keeps relative to `offsets`
    (`scoring.mask_objective`). Weights default to 1/R, offsets to 0.

    One forward and backward pass per request chunk and mask batch. At an all-ones mask with the defaults the
    gradient is the mask gradient: a unit whose gradient is large and positive loses the most log-probability
    when its output is scaled down.
    """
    masks = self._check_masks(head_masks, neuron_masks)
    if masks.heads is not None and masks.neurons is not None:
      raise UserError("mask_objective differentiates in one kind of mask: give head masks or neuron masks")
    lay, plan = self.prepare(requests, len(masks))
    weights = np.full(len(requests), 1.0 / len(requests)) if weights is None else np.asarray(weights, np.float64)
    offsets = np.zeros(len(requests)) if offsets is None else np.asarray(offsets, np.float64)
    for name, given in (("weight", weights), ("offset", offsets)):
      if given.shape != (len(requests),):
        raise UserError(f"need one {name} per request ({len(requests)}), got {given.shape}")
    replicated = mesh_lib.replicated(self.mesh)
    prefix = mesh_lib.put(lay.prefix, replicated) if len(lay.prefix) else None
    fill = self._fill(head_fill, neuron_fill)
    values = np.zeros(len(masks), np.float64)
    given = masks.heads if masks.heads is not None else masks.neurons
    grads = np.zeros(given.shape, np.float64)
    for chunk in lay.chunks:
      slots = chunk.index >= 0
      per_slot = [np.zeros(len(chunk.index), np.float32) for _ in range(2)]
      for slot_values, given in zip(per_slot, (weights, offsets)):
        slot_values[slots] = given[chunk.index[slots]]
      split = len(chunk.rows.tokens) % self.data_parallel == 0  # token rows over the data axis when they divide
      rows = self._put_rows(chunk.rows, mesh_lib.data_sharding(self.mesh, 2) if split else replicated)
      per_slot = [mesh_lib.put(a, replicated) for a in per_slot]
      for begin in range(0, len(masks), plan.masks_per_call):
        batch = masks.rows(slice(begin, begin + plan.masks_per_call))
        value, head_grad, neuron_grad = self._objective_fn(self.params, self._ablation(batch, fill, replicated),
                                                           prefix, rows, *per_slot, retained=retained)
        values[begin:begin + len(batch)] += mesh_lib.to_host(value)
        grads[begin:begin + len(batch)] += mesh_lib.to_host(head_grad if masks.heads is not None else neuron_grad)
    return values, grads

  def neuron_attribution(self, requests: Sequence[ScoringRequest], steps: int = 20, neuron_fill=None,
                         progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Integrated-gradients attribution float [R, L, F] of every neuron at each request's last context position
    for the probability of its continuation (`scoring.neuron_integrated_gradients`): value times the mean gradient
    along `steps` points of the path from 0 (the mean, with `neuron_fill`) to the neuron's value. Requests go in
    chunks sized so that a chunk's requests × steps rows fit the memory budget."""
    if steps < 1:
      raise UserError(f"integrated gradients need at least 1 step, got {steps}")
    c = self.config
    tokenized = scoring.tokenize(self.model.tokenizer, requests, c.max_position_embeddings)
    prefix_len = scoring.shared_prefix_length(tokenized) if self.share_prefix else 0
    suffix = batching.bucket(max(len(s) for s in tokenized.sequences) - prefix_len)
    dtype_bytes = jnp.dtype(self.dtype).itemsize
    # A backward pass keeps every layer's activations: allowed three forward passes' worth per row (an allowance,
    # not fitted to XLA's buffers as the scoring planner is).
    per_row = 3 * batching.activation_bytes(c, 1, 1, suffix, prefix_len, int(tokenized.num_targets.max()),
                                            dtype_bytes)
    per_row += c.num_layers * c.intermediate_size * 4 * 3  # the mask, its gradient and the running mean
    rows = max(1, int(self.memory_budget // (per_row * steps)))
    rows = min(rows, len(requests))
    lay = scoring.layout(tokenized, scoring.arrange(tokenized, prefix_len, pack=False)[0], rows, prefix_len,
                         self.pad_id)
    replicated = mesh_lib.replicated(self.mesh)
    prefix = mesh_lib.put(lay.prefix, replicated) if len(lay.prefix) else None
    fill = self._fill(None, neuron_fill).neurons
    out = np.zeros((len(requests), c.num_layers, c.intermediate_size), np.float32)
    for chunk in lay.chunks:
      start = time.perf_counter()
      arrays = [mesh_lib.put(a, replicated) for a in (chunk.rows.tokens, chunk.rows.positions, *chunk.row_targets())]
      scores = mesh_lib.to_host(self._attribution_fn(self.params, fill, prefix, *arrays, steps=steps))
      real = chunk.index >= 0
      out[chunk.index[real]] = scores[real]
      self.stats.calls += 1
      self.stats.seconds += time.perf_counter() - start
      if progress:
        progress(int(real.sum()))
    return out

  # -- mean ablation --------------------------------------------------------------------------

  def ablation_means(self, requests: Sequence[ScoringRequest]) -> tuple[np.ndarray, np.ndarray]:
    """Mean attention output of every head [L, H, Dh] and mean value of every neuron [L, F] over all tokens of
    `requests` (unablated model): the fill values of mean ablation."""
    tokenized = scoring.tokenize(self.model.tokenizer, requests, self.config.max_position_embeddings)
    order = np.argsort([len(s) for s in tokenized.sequences])
    c = self.config
    head_total = np.zeros((c.num_layers, c.num_kv_heads, c.queries_per_kv, c.head_dim), np.float64)
    neuron_total = np.zeros((c.num_layers, c.intermediate_size), np.float64)
    count = 0
    rows = max(1, self.tokens_per_batch // max(1, int(np.mean([len(s) for s in tokenized.sequences]))))
    for begin in range(0, len(order), rows):
      members = order[begin:begin + rows]
      width = batching.bucket(max(len(tokenized.sequences[i]) for i in members))
      tokens = np.full((1, rows, width), self.pad_id, np.int32)
      segments = np.full((1, rows, width), -1, np.int32)  # one segment per row; -1 on padding
      for row, i in enumerate(members):
        seq = tokenized.sequences[i]
        tokens[0, row, :len(seq)] = seq
        segments[0, row, :len(seq)] = 0
      replicated = mesh_lib.replicated(self.mesh)
      head_sums, neuron_sums = self._sums_fn(self.params, mesh_lib.put(tokens, replicated),
                                             mesh_lib.put(segments, replicated))
      head_total += np.asarray(mesh_lib.to_host(head_sums), np.float64)
      neuron_total += np.asarray(mesh_lib.to_host(neuron_sums), np.float64)
      count += int((segments >= 0).sum())
    heads = (head_total / count).reshape(c.num_layers, c.num_heads, c.head_dim).astype(np.float32)
    return heads, (neuron_total / count).astype(np.float32)


def _unit_sums(module, params, tokens, segments, dtype):
  positions = jnp.arange(tokens.shape[-1])[None, None]
  out = module.apply({"params": params}, tokens, positions, segments=segments, outputs=OutputSpec(unit_sums=True),
                     dtype=dtype)
  return out.head_sums[:, 0], out.neuron_sums[:, 0]
