"""Sampling in generation (`engine/sampling.py`, `requests.Sampling`, `Model.generate`'s temperature, top_k, top_p and
seed): greedy decoding untouched, draws reproducible from the seed and independent of the other rows of a call, the
filters transformers' own, the draws' frequencies the filtered softmax's, and bad settings refused with a
`UserError`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.api.model import Model
from jaxloc.bench.previous_generation import PreviousGenerator
from jaxloc.engine import sampling
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.requests import GenerationRequest, Sampling
from jaxloc.errors import UserError

PROMPTS = ["Once upon a time", "The capital of France is", "def add(a, b):"]
NEW = 8


@pytest.fixture(scope="module")
def model(tiny_model):
  """One `Model` for the module, so that its tests share the engine's compiled calls."""
  return Model(tiny_model)


@pytest.fixture(scope="module")
def masks(tiny_model):
  """Two head keep-masks [2, L, H]: none ablated, and three heads of layer 0."""
  config = tiny_model.config
  keep = np.ones((2, config.num_layers, config.num_heads), np.float32)
  keep[1, 0, :3] = 0
  return keep


@pytest.mark.heavy  # the previous generator compiles its own prefill and loop
def test_greedy_is_unchanged_without_sampling_arguments_and_at_temperature_zero(model, masks):
  greedy = model.generate(PROMPTS, masks, max_new_tokens=NEW)
  requests = [GenerationRequest(p, max_new_tokens=NEW) for p in PROMPTS]
  assert greedy == PreviousGenerator(model.engine.shared).generate(requests, masks)
  compiled = model.engine.compile_count
  # At temperature 0 the other settings change nothing, and the job runs the very executables greedy decoding ran.
  assert model.generate(PROMPTS, masks, max_new_tokens=NEW, temperature=0.0, top_k=5, top_p=0.5, seed=7) == greedy
  assert model.engine.compile_count == compiled


def test_the_same_seed_draws_the_same_texts_and_another_seed_others(model, masks):
  first = model.generate(PROMPTS, masks, max_new_tokens=NEW, temperature=2.0, seed=0)
  assert model.generate(PROMPTS, masks, max_new_tokens=NEW, temperature=2.0, seed=0) == first
  other = model.generate(PROMPTS, masks, max_new_tokens=NEW, temperature=2.0, seed=1)
  assert other != first
  assert sum(a != b for row, other_row in zip(first, other) for a, b in zip(row, other_row)) >= 4  # of 6 rows
  assert first != model.generate(PROMPTS, masks, max_new_tokens=NEW)  # not greedy


@pytest.mark.heavy  # three engines' jobs compile (two layouts, one row a call)
def test_a_row_draws_the_same_tokens_whichever_masks_share_the_call_and_however_it_is_batched(model, masks, tiny_model):
  kwargs = dict(max_new_tokens=NEW, temperature=1.5, top_p=0.9, seed=3)
  both = model.generate(PROMPTS, masks, **kwargs)
  assert model.generate(PROMPTS, masks[:1], **kwargs) == both[:1]
  one_row_a_call = Model(tiny_model, EngineConfig(generation_batch=1))
  assert one_row_a_call.generate(PROMPTS, masks, **kwargs) == both


@pytest.mark.heavy  # two engines' jobs compile, one of them ahead of time
def test_a_sampling_job_near_the_budget_runs_on_the_executable_xla_measured(model, masks, tiny_model, caplog):
  """Where the planner's estimate comes near the budget the decode call is compiled ahead of time for the job's
  arguments, sampler and row ids included, and that executable runs it: the same draws as an unconstrained job."""
  import logging

  from jaxloc.engine.planner import GIB

  kwargs = dict(max_new_tokens=NEW, temperature=1.0, top_k=20, seed=11)
  expected = model.generate(PROMPTS, masks, **kwargs)
  estimate = max(layout.estimated_bytes for layout in model.engine.generator._layouts.values())  # noqa: SLF001
  tight = Model(tiny_model, EngineConfig(memory_budget_gb=1.5 * estimate / GIB, residual_cache_gb=0))
  with caplog.at_level(logging.INFO, logger="jaxloc.engine.generator"):
    assert tight.generate(PROMPTS, masks, **kwargs) == expected
  assert any("XLA" in r.message for r in caplog.records)


def test_top_k_of_one_at_a_temperature_is_greedy(model, masks):
  greedy = model.generate(PROMPTS, masks, max_new_tokens=NEW)
  assert model.generate(PROMPTS, masks, max_new_tokens=NEW, temperature=1.5, top_k=1, seed=5) == greedy


