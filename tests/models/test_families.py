"""Every family beside Llama and Qwen2 against transformers' own implementation, on tiny random configs, in float32,
with no download: Qwen3, Gemma 2, Gemma 3 (text), Mistral, OLMo-2.

Each config has fewer KV heads than query heads and, where the family has them, sliding-window layers with a window
(4 to 7 tokens) far shorter than the sequences, so every window, rope table, soft cap and norm placement shows in the
logits. Weights are scaled up and norms and biases perturbed so that none of them is inert.
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.models import config as config_lib
from jaxloc.models.decoder import Ablation, Transformer, lm_logits
from jaxloc.models.loading import load_model
from tests.models.gguf_files import write_gguf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
SEQ = 40


def _qwen3():
  return transformers.Qwen3Config(
      vocab_size=151, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, head_dim=24, max_position_embeddings=256, tie_word_embeddings=False, rope_theta=1e5,
      rms_norm_eps=1e-6, attention_bias=True, use_sliding_window=True, sliding_window=6, max_window_layers=1)


def _gemma2():
  return transformers.Gemma2Config(
      vocab_size=163, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, head_dim=16, max_position_embeddings=256, query_pre_attn_scalar=24, sliding_window=5,
      attn_logit_softcapping=2.0, final_logit_softcapping=3.0, rope_theta=10000.0)


def _gemma3():
  return transformers.Gemma3TextConfig(
      vocab_size=173, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
      num_key_value_heads=1, head_dim=16, max_position_embeddings=256, query_pre_attn_scalar=20, sliding_window=4,
      layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
      attention_bias=True, tie_word_embeddings=False,
      rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})


def _mistral():
  return transformers.MistralConfig(
      vocab_size=131, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
      num_key_value_heads=2, head_dim=12, max_position_embeddings=256, sliding_window=7, rope_theta=1e4,
      tie_word_embeddings=True)


def _olmo2():
  return transformers.Olmo2Config(
      vocab_size=141, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
      num_key_value_heads=2, max_position_embeddings=256, attention_bias=True, rms_norm_eps=1e-5,
      tie_word_embeddings=False, eos_token_id=2, pad_token_id=1)


CONFIGS = {"qwen3": _qwen3, "gemma2": _gemma2, "gemma3": _gemma3, "mistral": _mistral, "olmo2": _olmo2}


def _random_model(config):
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
      elif "proj" in name:
        p.mul_(4.0)  # peaked attention and strong MLPs: windows, caps and ablations all move the logits
      elif "embed_tokens" in name:
        p.mul_(8.0)  # tokens that matter next to the layers' outputs (OLMo-2 has no norm before its first layer)
  return model.eval()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def family(request, tmp_path_factory):
  directory = str(tmp_path_factory.mktemp(request.param))
  reference = _random_model(CONFIGS[request.param]())
  reference.save_pretrained(directory)
  return load_model(directory, dtype=jnp.float32, cache_dir=None), reference


def _ours(loaded, tokens, head_mask=None, neuron_mask=None, config=None):
  """jaxloc's logits [batch, seq, vocab]; `config` overrides the model's (same parameters)."""
  config = config or loaded.config
  tokens = jnp.asarray(tokens)[:, None]
  out = Transformer(config).apply({"params": loaded.params}, tokens, jnp.arange(tokens.shape[-1])[None, None],
                                  ablation=Ablation(head_mask=head_mask, neuron_mask=neuron_mask))
  return np.asarray(lm_logits(config, loaded.params, out.hidden))[:, 0]


def _theirs(reference, tokens, heads=(), neurons=()):
  from jaxloc.models.torch_reference import ablated_heads, zeroed_down_proj_columns

  with torch.no_grad(), ablated_heads(reference, heads), zeroed_down_proj_columns(reference, neurons):
    return reference(torch.tensor(tokens)).logits.numpy()


def _tokens(config, seed, rows=2):
  return np.random.default_rng(seed).integers(0, config.vocab_size, size=(rows, SEQ))


def test_config_is_read_faithfully(family):
  loaded, reference = family
  hf, cfg = reference.config, loaded.config
  head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
  assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (
      hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads, head_dim)
  assert cfg.num_kv_heads < cfg.num_heads
  assert cfg.tie_word_embeddings == hf.tie_word_embeddings
  windows = [getattr(layer.self_attn, "sliding_window", None) for layer in reference.model.layers]
  if hf.model_type == "mistral":
    windows = [hf.sliding_window] * hf.num_hidden_layers
  assert [w if w is not None else config_lib.NO_WINDOW for w in windows] == list(
      cfg.layer_windows() or [config_lib.NO_WINDOW] * cfg.num_layers)
  assert (hf.model_type == "olmo2") == (cfg.qk_norm == "projection") and cfg.pre_norm == (hf.model_type != "olmo2")


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_logits_match_transformers(family):
  loaded, reference = family
  tokens = _tokens(loaded.config, 0)
  assert np.abs(_ours(loaded, tokens) - _theirs(reference, tokens)).max() < TOL


def test_sliding_windows_shape_the_logits(family):
  """The windows are shorter than the sequence, so taking them away must change the logits (else the parity above
  would not test them)."""
  loaded, _ = family
  cfg = loaded.config
  if not cfg.has_sliding_layers:
    pytest.skip(f"{cfg.model_type} has no sliding-window layers")
  assert cfg.sliding_window < SEQ // 4
  tokens = _tokens(cfg, 1)
  unwindowed = dataclasses.replace(cfg, sliding_window=config_lib.NO_WINDOW)
  assert np.abs(_ours(loaded, tokens) - _ours(loaded, tokens, config=unwindowed)).max() > 100 * TOL


def test_heads_and_neurons_ablated_match_the_reference_hooks(family):
  loaded, reference = family
  cfg = loaded.config
  tokens = _tokens(cfg, 2, rows=1)
  rng = np.random.default_rng(3)
  heads = [(0, 1), (cfg.num_layers - 1, cfg.num_heads - 1)]  # each shares its KV head with heads left on
  neurons = [(layer, int(i)) for layer in range(cfg.num_layers)
             for i in rng.choice(cfg.intermediate_size, cfg.intermediate_size // 3, replace=False)]
  head_mask = np.ones((1, cfg.num_layers, cfg.num_heads), np.float32)
  for layer, head in heads:
    head_mask[0, layer, head] = 0
  neuron_mask = np.ones((1, cfg.num_layers, cfg.intermediate_size), np.float32)
  for layer, index in neurons:
    neuron_mask[0, layer, index] = 0
  clean = _theirs(reference, tokens)
  for kwargs, hooks in (({"head_mask": head_mask}, {"heads": heads}),
                        ({"neuron_mask": neuron_mask}, {"neurons": neurons}),
                        ({"head_mask": head_mask, "neuron_mask": neuron_mask}, {"heads": heads, "neurons": neurons})):
    theirs = _theirs(reference, tokens, **hooks)
    assert np.abs(_ours(loaded, tokens, **{k: jnp.asarray(v) for k, v in kwargs.items()}) - theirs).max() < TOL
    assert np.abs(theirs - clean).max() > 100 * TOL  # the ablation changed something


def test_all_ones_masks_are_bit_identical(family):
  loaded, _ = family
  cfg = loaded.config
  tokens = _tokens(cfg, 4)
  plain = _ours(loaded, tokens)
  assert np.array_equal(plain, _ours(loaded, tokens, head_mask=jnp.ones((2, cfg.num_layers, cfg.num_heads))))
  assert np.array_equal(plain, _ours(loaded, tokens,
                                     neuron_mask=jnp.ones((2, cfg.num_layers, cfg.intermediate_size))))


@pytest.mark.parametrize("ablate", [False, True], ids=["unmasked", "heads_ablated"])
def test_greedy_generation_is_token_identical(family, ablate):
  """Prompts longer than the window, and more new tokens than it: the decoding cache outgrows the window."""
  from jaxloc.models.torch_reference import ablated_heads

  loaded, reference = family
  cfg = loaded.config
  heads = [(0, 2), (cfg.num_layers - 1, 0)] if ablate else []
  mask = np.ones((1, cfg.num_layers, cfg.num_heads), np.float32)
  for layer, head in heads:
    mask[0, layer, head] = 0
  rng = np.random.default_rng(5)
  prompts = [rng.integers(1, cfg.vocab_size, size=n).tolist() for n in (17, 9, 12)]
  engine = Engine(loaded, EngineConfig(generation_batch=4))
  ours = engine.generate_tokens(prompts, mask, max_new_tokens=12)[0]
  for prompt, generated in zip(prompts, ours):
    with torch.no_grad(), ablated_heads(reference, heads):
      expected = reference.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                    attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    assert generated == expected[0, len(prompt):].tolist()
  assert len({tuple(g) for g in ours}) > 1


# GGUF ------------------------------------------------------------------------------------------------------------
# transformers reads these families' GGUF metadata with its config defaults for what the file does not say
# (Gemma's query_pre_attn_scalar 256 and soft caps 50/30, Qwen3's head_dim 128, Gemma 3's sliding pattern of 6 and
# local rope base 10k); llama.cpp's (and jaxloc's) reading of the same file agrees when the model has those values.


def _gguf_gemma2():
  return transformers.Gemma2Config(
      vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
      num_key_value_heads=1, head_dim=256, max_position_embeddings=128, sliding_window=6)


def _gguf_gemma3():
  return transformers.Gemma3TextConfig(
      vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=6, num_attention_heads=2,
      num_key_value_heads=1, head_dim=256, max_position_embeddings=128, sliding_window=5)


def _gguf_qwen3():
  return transformers.Qwen3Config(
      vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
      num_key_value_heads=1, head_dim=128, max_position_embeddings=128, tie_word_embeddings=True)


def _gguf_mistral():
  return transformers.MistralConfig(
      vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)


GGUF_CONFIGS = {"gemma2": _gguf_gemma2, "gemma3": _gguf_gemma3, "qwen3": _gguf_qwen3, "mistral": _gguf_mistral}


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
@pytest.mark.parametrize("name", sorted(GGUF_CONFIGS))
def test_gguf_loads_as_transformers_reads_it(name, tmp_path):
  """A tiny model written as llama.cpp writes it: jaxloc's conversion matches transformers' own GGUF load, which
  matches the model itself (so the file follows llama.cpp's conventions)."""
  import os

  model = _random_model(GGUF_CONFIGS[name]())
  path = write_gguf(model, str(tmp_path / f"{name}.gguf"))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=os.path.basename(path),
                                                             dtype=torch.float32).eval()
  ours = load_model(path, dtype=jnp.float32, cache_dir=None, with_tokenizer=False)
  tokens = np.random.default_rng(6).integers(0, ours.config.vocab_size, size=(2, 24))
  expected = _theirs(model, tokens)
  assert np.abs(_theirs(theirs, tokens) - expected).max() < TOL
  assert np.abs(_ours(ours, tokens) - expected).max() < TOL
  assert ours.config.has_sliding_layers == name.startswith("gemma")


