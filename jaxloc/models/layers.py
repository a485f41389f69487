"""Layers of the decoder every family shares (`decoder.py`), with attention heads and MLP neurons that can be knocked
out; what differs between families is `ModelConfig` data read here (norm style, q/k norms, activation, soft-capping,
attention scale, sliding windows).

Axes (names used throughout jaxloc/models):
  masks     M   one head-ablation configuration each; every activation leads with it
  requests  R   sequences evaluated under the same mask; they may share context keys/values
  seq       S   positions of the tokens being computed now
  context   C   positions of keys/values computed earlier (a shared prefix, or the decoding cache)
  kv_heads  K   key/value heads
  groups    G   query heads per KV head; query head h is (k, g) with h = k * G + g, as `repeat_kv`
  head_dim  Dh
  embed     D
  mlp       F   MLP intermediate units (neurons), the input of `down_proj`

GQA stays explicit in the shapes: queries are [..., K, G, Dh] and keys [..., K, Dh]; KV heads are
never repeated in memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.models.config import ModelConfig, RopeScaling
from jaxloc.models.sites import Taps, apply_edit

try:  # the CPU features numpy detected at run time (`kernels_output_major`)
  from numpy._core._multiarray_umath import __cpu_features__ as _CPU_FEATURES  # type: ignore[attr-defined]
except ImportError:  # numpy 1.x
  from numpy.core._multiarray_umath import __cpu_features__ as _CPU_FEATURES  # type: ignore[attr-defined,no-redef]

Array = jax.Array
# Finite rather than -inf so that a query with no visible key (a padding row) softmaxes to a finite
# uniform row instead of NaN; such rows are never read.
_MASKED_SCORE = -1e30


class RMSNorm(nn.Module):
  """x / rms(x) times a learned scale, computed in float32.

  unit_offset: the scale is 1 + w (Gemma). scale_in_float32: multiply in float32 and cast after (Gemma, OLMo-2);
  otherwise cast the normalized input to the activation dtype, then scale (Llama).
  """

  eps: float
  param_dtype: Any = jnp.float32
  unit_offset: bool = False
  scale_in_float32: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = nn.initializers.zeros if self.unit_offset else nn.initializers.ones
    scale = self.param("scale", init, (x.shape[-1],), self.param_dtype)
    xf = x.astype(jnp.float32)
    normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    if self.scale_in_float32:
      factor = scale.astype(jnp.float32)
      return (normed * (1.0 + factor if self.unit_offset else factor)).astype(x.dtype)
    if self.unit_offset:
      raise ValueError("a (1 + w) norm scales in float32, as Gemma does")
    # Same order as transformers' Llama: cast back to the activation dtype, then scale.
    return scale.astype(x.dtype) * normed.astype(x.dtype)


def norm(config: ModelConfig, param_dtype, name: str | None = None) -> RMSNorm:
  """An RMSNorm in the model's style."""
  return RMSNorm(config.rms_norm_eps, param_dtype, config.norm_unit_offset, config.norm_scale_float32, name=name)


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
  """Rotary inverse frequencies [Dh/2] of one rope, scaled when configured (float32, as HF)."""
  dim = head_dim
  inv_freq = 1.0 / (theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
  inv_freq = inv_freq.astype(np.float32)
  if scaling is None:
    return inv_freq
  if scaling.rope_type == "linear":
    return (inv_freq / np.float32(scaling.factor)).astype(np.float32)
  old_len = scaling.original_max_position_embeddings
  low_freq_wavelen = old_len / scaling.low_freq_factor
  high_freq_wavelen = old_len / scaling.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
  smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
  smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
  is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
  return np.where(is_medium, smoothed, scaled).astype(np.float32)


def rotary_tables(config: ModelConfig, positions: Array) -> tuple[Array, Array]:
  """cos, sin [T, ..., Dh] for integer `positions` [...] (float32): one table per rope of `config.ropes()` (T is 2
  when sliding layers rotate with their own base, else 1)."""
  inv_freq = jnp.asarray(np.stack([inverse_frequencies(config.head_dim, theta, scaling)
                                   for theta, scaling in config.ropes()]))  # [T, Dh/2]
  freqs = positions.astype(jnp.float32)[None, ..., None] * inv_freq.reshape((len(inv_freq),) + (1,) * positions.ndim
                                                                            + (-1,))
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rotary(x: Array, cos: Array, sin: Array) -> Array:
  """Rotates x [M, R, S, *heads, Dh] by cos/sin [M|1, R|1, S, Dh] (the rotate-half convention)."""
  extra = x.ndim - cos.ndim
  cos = cos.reshape(cos.shape[:3] + (1,) * extra + cos.shape[3:]).astype(x.dtype)
  sin = sin.reshape(sin.shape[:3] + (1,) * extra + sin.shape[3:]).astype(x.dtype)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  return x * cos + rotated * sin


@dataclasses.dataclass
class Context:
  """Keys/values computed earlier: visible to every request of a mask (a shared prefix), or each request's own (a
  decoding cache).

  k, v: shared by a mask's requests, for one layer (with a leading L when held for all layers), k [M, C, K, Dh] and
    v [M, K, Dh, C]; or one block per request, for one layer, k [M, R, K, Dh, C] and v [M, R, K, C, Dh]. Each is
    the layout its product with the queries or the probabilities reads without a copy: for the shared block, a
    matmul over a mask's requests; for a request's own, one product per request with the contracted axis the
    middle one (`_per_request`).
  valid: bool [M, R|1, C'], which context positions each request may attend to; C' < C reads only the first C'.
  positions: int [M|1, R|1, C], each context key's absolute position (a sliding-window layer's query at position p
    sees those > p - window).
  """

  k: Array
  v: Array
  valid: Array
  positions: Array


jax.tree_util.register_dataclass(Context, data_fields=["k", "v", "valid", "positions"], meta_fields=[])


# How many leading axes of each kernel are its inputs: a kernel is stored [*inputs, *outputs] (the checkpoints' layout,
# `checkpoints.py`), or output-major [*outputs, *inputs] (`out_major`).
KERNEL_INPUTS = {"q_kernel": 1, "k_kernel": 1, "v_kernel": 1, "o_kernel": 3, "gate_kernel": 1, "up_kernel": 1,
                 "down_kernel": 1}


def stored_shape(name: str, shape: tuple[int, ...], output_major: bool) -> tuple[int, ...]:
  """The shape kernel `name` of checkpoint shape [*inputs, *outputs] is stored in: output-major, [*outputs, *inputs]."""
  held = KERNEL_INPUTS[name]
  return shape[held:] + shape[:held] if output_major else shape


def out_major(params: Any) -> Any:
  """A layer's parameters (one layer's tree, `decoder.layer_params`) with every kernel stored output-major, as
  `Attention` and `MLP` read them with `out_major=True`: a copy of each kernel."""

  def move(path, a):
    name = getattr(path[-1], "key", None)
    if name not in KERNEL_INPUTS:
      return a
    order = stored_shape(name, tuple(range(a.ndim)), True)  # each stored axis as an axis of the checkpoint layout
    return a.transpose(order)

  return jax.tree_util.tree_map_with_path(move, params)


_LAYOUT_PLATFORMS: list[str] = []  # `kernel_layout_for`'s platforms, innermost last


def kernels_output_major() -> bool:
  """Whether the unrolled decode step reads its layers' kernels output-major (`out_major`, `project`) rather than as
  the checkpoints store them: everywhere but on a CPU with AVX-512. At a decode step's few rows, XLA:CPU's matmuls
  took 1.5-2.3x less time with the kernel output-major, as the streamed left operand, on 2 AVX2 cores (32 rows of
  Gemma 3 270M's gate, down and q projections, 2026-11-28), and 15-35% more time than with the kernel as stored, the
  right operand, on 2 AVX-512 cores (2026-11-29). The same for a whole trace, so that `decoder.layer_params` and
  `Transformer.unrolled` agree; the platform is the backend in use, or `kernel_layout_for`'s."""
  platform = _LAYOUT_PLATFORMS[-1] if _LAYOUT_PLATFORMS else jax.default_backend()
  return platform != "cpu" or not _cpu_has_avx512()


@contextlib.contextmanager
def kernel_layout_for(platform: str) -> Iterator[None]:
  """Within it, `kernels_output_major` answers for `platform` ("cpu", "gpu", "tpu"), not the backend in use: for
  compiling ahead of time for another backend (`jaxloc.bench.deviceless`). Lay the layers out and trace in the same
  context: the answer is no part of a jitted function's cache key, so a function traced outside keeps its trace."""
  _LAYOUT_PLATFORMS.append(platform)
  try:
    yield
  finally:
    _LAYOUT_PLATFORMS.pop()


def _cpu_has_avx512() -> bool:
  """Whether this machine's CPU has AVX-512 (numpy's runtime detection; False where numpy does not say)."""
  return bool(_CPU_FEATURES.get("AVX512F", False))


def project(x: Array, kernel: Array, num_inputs: int, output_major: bool) -> Array:
  """x [..., *in] through a kernel [*in, *out] (or [*out, *in] when `output_major`; `num_inputs` is len(in)):
  [..., *out].

  Output-major, the product is a 2-D one with the kernel as its left operand, [out, in] @ [in, rows]: for the few rows
  of a decode step, XLA:CPU then streams the kernel as it lies, where as the right operand it re-packs all of it in
  every call."""
  if not output_major:
    return jnp.tensordot(x, kernel, num_inputs)
  lead, width = x.shape[:x.ndim - num_inputs], math.prod(x.shape[x.ndim - num_inputs:])
  outputs = kernel.shape[:kernel.ndim - num_inputs]
  y = kernel.reshape(-1, width) @ x.reshape(-1, width).T
  return y.T.reshape(lead + outputs)


def _per_request(x: Array, y: Array, preferred_element_type: Any = None) -> Array:
  """x [M, R, K, G, S, A] times y [M, R, K, A, B], one product per (mask, request, KV head): [M, R, K, G, S, B]
  (in `preferred_element_type`, else the operands' dtype).

  A decode step's products with each request's own cache have G * S rows. As 3-D products whose contracted axis is
  the cache's middle one (keys [Dh, C], values [C, Dh]), XLA:CPU reads the cache at about twice the rate of a 6-D
  einsum over keys [C, Dh] and values [Dh, C] (Gemma 3 270M's and SmolLM2's 32 rows of 384 entries, 2 AVX-512
  cores); as 6-D einsums over keys [Dh, C] and values [C, Dh], XLA moved every operand first."""
  m, r, k, g, s, a = x.shape
  assert y.shape[:4] == (m, r, k, a), (x.shape, y.shape)
  out = jnp.matmul(x.reshape(m * r * k, g * s, a), y.reshape(m * r * k, a, y.shape[-1]),
                   preferred_element_type=preferred_element_type)
  return out.reshape(m, r, k, g, s, y.shape[-1])


def _soft_cap(x: Array, cap: float | None) -> Array:
  return x if cap is None else jnp.tanh(x / cap) * cap


class Attention(nn.Module):
  """Grouped-query attention whose per-head outputs are scaled by a head mask before `o_proj`."""

  config: ModelConfig
  param_dtype: Any = jnp.float32
  out_major: bool = False  # kernels stored [*outputs, *inputs] (`out_major`, `project`)

  @nn.compact
  def __call__(self, x: Array, cos: Array, sin: Array, head_mask: Array | None, head_fill: Array | None,
               context: Context | None, segments: Array | None, positions: Array | None = None,
               window: Array | None = None, cache: tuple[Context, ...] = (), taps: Taps | None = None):
    """x: [M, R, S, D]; head_mask: [M, K, G] (1 keep, 0 ablate); head_fill: [K, G, Dh], or [R, S, K, G, Dh] a value
    per request and position (activation patching: another run's head outputs), or None (zero ablation);
    context: keys/values shared by each mask's requests (k [M, C, K, Dh], v [M, K, Dh, C]); cache: each request's own,
    in blocks of positions, each a `Context` (k [M, R, K, Dh, C'], v [M, R, K, C', Dh]; a decoding cache held in
    blocks is read block by block, each where it lies, only as far as its rows have come). A query attends to the
    context, then the cache's blocks, then the tokens of this call: one softmax over every block of scores, so that
    a mask's prefix is read once for all its requests;
    segments: int [M|1, R|1, S] or None (`Transformer`: a token sees earlier tokens of its own segment only);
    window: int32 scalar or None: a query at position p sees keys at positions > p - window (`positions`
    [M|1, R|1, S], the queries' own; context keys carry theirs);
    taps: the layer's edits and records of sites `q`, `k`, `v`, `scores`, `pattern`, `z`, `head_out` (`sites.Taps`).

    Returns (y [M, R, S, D], head outputs [M, R, S, K, G, Dh] after the mask, k, v [M, R, S, K, Dh], attention
    probabilities [M, R, K, G, S, C + C' + S] over the context, the cache's blocks and these tokens, in that order).
    """
    cfg = self.config
    kvh, groups, hd, d = cfg.num_kv_heads, cfg.queries_per_kv, cfg.head_dim, cfg.hidden_size
    init = nn.initializers.normal(0.02)
    dtype = x.dtype

    taps = taps or Taps()

    def weight(name, shape):  # shape: [*in, *out], as checkpoints store it
      return self.param(name, init, stored_shape(name, shape, self.out_major), self.param_dtype).astype(dtype)

    def dense(name, inputs, shape):
      return project(inputs, weight(name, shape), KERNEL_INPUTS[name], self.out_major)

    def bias(name, shape, enabled):
      return self.param(name, nn.initializers.zeros, shape, self.param_dtype).astype(dtype) if enabled else 0

    q = taps("q", dense("q_kernel", x, (d, kvh, groups, hd)) + bias("q_bias", (kvh, groups, hd), cfg.qkv_bias))
    k = taps("k", dense("k_kernel", x, (d, kvh, hd)) + bias("k_bias", (kvh, hd), cfg.qkv_bias))
    v = taps("v", dense("v_kernel", x, (d, kvh, hd)) + bias("v_bias", (kvh, hd), cfg.qkv_bias))
    if cfg.qk_norm == "head":
      q, k = norm(cfg, self.param_dtype, "q_norm")(q), norm(cfg, self.param_dtype, "k_norm")(k)
    elif cfg.qk_norm == "projection":  # over every head of the projection at once (OLMo-2)
      flat = lambda a: a.reshape(a.shape[:3] + (-1,))  # noqa: E731  heads in HF's order, h = k * G + g
      q = norm(cfg, self.param_dtype, "q_norm")(flat(q)).reshape(q.shape)
      k = norm(cfg, self.param_dtype, "k_norm")(flat(k)).reshape(k.shape)
    q = apply_rotary(q, cos, sin)
    k = apply_rotary(k, cos, sin)

    scale = cfg.attention_scale
    seq = x.shape[2]
    visible = jnp.tril(jnp.ones((seq, seq), bool))[None, None, None, None]  # [1, 1, 1, 1, S, T]
    if segments is not None:
      visible = visible & (segments[..., :, None] == segments[..., None, :])[:, :, None, None]
    if window is not None:
      visible = visible & (positions[..., None, :] > positions[..., :, None] - window)[:, :, None, None]
    scores = jnp.einsum("mrskgh,mrtkh->mrkgst", q, k, preferred_element_type=jnp.float32) * scale
    if taps.wants("scores"):  # as TransformerLens' hook_attn_scores: -inf where a query does not see a key
      taps("scores", jnp.where(visible, _soft_cap(scores, cfg.attn_softcap), -jnp.inf))
    scores = jnp.where(visible, _soft_cap(scores, cfg.attn_softcap), _MASKED_SCORE)
    blocks = []  # (scores [M, R, K, G, S, C], values, einsum of probabilities and values), earlier keys first
    for earlier in (context, *cache):
      if earlier is None:
        continue
      width = earlier.valid.shape[-1]  # read up to `width`
      if earlier.k.ndim == 4:  # shared by a mask's requests
        earlier_k, earlier_v = earlier.k[:, :width], earlier.v[..., :width]
        block = jnp.einsum("mrskgh,mckh->mrkgsc", q, earlier_k.astype(dtype), preferred_element_type=jnp.float32)
        product: Callable[[Array, Array], Array] = functools.partial(jnp.einsum, "mrkgsc,mkhc->mrskgh")
      else:  # each request's own
        earlier_k, earlier_v = earlier.k[..., :width], earlier.v[:, :, :, :width]
        # Apart from every other block's product: products sharing the queries are otherwise merged by XLA:GPU's dot
        # merger into one over the blocks concatenated, a copy of every layer's keys in every step. (Decoding reads
        # its blocks whole; a part of one, `width` short of it, would be copied to pass the barrier.)
        query, earlier_k = jax.lax.optimization_barrier((q, earlier_k))
        block = _per_request(jnp.moveaxis(query, 2, 4), earlier_k.astype(dtype), jnp.float32)  # [M, R, K, G, S, C]
        product = lambda p, v: jnp.moveaxis(_per_request(p, v), 4, 2)  # noqa: E731  [M, R, S, K, G, Dh]
      block = block * scale
      seen = earlier.valid[:, :, None, :]  # [M, R|1, 1, C]
      if window is not None:
        seen = seen & (earlier.positions[:, :, None, :] > positions[..., :, None] - window)
      block = jnp.where(seen[:, :, None, None], _soft_cap(block, cfg.attn_softcap), _MASKED_SCORE)
      blocks.append((block, earlier_v.astype(dtype), product))
    blocks.append((scores, v, functools.partial(jnp.einsum, "mrkgst,mrtkh->mrskgh")))
    # The softmax over every block at once, block by block: each block's exponentials go into its own product with
    # its values, and the sum divides the output, so no concatenation of the float32 scores is held.
    top = jax.lax.stop_gradient(functools.reduce(jnp.maximum, [b[0].max(axis=-1, keepdims=True) for b in blocks]))
    exps = [jnp.exp(block - top) for block, _, _ in blocks]
    total = functools.reduce(jnp.add, [e.sum(axis=-1, keepdims=True) for e in exps])  # [M, R, K, G, S, 1]
    out = functools.reduce(jnp.add, [product(e.astype(dtype), values) for e, (_, values, product) in zip(exps, blocks)])
    out = (out / jnp.moveaxis(total, 4, 2)).astype(dtype)
    probs = taps("pattern", jnp.concatenate([(e / total).astype(dtype) for e in exps], axis=-1))

    if head_mask is not None:
      out = apply_edit(out, 2, head_mask, head_fill)
    out = taps("z", out)
    o_kernel = weight("o_kernel", (kvh, groups, hd, d))
    if taps.wants("head_out"):  # each head's share of the output, [M, R, S, K, G, D]
      if self.out_major:
        raise ValueError("per-head outputs are read from a forward pass over stacked layers, not a decode step")
      taps("head_out", jnp.einsum("mrskgh,kghd->mrskgd", out, o_kernel))
    y = project(out, o_kernel, KERNEL_INPUTS["o_kernel"], self.out_major) + bias("o_bias", (d,), cfg.o_bias)
    return y, out, k, v, probs


class MLP(nn.Module):
  """The gated MLP (SwiGLU, or GeGLU for Gemma) whose intermediate units (neurons, the input of `down_proj`:
  act(gate) * up) are scaled by a neuron mask."""

  config: ModelConfig
  param_dtype: Any = jnp.float32
  out_major: bool = False  # kernels stored [*outputs, *inputs] (`out_major`, `project`)

  @nn.compact
  def __call__(self, x: Array, neuron_mask: Array | None = None, neuron_fill: Array | None = None,
               neuron_where: Array | None = None, taps: Taps | None = None) -> Array:
    """x: [M, R, S, D]; neuron_mask: [M, F] (1 keep, 0 ablate); neuron_fill: [F], or [R, S, F] a value per request
    and position (activation patching), or None (zero ablation);
    neuron_where: bool [M|1, R|1, S], the positions the mask applies at (None: every position);
    taps: the layer's edits and records of sites `mlp_pre` and `mlp_post` (`sites.Taps`).

    Returns (y [M, R, S, D], neuron values [M, R, S, F] before the mask, neuron values after it).
    """
    cfg = self.config
    d, f = cfg.hidden_size, cfg.intermediate_size
    init = nn.initializers.normal(0.02)

    def dense(name, inputs, shape):  # shape: [in, out], as checkpoints store it
      stored = stored_shape(f"{name}_kernel", shape, self.out_major)
      kernel = self.param(f"{name}_kernel", init, stored, self.param_dtype).astype(x.dtype)
      y = project(inputs, kernel, KERNEL_INPUTS[f"{name}_kernel"], self.out_major)
      if cfg.mlp_bias:
        y = y + self.param(f"{name}_bias", nn.initializers.zeros, shape[-1:], self.param_dtype).astype(x.dtype)
      return y

    act = jax.nn.silu if cfg.hidden_act == "silu" else functools.partial(jax.nn.gelu, approximate=True)
    taps = taps or Taps()
    hidden = act(taps("mlp_pre", dense("gate", x, (d, f)))) * dense("up", x, (d, f))
    ablated = hidden
    if neuron_mask is not None:
      ablated = apply_edit(hidden, 1, neuron_mask, neuron_fill, neuron_where)
    ablated = taps("mlp_post", ablated)
    return dense("down", ablated, (f, d)), hidden, ablated
