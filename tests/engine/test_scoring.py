"""Batched scoring under masks: the shared prefix, mask batching and bucketing change nothing but speed."""

import numpy as np
import pytest

from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.requests import ScoringRequest
from jaxloc.engine import batching, scoring_kernels

SHOTS = "".join(f"Question: What is {a} plus {b}?\nAnswer: {a + b}\n\n" for a, b in [(2, 3), (4, 1), (5, 2), (1, 1)])


def few_shot_requests(n, seed=0):
  rng = np.random.default_rng(seed)
  return [ScoringRequest(SHOTS + f"Question: What is {a} plus {b}?\nAnswer:", f" {a + b}")
          for a, b in rng.integers(0, 10, size=(n, 2))]


def random_masks(config, n, ablated=4, seed=0):
  rng = np.random.default_rng(seed)
  masks = np.ones((n, config.num_layers, config.num_heads), np.float32)
  for m in range(1, n):
    masks[m].reshape(-1)[rng.choice(config.num_head_total, ablated, replace=False)] = 0
  return masks


def test_shared_prefix_equals_unshared(tiny_model):
  requests = few_shot_requests(12)
  masks = random_masks(tiny_model.config, 5)
  shared = Engine(tiny_model, EngineConfig(share_prefix=True))
  assert len(shared.prepare(requests)[0].prefix) > 20
  a = shared.score(requests, masks)
  b = Engine(tiny_model, EngineConfig(share_prefix=False)).score(requests, masks)
  assert np.abs(a.logprob - b.logprob).max() < 1e-4
  assert np.array_equal(a.is_greedy, b.is_greedy)
  assert np.abs(a.logprob[1:] - a.logprob[0]).max() > 1e-2  # the masks matter


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_mask_batch_equals_masks_one_at_a_time(tiny_model):
  requests = few_shot_requests(7, seed=1)
  masks = random_masks(tiny_model.config, 6, seed=1)
  engine = Engine(tiny_model, EngineConfig(tokens_per_batch=100_000))
  assert engine.masks_per_call(requests) >= 6  # 6 masks ride one call (padded to the layout's masks per call)
  batched = engine.score(requests, masks)
  one_at_a_time = Engine(tiny_model)
  single = np.stack([one_at_a_time.score(requests, m[None]).logprob[0] for m in masks])
  assert np.abs(batched.logprob - single).max() < 1e-4


def test_scores_match_transformers_on_smollm2(smollm2, smollm2_engine, smollm2_torch):
  import torch
  from jaxloc.models.torch_reference import ablated_heads

  requests = few_shot_requests(6, seed=2) + [ScoringRequest("The capital of France is", " Paris")]
  heads = [(3, 1), (12, 5), (20, 0)]
  masks = np.ones((2, 30, 9), np.float32)
  for layer, head in heads:
    masks[1, layer, head] = 0
  ours = smollm2_engine.score(requests, masks)
  tok = smollm2.tokenizer
  for mask_index, ablate in enumerate([[], heads]):
    for i, r in enumerate(requests):
      ctx, cont = tok(r.context)["input_ids"], tok(r.continuation, add_special_tokens=False)["input_ids"]
      with torch.no_grad(), ablated_heads(smollm2_torch, ablate):
        logits = smollm2_torch(torch.tensor([ctx + cont])).logits[0, len(ctx) - 1:-1]
      logprobs = torch.log_softmax(logits, -1)
      expected = float(logprobs[torch.arange(len(cont)), torch.tensor(cont)].sum())
      greedy = bool((logits.argmax(-1) == torch.tensor(cont)).all())
      assert abs(ours.logprob[mask_index, i] - expected) < 1e-3
      assert ours.is_greedy[mask_index, i] == greedy


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_bucketing_bounds_compilations(tiny_model):
  """30 request sets of different lengths compile a few shapes per length bucket (scoring from layer 0, from a later
  layer, and the residual streams that allows), not one per set or mask."""
  engine = Engine(tiny_model, EngineConfig(share_prefix=False, tokens_per_batch=4096))
  masks = random_masks(tiny_model.config, 3)
  rng = np.random.default_rng(0)
  for n in range(30):
    words = " ".join(["word"] * int(rng.integers(3, 60)))
    engine.score([ScoringRequest(words, " end"), ScoringRequest("short", " x")], masks)
  assert engine.compile_count <= 3 * len({batching.bucket(n) for n in range(1, 64)}) == 24


