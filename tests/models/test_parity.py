"""Logit parity with transformers' PyTorch implementation, in float32, with no download."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.models.decoder import Ablation, lm_logits
from jaxloc.models.loading import load_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL_TINY = 1e-4


def _tiny_llama():
  return transformers.LlamaConfig(
      vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
      num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
      rope_theta=5000.0, rms_norm_eps=1e-5,
      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16})


def _tiny_llama_biased():
  return transformers.LlamaConfig(
      vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
      num_key_value_heads=3, max_position_embeddings=128, tie_word_embeddings=True, attention_bias=True,
      mlp_bias=True)


def _tiny_qwen2():
  return transformers.Qwen2Config(
      vocab_size=173, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, rope_theta=1e6,
      rms_norm_eps=1e-6)


CONFIGS = {"llama3_untied_gqa": _tiny_llama, "llama_bias_tied": _tiny_llama_biased, "qwen2_tied_gqa": _tiny_qwen2}


def _save_random(config_fn, directory):
  torch.manual_seed(0)
  config = config_fn()
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
  # Random init leaves biases at zero and norms at one; perturb them so the test can see them.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(directory)
  return model


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request, tmp_path_factory):
  directory = str(tmp_path_factory.mktemp(request.param))
  reference = _save_random(CONFIGS[request.param], directory)
  loaded = load_model(directory, dtype=jnp.float32, cache_dir=None)
  return loaded, reference


def _jax_logits(loaded, tokens, positions=None, head_mask=None, segments=None, neuron_mask=None):
  """The module's float32 logits at full matmul precision, as an engine computes them (`--float32_matmuls`'s default;
  on GPUs JAX's own default would be TF32)."""
  tokens = jnp.asarray(tokens)[:, None]  # [batch as masks, 1 request, seq]
  if positions is None:
    positions = jnp.arange(tokens.shape[-1])[None, None]
  with jax.default_matmul_precision("highest"):
    out = loaded.module.apply({"params": loaded.params}, tokens, jnp.asarray(positions),
                              ablation=Ablation(head_mask=head_mask, neuron_mask=neuron_mask), segments=segments)
    return np.asarray(lm_logits(loaded.config, loaded.params, out.hidden))[:, 0]


def test_logits_match_transformers(tiny):
  loaded, reference = tiny
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, loaded.config.vocab_size, size=(3, 40))
  ours = _jax_logits(loaded, tokens)
  with torch.no_grad():
    theirs = reference(torch.tensor(tokens)).logits.numpy()
  assert np.abs(ours - theirs).max() < TOL_TINY


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_padded_batch_matches_unpadded_sequences(tiny):
  """Right padding needs no mask; left padding needs segments (-1 on padding) and shifted positions."""
  loaded, reference = tiny
  rng = np.random.default_rng(1)
  lengths = [37, 21, 8]
  width = max(lengths)
  pad = 0
  seqs = [rng.integers(1, loaded.config.vocab_size, size=n) for n in lengths]
  with torch.no_grad():
    expected = [reference(torch.tensor(s)[None]).logits[0].numpy() for s in seqs]
  right = np.full((3, width), pad)
  left = np.full((3, width), pad)
  left_valid = np.zeros((3, width), bool)
  left_pos = np.zeros((3, width), int)
  for i, s in enumerate(seqs):
    right[i, :len(s)] = s
    left[i, width - len(s):] = s
    left_valid[i, width - len(s):] = True
    left_pos[i, width - len(s):] = np.arange(len(s))
  ours_right = _jax_logits(loaded, right)
  ours_left = _jax_logits(loaded, left, positions=left_pos[:, None], segments=jnp.where(left_valid, 0, -1)[:, None])
  for i, s in enumerate(seqs):
    assert np.abs(ours_right[i, :len(s)] - expected[i]).max() < TOL_TINY
    assert np.abs(ours_left[i, width - len(s):] - expected[i]).max() < TOL_TINY


