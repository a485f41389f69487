"""Every engine path on a tiny Gemma 3 whose sliding window (4 tokens) is shorter than every request and prompt:
packing, the shared prefix, starting at a later layer, the decoding cache, gradients, integrated gradients and mean
ablation compute what the model computes on each whole sequence alone.

Packed rows and the shared prefix respect the window by absolute position (a token at position p sees keys at
positions > p - window), and so does the decoding cache however long it grows, which is what these tests pin down.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.engine import scoring_kernels
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.requests import ScoringRequest
from jaxloc.models.decoder import Ablation, lm_logits
from tests.tiny import GEMMA3, make_tiny

SHOTS = "".join(f"Q: {a} plus {b}?\nA: {a + b}\n\n" for a, b in [(2, 3), (4, 1), (5, 2)])


@pytest.fixture(scope="module")
def tiny_gemma3(tokenizer):
  model = make_tiny(tokenizer, **GEMMA3)
  assert model.config.has_sliding_layers and len(model.config.ropes()) == 2
  return model


def requests(n, seed=0, shared=True):
  """Requests of uneven lengths, every one longer than the window."""
  rng = np.random.default_rng(seed)
  words = ["cat", "dogs", "a", "tree", "blue", "river", "stone", "x"]
  return [ScoringRequest((SHOTS if shared else "") + f"Q: {' '.join(rng.choice(words, size=rng.integers(1, 7)))}?\nA:",
                         " " + " ".join(rng.choice(words, size=rng.integers(1, 3)))) for _ in range(n)]


def random_masks(config, n, seed=0):
  rng = np.random.default_rng(seed)
  masks = (rng.random((n, config.num_layers, config.num_heads)) > 0.25).astype(np.float32)
  masks[0] = 1
  return masks


WIDTH = 64  # every sequence computed alone is right-padded to this width (causal: padding changes no earlier logit)


@functools.partial(jax.jit, static_argnums=0)
def _forward(module, params, tokens, head_mask):
  """Log-probabilities [WIDTH, V] of one padded sequence under one head keep-mask."""
  out = module.apply({"params": params}, tokens[None, None], jnp.arange(WIDTH)[None, None],
                     ablation=Ablation(head_mask=head_mask[None]))
  return jax.nn.log_softmax(lm_logits(module.config, params, out.hidden)[0, 0], axis=-1)


def _logprobs(model, sequence, head_mask):
  """Log-probabilities [S, V] of one whole sequence, computed directly (no prefix, no packing, no cache)."""
  tokens = np.zeros(WIDTH, np.int32)
  tokens[:len(sequence)] = sequence
  out = _forward(model.module, model.params, jnp.asarray(tokens), jnp.asarray(head_mask))
  return np.asarray(out, np.float64)[:len(sequence)]


def test_scores_equal_each_sequence_computed_alone(tiny_gemma3):
  """The engine's fastest layout (shared prefix, packed rows, masks started at their first ablated layer) against
  each request's whole sequence through the model, under each mask."""
  reqs = requests(9, seed=1)
  masks = random_masks(tiny_gemma3.config, 3, seed=1)
  engine = Engine(tiny_gemma3)
  layout, _ = engine.prepare(reqs)
  assert len(layout.prefix) > 4 * tiny_gemma3.config.sliding_window
  assert any(len(set(row[row >= 0])) > 1 for c in layout.chunks for row in c.rows.segments)  # rows hold several
  out = engine.score(reqs, masks)
  tokenized = scoring_kernels.tokenize(tiny_gemma3.tokenizer, reqs, tiny_gemma3.config.max_position_embeddings)
  for m, mask in enumerate(masks):
    for i, (sequence, start) in enumerate(zip(tokenized.sequences, tokenized.target_start)):
      logprobs = _logprobs(tiny_gemma3, sequence, mask)
      targets = range(int(start), len(sequence))
      expected = sum(logprobs[p - 1, sequence[p]] for p in targets)
      assert abs(out.logprob[m, i] - expected) < 1e-4
      assert out.is_greedy[m, i] == all(logprobs[p - 1].argmax() == sequence[p] for p in targets)
  assert np.abs(out.logprob[1:] - out.logprob[0]).max() > 1e-2  # the masks matter


@pytest.mark.parametrize("shared", [True, False])
def test_packed_rows_score_as_one_request_per_row(tiny_gemma3, shared):
  reqs = requests(17, seed=2, shared=shared)
  masks = random_masks(tiny_gemma3.config, 4, seed=2)
  packed = Engine(tiny_gemma3, EngineConfig(residual_cache_gb=0))
  layout, _ = packed.prepare(reqs)
  assert any(len(set(row[row >= 0])) > 1 for c in layout.chunks for row in c.rows.segments)
  a = packed.score(reqs, masks)
  b = Engine(tiny_gemma3, EngineConfig(pack=False, residual_cache_gb=0)).score(reqs, masks)
  assert np.abs(a.logprob - b.logprob).max() < 1e-4
  assert np.array_equal(a.is_greedy, b.is_greedy)


