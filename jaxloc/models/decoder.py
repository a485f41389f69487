"""The decoder of every supported family: Llama 3.x (and any Llama-shaped checkpoint: SmolLM2), Mistral, Qwen2/2.5,
Qwen3, Gemma 2, Gemma 3 (text) and OLMo-2.

The families differ only in configuration (`config.py` reads each one's): where the RMSNorms sit (before attention
and the MLP, on their outputs, or both) and whether they scale by (1 + w); q/k norms per head or over the whole
projection; SwiGLU or GeGLU; embeddings scaled by sqrt(hidden); soft-capped attention scores and final logits; the
query scale; q/k/v/o biases; tied or untied embeddings; and sliding-window layers interleaved with full ones, each
kind with its own rope base. So every family runs through this one module, and the head and neuron masks mean the
same thing in all of them: a head's slice of the `o_proj` input, a neuron's `down_proj` input.

Inputs are data, in penzai's spirit: an `Ablation` holds a head mask [masks, layers, heads] (1 keep,
0 ablate) that scales every query head's attention output before `o_proj`, and/or a neuron mask
[masks, layers, mlp] that scales every MLP intermediate unit before `down_proj`; optional fill values
(per head [layers, heads, head_dim], per neuron [layers, mlp]) turn zero ablation into mean ablation.
That is what lets many ablation configurations run as one batched, compiled computation. What a forward pass is
asked for is data too: `Resume` starts it at a later layer, a static `OutputSpec` names what it returns besides
the hidden states, and each decoder layer reads typed inputs, its own slice of `LayerInputs` and the whole of
`SharedInputs`; a family's per-layer attributes (a sliding-window layer's window, which rope table a layer uses)
are `LayerInputs` fields filled from the config, not modes.

Axes are those of `layers.py`, plus `layers` L (the scanned decoder layers), `vocab` V and `ropes` T (rotary tables:
2 when sliding layers rotate with their own base, else 1).
Tokens are [M, R, S]: every mask has its own batch of requests, which may share context keys/values
[L, M, C, K, Dh] (a prefix computed once per mask) and may each have their own, a decoding cache (per layer, keys
[M, R, K, Dh, C'] and values [M, R, K, C', Dh]: the layouts the decode step's matmuls read without a copy,
`layers.Attention`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxloc.models.config import ModelConfig
from jaxloc.models.layers import MLP, Attention, Context, kernels_output_major, norm, out_major, rotary_tables
from jaxloc.models.sites import Edit, Taps

Array = jax.Array


@dataclasses.dataclass
class ModelOutput:
  """hidden: [M, R, S, D] after the final norm (feed to `lm_logits`).
  k, v: [L, M, R, S, K, Dh] keys/values of these tokens (`OutputSpec.kv`).
  head_sums: [L, M, K, G, Dh] per-head attention outputs and neuron_sums: [L, M, F] neuron values summed over
  valid tokens (`OutputSpec.unit_sums`; divide by the token count for mean-ablation fill values).
  residual: [L, M, R, S, D] the residual stream entering each layer (`OutputSpec.residuals`).
  sites: what `OutputSpec.sites` asks for (`sites.SITES`), per layer [L, M, R, S, ...] with heads split (K, G) (`pattern`
  [L, M, R, K, G, S, C + C' + S], `scores` of these tokens [.., S, S]); `embed` [M, R, S, D].
  """

  hidden: Array
  k: Array | None = None
  v: Array | None = None
  head_sums: Array | None = None
  neuron_sums: Array | None = None
  residual: Array | None = None
  sites: dict[str, Array] | None = None


jax.tree_util.register_dataclass(ModelOutput, data_fields=["hidden", "k", "v", "head_sums", "neuron_sums", "residual",
                                                           "sites"],
                                 meta_fields=[])


@dataclasses.dataclass
class Ablation:
  """What a forward pass knocks out, per mask (every field optional; all None is the unablated model).

  head_mask: [M, L, H] and neuron_mask: [M, L, F], 1 keep, 0 ablate (soft values scale).
  head_fill: [L, H, Dh] and neuron_fill: [L, F], what an ablated unit outputs instead (None: zero); or
    [L, R, S, H, Dh] and [L, R, S, F], a value per request and position: activation patching, where the fill is
    another run's outputs of the same units (`OutputSpec.activations`), is mean ablation with a per-position fill.
  neuron_where: bool [M|1, R|1, S], the positions the neuron mask applies at (None: every position; integrated
    gradients scale one position).
  edits: edits of named sites at chosen positions (`sites.Edit`, rows leading like the masks): interventions."""

  head_mask: Array | None = None
  head_fill: Array | None = None
  neuron_mask: Array | None = None
  neuron_fill: Array | None = None
  neuron_where: Array | None = None
  edits: tuple[Edit, ...] = ()

  @property
  def num_masks(self) -> int:
    masks = [m.shape[0] for m in (self.head_mask, self.neuron_mask) if m is not None]
    masks += [e.num_rows for e in self.edits]
    if not masks:
      raise ValueError("this ablation holds no masks")
    return max(masks)


jax.tree_util.register_dataclass(
    Ablation, data_fields=["head_mask", "head_fill", "neuron_mask", "neuron_fill", "neuron_where", "edits"],
    meta_fields=[])


@dataclasses.dataclass(frozen=True)
class OutputSpec:
  """What a forward pass returns besides the final hidden states; static (each combination compiles once).

  kv: every layer's keys/values of these tokens (to build a context: a shared prefix, a decoding cache).
  residuals: the residual stream entering every layer (to resume at a later layer, `Resume`).
  unit_sums: per-head attention outputs and neuron values summed over valid tokens (mean-ablation fill values).
  sites: the named activations to return at every position (`sites.SITES`), a sorted tuple of names.
  """

  kv: bool = False
  residuals: bool = False
  unit_sums: bool = False
  sites: tuple[str, ...] = ()


@dataclasses.dataclass
class Resume:
  """Start at `layer` (int32 scalar) from the residual stream [M|1, R, S, D] entering it instead of embedding the
  tokens; the layers below pass it through untouched (exact when no mask ablates anything there and `residual` is
  the unablated model's, `OutputSpec(residuals=True)`). Their keys/values come out as zeros, read by no query.

  With `starts` (int32 [M], each mask's own first layer, none below `layer`) and `residuals` [L, M|1, R, S, D] (the
  unablated stream entering every layer), a mask enters every layer up to its own start with the unablated stream
  instead of the one computed from `layer`: its outputs are then bit for bit those of a call that starts where it
  does, whichever masks share its call."""

  layer: Array
  residual: Array
  starts: Array | None = None
  residuals: Array | None = None


jax.tree_util.register_dataclass(Resume, data_fields=["layer", "residual", "starts", "residuals"], meta_fields=[])


@dataclasses.dataclass
class LayerInputs:
  """What each decoder layer gets for itself, stacked over a leading `layers` axis (the scan slices it); None where a
  call or a model has none. A per-layer attribute of a model family is a field here, filled from the config, not a
  mode of `Transformer.__call__`.

  index: int [L], the layer's number. head_mask: [L, M, K, G]; head_fill: [L, K, G, Dh] or [L, R, S, K, G, Dh];
  neuron_mask: [L, M, F]; neuron_fill: [L, F] or [L, R, S, F] (`Ablation`, laid out per layer). context_k
  [L, M, C, K, Dh], context_v [L, M, K, Dh, C] (`Context` shared by a mask's requests; set per layer by
  `Transformer.unrolled` where the context comes one `Context` per layer); cache_k, cache_v: this layer's decoding
  cache (each request's own), a tuple of blocks (keys [M, R, K, Dh, C'], values [M, R, K, C', Dh], `Context`), set
  per layer by `Transformer.unrolled`, never stacked.
  window: int [L], how far back each layer's queries see (`ModelConfig.layer_windows`; None when no layer slides).
  rope: int [L], each layer's rotary table in `SharedInputs.cos`/`sin` (None when every layer uses the first).
  edits: `Ablation.edits` with layers leading (`sites.Edit.per_layer`)."""

  index: Array
  head_mask: Array | None = None
  head_fill: Array | None = None
  neuron_mask: Array | None = None
  neuron_fill: Array | None = None
  context_k: Array | None = None
  context_v: Array | None = None
  cache_k: tuple[Array, ...] | None = None
  cache_v: tuple[Array, ...] | None = None
  window: Array | None = None
  rope: Array | None = None
  edits: tuple[Edit, ...] = ()

  @classmethod
  def build(cls, config: ModelConfig, ablation: Ablation, context: Context | None, num_masks: int) -> "LayerInputs":
    c = config
    inputs = cls(jnp.arange(c.num_layers))
    if ablation.head_mask is not None:
      inputs.head_mask = jnp.swapaxes(ablation.head_mask, 0, 1).reshape(c.num_layers, num_masks, c.num_kv_heads,
                                                                        c.queries_per_kv)
      if ablation.head_fill is not None:
        fill = ablation.head_fill  # [L, (R, S,) H, Dh]: the heads split into (K, G)
        inputs.head_fill = fill.reshape(fill.shape[:-2] + (c.num_kv_heads, c.queries_per_kv, c.head_dim))
    if ablation.neuron_mask is not None:
      inputs.neuron_mask = jnp.swapaxes(ablation.neuron_mask, 0, 1)
      inputs.neuron_fill = ablation.neuron_fill
    if context is not None:
      inputs.context_k, inputs.context_v = context.k, context.v
    inputs.edits = tuple(edit.per_layer() for edit in ablation.edits if edit.layer is None)
    if c.has_sliding_layers:
      inputs.window = jnp.asarray(c.layer_windows(), jnp.int32)
    if len(c.ropes()) > 1:
      inputs.rope = jnp.asarray(c.layer_ropes(), jnp.int32)
    return inputs


jax.tree_util.register_dataclass(LayerInputs, data_fields=["index", "head_mask", "head_fill", "neuron_mask",
                                                           "neuron_fill", "context_k", "context_v", "cache_k",
                                                           "cache_v", "window", "rope", "edits"],
                                 meta_fields=[])


@dataclasses.dataclass
class SharedInputs:
  """What every decoder layer gets whole (broadcast over the scan).

  cos, sin: [T, M|1, R|1, S, Dh] rotary tables, one per rope (`ModelConfig.ropes`); positions: int [M|1, R|1, S];
  segments: int [M|1, R|1, S] or None (`Transformer.__call__`); neuron_where: bool [M|1, R|1, S] or None
  (`Ablation`); context_valid: bool [M, R|1, C] and context_positions: int [M|1, R|1, C], or None (`Context`);
  cache_valid: bool [M, R, C'] and cache_positions: int [M|1, R|1, C'] of each block of the decoding cache (tuples,
  as `LayerInputs.cache_k`), or None;
  start_layer: int32 scalar or None (`Resume`).
  edits: the edits of one layer each (`sites.Edit.layer`), read whole by every layer.
  """

  cos: Array
  sin: Array
  positions: Array
  segments: Array | None = None
  neuron_where: Array | None = None
  context_valid: Array | None = None
  context_positions: Array | None = None
  cache_valid: tuple[Array, ...] | None = None
  cache_positions: tuple[Array, ...] | None = None
  start_layer: Array | None = None
  mask_starts: Array | None = None
  start_residuals: Array | None = None
  edits: tuple[Edit, ...] = ()


jax.tree_util.register_dataclass(SharedInputs, data_fields=["cos", "sin", "positions", "segments", "neuron_where",
                                                            "context_valid", "context_positions", "cache_valid",
                                                            "cache_positions", "start_layer", "mask_starts",
                                                            "start_residuals", "edits"],
                                 meta_fields=[])


@dataclasses.dataclass
class LayerOutputs:
  """What a decoder layer returns besides its residual stream (None where `OutputSpec` does not ask); the scan
  stacks them over `layers` (`ModelOutput`)."""

  k: Array | None = None
  v: Array | None = None
  head_sums: Array | None = None
  neuron_sums: Array | None = None
  residual: Array | None = None
  sites: dict[str, Array] | None = None


jax.tree_util.register_dataclass(LayerOutputs, data_fields=["k", "v", "head_sums", "neuron_sums", "residual",
                                                            "sites"],
                                 meta_fields=[])


class DecoderLayer(nn.Module):
  """One decoder layer; with `shared.start_layer` set, layers below it pass the residual through untouched (their
  key/value outputs are then zeros, never read)."""

  config: ModelConfig
  param_dtype: Any = jnp.float32
  outputs: OutputSpec = OutputSpec()
  out_major: bool = False  # kernels stored output-major (`layers.out_major`): the unrolled decode step's layout

  def setup(self):
    cfg = self.config
    if cfg.pre_norm:
      self.attn_norm = norm(cfg, self.param_dtype)
      self.mlp_norm = norm(cfg, self.param_dtype)
    if cfg.post_norm:
      self.post_attn_norm = norm(cfg, self.param_dtype)
      self.post_mlp_norm = norm(cfg, self.param_dtype)
    self.attn = Attention(cfg, self.param_dtype, self.out_major)
    self.mlp = MLP(cfg, self.param_dtype, self.out_major)

  def __call__(self, x: Array, layer: LayerInputs, shared: SharedInputs):
    if shared.mask_starts is not None:  # masks that start later enter this layer unablated (`Resume.starts`)
      later = (shared.mask_starts >= layer.index).reshape((-1,) + (1,) * (x.ndim - 1))
      x = jnp.where(later, shared.start_residuals[layer.index].astype(x.dtype), x)
    if shared.start_layer is None:
      x_out, outputs = self.compute(x, layer, shared)
    else:
      x_out, outputs = nn.cond(layer.index >= shared.start_layer, DecoderLayer.compute, DecoderLayer.skip, self, x,
                               layer, shared)
    if self.outputs.residuals:
      outputs.residual = x
    return x_out, outputs

  def compute(self, x: Array, layer: LayerInputs, shared: SharedInputs):
    cfg = self.config
    context = None
    if layer.context_k is not None:
      context = Context(layer.context_k, layer.context_v, shared.context_valid, shared.context_positions)
    cache: tuple[Context, ...] = ()
    if layer.cache_k is not None:
      cache = tuple(map(Context, layer.cache_k, layer.cache_v, shared.cache_valid, shared.cache_positions))
    rope = 0 if layer.rope is None else layer.rope
    taps = Taps(layer.edits + shared.edits, self.outputs.sites, layer.index)
    x = taps("resid_pre", x)
    attn_out, head_out, k, v, _ = self.attn(self.attn_norm(x) if cfg.pre_norm else x, shared.cos[rope],
                                            shared.sin[rope], layer.head_mask, layer.head_fill, context,
                                            shared.segments, shared.positions, layer.window, cache, taps)
    if cfg.post_norm:
      attn_out = self.post_attn_norm(attn_out)
    x = taps("resid_mid", x + taps("attn_out", attn_out))
    mlp_out, neurons, _ = self.mlp(self.mlp_norm(x) if cfg.pre_norm else x, layer.neuron_mask, layer.neuron_fill,
                                   shared.neuron_where, taps)
    if cfg.post_norm:
      mlp_out = self.post_mlp_norm(mlp_out)
    x = taps("resid_post", x + taps("mlp_out", mlp_out))
    outputs = LayerOutputs()
    if self.outputs.kv:
      outputs.k, outputs.v = k, v
    if self.outputs.unit_sums:
      weights = (shared.segments >= 0).astype(jnp.float32)
      weights = jnp.broadcast_to(weights, head_out.shape[:3])
      outputs.head_sums = jnp.einsum("mrs,mrskgh->mkgh", weights, head_out.astype(jnp.float32))
      outputs.neuron_sums = jnp.einsum("mrs,mrsf->mf", weights, neurons.astype(jnp.float32))
    if self.outputs.sites:
      outputs.sites = {name: taps.values[name] for name in self.outputs.sites if name in taps.values}
    return x, outputs

  def skip(self, x: Array, layer: LayerInputs, shared: SharedInputs):
    """A layer below the start: what `compute` returns, with the residual unchanged."""
    del layer, shared
    outputs = LayerOutputs()
    if self.outputs.kv:
      cfg = self.config
      outputs.k = outputs.v = jnp.zeros(x.shape[:3] + (cfg.num_kv_heads, cfg.head_dim), x.dtype)
    return x, outputs


class Transformer(nn.Module):
  """Final-normed hidden states from tokens under head masks; `lm_logits` turns them into logits.

  Parameters are a plain pytree (the `params` collection). Layout: `embed/embedding` [V, D];
  `layers/...` stacked over a leading L axis (attention `q_kernel` [L, D, K, G, Dh], `k_kernel` and
  `v_kernel` [L, D, K, Dh], `o_kernel` [L, K, G, Dh, D], with `q_norm`/`k_norm` `scale`s [L, Dh] (per head) or
  [L, H * Dh] and [L, K * Dh] (whole projection) where the family has them; MLP `gate_kernel`, `up_kernel` [L, D, F]
  and `down_kernel` [L, F, D]; norm `scale`s [L, D]: `attn_norm`, `mlp_norm` before attention and MLP,
  `post_attn_norm`, `post_mlp_norm` on their outputs); `final_norm/scale` [D]; `lm_head` [D, V] only when
  embeddings are untied.
  """

  config: ModelConfig
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens: Array, positions: Array, *, ablation: Ablation | None = None,
               context: Context | tuple[Context, ...] | None = None, segments: Array | None = None,
               start: Resume | None = None, outputs: OutputSpec = OutputSpec(), dtype: Any = None,
               cache: tuple[tuple[Context, ...], ...] | None = None) -> ModelOutput:
    """Runs the decoder.

    tokens: int [M, R, S]. positions: int [M|1, R|1, S], absolute positions (after any context).
    ablation: head and/or neuron masks with their fill values (`Ablation`), or None for the unablated model.
    context: keys [L, M, C, K, Dh] and values [L, M, K, Dh, C] visible to every request, with `valid` [M, R|1, C];
      with a cache, also one `Context` per layer (each layer's keys, values, `valid` and positions where they lie: a
      sliding-window layer's may leave out the front its queries no longer see, `generation_kernels.decode`).
    cache: each request's own keys/values (a decoding cache), per layer a tuple of blocks of positions, each a
      `Context` (keys [M, R, K, Dh, C'], values [M, R, K, C', Dh]; block b of every layer with the same `valid`
      [M, R, C'] and positions); a token attends to the context, then its cache, then the tokens of this call. With a
      cache the layers run unrolled (`unrolled`).
    segments: int [M|1, R|1, S]: a token attends to earlier tokens of its own segment only (several requests packed
      in one row); -1 marks padding, which no real token sees. None: one segment per row (right padding needs
      nothing more: causal attention already hides it from real tokens).
    start: resume at a later layer from a residual stream (`Resume`) instead of embedding `tokens`.
    outputs: what to return besides the hidden states (`OutputSpec`).
    dtype: activation dtype; defaults to the parameter dtype.
    """
    cfg = self.config
    dtype = dtype or self.param_dtype
    if (outputs.unit_sums or outputs.sites) and start is not None:
      raise ValueError("unit sums and sites need every layer: a forward pass that collects them cannot resume "
                       "at a later layer")
    embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, param_dtype=self.param_dtype,
                     embedding_init=nn.initializers.normal(0.02), name="embed")
    if not cfg.tie_word_embeddings:
      self.param("lm_head", nn.initializers.normal(0.02), (cfg.hidden_size, cfg.vocab_size), self.param_dtype)
    if start is None:
      x = embed(tokens).astype(dtype)
      if cfg.embed_scale:  # the scale rounded to the activation dtype, as transformers' Gemma
        x = x * jnp.asarray(cfg.hidden_size**0.5, dtype)
      embedded = x
    else:
      x = jnp.broadcast_to(start.residual.astype(dtype), tokens.shape + (cfg.hidden_size,))
    cos, sin = rotary_tables(cfg, positions)
    ablation = ablation or Ablation()
    if outputs.unit_sums and segments is None:
      segments = jnp.zeros(tokens.shape, jnp.int32)
    per_layer = context if isinstance(context, tuple) else None
    if per_layer is not None and cache is None:
      raise ValueError("a context given per layer needs a cache: the layers then run unrolled")
    layer = LayerInputs.build(cfg, ablation, None if per_layer is not None else context, tokens.shape[0])
    seen = None if per_layer is not None else context  # a per-layer context's valid entries go with each layer
    visible = None if cache is None else cache[0]  # every layer's blocks have the same valid entries and positions
    shared = SharedInputs(cos, sin, positions, segments, ablation.neuron_where,
                          None if seen is None else seen.valid, None if seen is None else seen.positions,
                          None if visible is None else tuple(b.valid for b in visible),
                          None if visible is None else tuple(b.positions for b in visible),
                          None if start is None else start.layer, None if start is None else start.starts,
                          None if start is None else start.residuals,
                          tuple(edit for edit in ablation.edits if edit.layer is not None))
    if cache is not None:
      x, stacked = self.unrolled(x, layer, shared, cache, outputs, per_layer)
    else:
      layers = nn.scan(DecoderLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=(0, nn.broadcast), length=cfg.num_layers)(cfg, self.param_dtype, outputs, name="layers")
      x, stacked = layers(x, layer, shared)
    hidden = norm(cfg, self.param_dtype, "final_norm")(x)
    sites = stacked.sites
    if "embed" in outputs.sites:
      sites = {**(sites or {}), "embed": embedded}
    return ModelOutput(hidden, stacked.k, stacked.v, stacked.head_sums, stacked.neuron_sums, stacked.residual, sites)

  def unrolled(self, x: Array, layer: LayerInputs, shared: SharedInputs, caches: tuple[tuple[Context, ...], ...],
               outputs: OutputSpec, contexts: tuple[Context, ...] | None = None) -> tuple[Array, LayerOutputs]:
    """The layers one after another (not scanned), layer l with its own cache `caches[l]`, its own context
    `contexts[l]` where the context comes per layer (its keys, values, valid entries and positions), and its own
    slice of the stacked parameters: a decode step reads each layer's weights, context and cache where they lie,
    where a slice of stacked ones is copied first (XLA materializes a slice that feeds a matmul). Only in `apply`."""
    cfg = self.config
    if len(caches) != cfg.num_layers or (contexts is not None and len(contexts) != cfg.num_layers):
      raise ValueError(f"{len(caches)} per-layer caches and {len(contexts or ())} per-layer contexts for "
                       f"{cfg.num_layers} layers")
    params = self.variables["params"]["layers"]
    if not isinstance(params, tuple):  # stacked [L, ...]: sliced here (`layer_params` slices once, outside a loop)
      params = layer_params(params, cfg.num_layers)
    step = DecoderLayer(cfg, self.param_dtype, outputs, out_major=kernels_output_major(), parent=None)
    collected = []
    for index, cache in enumerate(caches):
      own = jax.tree.map(lambda a: a[index], layer)  # noqa: B023  (used at once)
      own = dataclasses.replace(own, cache_k=tuple(b.k for b in cache), cache_v=tuple(b.v for b in cache))
      seen = shared
      if contexts is not None:
        own = dataclasses.replace(own, context_k=contexts[index].k, context_v=contexts[index].v)
        seen = dataclasses.replace(shared, context_valid=contexts[index].valid,
                                   context_positions=contexts[index].positions)
      x, out = step.apply({"params": params[index]}, x, own, seen)
      collected.append(out)
    return x, jax.tree.map(lambda *parts: jnp.stack(parts), *collected)


def layer_params(stacked: Any, num_layers: int) -> tuple[Any, ...]:
  """The decoder layers' parameters [L, ...] (`params["layers"]`) as L trees, one per layer, each kernel in the layout
  `Transformer.unrolled` reads (`kernels_output_major`). Given as `params["layers"]` with per-layer caches, they are
  sliced and laid out where this runs (`generation_kernels.decode_layers`): once per generation job where the job
  holds the copy, else once per decode call, before its loop; never in every step."""
  lay_out = out_major if kernels_output_major() else (lambda tree: tree)
  return tuple(lay_out(jax.tree.map(lambda a: a[index], stacked)) for index in range(num_layers))  # noqa: B023


def greedy_tokens(config: ModelConfig, params, hidden: Array) -> Array:
  """int32 [...]: the argmax of `lm_logits` over the vocabulary for final-normed hidden states [..., D] (the first of
  equal maxima, as `jnp.argmax`): greedy decoding's next tokens, for a few rows against a large vocabulary.

  With tied embeddings the logits are computed vocabulary-major, [V, N] = embedding [V, D] @ hidden [D, N]: the
  embedding is the matmul's long operand, streamed, where [N, V] = hidden @ embedding.T re-packs all of it in every
  call (XLA:CPU, 2 AVX2 cores, 32 rows of Gemma 3's 262,144 tokens: 146 ms against 184 ms). The argmax over that leading
  axis is taken from plain maxima (`_argmax_rows`). An untied `lm_head` [D, V] keeps `lm_logits`' layout
  (its transpose would be copied)."""
  lead = hidden.shape[:-1]
  flat = hidden.reshape(-1, hidden.shape[-1])
  if not config.tie_word_embeddings:
    return jnp.argmax(lm_logits(config, params, flat), axis=-1).astype(jnp.int32).reshape(lead)
  embedding = params["embed"]["embedding"]
  logits = jnp.einsum("vd,nd->vn", embedding.astype(flat.dtype), flat, preferred_element_type=jnp.float32)
  if config.final_softcap is not None:
    logits = jnp.tanh(logits / config.final_softcap) * config.final_softcap
  return _argmax_rows(logits).reshape(lead)


def _argmax_rows(logits: Array) -> Array:
  """int32 [N]: `jnp.argmax(logits, axis=0)` of [V, N], the first maximum (a row's first NaN where it has one), from
  plain maxima: each row's maximum, each block's, the first block reaching the row's maximum, then the first entry of
  that block that does; a row holding a NaN takes the same search over where its NaNs are. XLA:CPU's argmax over a
  long leading axis is a paired reduction it does not vectorize: 19 ms for [262144, 32] on 2 AVX-512 cores, in blocks
  of 2,048 no faster; this takes 2-3 ms. Branch-free, so no step waits on a predicate (a GPU's would)."""
  vocab, rows = logits.shape
  block = math.gcd(vocab, 2048)

  def first_reaching(values: Array, floor: Array) -> Array:  # [N]: the first entry of each row at least its floor
    blocks = values.reshape(vocab // block, block, rows)
    first = jnp.argmax(blocks.max(axis=1) >= floor, axis=0)  # the first block holding one
    return first * block + jnp.argmax(blocks[first, :, jnp.arange(rows)] >= floor[:, None], axis=1)

  # XLA:CPU's vectorized maxima skip NaNs: where a row holds one, its first NaN is found apart.
  nans = jnp.isnan(logits).astype(logits.dtype)
  has_nan = nans.max(axis=0) > 0
  top = first_reaching(logits, logits.max(axis=0))
  return jnp.where(has_nan, first_reaching(nans, jnp.ones((rows,), logits.dtype)), top).astype(jnp.int32)


def lm_logits(config: ModelConfig, params, hidden: Array) -> Array:
  """float32 logits [..., V] for final-normed hidden states [..., D] (soft-capped when the family caps them); run it
  only where needed."""
  if config.tie_word_embeddings:
    kernel = params["embed"]["embedding"].T
  else:
    kernel = params["lm_head"]
  logits = jnp.matmul(hidden, kernel.astype(hidden.dtype), preferred_element_type=jnp.float32)
  if config.final_softcap is not None:
    logits = jnp.tanh(logits / config.final_softcap) * config.final_softcap
  return logits
