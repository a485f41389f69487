"""Packing several requests to a row and starting masks at their first ablated layer change nothing but speed."""

import logging

import numpy as np
import pytest

from jaxloc.engine import scoring_kernels
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.masks import Masks
from jaxloc.engine.requests import ScoringRequest

SHOTS = "".join(f"Q: {a} plus {b}?\nA: {a + b}\n\n" for a, b in [(2, 3), (4, 1), (5, 2)])


def mixed_requests(n, seed=0, shared=True):
  """Requests of uneven suffix lengths (1 to ~12 tokens of question, 1 to 3 target tokens)."""
  rng = np.random.default_rng(seed)
  words = ["cat", "dogs", "a", "tree", "blue", "river", "stone", "x"]
  out = []
  for _ in range(n):
    question = " ".join(rng.choice(words, size=rng.integers(1, 7)))
    answer = " " + " ".join(rng.choice(words, size=rng.integers(1, 3)))
    out.append(ScoringRequest((SHOTS if shared else "") + f"Q: {question}?\nA:", answer))
  return out


def single_head_masks(config):
  masks = np.ones((config.num_head_total, config.num_layers, config.num_heads), np.float32)
  for i in range(config.num_head_total):
    masks[i].reshape(-1)[i] = 0
  return masks


@pytest.mark.parametrize("shared", [True, False])
def test_packed_rows_score_as_one_request_per_row(tiny_model, shared):
  requests = mixed_requests(23, seed=1, shared=shared)
  rng = np.random.default_rng(0)
  masks = (rng.random((5, tiny_model.config.num_layers, tiny_model.config.num_heads)) > 0.3).astype(np.float32)
  packed = Engine(tiny_model, EngineConfig(residual_cache_gb=0))
  layout, _ = packed.prepare(requests)
  assert max(int((c.rows.segments >= 0).sum(1).max()) for c in layout.chunks) > 0
  assert any(len(set(row[row >= 0])) > 1 for c in layout.chunks for row in c.rows.segments)  # rows hold several
  unpacked = Engine(tiny_model, EngineConfig(pack=False, residual_cache_gb=0))
  a, b = packed.score(requests, masks), unpacked.score(requests, masks)
  assert np.abs(a.logprob - b.logprob).max() < 1e-4
  assert np.array_equal(a.is_greedy, b.is_greedy)
  assert layout.padded_tokens_per_mask < unpacked.prepare(requests)[0].padded_tokens_per_mask


def test_packing_fills_rows_first_fit():
  """Suffixes computing 31, 30, 22, 7, 5, 4 tokens (after a 2-token prefix; a request's last token is never
  computed), longest first into rows 32 wide (64 and 128 wide cost as much; the narrowest wins)."""
  lengths = [30, 5, 7, 22, 4, 31]
  tokenized = scoring_kernels.TokenizedRequests([np.arange(n + 3) for n in lengths], np.full(6, 3))
  rows, width = scoring_kernels.arrange(tokenized, 2, pack=True)
  assert width == 32
  assert rows == [[5], [0], [3, 2], [1, 4]]
  unpacked, _ = scoring_kernels.arrange(tokenized, 2, pack=False)
  assert unpacked == [[4], [1], [2], [3], [0], [5]]


def test_packing_width_follows_the_cost():
  """Six suffixes computing 21 tokens: 24 wide needs six rows (144 tokens), 64 wide two (128), 128 wide one (128)
  whose attention costs more: 64 wins once keys cost anything."""
  tokenized = scoring_kernels.TokenizedRequests([np.arange(24) for _ in range(6)], np.full(6, 20))
  rows, width = scoring_kernels.arrange(tokenized, 2, pack=True, key_cost=1e-3)
  assert width == 64 and [len(r) for r in rows] == [3, 3]


def test_start_layer_matches_full_computation(tiny_model):
  """Single-head masks (every layer), random masks, neuron masks and the unablated mask: resuming from the cached
  unablated residual streams gives the full computation's scores."""
  config = tiny_model.config
  requests = mixed_requests(9, seed=2)
  heads = single_head_masks(config)
  rng = np.random.default_rng(1)
  random = (rng.random((3, config.num_layers, config.num_heads)) > 0.2).astype(np.float32)
  masks = np.concatenate([heads[::-1], random, np.ones((1, config.num_layers, config.num_heads), np.float32)])
  # A few masks per call, so batches can start at different layers.
  fast = Engine(tiny_model, EngineConfig(tokens_per_batch=100))
  full = Engine(tiny_model, EngineConfig(tokens_per_batch=100, residual_cache_gb=0))
  assert fast.masks_per_call(requests) < len(masks) // 3
  a, b = fast.score(requests, masks), full.score(requests, masks)
  assert np.abs(a.logprob - b.logprob).max() < 1e-4
  assert np.array_equal(a.is_greedy, b.is_greedy)
  assert fast.stats.layer_tokens < full.stats.layer_tokens  # layers really were skipped
  neurons = np.ones((config.num_layers, config.num_layers, config.intermediate_size), np.float32)
  for layer in range(config.num_layers):
    neurons[layer, layer, rng.choice(config.intermediate_size, 5, replace=False)] = 0
  fill = rng.normal(size=(config.num_layers, config.intermediate_size)).astype(np.float32)
  a = fast.score(requests, neuron_masks=neurons, neuron_fill=fill)
  b = full.score(requests, neuron_masks=neurons, neuron_fill=fill)
  assert np.abs(a.logprob - b.logprob).max() < 1e-4