def test_unsupported_family_options_are_clear_errors():
  from jaxloc.errors import UserError

  base = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 2,
          "num_attention_heads": 2}
  with pytest.raises(UserError, match=r"unsupported rope type 'yarn'.*default, linear, llama3"):
    config_lib.config_from_hf({**base, "model_type": "qwen3", "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
  with pytest.raises(UserError, match="use_bidirectional_attention"):
    config_lib.config_from_hf({**base, "model_type": "gemma3_text", "use_bidirectional_attention": True})
  with pytest.raises(UserError, match="gemma3_text"):
    config_lib.config_from_hf({**base, "model_type": "gemma3"})
  with pytest.raises(UserError, match=r"hidden activation 'gelu'.*gelu_pytorch_tanh"):
    config_lib.config_from_hf({**base, "model_type": "gemma2", "hidden_activation": "gelu"})
  with pytest.raises(UserError, match=r"rope scaling 'linear' on sliding layers"):
    config_lib.config_from_hf({**base, "model_type": "gemma3_text", "rope_parameters": {
        "sliding_attention": {"rope_type": "linear", "factor": 2.0}}})
  with pytest.raises(UserError, match="layer_types names 3 layers"):
    config_lib.config_from_hf({**base, "model_type": "gemma2", "layer_types": ["sliding_attention"] * 3})