def test_bucket_ladder():
  assert [batching.bucket(n) for n in (1, 8, 9, 64, 65, 100, 129, 1000)] == [8, 8, 16, 64, 80, 112, 160, 1024]
  sizes = {batching.bucket(n) for n in range(1, 4097)}
  assert len(sizes) <= 8 + 4 * 6 + 1


def test_a_request_over_the_window_keeps_its_contexts_end_and_says_so(tokenizer, caplog):
  """The context is cut from the left to fit the model's positions, as lm-eval does, and one warning line says how
  many requests were cut and which was longest."""
  long = "The capital of France is Paris. " * 40 + "The capital of Italy is"
  requests = [ScoringRequest("The capital of Spain is", " Madrid"), ScoringRequest(long, " Rome")]
  with caplog.at_level("WARNING"):
    tokenized = scoring_kernels.tokenize(tokenizer, requests, max_length=64)
  whole = tokenizer(long)["input_ids"] + tokenizer(" Rome", add_special_tokens=False)["input_ids"]
  assert len(tokenized.sequences[1]) == 64 and list(tokenized.sequences[1]) == whole[-64:]
  assert [r.getMessage() for r in caplog.records] == [
      f"1 of 2 requests are longer than the model's 64 positions: each keeps only the end of its context (cut from the "
      f"left, as lm-eval does); the longest, request 1 (context 'The capital of France is Paris. The capi…'), has "
      f"{len(whole):,} tokens"]
  caplog.clear()
  scoring_kernels.tokenize(tokenizer, requests[:1], max_length=64)
  assert not caplog.records


def test_shared_prefix_leaves_first_predictor_out():
  tokenized = scoring_kernels.TokenizedRequests([np.array([1, 2, 3, 4, 5, 6, 7]), np.array([1, 2, 3, 4, 5, 6, 8])],
                                        np.array([6, 6]))
  assert scoring_kernels.shared_prefix_length(tokenized) == 5  # position 5 predicts the first target token


def test_mean_ablation_matches_torch_fill(smollm2, smollm2_engine, smollm2_torch):
  import torch
  from jaxloc.models.torch_reference import ablated_heads

  requests = few_shot_requests(4, seed=3)
  engine = smollm2_engine
  means = engine.ablation_means(requests)[0]
  assert means.shape == (30, 9, 64) and np.abs(means).max() > 0
  heads = [(4, 2), (17, 6)]
  masks = np.ones((1, 30, 9), np.float32)
  for layer, head in heads:
    masks[0, layer, head] = 0
  ours = engine.score(requests[:1], masks, head_fill=means).logprob[0, 0]
  tok = smollm2.tokenizer
  ctx = tok(requests[0].context)["input_ids"]
  cont = tok(requests[0].continuation, add_special_tokens=False)["input_ids"]
  with torch.no_grad(), ablated_heads(smollm2_torch, heads, fill=means):
    logits = smollm2_torch(torch.tensor([ctx + cont])).logits[0, len(ctx) - 1:-1]
  expected = float(torch.log_softmax(logits, -1)[torch.arange(len(cont)), torch.tensor(cont)].sum())
  assert abs(ours - expected) < 1e-3


def test_bad_mask_shape_is_a_clear_error(tiny_model):
  from jaxloc.errors import UserError

  with pytest.raises(UserError, match=r"head masks must be \[masks, 3, 6\]"):
    Engine(tiny_model).score(few_shot_requests(2), np.ones((2, 30, 9)))