def _expected_probabilities(logits, temperature, top_k=None, top_p=None):
  """softmax(logits / temperature) over the top_k likeliest, then over the smallest likeliest set reaching top_p."""
  scaled = np.asarray(logits, np.float64) / temperature
  order = np.argsort(-scaled, kind="stable")
  keep = np.zeros(len(scaled), bool)
  keep[order[:top_k or len(scaled)]] = True
  probs = np.where(keep, np.exp(scaled - scaled.max()), 0)
  probs /= probs.sum()
  if top_p is not None:
    before = np.cumsum(probs[order]) - probs[order]
    nucleus = np.zeros(len(scaled), bool)
    nucleus[order[before < top_p]] = True
    probs = np.where(nucleus, probs, 0)
    probs /= probs.sum()
  return probs


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.5, None, None), (1.0, 3, None),
                                                     (1.0, None, 0.7), (2.0, 4, 0.8)])
def test_draws_follow_the_filtered_softmax(temperature, top_k, top_p):
  logits = jnp.array([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
  draws = 40_000  # a row per draw, each with the key of its own token index
  keys = sampling.token_keys(jax.random.key_data(jax.random.key(0)), jnp.zeros((draws, 2), jnp.int32),
                             jnp.arange(draws, dtype=jnp.int32))
  tokens = sampling.sample(jnp.broadcast_to(logits, (draws, len(logits))), keys, jnp.float32(temperature),
                           None if top_k is None else jnp.int32(top_k), None if top_p is None else jnp.float32(top_p))
  frequencies = np.bincount(np.asarray(tokens), minlength=len(logits)) / draws
  expected = _expected_probabilities(logits, temperature, top_k, top_p)
  assert (frequencies[expected == 0] == 0).all()  # a filtered token is never drawn
  np.testing.assert_allclose(frequencies, expected, atol=0.012)  # over 5 standard errors at these draws


def test_filters_keep_what_transformers_warpers_keep():
  torch = pytest.importorskip("torch")
  logits_process = pytest.importorskip("transformers.generation.logits_process")
  logits = np.random.default_rng(0).normal(size=(64, 50)).astype(np.float32) * 3
  for top_k, top_p in [(5, None), (None, 0.9), (None, 0.3), (10, 0.5), (50, 1e-4)]:
    scores = torch.tensor(logits)
    if top_k is not None:
      scores = logits_process.TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
      scores = logits_process.TopPLogitsWarper(top_p)(None, scores)
    ours = sampling.filter_logits(jnp.asarray(logits), None if top_k is None else jnp.int32(top_k),
                                  None if top_p is None else jnp.float32(top_p))
    np.testing.assert_array_equal(np.isfinite(np.asarray(ours)), np.isfinite(scores.numpy()), err_msg=f"{top_k, top_p}")


def test_a_row_key_depends_on_its_mask_prompt_and_token_alone():
  key = jax.random.key_data(jax.random.key(0))
  ids = jnp.array([[0, 0], [0, 1], [1, 0], [0, 0]], jnp.int32)
  index = jnp.array([0, 0, 0, 1], jnp.int32)
  data = np.asarray(jax.random.key_data(sampling.token_keys(key, ids, index)))
  assert len({tuple(d) for d in data}) == 4  # a mask, a prompt or a token apart: another key
  alone = np.asarray(jax.random.key_data(sampling.token_keys(key, ids[2:3], index[2:3])))
  np.testing.assert_array_equal(alone[0], data[2])


@pytest.mark.parametrize("settings,message", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature=1.0, top_k=0), "top_k"),
    (dict(temperature=1.0, top_k=10**7), "vocabulary size"), (dict(temperature=1.0, top_k=2.5), "top_k"),
    (dict(temperature=1.0, top_p=0.0), "top_p"), (dict(temperature=1.0, top_p=1.5), "top_p"),
    (dict(temperature=1.0, seed=1.5), "seed"), (dict(temperature=1.0, seed="0"), "seed"),
    (dict(temperature=1.0, seed=-1), "seed"), (dict(temperature=1.0, seed=2**32), "seed"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(max_new_tokens=-3), "max_new_tokens")])
def test_bad_settings_are_user_errors_naming_the_value(model, settings, message):
  with pytest.raises(UserError, match=message):
    model.generate(PROMPTS, **settings)


def test_the_engine_refuses_a_top_k_over_the_vocabulary(model):
  request = GenerationRequest("Hello", max_new_tokens=2, sampling=Sampling(1.0, top_k=10**7))
  with pytest.raises(UserError, match="vocabulary size"):
    model.engine.generate([request], np.ones((1, model.config.num_layers, model.config.num_heads)))
  assert Sampling(1, top_k=np.int64(3), seed=np.int32(2)) == Sampling(1.0, top_k=3, seed=2)  # one job's settings