def test_grouped_batches_come_back_in_mask_order(tiny_model):
  """Masks out of layer order are grouped by their first ablated layer; results still come back as contiguous
  slices in the caller's order, covering every mask once."""
  config = tiny_model.config
  requests = mixed_requests(6, seed=3)
  heads = single_head_masks(config)
  order = np.random.default_rng(2).permutation(len(heads))
  engine = Engine(tiny_model, EngineConfig(tokens_per_batch=300))
  slices = []
  logprob = np.zeros((len(heads), len(requests)), np.float32)
  for where, out in engine.score_batches(requests, heads[order]):
    slices.append(where)
    logprob[where] = out.logprob
  assert [s.start for s in slices] == [0] + [s.stop for s in slices[:-1]] and slices[-1].stop == len(heads)
  expected = Engine(tiny_model, EngineConfig(residual_cache_gb=0)).score(requests, heads[order]).logprob
  assert np.abs(logprob - expected).max() < 1e-4


def test_start_layers_of_masks(tiny_model):
  config = tiny_model.config
  engine = Engine(tiny_model)
  heads = np.ones((3, config.num_layers, config.num_heads), np.float32)
  heads[0, 1, 0] = 0
  heads[1, 2, 1] = 0.5  # a soft mask scales: it counts as ablating
  neurons = np.ones((3, config.num_layers, config.intermediate_size), np.float32)
  neurons[1, 0, 3] = 0
  assert engine.start_layers(Masks(heads, None)).tolist() == [1, 2, config.num_layers]
  assert engine.start_layers(Masks(heads, neurons)).tolist() == [1, 0, config.num_layers]


def test_residual_cache_too_small_falls_back_to_layer_zero(tiny_model, caplog):
  requests = mixed_requests(5, seed=4)
  heads = single_head_masks(tiny_model.config)
  engine = Engine(tiny_model, EngineConfig(residual_cache_gb=2**-30))
  with caplog.at_level(logging.WARNING):
    a = engine.score(requests, heads)
  assert "over the residual cache" in caplog.text and "--residual_cache_gb" in caplog.text
  assert engine.stats.layer_tokens == engine.stats.tokens * tiny_model.config.num_layers
  b = Engine(tiny_model, EngineConfig(residual_cache_gb=0)).score(requests, heads)
  assert np.abs(a.logprob - b.logprob).max() < 1e-4


def test_residual_cache_must_be_under_the_memory_budget(tiny_model):
  from jaxloc.errors import UserError

  with pytest.raises(UserError, match="residual cache"):
    Engine(tiny_model, EngineConfig(memory_budget_gb=1 / 1024, residual_cache_gb=2 / 1024))


def test_shared_prefill_generates_as_full_prefill(tiny_model):
  """Generation masks whose first ablated layer is past 0 prefill the shared prefix from there, the layers below from
  the unablated prefix (computed once): the same tokens as every mask prefilling it whole (single heads of every
  layer, suffixes of different lengths)."""
  config = tiny_model.config
  shared = [7, 3, 9, 12, 5, 8]
  prompts = [shared + [5, 9, 3, 7, 11, 2, 8], shared + [4, 4, 6], shared + [12, 3, 9, 9, 1]]
  heads = single_head_masks(config)
  fast = Engine(tiny_model, EngineConfig(generation_batch=4))
  full = Engine(tiny_model, EngineConfig(generation_batch=4, residual_cache_gb=0))
  a = fast.generate_tokens(prompts, heads, max_new_tokens=6)
  b = full.generate_tokens(prompts, heads, max_new_tokens=6)
  assert fast.generator._prefix_fn.compiled_shapes() == 1  # noqa: SLF001  the unablated prefix ran
  assert full.generator._prefix_fn.compiled_shapes() == 0  # noqa: SLF001
  assert a == b
  assert len({tuple(row[0]) for row in a}) > 1  # the masks change what is generated


def test_one_mask_generation_skips_the_shared_prefill(tiny_model):
  """Prompts under a single mask: an unablated prefix would only add work, so none runs."""
  heads = single_head_masks(tiny_model.config)[-1:]
  engine = Engine(tiny_model, EngineConfig(generation_batch=4))
  engine.generate_tokens([[5, 9, 3, 7, 8, 1], [5, 9, 3, 7, 8, 4, 6, 1]], heads, max_new_tokens=3)
  assert engine.generator._prefix_fn.compiled_shapes() == 0  # noqa: SLF001
