"""The Llama-architecture decoder: Llama 3.x, Qwen2/Qwen2.5 and any Llama-shaped checkpoint (SmolLM2).

Qwen2 differs from Llama only in configuration (q/k/v biases, its own rope theta), so both families
run through this one module; `config.py` reads each family's config.

Inputs are data, in penzai's spirit: an `Ablation` holds a head mask [masks, layers, heads] (1 keep,
0 ablate) that scales every query head's attention output before `o_proj`, and/or a neuron mask
[masks, layers, mlp] that scales every MLP intermediate unit before `down_proj`; optional fill values
(per head [layers, heads, head_dim], per neuron [layers, mlp]) turn zero ablation into mean ablation.
That is what lets many ablation configurations run as one batched, compiled computation.

Axes are those of `layers.py`, plus `layers` L (the scanned decoder layers) and `vocab` V.
Tokens are [M, R, S]: every mask has its own batch of requests, which may share context keys/values
[L, M, C, K, Dh] (a prefix computed once per mask, or a decoding cache).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxloc.models.config import ModelConfig
from jaxloc.models.layers import MLP, Attention, Context, RMSNorm, rotary_tables

Array = jax.Array


@dataclasses.dataclass
class ModelOutput:
  """hidden: [M, R, S, D] after the final norm (feed to `Transformer.logits`).
  k, v: [L, M, R, S, K, Dh] keys/values of these tokens when asked for (to build a context).
  head_sums: [L, M, K, G, Dh] per-head attention outputs and neuron_sums: [L, M, F] neuron values summed over
  valid tokens, when asked for (divide by the token count for mean-ablation fill values).
  residual: [L, M, R, S, D] the residual stream entering each layer, when asked for (to resume at a later layer).
  """

  hidden: Array
  k: Array | None = None
  v: Array | None = None
  head_sums: Array | None = None
  neuron_sums: Array | None = None
  residual: Array | None = None


jax.tree_util.register_dataclass(ModelOutput, data_fields=["hidden", "k", "v", "head_sums", "neuron_sums", "residual"],
                                 meta_fields=[])


@dataclasses.dataclass
class Ablation:
  """What a forward pass knocks out, per mask (every field optional; all None is the unablated model).

  head_mask: [M, L, H] and neuron_mask: [M, L, F], 1 keep, 0 ablate (soft values scale).
  head_fill: [L, H, Dh] and neuron_fill: [L, F], what an ablated unit outputs instead (None: zero).
  neuron_where: bool [M|1, R|1, S], the positions the neuron mask applies at (None: every position; integrated
    gradients scale one position).
  """

  head_mask: Array | None = None
  head_fill: Array | None = None
  neuron_mask: Array | None = None
  neuron_fill: Array | None = None
  neuron_where: Array | None = None

  @property
  def num_masks(self) -> int:
    masks = [m for m in (self.head_mask, self.neuron_mask) if m is not None]
    if not masks:
      raise ValueError("this ablation holds no masks")
    return masks[0].shape[0]


jax.tree_util.register_dataclass(
    Ablation, data_fields=["head_mask", "head_fill", "neuron_mask", "neuron_fill", "neuron_where"], meta_fields=[])


class DecoderLayer(nn.Module):
  """One decoder layer; with `shared["start_layer"]` set, layers below it pass the residual through untouched (their
  key/value outputs are then zeros, never read)."""

  config: ModelConfig
  param_dtype: Any = jnp.float32
  return_kv: bool = False
  collect_sums: bool = False
  return_residuals: bool = False

  def setup(self):
    cfg = self.config
    self.attn_norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)
    self.attn = Attention(cfg, self.param_dtype)
    self.mlp_norm = RMSNorm(cfg.rms_norm_eps, self.param_dtype)
    self.mlp = MLP(cfg, self.param_dtype)

  def __call__(self, x: Array, per_layer: dict, shared: dict):
    if shared.get("start_layer") is None:
      x_out, outputs = self.compute(x, per_layer, shared)
    else:
      x_out, outputs = nn.cond(per_layer["index"] >= shared["start_layer"], DecoderLayer.compute,
                               DecoderLayer.skip, self, x, per_layer, shared)
    if self.return_residuals:
      outputs["residual"] = x
    return x_out, outputs

  def compute(self, x: Array, per_layer: dict, shared: dict):
    context = None
    if per_layer.get("context_k") is not None:
      context = Context(per_layer["context_k"], per_layer["context_v"], shared["context_valid"])
    attn_out, head_out, k, v = self.attn(self.attn_norm(x), shared["cos"], shared["sin"], per_layer.get("head_mask"),
                                         per_layer.get("head_fill"), context, shared.get("segments"))
    x = x + attn_out
    mlp_out, neurons = self.mlp(self.mlp_norm(x), per_layer.get("neuron_mask"), per_layer.get("neuron_fill"),
                                shared.get("neuron_where"))
    x = x + mlp_out
    outputs = {}
    if self.return_kv:
      outputs["k"], outputs["v"] = k, v
    if self.collect_sums:
      weights = (shared["segments"] >= 0).astype(jnp.float32)
      weights = jnp.broadcast_to(weights, head_out.shape[:3])
      outputs["head_sums"] = jnp.einsum("mrs,mrskgh->mkgh", weights, head_out.astype(jnp.float32))
      outputs["neuron_sums"] = jnp.einsum("mrs,mrsf->mf", weights, neurons.astype(jnp.float32))
    return x, outputs

  def skip(self, x: Array, per_layer: dict, shared: dict):
    """A layer below the start: what `compute` returns, with the residual unchanged."""
    del per_layer, shared
    outputs = {}
    if self.return_kv:
      cfg = self.config
      kv = jnp.zeros(x.shape[:3] + (cfg.num_kv_heads, cfg.head_dim), x.dtype)
      outputs["k"], outputs["v"] = kv, kv
    return x, outputs


class Transformer(nn.Module):
  """Final-normed hidden states from tokens under head masks; `lm_logits` turns them into logits.

  Parameters are a plain pytree (the `params` collection). Layout: `embed/embedding` [V, D];
  `layers/...` stacked over a leading L axis (attention `q_kernel` [L, D, K, G, Dh], `k_kernel` and
  `v_kernel` [L, D, K, Dh], `o_kernel` [L, K, G, Dh, D]; MLP `gate_kernel`, `up_kernel` [L, D, F] and
  `down_kernel` [L, F, D]; norm `scale`s [L, D]); `final_norm/scale` [D]; `lm_head` [D, V] only when
  embeddings are untied.
  """

  config: ModelConfig
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens: Array, positions: Array, ablation: Ablation | None = None,
               context: Context | None = None, segments: Array | None = None, *, start_layer: Array | None = None,
               residual: Array | None = None, return_kv: bool = False, return_residuals: bool = False,
               collect_sums: bool = False, dtype: Any = None) -> ModelOutput:
    """Runs the decoder.

    tokens: int [M, R, S]. positions: int [M|1, R|1, S], absolute positions (after any context).
    ablation: head and/or neuron masks with their fill values (`Ablation`), or None for the unablated model.
    context: keys/values [L, M, C, K, Dh] visible to every request, with `valid` [M, R|1, C].
    segments: int [M|1, R|1, S]: a token attends to earlier tokens of its own segment only (several requests packed
      in one row); -1 marks padding, which no real token sees. None: one segment per row (right padding needs
      nothing more: causal attention already hides it from real tokens).
    start_layer, residual: resume at layer `start_layer` (int32 scalar) from the residual stream [M|1, R, S, D]
      entering it, instead of embedding `tokens`; the layers below are skipped (exact when no mask ablates anything
      there and `residual` is the unablated model's, `return_residuals`). Their keys/values come out as zeros.
    return_residuals: also return the residual stream entering every layer, [L, M, R, S, D].
    dtype: activation dtype; defaults to the parameter dtype.
    """
    cfg = self.config
    dtype = dtype or self.param_dtype
    m = tokens.shape[0]
    if collect_sums and start_layer is not None:
      raise ValueError("collect_sums needs every layer: it cannot start at a later layer")
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, param_dtype=self.param_dtype,
                     embedding_init=nn.initializers.normal(0.02), name="embed")
    if not cfg.tie_word_embeddings:
      self.param("lm_head", nn.initializers.normal(0.02), (cfg.hidden_size, cfg.vocab_size), self.param_dtype)
    if start_layer is None:
      x = embed(tokens).astype(dtype)
    else:
      x = jnp.broadcast_to(residual.astype(dtype), tokens.shape + (cfg.hidden_size,))
    cos, sin = rotary_tables(cfg, positions)
    ablation = ablation or Ablation()
    per_layer: dict[str, Array] = {"index": jnp.arange(cfg.num_layers)}
    if ablation.head_mask is not None:
      per_layer["head_mask"] = jnp.swapaxes(ablation.head_mask, 0, 1).reshape(
          cfg.num_layers, m, cfg.num_kv_heads, cfg.queries_per_kv)
      if ablation.head_fill is not None:
        per_layer["head_fill"] = ablation.head_fill.reshape(cfg.num_layers, cfg.num_kv_heads, cfg.queries_per_kv,
                                                            cfg.head_dim)
    if ablation.neuron_mask is not None:
      per_layer["neuron_mask"] = jnp.swapaxes(ablation.neuron_mask, 0, 1)  # [L, M, F]
      if ablation.neuron_fill is not None:
        per_layer["neuron_fill"] = ablation.neuron_fill
    if collect_sums and segments is None:
      segments = jnp.zeros(tokens.shape, jnp.int32)
    shared = {"cos": cos, "sin": sin, "segments": segments, "neuron_where": ablation.neuron_where,
              "start_layer": start_layer}
    if context is not None:
      per_layer["context_k"], per_layer["context_v"] = context.k, context.v
      shared["context_valid"] = context.valid
    layers = nn.scan(DecoderLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                     in_axes=(0, nn.broadcast), length=cfg.num_layers)(
                         cfg, self.param_dtype, return_kv, collect_sums, return_residuals, name="layers")
    x, outputs = layers(x, per_layer, shared)
    hidden = RMSNorm(cfg.rms_norm_eps, self.param_dtype, name="final_norm")(x)
    return ModelOutput(hidden, outputs.get("k"), outputs.get("v"), outputs.get("head_sums"),
                       outputs.get("neuron_sums"), outputs.get("residual"))


def lm_logits(config: ModelConfig, params, hidden: Array) -> Array:
  """float32 logits [..., V] for final-normed hidden states [..., D]; run it only where needed."""
  if config.tie_word_embeddings:
    kernel = params["embed"]["embedding"].T
  else:
    kernel = params["lm_head"]
  return jnp.matmul(hidden, kernel.astype(hidden.dtype), preferred_element_type=jnp.float32)
