"""Tiny random Llamas with a real tokenizer: real text requests, fast compiles. `make_tiny` builds jaxloc's own
modules (no torch), a Llama or, with `GEMMA3`, a Gemma 3 whose sliding window (4 tokens) is shorter than every
request; `save_tiny_hf` saves a `transformers` model as an HF directory (what a user passes with --model=DIR). The
fixtures in tests/conftest.py give each one per session."""

import jax
import jax.numpy as jnp

from jaxloc.models.config import FULL, SLIDING, ModelConfig
from jaxloc.models.decoder import Transformer
from jaxloc.models.loading import LoadedModel


# Gemma 3's family options on make_tiny's shapes: pre- and post-norms scaling by (1 + w), per-head q/k norms, GeGLU,
# scaled embeddings, its query scale, and a full layer between two sliding ones (window 4, rope base 10k; full
# layers 1M).
GEMMA3 = dict(model_type="gemma3_text", post_norm=True, norm_unit_offset=True, norm_scale_float32=True, qk_norm="head",
              hidden_act="gelu_pytorch_tanh", embed_scale=True, query_pre_attn_scalar=12.0, rope_theta=1e6,
              sliding_window=4, layer_types=(SLIDING, FULL, SLIDING), sliding_rope_theta=1e4)


def make_tiny(tokenizer, seed=0, **overrides):
  fields = dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=48, intermediate_size=64, num_layers=3,
                num_heads=6, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0,
                tie_word_embeddings=True, eos_token_ids=(tokenizer.eos_token_id,))
  fields.update(overrides)
  config = ModelConfig(**fields)
  module = Transformer(config)
  params = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, 1, 4), jnp.int32), jnp.arange(4)[None, None])["params"]
  # Scale up so that random heads matter: ablations must visibly change scores.
  params = jax.tree.map(lambda p: p * 4 if p.ndim >= 3 else p, params)
  return LoadedModel("tiny", config, params, module, tokenizer, jnp.float32, "random")


def save_tiny_hf(tokenizer, directory: str) -> str:
  """A tiny random `transformers` Llama (GQA, tied embeddings) saved with `tokenizer` in `directory`."""
  import pytest

  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48,
                                    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                    tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id)
  model = transformers.AutoModelForCausalLM.from_config(config)
  with torch.no_grad():
    for p in model.parameters():
      p.mul_(8.0)  # random heads must matter for the scores to vary
  model.save_pretrained(directory)
  tokenizer.save_pretrained(directory)
  return directory
