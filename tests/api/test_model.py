"""The prompt-level API (`jaxloc.load`, `jaxloc.from_hf`, `Model`) against transformers on a tiny random Llama: logits,
cached activations (hidden states, per-head outputs, attention patterns) and activation patching against a PyTorch
hook loop; many masks in one call against one call per mask."""

import numpy as np
import pytest

import jaxloc
from jaxloc.errors import UserError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Float32 on both sides; the tiny model's weights are scaled up so that heads matter, and its logits reach ~20.
TOLERANCE = 1e-4


def gap(ours, reference) -> float:
  """Largest difference, relative to the reference's largest magnitude (at least 1)."""
  reference = np.asarray(reference)
  return float(np.abs(np.asarray(ours) - reference).max() / max(1.0, float(np.abs(reference).max())))


pytestmark = pytest.mark.heavy  # each compiles the tiny model several times (5-20 s on 2 busy cores)

PROMPTS = ["The plural of mouse is", "When Mary and John went to the store, John gave a drink to"]


@pytest.fixture(scope="module")
def torch_model(tiny_model_dir):
  return transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                           attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def model(torch_model, tokenizer):
  """Converted from the transformers model in memory (not from its directory)."""
  return jaxloc.from_hf(torch_model, tokenizer=tokenizer)


def _torch_run(torch_model, ids, **kwargs):
  with torch.no_grad():
    return torch_model(torch.tensor([ids]), **kwargs)


def test_from_hf_in_memory_and_directory_give_transformers_logits(model, torch_model, tiny_model_dir):
  ids = model.tokens(PROMPTS)
  ours = model.logits(PROMPTS)  # [1 mask, prompts, tokens, vocab]
  from_dir = jaxloc.from_hf(tiny_model_dir).logits(PROMPTS)
  assert ours.shape[:2] == (1, 2) and ours.shape[3] == model.config.vocab_size
  for p, prompt_ids in enumerate(ids):
    reference = _torch_run(torch_model, prompt_ids).logits[0].numpy()
    assert gap(ours[0, p, :len(prompt_ids)], reference) < TOLERANCE
    assert gap(from_dir[0, p, :len(prompt_ids)], reference) < TOLERANCE
  top = model.logits(PROMPTS, last=True, top_k=3)
  last = ours[0, 0, len(ids[0]) - 1]
  assert top.tokens[0, 0].tolist() == np.argsort(-last)[:3].tolist()
  assert np.allclose(np.exp(top.logprobs[0, 0]).sum() <= 1.0, True)


def test_head_masks_match_the_o_proj_hook_and_many_masks_equal_one_call_each(model, torch_model):
  from jaxloc.models.torch_reference import ablated_heads

  masks = jaxloc.masks.none(model) + jaxloc.masks.heads(model, ["L0H1", "L2H3"], each=True) + \
      jaxloc.masks.random(model, 5, 0.25, seed=1)
  together = model.logits(PROMPTS, masks, last=True)
  one_by_one = np.concatenate([model.logits(PROMPTS, masks[i], last=True) for i in range(len(masks))])
  assert together.shape == (8, 2, model.config.vocab_size)
  assert gap(together, one_by_one) < TOLERANCE
  ids = model.tokens(PROMPTS[0])[0]
  with ablated_heads(torch_model, [(0, 1)]):
    reference = _torch_run(torch_model, ids).logits[0, -1].numpy()
  assert gap(together[1, 0], reference) < TOLERANCE
  assert np.abs(together[1, 0] - together[0, 0]).max() > 1e-2  # the ablation mattered
  named = model.logits(PROMPTS, heads="L0H1", last=True)
  assert gap(named[0], together[1]) < TOLERANCE


def test_cache_matches_hidden_states_attentions_and_o_proj_inputs(model, torch_model):
  from jaxloc.models.torch_reference import o_proj_inputs

  cache = model.run_with_cache(PROMPTS, jaxloc.masks.none(model) + jaxloc.masks.heads(model, "L1H2"),
                               names=["resid_pre", "pattern", "z", "final", "logits"])
  c = model.config
  for p, ids in enumerate(cache.tokens):
    n = len(ids)
    out = _torch_run(torch_model, ids, output_hidden_states=True, output_attentions=True)
    for layer in range(c.num_layers):
      assert gap(cache.get("resid_pre", layer, prompt=p), out.hidden_states[layer][0].numpy()) < TOLERANCE
      assert gap(cache.get("pattern", layer, prompt=p), out.attentions[layer][0].numpy()) < TOLERANCE
    assert gap(cache.get("final", prompt=p), out.hidden_states[c.num_layers][0].numpy()) < TOLERANCE
    heads = o_proj_inputs(torch_model, torch.tensor([ids]))
    for layer in range(c.num_layers):
      ours = cache.get("z", layer, prompt=p).reshape(n, -1)
      assert gap(ours, heads[layer][0].numpy()) < TOLERANCE
    assert gap(cache.get("logits", prompt=p), out.logits[0].numpy()) < TOLERANCE
  assert np.all(np.nan_to_num(cache["z", 1][1, :, :, 2]) == 0)  # the ablated head outputs nothing
  assert np.allclose(cache.pattern("L1H2").sum(-1), 1.0, atol=1e-5)
  assert cache.labels == ["none", "L1H2"]
  short = int(np.argmin(cache.lengths))  # past a shorter prompt's end: NaN, never a padding token's values
  assert np.isnan(cache["z"][0, 0, short, cache.lengths[short]:]).all()
  assert "mlp_post" not in cache and "Cache(" in repr(cache) and len(repr(cache)) < 400