def test_mask_gradient_matches_finite_differences(tiny_model):
  requests = few_shot_requests(5, seed=4)
  engine = Engine(tiny_model)
  config = tiny_model.config
  ones = np.ones((1, config.num_layers, config.num_heads), np.float32)
  value, gradient = engine.mask_objective(requests, ones)
  gradient = gradient[0]
  base = engine.score(requests, ones).logprob.mean()
  assert abs(value[0] - base) < 1e-4
  eps = 1e-3
  for layer, head in [(0, 1), (1, 4), (2, 5)]:
    mask = ones.copy()
    mask[0, layer, head] = 1 - eps
    finite_difference = (base - engine.score(requests, mask).logprob.mean()) / eps
    assert abs(gradient[layer, head] - finite_difference) < 0.02 * max(1.0, abs(finite_difference))
  assert np.abs(gradient).max() > 1e-3


def test_retained_probability_of_soft_masks_and_its_gradient(tiny_model):
  """Several soft masks at once: each value is the mean over requests of exp(min(logprob - offset, 0)), each
  gradient that mask's own (checked by finite differences)."""
  requests = few_shot_requests(6, seed=8)
  engine = Engine(tiny_model)
  config = tiny_model.config
  rng = np.random.default_rng(0)
  soft = rng.uniform(0.2, 1.0, (3, config.num_layers, config.num_heads)).astype(np.float32)
  # Offsets above some requests' scores and below others': both sides of the cap at 1.
  offsets = engine.score(requests, soft[:1]).logprob[0] + np.tile([0.5, -0.5], len(requests) // 2)
  weights = np.full(len(requests), 1 / len(requests))
  values, grads = engine.mask_objective(requests, soft, weights, offsets, retained=True)
  logprob = engine.score(requests, soft).logprob.astype(np.float64)
  expected = np.exp(np.minimum(logprob - offsets[None], 0)).mean(axis=1)
  np.testing.assert_allclose(values, expected, atol=1e-5)
  assert 0.5 < expected.min() and expected.max() < 1.0
  eps = 1e-2
  for m, layer, head in [(0, 0, 1), (2, 2, 3)]:
    up, down = soft.copy(), soft.copy()
    up[m, layer, head] += eps
    down[m, layer, head] -= eps
    after, _ = engine.mask_objective(requests, up, weights, offsets, retained=True)
    before, _ = engine.mask_objective(requests, down, weights, offsets, retained=True)
    finite_difference = (after[m] - before[m]) / (2 * eps)  # central: the second-order term cancels
    assert abs(grads[m, layer, head] - finite_difference) < 0.05 * max(0.02, abs(finite_difference))
    assert np.allclose(np.delete(after, m), np.delete(values, m))  # the other masks did not move


def test_request_chunks_are_balanced(tiny_model):
  """100 requests that do not fit one call are cut into equal chunks, not 97 + a padded 3."""
  requests = few_shot_requests(100, seed=5)
  engine = Engine(tiny_model, EngineConfig(share_prefix=False, pack=False, tokens_per_batch=2000))
  layout, _ = engine.prepare(requests)
  sizes = [int((c.index >= 0).sum()) for c in layout.chunks]
  assert len(sizes) > 1 and max(sizes) - min(sizes) <= 1
  assert all(c.rows.tokens.shape[0] == layout.chunks[0].rows.tokens.shape[0] for c in layout.chunks)


def test_every_call_of_a_layout_takes_one_number_of_masks(tiny_model):
  """Masks per call are the layout's, whatever the caller has: a baseline, a validation curve, single-head checks
  and a design batch pad to one compiled shape (and padding changes no score)."""
  requests = few_shot_requests(10, seed=3)
  masks = random_masks(tiny_model.config, 30, seed=3)
  engine = Engine(tiny_model, EngineConfig(tokens_per_batch=80 * 24))
  per_call = engine.masks_per_call(requests)
  assert 1 < per_call < len(masks)
  full = engine.score(requests, masks).logprob
  compiled = engine.compile_count
  for count in (1, 2, 5, per_call + 1):
    assert np.abs(engine.score(requests, masks[:count]).logprob - full[:count]).max() < 1e-5
  assert engine.compile_count == compiled


def test_call_size_pads_to_the_plan_unless_a_smaller_call_saves_more_than_a_compile():
  from jaxloc.engine.scorer import call_size

  assert call_size(100, 85, {85}, 50.0, 2.0) == 85  # more than a call: the planned size
  assert call_size(3, 85, {85}, None, 2.0) == 85  # no full call timed yet
  assert call_size(3, 85, {85}, 50.0, None) == 85  # nothing compiled yet
  assert call_size(3, 85, {85}, 4.0, 1.0) == 85  # SmolLM2-like: padding costs less than a few compiles
  assert call_size(3, 85, {85}, 50.0, 2.0) == 4  # 1B on a CPU: a full call costs 25 compiles
  assert call_size(3, 85, {85, 4}, 0.1, 4.0) == 4  # compiled already: free
  assert call_size(2, 85, {85, 4}, 50.0, 2.0) == 4  # one smaller size per shape: it takes what fits it
  assert call_size(11, 85, {85, 4}, 50.0, 2.0) == 85  # and no second one
  assert call_size(60, 85, {85}, 50.0, 4.0) == 85  # 64 would save 12 s, less than four 4 s compiles


def test_a_few_masks_take_a_smaller_call_when_a_full_one_costs_more_than_a_compile(tiny_model):
  requests = few_shot_requests(10, seed=3)
  masks = random_masks(tiny_model.config, 30, seed=3)
  engine = Engine(tiny_model, EngineConfig(tokens_per_batch=80 * 24, compilation_cache="none"))
  full = engine.score(requests, masks).logprob  # full calls, timed
  compiled = engine.compile_count
  np.testing.assert_allclose(engine.score(requests, masks[:3]).logprob, full[:3], atol=1e-5)
  assert engine.compile_count == compiled  # a tiny model's full call costs less than a compile: padded
  engine.scorer._full_call = {shape: 1e6 for shape in engine.scorer._full_call}  # as if each took 11 days
  np.testing.assert_allclose(engine.score(requests, masks[:3]).logprob, full[:3], atol=1e-5)
  assert engine.compile_count > compiled
  compiled = engine.compile_count
  engine.score(requests, masks[:4])  # the 4-mask call is compiled now
  assert engine.compile_count == compiled


@pytest.mark.parametrize("unit", ["heads", "neurons"])
def test_a_masks_exact_scores_do_not_depend_on_the_masks_sharing_its_call(tiny_model, unit):
  """What makes a resumed run bit-identical to one never interrupted: with the residual cache a batch starts at its
  lowest first ablated layer, and each mask at its own (`Resume.starts`); `exact` calls all take the layout's size
  (XLA picks kernels by shape). So a mask scores the same bits alone, in another order, with other companions, and
  in a call the timing would have made smaller. Shared prefix included."""
  from jaxloc.engine.masks import check_masks, start_layers

  c = tiny_model.config
  requests = few_shot_requests(10, seed=3)
  rng = np.random.default_rng(5)
  width = c.num_heads if unit == "heads" else c.intermediate_size
  masks = (rng.random((24, c.num_layers, width)) > (0.12 if unit == "heads" else 0.02)).astype(np.float32)
  masks[:, 0] = np.where(np.arange(24)[:, None] % 3 == 0, masks[:, 0], 1.0)  # two in three start above layer 0
  kind = "head_masks" if unit == "heads" else "neuron_masks"
  starts = start_layers(c, check_masks(c, None, masks) if unit == "neurons" else check_masks(c, masks))
  assert len(set(starts.tolist())) > 1
  engine = Engine(tiny_model, EngineConfig(tokens_per_batch=80 * 24, compilation_cache="none"))
  assert 1 < engine.masks_per_call(requests) < len(masks) and len(engine.prepare(requests)[0].prefix) > 20

  def score(keep):
    return np.concatenate([out.logprob for _, out in engine.score_batches(requests, **{kind: keep}, exact=True)])

  full = score(masks)
  assert np.abs(full - full[0]).max() > 1e-3  # the masks matter
  engine.scorer._full_call = {shape: 1e6 for shape in engine.scorer._full_call}  # a smaller call would pay
  assert np.array_equal(score(masks[::-1]), full[::-1])
  for begin in (1, 5, 13):
    assert np.array_equal(score(masks[begin:]), full[begin:]), begin
  for i in np.flatnonzero(starts > starts.min())[:4]:
    assert np.array_equal(score(masks[i:i + 1]), full[i:i + 1]), (i, starts[i])
  assert np.array_equal(score(masks[starts == starts.max()]), full[starts == starts.max()])


def test_a_pinned_layout_outlives_every_other(tiny_model):
  from jaxloc.engine import layouts

  engine = Engine(tiny_model)
  pinned = few_shot_requests(6, seed=7)
  lay, _ = engine.prepare(pinned, pin=True)
  for seed in range(layouts.MAX_LAYOUTS + 2):
    engine.prepare(few_shot_requests(3, seed=100 + seed))
  assert engine.prepare(pinned)[0] is lay


def test_held_out_documents_pad_into_a_shape_laid_out_before(tiny_model):
  """Requests scored in a few calls (held-out documents, half as many as the identification ones) take the larger
  shape compiled before instead of compiling their own; scored often, they get their own. Scores are the same."""
  identification, held_out = few_shot_requests(40, seed=1), few_shot_requests(12, seed=2)
  masks = random_masks(tiny_model.config, 3, seed=4)
  scores = {}
  for few_calls in (True, False):
    engine = Engine(tiny_model, EngineConfig(compilation_cache="none"))
    engine.score(identification, masks)
    compiled = engine.compile_count
    scores[few_calls] = np.asarray(list(engine.score_batches(held_out, masks, few_calls=few_calls))[0][1].logprob)
    assert (engine.compile_count == compiled) == few_calls, (few_calls, compiled, engine.compile_count)
    assert len(engine.shared.layouts.shapes) == (1 if few_calls else 2)
  np.testing.assert_allclose(scores[True], scores[False], atol=1e-5)


def test_float32_activations_over_bfloat16_weights(tiny_model):
  """--activation_dtype=float32 with bfloat16 weights: weights stay bfloat16 in memory, the residual stream and
  every matmul run in float32. What is left is the weights' own rounding: the same as a float32 engine over the
  weights rounded to bfloat16, and less than the error of running in bfloat16."""
  import dataclasses

  import jax
  import jax.numpy as jnp

  requests = few_shot_requests(6, seed=3)
  masks = random_masks(tiny_model.config, 3)
  bf16 = dataclasses.replace(tiny_model, params=jax.tree.map(lambda p: p.astype(jnp.bfloat16), tiny_model.params),
                             dtype=jnp.bfloat16)
  rounded = dataclasses.replace(tiny_model, params=jax.tree.map(lambda p: p.astype(jnp.float32), bf16.params))
  # Every layer computed (no residual cache): the comparison is of dtypes, not of where a mask's computation starts
  # (the unablated mask resumes at the last layer from the cached stream, whose bfloat16 rounding differs).
  every_layer = EngineConfig(residual_cache_gb=0.0)
  reference = Engine(tiny_model, every_layer).score(requests, masks).logprob
  mixed_engine = Engine(bf16, dataclasses.replace(every_layer, activation_dtype="float32"))
  assert mixed_engine.params["embed"]["embedding"].dtype == jnp.bfloat16 and mixed_engine.dtype == jnp.float32
  mixed = mixed_engine.score(requests, masks).logprob
  np.testing.assert_allclose(mixed, Engine(rounded, every_layer).score(requests, masks).logprob, atol=1e-5)
  pure = np.abs(Engine(bf16, every_layer).score(requests, masks).logprob - reference).max()
  assert np.abs(mixed - reference).max() < 0.75 * pure, (np.abs(mixed - reference).max(), pure)
