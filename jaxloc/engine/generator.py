"""The generation job of an engine: continuations of many prompts under many masks, cut at stop strings, each token
greedy or sampled (`requests.Sampling`, drawn in the compiled steps by `sampling.next_tokens`).

Axes as in `generation_kernels.py`: `masks` M, `requests` R; a job decodes Ms masks at once in mask slots, each with Rs
row slots of (mask, prompt) pairs. The prompts' longest shared token prefix (a task's few-shot examples) is prefilled
once per mask slot and kept there; each row keeps only its own suffix and new tokens. Decoding runs in chunks of
`generation_kernels.CHUNK_STEPS` steps; between chunks the host takes the tokens of rows that ended (EOS, a stop
string, the token budget) and fills their row slots from their mask's queue of pending prompts (one queue per mask,
shared by every slot holding it), prefilling each prompt at its own width (`Generator._insert`). A mask slot whose
rows have all ended and whose mask has no prompt left takes the next mask, or, once every mask has started, a mask
whose prompts are still pending (`assign_masks`): a call stays full until the work runs out. A chunk reads the blocks
of each row's cache that its longest live row has filled (`generation_kernels.read_blocks`), and a sliding-window
layer's prefix from the first entry some live row still sees (`generation_kernels.window_skip`).

How many slots fit comes from the planner's estimate (`Planner.generation_slots`); where that estimate comes near the
memory budget, the decode call is compiled ahead of time and XLA's own `memory_analysis()` decides (the executable is
kept and runs the job).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import time
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from numpy.typing import ArrayLike

from jaxloc.engine import batching, generation_kernels, sampling as sampling_lib, stops as stop_strings
from jaxloc.engine.masks import Fills, Masks, check_fills, check_masks, start_layers
from jaxloc.engine.mesh import DATA, to_host
from jaxloc.engine.planner import GIB, GenerationSlots
from jaxloc.engine.requests import GREEDY, GenerationRequest, Sampling
from jaxloc.engine.scoring_kernels import MIN_SHARED_PREFIX
from jaxloc.engine.resources import SharedResources
from jaxloc.errors import UserError
from jaxloc.models.decoder import Ablation

log = logging.getLogger(__name__)

# XLA's memory analysis is consulted where the planner's estimate exceeds this share of the budget.
MEASURE_ABOVE = 0.5


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
  """Longest token prefix of every prompt that leaves each at least its last token (which predicts the first new
  one); 0 when shorter than MIN_SHARED_PREFIX."""
  first = list(prompts[0])
  length = min(len(p) for p in prompts) - 1
  for prompt in prompts[1:]:
    same = np.asarray(prompt[:length]) == np.asarray(first[:length])
    length = int(np.argmin(same)) if not same.all() else length
  return length if length >= MIN_SHARED_PREFIX else 0


def assign_masks(free: Sequence[int], rows: int, order: collections.deque[int],
                 pending: dict[int, collections.deque[int]], docs: Sequence[int],
                 waiting: Mapping[int, int]) -> list[tuple[int, int]]:
  """(mask slot, mask) for the mask slots `free` (no live row, their mask's prompts all started): the next masks of
  `order`, each with all of `docs` pending (`pending[mask]`); once every mask has started, the mask with the most
  prompts that no row slot will take (`waiting[mask]`: free row slots of the slots already holding it; a slot given
  here claims `rows`), so that a slot takes on another's work rather than idle while that mask's own slots work
  through it. Takes the masks off `order`."""
  assigned = []
  unclaimed = {m: len(queue) - waiting.get(m, 0) for m, queue in pending.items()}
  for s in free:
    if order:
      m = order.popleft()
      pending[m] = collections.deque(docs)
      unclaimed[m] = len(docs) - rows
    else:
      m = max(unclaimed, key=unclaimed.__getitem__, default=-1)
      if m < 0 or unclaimed[m] <= 0:
        break
      unclaimed[m] -= rows
    assigned.append((s, m))
  return assigned


@dataclasses.dataclass(frozen=True)
class Job:
  """One generation job's shapes: mask slots and row slots (`layout`), the prefix (`prefix_len` real tokens of a
  `prefix`-wide array), suffixes `suffix` wide, `new` tokens at most per row, each row's cache `suffix + new`."""

  layout: GenerationSlots
  prefix_len: int
  prefix: int
  suffix: int
  new: int

  @property
  def cache(self) -> int:
    return self.suffix + self.new


