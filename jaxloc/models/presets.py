"""Random-weight models shaped like real checkpoints (`random:llama-3.1-8b`), for throughput and memory
benchmarks on accelerators without downloading weights. Scores from them mean nothing.

The shapes are those of the published configs; the tokenizer is the embedded SmolLM2 one (its ids
fit every vocabulary here), so text requests tokenize.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxloc.errors import UserError
from jaxloc.models.config import ModelConfig, RopeScaling, config_from_hf

_LLAMA3_ROPE = dict(rope_theta=500000.0, max_position_embeddings=131072)

PRESETS: dict[str, ModelConfig] = {
    "llama-3.1-8b": ModelConfig("llama", 128256, 4096, 14336, 32, 32, 8, 128, 1e-5,
                                rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192), **_LLAMA3_ROPE),
    "llama-3.2-3b": ModelConfig("llama", 128256, 3072, 8192, 28, 24, 8, 128, 1e-5, tie_word_embeddings=True,
                                rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), **_LLAMA3_ROPE),
    "llama-3.2-1b": ModelConfig("llama", 128256, 2048, 8192, 16, 32, 8, 64, 1e-5, tie_word_embeddings=True,
                                rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), **_LLAMA3_ROPE),
    "qwen2.5-7b": ModelConfig("qwen2", 152064, 3584, 18944, 28, 28, 4, 128, 1e-6, rope_theta=1e6, qkv_bias=True,
                              max_position_embeddings=32768),
    "qwen2.5-3b": ModelConfig("qwen2", 151936, 2048, 11008, 36, 16, 2, 128, 1e-6, rope_theta=1e6, qkv_bias=True,
                              tie_word_embeddings=True, max_position_embeddings=32768),
    "smollm2-135m": ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, 1e-5, rope_theta=100000.0,
                                tie_word_embeddings=True),
    # The other families from their published config.json values, read by the converter real checkpoints go through.
    "gemma-2-2b": config_from_hf(dict(
        model_type="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
        num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=4096, max_position_embeddings=8192,
        hidden_activation="gelu_pytorch_tanh")),
    "gemma-3-1b": config_from_hf(dict(
        model_type="gemma3_text", vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512, sliding_window_pattern=6,
        max_position_embeddings=32768, hidden_activation="gelu_pytorch_tanh")),
    "qwen3-8b": config_from_hf(dict(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6, max_position_embeddings=40960)),
    "olmo-2-7b": config_from_hf(dict(
        model_type="olmo2", vocab_size=100352, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, rope_theta=500000.0, rms_norm_eps=1e-6,
        max_position_embeddings=4096)),
}
PREFIX = "random:"


def preset_config(spec: str) -> ModelConfig:
  name = spec[len(PREFIX):]
  if name not in PRESETS:
    raise UserError(f"unknown random preset {name!r}; presets: {', '.join(PREFIX + p for p in PRESETS)}")
  return PRESETS[name]


def random_params(module, config: ModelConfig, dtype, sharding_for=None, seed: int = 0):
  """Initializes parameters directly on devices (placed per `sharding_for`), never on the host."""
  tokens = jnp.zeros((1, 1, 1), jnp.int32)

  def init(key):
    return module.init(key, tokens, tokens)["params"]

  shapes = jax.eval_shape(init, jax.random.PRNGKey(seed))
  shardings = None
  if sharding_for is not None:
    shardings = jax.tree_util.tree_map_with_path(
        lambda path, leaf: sharding_for("/".join(k.key for k in path), leaf.shape), shapes)
  params = jax.jit(init, out_shardings=shardings)(jax.random.PRNGKey(seed))
  return jax.tree.map(lambda p: p.astype(dtype), params)
