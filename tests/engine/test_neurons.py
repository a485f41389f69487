"""Neuron masks through the engine: scores, batches, gradients and integrated gradients."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.engine import scoring_kernels
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.requests import ScoringRequest
from jaxloc.errors import UserError
from jaxloc.models.decoder import Ablation, lm_logits
from tests.engine.test_scoring import few_shot_requests


def random_neuron_masks(config, n, ablated=20, seed=0):
  rng = np.random.default_rng(seed)
  masks = np.ones((n, config.num_layers, config.intermediate_size), np.float32)
  for m in range(1, n):
    masks[m].reshape(-1)[rng.choice(config.num_layers * config.intermediate_size, ablated, replace=False)] = 0
  return masks


def test_neuron_scores_match_zeroed_down_proj_columns_on_smollm2(smollm2, smollm2_engine, smollm2_torch):
  import torch
  from jaxloc.models.torch_reference import zeroed_down_proj_columns

  requests = few_shot_requests(5, seed=2) + [ScoringRequest("The capital of France is", " Paris")]
  rng = np.random.default_rng(0)
  neurons = [(layer, int(i)) for layer in (1, 10, 25) for i in rng.choice(1536, 200, replace=False)]
  masks = np.ones((2, 30, 1536), np.float32)
  for layer, index in neurons:
    masks[1, layer, index] = 0
  ours = smollm2_engine.score(requests, neuron_masks=masks)
  tok = smollm2.tokenizer
  for mask_index, ablate in enumerate([[], neurons]):
    for i, r in enumerate(requests):
      ctx, cont = tok(r.context)["input_ids"], tok(r.continuation, add_special_tokens=False)["input_ids"]
      with torch.no_grad(), zeroed_down_proj_columns(smollm2_torch, ablate):
        logits = smollm2_torch(torch.tensor([ctx + cont])).logits[0, len(ctx) - 1:-1]
      expected = float(torch.log_softmax(logits, -1)[torch.arange(len(cont)), torch.tensor(cont)].sum())
      assert abs(ours.logprob[mask_index, i] - expected) < 1e-3
  assert np.abs(ours.logprob[1] - ours.logprob[0]).max() > 1e-2


@pytest.mark.heavy
def test_neuron_batches_and_heads_with_neurons(tiny_model):
  """A batch of neuron masks equals each mask alone; head and neuron masks given together equal the model
  applied with both; an all-ones neuron mask changes no score bit."""
  config = tiny_model.config
  requests = few_shot_requests(7, seed=1)
  neurons = random_neuron_masks(config, 6, seed=1)
  engine = Engine(tiny_model)
  batched = engine.score(requests, neuron_masks=neurons)
  single = np.stack([Engine(tiny_model).score(requests, neuron_masks=m[None]).logprob[0] for m in neurons])
  assert np.abs(batched.logprob - single).max() < 1e-4
  assert np.abs(batched.logprob[1:] - batched.logprob[0]).max() > 1e-3
  ones_heads = np.ones((1, config.num_layers, config.num_heads), np.float32)
  plain = engine.score(requests, ones_heads).logprob
  assert np.array_equal(plain, engine.score(requests, ones_heads, neuron_masks=neurons[:1]).logprob)
  heads = ones_heads.copy()
  heads[0, 1, 2] = 0
  both = engine.score(requests, heads, neuron_masks=neurons[1:2]).logprob
  assert np.abs(both - engine.score(requests, heads).logprob).max() > 1e-4
  assert np.abs(both - batched.logprob[1:2]).max() > 1e-4
  with pytest.raises(UserError, match=r"neuron masks must be \[masks, 3, 64\]"):
    engine.score(requests, neuron_masks=np.ones((1, 3, 6)))
  with pytest.raises(UserError, match="2 head masks but 1 neuron masks"):
    engine.score(requests, np.ones((2, 3, 6)), neuron_masks=neurons[:1])


def test_neuron_mask_gradient_matches_finite_differences(tiny_model):
  requests = few_shot_requests(5, seed=4)
  engine = Engine(tiny_model)
  config = tiny_model.config
  ones = np.ones((1, config.num_layers, config.intermediate_size), np.float32)
  value, gradient = engine.mask_objective(requests, neuron_masks=ones)
  base = engine.score(requests, neuron_masks=ones).logprob.mean()
  assert abs(value[0] - base) < 1e-4
  eps = 1e-3
  for layer, index in [(0, 1), (1, 40), (2, 63)]:
    mask = ones.copy()
    mask[0, layer, index] = 1 - eps
    finite_difference = (base - engine.score(requests, neuron_masks=mask).logprob.mean()) / eps
    assert abs(gradient[0, layer, index] - finite_difference) < 0.02 * max(1.0, abs(finite_difference))
  assert np.abs(gradient).max() > 1e-3


def _probability(loaded, sequence, start, neuron_scale):
  """The probability of sequence[start:] given sequence[:start], every neuron at position start - 1 scaled by
  `neuron_scale` (the whole sequence computed directly: no shared prefix, no chunks)."""
  c = loaded.config
  tokens = jnp.asarray(sequence)[None, None]
  where = (jnp.arange(len(sequence)) == start - 1)[None, None]
  ablation = Ablation(neuron_mask=jnp.full((1, c.num_layers, c.intermediate_size), neuron_scale), neuron_where=where)
  out = loaded.module.apply({"params": loaded.params}, tokens, jnp.arange(len(sequence))[None, None],
                           ablation=ablation)
  logits = np.asarray(lm_logits(c, loaded.params, out.hidden))[0, 0]
  logprobs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(
      -1, keepdims=True)
  return float(np.exp(sum(logprobs[p - 1, sequence[p]] for p in range(start, len(sequence)))))


@pytest.mark.heavy
def test_integrated_gradients_are_complete(tiny_model):
  """Completeness: each request's attributions sum to p(target) minus p(target) with every neuron at its last
  context position zeroed, up to the Riemann error of the path (shrinking with steps); a shared prefix changes
  nothing."""
  requests = few_shot_requests(6, seed=5) + [ScoringRequest("Question: What is 7 plus 1?\nAnswer:", " 8 and 1")]
  shared = Engine(tiny_model, EngineConfig(share_prefix=True))
  assert len(shared.prepare(requests)[0].prefix) > 0
  attribution = shared.neuron_attribution(requests, steps=64)
  assert attribution.shape == (len(requests), 3, 64)
  unshared = Engine(tiny_model, EngineConfig(share_prefix=False)).neuron_attribution(requests, steps=64)
  assert np.abs(attribution - unshared).max() < 1e-5 + 1e-3 * np.abs(attribution).max()
  tokenized = scoring_kernels.tokenize(tiny_model.tokenizer, requests, tiny_model.config.max_position_embeddings)
  for i, (sequence, start) in enumerate(zip(tokenized.sequences, tokenized.target_start)):
    full = _probability(tiny_model, sequence, int(start), 1.0)
    zeroed = _probability(tiny_model, sequence, int(start), 0.0)
    total = float(attribution[i].sum())
    assert abs(full - zeroed) > 0.01 * full  # a random model gives its targets tiny probabilities: compare relatively
    assert abs(total - (full - zeroed)) < 0.05 * abs(full - zeroed), (i, total, full - zeroed)
  coarse = shared.neuron_attribution(requests, steps=4)
  assert np.abs(coarse - attribution).max() > 0  # the steps are used


def test_mean_neuron_ablation_uses_the_means(tiny_model):
  engine = Engine(tiny_model)
  requests = few_shot_requests(4, seed=6)
  _, neuron_means = engine.ablation_means(requests)
  config = tiny_model.config
  assert neuron_means.shape == (config.num_layers, config.intermediate_size)
  masks = random_neuron_masks(config, 3, ablated=30, seed=6)
  zero = engine.score(requests, neuron_masks=masks).logprob
  mean = engine.score(requests, neuron_masks=masks, neuron_fill=neuron_means).logprob
  assert np.array_equal(zero[0], mean[0])  # nothing ablated: the fill is never used
  assert np.abs(zero[1:] - mean[1:]).max() > 1e-4