def test_patching_every_head_in_one_call_matches_a_hook_loop(model, torch_model):
  from jaxloc.models.torch_reference import patched_heads_loop

  clean, corrupted = ["When Mary and John went out, John gave it to"], ["When Mary and John went out, Mary gave it to"]
  patched = model.patch(clean, corrupted)
  c = model.config
  assert patched.logits.shape == (c.num_layers * c.num_heads, 1, c.vocab_size)
  heads = [(layer, h) for layer in range(c.num_layers) for h in range(c.num_heads)]
  reference = patched_heads_loop(torch_model, torch.tensor(model.tokens(clean)), torch.tensor(model.tokens(corrupted)),
                                 heads)
  assert gap(patched.logits, reference) < TOLERANCE
  assert np.abs(patched.logits - patched.corrupted).max() > 1e-2  # patching changed something
  # Patching every head of a layer at once from the clean run is that layer's clean attention output.
  every = jaxloc.masks.MaskSet(np.zeros((1, c.num_layers, c.num_heads), np.float32), None, ["all"])
  assert gap(model.patch(clean, corrupted, every).logits[0], patched.clean) < TOLERANCE
  columns = model.patch(clean, corrupted, "L0H0,L1N3", columns=[5, 7])
  assert columns.logits.shape == (2, 1, 2) and columns.labels == ["L0H0", "L1N3"]
  assert gap(columns.logits[0], patched.logits[0][:, [5, 7]]) < TOLERANCE


def test_score_and_generate_take_many_masks(model):
  masks = jaxloc.masks.none(model) + jaxloc.masks.heads(model, ["L0H1", "L2H3"], each=True)
  scores = model.score(["The plural of mouse is"], [" mice"], masks)
  assert scores.shape == (3, 1)
  ids = model.tokens(["The plural of mouse is mice"])[0]
  prompt = len(model.tokens(["The plural of mouse is"])[0])
  logits = model.logits(["The plural of mouse is mice"], masks)[:, 0, :len(ids)]
  logprobs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
      - logits.max(-1, keepdims=True)
  expected = sum(logprobs[:, t - 1, ids[t]] for t in range(prompt, len(ids)))
  assert np.abs(scores[:, 0] - expected).max() < 1e-3
  texts = model.generate(["Once upon a time"], masks, max_new_tokens=4)
  assert len(texts) == 3 and len(texts[0]) == 1 and texts[0][0]


def test_masks_builder_and_errors(model):
  c = model.config
  sweep = jaxloc.masks.single_heads(model, layers=[1])
  assert sweep.heads.shape == (c.num_heads, c.num_layers, c.num_heads) and sweep.labels[0] == "L1H0"
  assert (sweep.heads == 0).sum() == c.num_heads and sweep.heads[2, 1, 2] == 0
  both = jaxloc.masks.heads(model, "L0H1") + jaxloc.masks.neurons(model, ["L2N5"])
  assert both.heads.shape == (2, c.num_layers, c.num_heads) and both.neurons.shape == (2, c.num_layers,
                                                                                         c.intermediate_size)
  assert both.heads[1].min() == 1 and both.neurons[0].min() == 1 and both.neurons[1, 2, 5] == 0
  rand = jaxloc.masks.random(model, 10, 0.25, seed=3)
  assert len(rand) == 10 and np.all((rand.heads == 0).sum(axis=(1, 2)) == round(0.25 * c.num_layers * c.num_heads))
  with pytest.raises(UserError, match="L9H0 is out of range"):
    jaxloc.masks.heads(model, "L9H0")
  with pytest.raises(UserError, match="head keep-masks must be"):
    model.logits(PROMPTS, np.ones((2, 5)))
  with pytest.raises(UserError, match="same number of tokens"):
    model.patch(["a b c d"], ["a"])