class Generator:
  """`Engine.generate` and `Engine.generate_tokens`."""

  def __init__(self, shared: SharedResources):
    self.shared = shared
    module, config, dtype = shared.module, shared.model_config, shared.placement.dtype
    self._prefix_fn = shared.jit(functools.partial(generation_kernels.unablated_prefix, module, dtype=dtype))
    self._load_fn = shared.jit(functools.partial(generation_kernels.load_masks, module, dtype=dtype),
                               donate_argnums=(1,))
    self._insert_fn = shared.jit(functools.partial(generation_kernels.insert_rows, module, config, dtype=dtype),
                                 static_argnames=("pad_id",), donate_argnums=(1,))
    self._layers_fn = shared.jit(functools.partial(generation_kernels.decode_layers, config))
    self._decode_fn = shared.jit(functools.partial(generation_kernels.decode, module, config, dtype=dtype),
                                 static_argnames=("steps", "blocks", "skip"), donate_argnums=(1,))
    self.jitted = (self._prefix_fn, self._load_fn, self._insert_fn, self._layers_fn, self._decode_fn)
    self._stop_cache: dict[tuple[str, ...], tuple[jax.Array, ...]] = {}
    self._token_strings: list[str] | None = None
    self._layouts: dict = {}  # (masks, docs, prefix, suffix, new, kinds) -> GenerationSlots, measured once
    self._makers: dict = {}  # a state's shapes -> its compiled maker (`generation_kernels.empty_slots`)

  def _stop_tables(self, stops: tuple[str, ...]) -> tuple[jax.Array, ...]:
    """Device tables of the stop-string automaton for `stops` (cached; the vocabulary is decoded once)."""
    if stops not in self._stop_cache:
      vocab = self.shared.model_config.vocab_size
      if stops and self._token_strings is None:
        tok = self.shared.model.tokenizer
        known = len(tok)  # embedding rows past the tokenizer's vocabulary are never-emitted padding
        self._token_strings = [tok.decode([i], skip_special_tokens=True) if i < known else "" for i in range(vocab)]
      strings = self._token_strings if stops and self._token_strings is not None else [""] * vocab
      tables = stop_strings.stop_tables(strings, stops)
      self._stop_cache[stops] = tuple(self.shared.placement.put(t) for t in tables)
    return self._stop_cache[stops]

  def _eos_ids(self) -> list[int]:
    tok = self.shared.model.tokenizer
    extra = [tok.eos_token_id] if tok is not None and tok.eos_token_id is not None else []
    return sorted({*self.shared.model_config.eos_token_ids, *extra}) or [-1]

  # --- the state's arrays, their shardings and shapes -----------------------------------------------------------

  def _shardings(self, state_like: generation_kernels.Slots) -> generation_kernels.Slots:
    """Each array of a `Slots` split over the data axis along its mask-slot axis (fills and scalars replicated)."""
    mesh = self.shared.placement.mesh

    def along(axis: int) -> Any:  # a sharding where the state holds an array (a `Slots` of shardings)
      return NamedSharding(mesh, PartitionSpec(*([None] * axis), DATA))

    replicated: Any = NamedSharding(mesh, PartitionSpec())
    ablation = state_like.ablation
    return generation_kernels.Slots(
        ablation=Ablation(None if ablation.head_mask is None else along(0),
                          None if ablation.head_fill is None else replicated,
                          None if ablation.neuron_mask is None else along(0),
                          None if ablation.neuron_fill is None else replicated),
        prefix_len=replicated, prefix_k=along(1), prefix_v=along(1),
        cache_k=tuple(tuple(along(0) for _ in layer) for layer in state_like.cache_k),
        cache_v=tuple(tuple(along(0) for _ in layer) for layer in state_like.cache_v),
        length=along(0), current=along(0), tokens=along(0), count=along(0), done=along(0), automaton=along(0))

  def _abstract(self, job: Job, masks: Masks, fill: Fills) -> generation_kernels.Slots:
    """The state of `job` as shapes and dtypes (`jax.ShapeDtypeStruct`s with their shardings)."""
    state = generation_kernels.slot_shapes(
        self.shared.model_config, self.shared.placement.dtype, slots=job.layout.slots, rows=job.layout.rows,
        prefix=job.prefix, cache=job.cache, new=job.new, heads=masks.heads is not None,
        neurons=masks.neurons is not None, head_fill=masks.heads is not None and fill.heads is not None,
        neuron_fill=masks.neurons is not None and fill.neurons is not None)
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state,
                        self._shardings(state))

  def _empty(self, job: Job, masks: Masks, fill: Fills) -> generation_kernels.Slots:
    """A state of `job` with every row ended and every mask slot keeping everything, made on the devices (one
    compiled maker per shape)."""
    abstract = self._abstract(job, masks, fill)
    leaves, tree = jax.tree.flatten(abstract)
    key = (tree, tuple((x.shape, str(x.dtype)) for x in leaves))
    if key not in self._makers:
      self._makers[key] = jax.jit(functools.partial(generation_kernels.empty_slots, abstract),
                                  out_shardings=jax.tree.map(lambda s: s.sharding, abstract))
    fills = self.shared.placement.fills(fill)
    return self._makers[key](fills.heads if abstract.ablation.head_fill is not None else None,
                             fills.neurons if abstract.ablation.neuron_fill is not None else None,
                             np.int32(job.prefix_len))

  # --- planning -------------------------------------------------------------------------------------------------

  def _weights(self, layout: GenerationSlots, *, abstract: bool = False) -> dict[str, Any]:
    """The parameters a job's decode calls take: the engine's, with the layers laid out for decoding once
    (`generation_kernels.decode_layers`) where the job holds them (`GenerationSlots.held_layers`); else each call
    lays them out. `abstract`: the laid-out layers as the shapes and shardings they will have, made by no call (to
    compile a decode call against)."""
    params = self.shared.placement.params
    if not layout.held_layers:
      return params
    lay_out = self._layers_fn.executable(params)
    if abstract:
      return dict(params, layers=lay_out.out_info)
    self.shared.stats.calls += 1
    return dict(params, layers=lay_out(params))

  def _decode_args(self, weights: dict[str, Any], state: generation_kernels.Slots, tables: tuple[jax.Array, ...],
                   eos_ids: jax.Array, budget: jax.Array, sampler: sampling_lib.Sampler | None,
                   row_ids: jax.Array | None) -> tuple[Any, ...]:
    """A decode call's arguments; a greedy job's (sampler None) are those of the decode call before sampling."""
    args = (weights, state, eos_ids, tables[0], tables[1], budget)
    return args if sampler is None else args + (sampler, row_ids)

  def _row_ids(self, mask_of: np.ndarray, doc_of: np.ndarray) -> jax.Array:
    """int32 [Ms, Rs, 2]: each row slot's (mask, prompt) indices, split over devices as the slots are."""
    ids = np.stack(np.broadcast_arrays(mask_of[:, None], doc_of), axis=-1).astype(np.int32)
    return self.shared.placement.put(ids, self.shared.placement.split(ids.ndim))

  def _layout(self, key: Hashable, masks: Masks, fill: Fills, num_masks: int, num_docs: int, prefix: int,
              suffix: int, new: int, tables: tuple[jax.Array, ...], eos_ids: jax.Array,
              sampler: sampling_lib.Sampler | None = None) -> GenerationSlots:
    """The planner's slots for this job's shapes; where its estimate comes near the budget, XLA's memory analysis of
    the compiled decode call (reading every block) confirms it, or the layout lets go of its held layers, then shrinks
    (`Planner.smaller`), until XLA measures one under the budget (each executable is kept, and the chosen one runs
    the job). XLA measures the decode call only: where the layers are held, an insert can hold more (the planner's
    estimate covers both, `benchmark_memory --parts=generation`)."""
    if key in self._layouts:
      return self._layouts[key]
    planner = self.shared.planner
    layout = planner.generation_slots(masks=num_masks, docs=num_docs, prefix=prefix, suffix=suffix, new=new,
                                      stop_states=tables[0].shape[1])
    if layout.estimated_bytes > MEASURE_ABOVE * planner.budget:
      while True:  # from here on XLA decides, down to a layout it has measured under the budget
        abstract = self._abstract(Job(layout, 1, prefix, suffix, new), masks, fill)
        weights = self._weights(layout, abstract=True)
        row_ids = None if sampler is None else self._row_ids(np.zeros(layout.slots, np.int32),
                                                             np.zeros((layout.slots, layout.rows), np.int32))
        args = self._decode_args(weights, abstract, tables, eos_ids, jnp.int32(0), sampler, row_ids)
        executable = self._decode_fn.executable(*args, steps=generation_kernels.CHUNK_STEPS,
                                                blocks=len(generation_kernels.cache_blocks(suffix + new)))
        # Laid-out layers the job holds are its own copy: they count, the model's parameters do not.
        resident = {k: v for k, v in weights.items() if k != "layers" or not layout.held_layers}
        measured = xla_bytes(executable, resident)
        log.info("generation: %d mask slots x %d rows, planner %.2f GiB, XLA %.2f GiB (budget %.2f GiB)",
                 layout.slots, layout.rows, layout.estimated_bytes / GIB, measured / GIB, planner.budget / GIB)
        if measured <= planner.budget:
          break
        if layout.held_layers:  # first the same layout, each call laying the layers out for itself, prefills whole
          layout = planner.generation_layout(layout.slots, layout.rows, prefix, suffix, new, tables[0].shape[1],
                                             held_layers=False)
          continue
        if layout.rows == 1 and layout.slots <= planner.data_parallel:
          raise UserError(f"one generation row needs {measured / GIB:.2f} GiB (XLA), over the memory budget of "
                          f"{planner.budget / GIB:.2f} GiB; raise --memory_budget_gb or shorten the prompts")
        layout = planner.smaller(layout, prefix, suffix, new, tables[0].shape[1])
    self._layouts[key] = layout
    return layout

  # --- the job ----------------------------------------------------------------------------------------------------

  def _generate_grid(self, prompt_ids: Sequence[Sequence[int]] | Mapping[int, Sequence[int]], docs: Sequence[int],
                     masks: Masks, fill: Fills,
                     stops: tuple[str, ...], max_new: int, progress: Callable[[int], None] | None = None,
                     sampling: Sampling = GREEDY) -> Iterator[tuple[tuple[int, int], list[int]]]:
    """The tokens of every prompt `docs` under every mask, greedy or sampled (`sampling`, checked), as rows end:
    ((mask, prompt), generated ids up to and including the stop token). A sampled row's keys come from its mask's
    index in `masks` and its prompt's in `prompt_ids`."""
    if not docs or not len(masks):
      return
    shared, place = self.shared, self.shared.placement
    c, pad_id = shared.model_config, shared.pad_id
    tables = self._stop_tables(stops)
    eos_ids = place.put(np.asarray(self._eos_ids(), np.int32))
    prefix_len = shared_prefix_length([prompt_ids[i] for i in docs]) if shared.config.share_prefix else 0
    prefix_width = batching.bucket(prefix_len) if prefix_len else 0
    suffixes = {i: list(prompt_ids[i][prefix_len:]) for i in docs}
    suffix_width = batching.bucket(max(len(s) for s in suffixes.values()))  # every row prefills this wide
    new = batching.bucket_pow2(max_new)
    sampler = sampling_lib.make_sampler(sampling, place.put)
    kinds = (masks.heads is not None, masks.neurons is not None, fill.heads is not None, fill.neurons is not None,
             jax.tree.structure(sampler))  # a sampling job's decode call is another executable, measured apart
    key = (batching.bucket_pow2(len(masks)), batching.bucket_pow2(len(docs)), prefix_width, suffix_width, new, kinds)
    layout = self._layout(key, masks, fill, len(masks), len(docs), prefix_width, suffix_width, new, tables, eos_ids,
                          sampler)
    weights = self._weights(layout)
    job = Job(layout, prefix_len, prefix_width, suffix_width, new)
    slots, rows = layout.slots, layout.rows
    start = time.perf_counter()
    state = self._empty(job, masks, fill)

    prefix_host = np.full((prefix_width,), pad_id, np.int32)
    prefix_host[:prefix_len] = prompt_ids[docs[0]][:prefix_len]
    prefix_tokens = place.put(prefix_host)
    starts = (start_layers(c, masks) if shared.planner.residual_cache else np.zeros(len(masks), np.int64))
    unablated = None
    # The unablated prefix costs one prefill of every layer and saves each mask the layers below its start.
    if prefix_len and starts.sum() > c.num_layers:
      size = shared.planner.prompt_stream_bytes(1, prefix_width)
      if shared.planner.fits_residual_cache(size):
        unablated = self._prefix_fn(place.params, prefix_tokens)
        shared.stats.calls += 1
      else:
        log.warning("the unablated prefix (%d tokens) needs %.2f GiB, over the residual cache of %.2f GiB: every mask "
                    "prefills it from layer 0 (raise --residual_cache_gb to share it)", prefix_len, size / GIB,
                    shared.planner.residual_cache / GIB)
    order = collections.deque(sorted(range(len(masks)), key=lambda m: starts[m]))  # neighbours share start layers
    mask_of = np.full(slots, -1)
    # Each mask's prompts not yet started: one queue per mask, shared by every mask slot holding it.
    pending: dict[int, collections.deque[int]] = {}
    doc_of = np.full((slots, rows), -1)
    live = np.zeros((slots, rows), bool)
    length = np.zeros((slots, rows), np.int64)
    budget = place.put(np.int32(max_new))
    while True:
      free = [s for s in range(slots) if not live[s].any() and not pending.get(int(mask_of[s]))]
      waiting: collections.Counter[int] = collections.Counter()  # free row slots of the slots that keep their mask
      for s in set(range(slots)) - set(free):
        waiting[int(mask_of[s])] += int((~live[s]).sum())
      assigned = assign_masks(free, rows, order, pending, docs, waiting)
      if assigned:
        state = self._load(state, job, assigned, mask_of, masks, starts, unablated, prefix_tokens)
      queues = [pending.get(int(m), collections.deque()) for m in mask_of]  # a slot without a mask: none
      state = self._insert(state, job, suffixes, queues, live, doc_of, length, sampler, mask_of)
      if not live.any():
        break
      blocks = generation_kernels.read_blocks(int(length[live].max()), job.cache)
      skip = generation_kernels.window_skip(c, job.prefix, job.prefix_len + int(length[live].min()))
      row_ids = None if sampler is None else self._row_ids(mask_of, doc_of)
      args = self._decode_args(weights, state, tables, eos_ids, budget, sampler, row_ids)
      state = self._decode_fn.executable(*args, steps=generation_kernels.CHUNK_STEPS, blocks=blocks, skip=skip)(*args)
      shared.stats.calls += 1
      done, count, length = (np.array(to_host(a)) for a in (state.done, state.count, state.length))
      ended = live & done
      if ended.any():
        tokens = to_host(state.tokens)
        for s, r in zip(*np.nonzero(ended)):
          n = min(int(count[s, r]), max_new)
          shared.stats.tokens += n
          yield (int(mask_of[s]), int(doc_of[s, r])), tokens[s, r, :n].tolist()
        live &= ~ended
        if progress:
          progress(int(ended.sum()))
    shared.stats.seconds += time.perf_counter() - start

  def _load(self, state: generation_kernels.Slots, job: Job, assigned: list[tuple[int, int]], mask_of: np.ndarray,
            masks: Masks, starts: np.ndarray, unablated: tuple[jax.Array, jax.Array, jax.Array] | None,
            prefix_tokens: jax.Array) -> generation_kernels.Slots:
    """Loads each (mask slot, mask) of `assigned` (`assign_masks`), the prefix prefilled under the mask, in calls of
    at most the planner's masks (`Planner.load_masks` within the layout's prefill room; padding entries point past
    the slots)."""
    place = self.shared.placement
    per_call = self.shared.planner.load_masks(len(mask_of), job.prefix, job.layout.prefill_room)
    for begin in range(0, len(assigned), per_call):
      part = assigned[begin:begin + per_call]
      into, taken = [s for s, _ in part], [m for _, m in part]
      size = min(per_call, batching.bucket_pow2(len(taken)))
      chosen = np.array(taken + [taken[0]] * (size - len(taken)))
      slot = np.array(into + [len(mask_of)] * (size - len(taken)), np.int32)
      mask_of[into] = taken
      batch = masks.rows(chosen)
      ablation = Ablation(None if batch.heads is None else place.put(batch.heads.astype(place.dtype)), None,
                          None if batch.neurons is None else place.put(batch.neurons.astype(place.dtype)), None)
      resume = None
      if unablated is not None:
        layer = min(min(int(starts[m]) for m in taken), self.shared.model_config.num_layers - 1)
        resume = (place.put(np.int32(layer)),) + tuple(unablated)
      state = self._load_fn(place.params, state, place.put(slot), ablation, prefix_tokens, resume)
      self.shared.stats.calls += 1
    return state

  def _insert(self, state: generation_kernels.Slots, job: Job, suffixes: dict[int, list[int]],
              queues: Sequence[collections.deque[int]], live: np.ndarray, doc_of: np.ndarray, length: np.ndarray,
              sampler: sampling_lib.Sampler | None, mask_of: np.ndarray) -> generation_kernels.Slots:
    """Fills every free row slot of each mask slot from its mask's queue of pending prompts (`queues[s]`, shared by
    the slots holding that mask). The prompts are prefilled by width (`batching.bucket_coarse` of each suffix, at
    most the job's), so a short prompt is not prefilled as wide as the job's longest: a call starts rows of one width
    in the mask slots that have some (in every slot where they are split over devices), at most the slots and rows
    the planner's estimate covers at that width (`Planner.insert_call`, within the layout's prefill room). With a
    `sampler`, each row's first token is drawn with its (mask, prompt) indices (`mask_of` [Ms], the slots' masks)."""
    slots, rows = live.shape
    widths: dict[int, dict[int, list[tuple[int, int]]]] = {}  # width -> mask slot -> [(row slot, prompt)]
    for s, queue in enumerate(queues):
      for r in np.nonzero(~live[s])[0][:len(queue)]:
        doc = queue.popleft()
        width = min(batching.bucket_coarse(len(suffixes[doc])), job.suffix)
        widths.setdefault(width, {}).setdefault(s, []).append((int(r), doc))
        doc_of[s, r], live[s, r], length[s, r] = doc, True, len(suffixes[doc])
    planner, place = self.shared.planner, self.shared.placement
    every = planner.data_parallel > 1  # the slots split over devices: every insert starts rows in every slot
    split = lambda a: place.put(a, place.split(a.ndim))  # noqa: E731
    for width, starting in sorted(widths.items()):
      filled = list(range(slots)) if every else list(starting)
      deepest = max(len(entries) for entries in starting.values())
      # A few shapes a width: rows and slots each within a factor of 8 and 4 of the most a call starts.
      per_call, cap = planner.insert_call(slots, rows, job.suffix, width, prefix=job.prefix,
                                          room=job.layout.prefill_room)
      inserted = min(cap, max(batching.bucket_pow2(deepest), rows // 8))
      for begin in range(0, len(filled), per_call):
        part = filled[begin:begin + per_call]
        for offset in range(0, deepest, inserted):
          calls = [(s, starting.get(s, [])[offset:offset + inserted]) for s in part]
          calls = calls if every else [(s, entries) for s, entries in calls if entries]
          if not any(entries for _, entries in calls):
            continue
          size = min(per_call, max(batching.bucket_pow2(len(calls)), per_call // 4))
          slot = np.full((size,), slots, np.int32)
          row = np.full((size, inserted), rows, np.int32)
          tokens = np.full((size, inserted, width), self.shared.pad_id, np.int32)
          lengths = np.ones((size, inserted), np.int32)
          row_ids = np.zeros((size, inserted, 2), np.int32)
          for i, (s, entries) in enumerate(calls):
            slot[i] = s
            for j, (r, doc) in enumerate(entries):
              suffix = suffixes[doc]
              row[i, j], lengths[i, j] = r, len(suffix)
              tokens[i, j, :len(suffix)] = suffix
              row_ids[i, j] = (mask_of[s], doc)
          # A greedy job's insert takes the arguments it took before sampling (the same executable).
          drawn = {} if sampler is None else dict(sampler=sampler, row_ids=split(row_ids))
          state = self._insert_fn(place.params, state, None if every else place.put(slot), split(row), split(tokens),
                                  split(lengths), pad_id=self.shared.pad_id, **drawn)
          self.shared.stats.calls += 1
    return state

  # --- the engine's face ------------------------------------------------------------------------------------------

  def generate(self, requests: Sequence[GenerationRequest], head_masks: ArrayLike | None = None,
               head_fill: ArrayLike | None = None, progress: Callable[[int], None] | None = None, *,
               neuron_masks: ArrayLike | None = None, neuron_fill: ArrayLike | None = None) -> list[list[str]]:
    """Continuations [M][R] of every request under every mask, cut at the first stop string: greedy, or sampled as
    each request's `sampling` says (a `UserError` where its top_k is over the vocabulary)."""
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
    fill = check_fills(config, head_fill, neuron_fill)
    texts = [[""] * len(requests) for _ in range(len(masks))]
    # Requests that share stop strings, a token budget and sampling settings are one job.
    groups: dict = {}
    for i, r in enumerate(requests):
      groups.setdefault((tuple(r.stop), r.max_new_tokens, r.sampling.check_vocab(config.vocab_size)), []).append(i)
    for (stops, max_new, sampling), members in groups.items():
      for (m, i), ids in self._generate_grid(prompt_ids, members, masks, fill, stops, max_new, progress, sampling):
        texts[m][i] = stop_strings.truncate_at_stop(tok.decode(ids, skip_special_tokens=True), stops)
    return texts

  def generate_tokens(self, prompt_ids: Sequence[Sequence[int]], head_masks: ArrayLike | None, max_new_tokens: int,
                      head_fill: ArrayLike | None = None, *, neuron_masks: ArrayLike | None = None,
                      neuron_fill: ArrayLike | None = None) -> list[list[list[int]]]:
    """Greedy token ids [M][R] for pre-tokenized prompts, stopping at EOS only (for parity checks)."""
    config = self.shared.model_config
    masks = check_masks(config, head_masks, neuron_masks)
    out: list[list[list[int]]] = [[[] for _ in prompt_ids] for _ in range(len(masks))]
    fill = check_fills(config, head_fill, neuron_fill)
    for (m, i), ids in self._generate_grid(prompt_ids, list(range(len(prompt_ids))), masks, fill, (), max_new_tokens):
      out[m][i] = ids
    return out


def xla_bytes(executable: Any, resident: Any) -> int:
  """What a compiled call holds beyond `resident` (the model's parameter arrays among its arguments, in memory
  whether it runs or not), by XLA's `memory_analysis()`: temporaries, arguments and outputs, an output that reuses a
  donated argument's buffer counted once."""
  analysis = executable.memory_analysis()  # per device: so are the resident arrays' bytes taken off
  resident_bytes = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(resident))
  return int(analysis.temp_size_in_bytes + analysis.argument_size_in_bytes + analysis.output_size_in_bytes
             - analysis.alias_size_in_bytes - resident_bytes)