def test_shared_prefix_equals_unshared(tiny_gemma3):
  reqs = requests(8, seed=3)
  masks = random_masks(tiny_gemma3.config, 4, seed=3)
  a = Engine(tiny_gemma3, EngineConfig(share_prefix=True)).score(reqs, masks)
  b = Engine(tiny_gemma3, EngineConfig(share_prefix=False)).score(reqs, masks)
  assert np.abs(a.logprob - b.logprob).max() < 1e-4
  assert np.array_equal(a.is_greedy, b.is_greedy)


def test_start_layer_matches_full_computation(tiny_gemma3):
  config = tiny_gemma3.config
  reqs = requests(7, seed=4)
  heads = np.ones((config.num_head_total, config.num_layers, config.num_heads), np.float32)
  for i in range(config.num_head_total):
    heads[i].reshape(-1)[i] = 0
  fast = Engine(tiny_gemma3, EngineConfig(tokens_per_batch=100))
  full = Engine(tiny_gemma3, EngineConfig(tokens_per_batch=100, residual_cache_gb=0))
  a, b = fast.score(reqs, heads[::-1]), full.score(reqs, heads[::-1])
  assert np.abs(a.logprob - b.logprob).max() < 1e-4
  assert fast.stats.layer_tokens < full.stats.layer_tokens  # layers really were skipped


def _greedy_alone(model, prompt, mask, steps):
  """Greedy tokens by recomputing the whole sequence at every step (no cache)."""
  sequence = list(prompt)
  for _ in range(steps):
    sequence.append(int(_logprobs(model, sequence, mask)[-1].argmax()))
  return sequence[len(prompt):]


def test_generation_equals_recomputing_each_sequence(tiny_gemma3):
  """Prompts sharing a prefix longer than the window, 10 new tokens past it: sliding layers read the shared prefix,
  each row's own cache and the new token through the window only; the unablated prefix changes nothing."""
  config = tiny_gemma3.config
  rng = np.random.default_rng(5)
  shared = rng.integers(1, config.vocab_size, size=7).tolist()
  prompts = [shared + rng.integers(1, config.vocab_size, size=n).tolist() for n in (6, 1, 3)]
  masks = np.ones((config.num_head_total, config.num_layers, config.num_heads), np.float32)
  for i in range(config.num_head_total):
    masks[i].reshape(-1)[i] = 0  # one head each, of every layer: prefixes start at every layer
  fast = Engine(tiny_gemma3, EngineConfig(generation_batch=4))
  full = Engine(tiny_gemma3, EngineConfig(generation_batch=4, residual_cache_gb=0))
  a = fast.generate_tokens(prompts, masks, max_new_tokens=10)
  assert a == full.generate_tokens(prompts, masks, max_new_tokens=10)
  assert fast.generator._prefix_fn.compiled_shapes() == 1  # noqa: SLF001  the unablated prefix ran
  for m in (0, config.num_heads + 1, config.num_head_total - 1):
    for i, prompt in enumerate(prompts):
      assert a[m][i] == _greedy_alone(tiny_gemma3, prompt, masks[m], 10)
  assert len({tuple(row) for row in a[0]}) > 1


def test_mask_gradient_matches_finite_differences(tiny_gemma3):
  reqs = requests(5, seed=6)
  engine = Engine(tiny_gemma3)
  config = tiny_gemma3.config
  ones = np.ones((1, config.num_layers, config.num_heads), np.float32)
  value, gradient = engine.mask_objective(reqs, ones)
  base = engine.score(reqs, ones).logprob.mean()
  assert abs(value[0] - base) < 1e-4
  eps = 1e-3
  for layer, head in [(0, 1), (1, 4), (2, 5)]:
    mask = ones.copy()
    mask[0, layer, head] = 1 - eps
    finite_difference = (base - engine.score(reqs, mask).logprob.mean()) / eps
    assert abs(gradient[0, layer, head] - finite_difference) < 0.02 * max(1.0, abs(finite_difference))


def test_integrated_gradients_and_mean_ablation(tiny_gemma3):
  """Neuron attributions with a shared prefix equal those without; mean ablation reads the unablated means."""
  reqs = requests(4, seed=7)
  config = tiny_gemma3.config
  shared = Engine(tiny_gemma3, EngineConfig(share_prefix=True))
  attribution = shared.neuron_attribution(reqs, steps=8)
  unshared = Engine(tiny_gemma3, EngineConfig(share_prefix=False)).neuron_attribution(reqs, steps=8)
  assert attribution.shape == (len(reqs), config.num_layers, config.intermediate_size)
  assert np.abs(attribution).max() > 0
  assert np.abs(attribution - unshared).max() < 1e-5 + 1e-3 * np.abs(attribution).max()
  head_means, neuron_means = shared.ablation_means(reqs)
  assert head_means.shape == (config.num_layers, config.num_heads, config.head_dim)
  masks = random_masks(config, 3, seed=7)
  zero = shared.score(reqs, masks).logprob
  mean = shared.score(reqs, masks, head_fill=head_means).logprob
  assert np.array_equal(zero[0], mean[0]) and np.abs(zero[1:] - mean[1:]).max() > 1e-4