def test_head_mask_matches_o_proj_pre_hook(tiny):
  from jaxloc.models.torch_reference import ablated_heads

  loaded, reference = tiny
  cfg = loaded.config
  rng = np.random.default_rng(2)
  tokens = rng.integers(0, cfg.vocab_size, size=(1, 30))
  # Query head 1 shares its KV group with head 0 (and others), which stay on.
  heads = [(0, 1), (cfg.num_layers - 1, cfg.num_heads - 1)]
  mask = np.ones((1, cfg.num_layers, cfg.num_heads), np.float32)
  for layer, head in heads:
    mask[0, layer, head] = 0
  ours = _jax_logits(loaded, tokens, head_mask=jnp.asarray(mask))
  with torch.no_grad(), ablated_heads(reference, heads):
    theirs = reference(torch.tensor(tokens)).logits.numpy()
  with torch.no_grad():
    clean = reference(torch.tensor(tokens)).logits.numpy()
  assert np.abs(ours - theirs).max() < TOL_TINY
  assert np.abs(theirs - clean).max() > 100 * TOL_TINY  # the ablation really changed something


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_all_ones_mask_is_bit_identical(tiny):
  loaded, _ = tiny
  cfg = loaded.config
  tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 25))
  plain = _jax_logits(loaded, tokens)
  ones = _jax_logits(loaded, tokens, head_mask=jnp.ones((2, cfg.num_layers, cfg.num_heads)))
  assert np.array_equal(plain, ones)


def test_neuron_mask_matches_zeroed_down_proj_columns(tiny):
  from jaxloc.models.torch_reference import zeroed_down_proj_columns

  loaded, reference = tiny
  cfg = loaded.config
  rng = np.random.default_rng(4)
  tokens = rng.integers(0, cfg.vocab_size, size=(1, 30))
  # A third of every layer's neurons (a random tiny model spreads its function thinly), the last index included.
  neurons = [(layer, int(i)) for layer in range(cfg.num_layers)
             for i in rng.choice(cfg.intermediate_size - 1, cfg.intermediate_size // 3, replace=False)]
  neurons.append((0, cfg.intermediate_size - 1))
  mask = np.ones((1, cfg.num_layers, cfg.intermediate_size), np.float32)
  for layer, index in neurons:
    mask[0, layer, index] = 0
  ours = _jax_logits(loaded, tokens, neuron_mask=jnp.asarray(mask))
  with torch.no_grad(), zeroed_down_proj_columns(reference, neurons):
    theirs = reference(torch.tensor(tokens)).logits.numpy()
  with torch.no_grad():
    clean = reference(torch.tensor(tokens)).logits.numpy()
  assert np.abs(ours - theirs).max() < TOL_TINY
  assert np.abs(theirs - clean).max() > 10 * TOL_TINY  # the ablation changed the logits (random MLPs are weak)
  # Heads and neurons together: both ablations at once.
  heads = np.ones((1, cfg.num_layers, cfg.num_heads), np.float32)
  heads[0, 0, 1] = 0
  from jaxloc.models.torch_reference import ablated_heads
  both = _jax_logits(loaded, tokens, head_mask=jnp.asarray(heads), neuron_mask=jnp.asarray(mask))
  with torch.no_grad(), zeroed_down_proj_columns(reference, neurons), ablated_heads(reference, [(0, 1)]):
    theirs_both = reference(torch.tensor(tokens)).logits.numpy()
  assert np.abs(both - theirs_both).max() < TOL_TINY


def test_all_ones_neuron_mask_is_bit_identical(tiny):
  loaded, _ = tiny
  cfg = loaded.config
  tokens = np.random.default_rng(5).integers(0, cfg.vocab_size, size=(2, 25))
  plain = _jax_logits(loaded, tokens)
  ones = _jax_logits(loaded, tokens, neuron_mask=jnp.ones((2, cfg.num_layers, cfg.intermediate_size)))
  assert np.array_equal(plain, ones)


def test_config_is_read_faithfully(tiny):
  loaded, reference = tiny
  hf = reference.config
  cfg = loaded.config
  assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads) == (
      hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads)
  assert cfg.tie_word_embeddings == hf.tie_word_embeddings
  assert ("lm_head" in loaded.params) == (not hf.tie_word_embeddings)
