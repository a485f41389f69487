"""Model configuration shared by every supported family, read from an HF `config.json` or GGUF metadata.

One decoder runs every family (`decoder.py`); what tells them apart is data in `ModelConfig`: where the norms sit
and how they scale, q/k norms, the MLP's activation, embedding scaling, soft-capping, the attention scale,
sliding-window layers and their rope base, biases, tied embeddings. `config_from_hf` and `config_from_gguf` read
each family's own names and defaults (as `transformers` and llama.cpp do) into those fields.

Anything jaxloc cannot compute faithfully (an unknown `model_type`, rope type, activation or option)
is refused with a message listing what is supported: a silently wrong model would give silently
wrong localizations.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from jaxloc.errors import UserError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "olmo2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
SLIDING, FULL = "sliding_attention", "full_attention"
QK_NORMS = (None, "head", "projection")
# A full-attention layer's window in the per-layer window array: wider than any sequence.
NO_WINDOW = 1 << 30

# transformers' defaults for keys a family's config.json may leave out (its config class's field defaults).
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": False, "rms_norm_eps": 1e-6},
    "mistral": {"tie_word_embeddings": False, "rms_norm_eps": 1e-6, "sliding_window": 4096},
    "qwen2": {"tie_word_embeddings": False, "rms_norm_eps": 1e-6},
    "qwen3": {"tie_word_embeddings": False, "rms_norm_eps": 1e-6, "head_dim": 128, "sliding_window": 4096,
              "max_window_layers": 28},
    "gemma2": {"tie_word_embeddings": True, "rms_norm_eps": 1e-6, "head_dim": 256, "sliding_window": 4096,
               "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
    "gemma3_text": {"tie_word_embeddings": True, "rms_norm_eps": 1e-6, "head_dim": 256, "sliding_window": 4096,
                    "query_pre_attn_scalar": 256, "attn_logit_softcapping": None, "final_logit_softcapping": None,
                    "sliding_window_pattern": 6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},
    "olmo2": {"tie_word_embeddings": False, "rms_norm_eps": 1e-5},
}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """Rotary frequency scaling: `linear` divides every frequency by `factor`; `llama3` (Llama-3.1/3.2) scales low
  frequencies by `factor` and smooths the band between `low_freq_factor` and `high_freq_factor`."""

  factor: float
  low_freq_factor: float | None = None
  high_freq_factor: float | None = None
  original_max_position_embeddings: int | None = None
  rope_type: str = "llama3"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyper-parameters of a decoder of any supported family (Llama, Mistral, Qwen2/3, Gemma 2/3, OLMo-2).

  Query heads are grouped over KV heads: query head `h` reads KV head `h // queries_per_kv`,
  as `repeat_kv` does in transformers.

  The fields after `pad_token_id` are the family options; their defaults are Llama's.
  pre_norm: an RMSNorm before attention and before the MLP (every family but OLMo-2).
  post_norm: an RMSNorm on the attention output and on the MLP output, before each residual add (Gemma 2/3, OLMo-2).
  norm_unit_offset: norms scale by (1 + w) (Gemma). norm_scale_float32: norms multiply by their scale in float32 and
    cast after (Gemma, OLMo-2); Llama casts the normalized input first.
  qk_norm: "head", an RMSNorm over each query/key head's Dh (Qwen3, Gemma 3), or "projection", over the whole query
    and key projections (OLMo-2), before rotation; None: none.
  hidden_act: the MLP's gate activation, "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU, Gemma).
  embed_scale: embeddings are multiplied by sqrt(hidden_size) in the activation dtype (Gemma).
  query_pre_attn_scalar: attention scores are scaled by its inverse square root (Gemma); None: by head_dim's.
  attn_softcap, final_softcap: cap * tanh(x / cap) on attention scores, on the final logits (Gemma 2).
  layer_types: per layer, "sliding_attention" or "full_attention" (empty: every layer full). A sliding layer's token
    at position p attends to keys at positions > p - sliding_window.
  sliding_rope_theta: the rope base of sliding layers when it differs from the full layers' (Gemma 3); their rope is
    unscaled.
  """

  model_type: str
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float
  rope_theta: float
  rope_scaling: RopeScaling | None = None
  tie_word_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  max_position_embeddings: int = 8192
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  pre_norm: bool = True
  post_norm: bool = False
  norm_unit_offset: bool = False
  norm_scale_float32: bool = False
  qk_norm: str | None = None
  hidden_act: str = "silu"
  embed_scale: bool = False
  query_pre_attn_scalar: float | None = None
  attn_softcap: float | None = None
  final_softcap: float | None = None
  sliding_window: int | None = None
  layer_types: tuple[str, ...] = ()
  sliding_rope_theta: float | None = None

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise UserError(f"num_attention_heads={self.num_heads} is not a multiple of "
                      f"num_key_value_heads={self.num_kv_heads}")
    if not (self.pre_norm or self.post_norm):
      raise UserError("a decoder needs pre-norms, post-norms or both; this config has neither")
    if self.qk_norm not in QK_NORMS:
      raise UserError(f"unsupported qk_norm {self.qk_norm!r}; supported: head, projection, or none")
    if self.hidden_act not in SUPPORTED_ACTIVATIONS:
      raise UserError(f"unsupported hidden_act {self.hidden_act!r}; supported: {', '.join(SUPPORTED_ACTIVATIONS)}")
    if self.layer_types:
      if len(self.layer_types) != self.num_layers:
        raise UserError(f"layer_types names {len(self.layer_types)} layers; the model has {self.num_layers}")
      unknown = sorted(set(self.layer_types) - {SLIDING, FULL})
      if unknown:
        raise UserError(f"unsupported layer types {unknown}; supported: {SLIDING}, {FULL}")
      if SLIDING in self.layer_types and not (self.sliding_window and self.sliding_window > 0):
        raise UserError(f"sliding-attention layers need a positive sliding_window, got {self.sliding_window}")

  @property
  def queries_per_kv(self) -> int:
    return self.num_heads // self.num_kv_heads

  @property
  def num_head_total(self) -> int:
    return self.num_layers * self.num_heads

  @property
  def attention_scale(self) -> float:
    """What query-key dot products are multiplied by."""
    return 1.0 / math.sqrt(self.query_pre_attn_scalar or self.head_dim)

  @property
  def has_sliding_layers(self) -> bool:
    return SLIDING in self.layer_types

  def layer_windows(self) -> tuple[int, ...]:
    """Per layer, how far back a query sees (NO_WINDOW on full-attention layers)."""
    return tuple(self.sliding_window if kind == SLIDING else NO_WINDOW for kind in self.layer_types)

  def ropes(self) -> tuple[tuple[float, RopeScaling | None], ...]:
    """The rotary tables (base, scaling) the layers use: full layers' first, then sliding layers' when different."""
    full = (self.rope_theta, self.rope_scaling)
    if self.sliding_rope_theta is None or not self.has_sliding_layers:
      return (full,)
    return full, (self.sliding_rope_theta, None)

  def layer_ropes(self) -> tuple[int, ...]:
    """Per layer, its table in `ropes()`."""
    return tuple(int(kind == SLIDING) for kind in self.layer_types)

  def flops_per_token(self, with_lm_head: bool = True) -> float:
    """Matmul FLOPs per token of the weights (2 per multiply-add), attention scores excluded."""
    d, hd = self.hidden_size, self.head_dim
    attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
    mlp = 3 * d * self.intermediate_size
    flops = 2 * self.num_layers * (attn + mlp)
    if with_lm_head:
      flops += 2 * d * self.vocab_size
    return float(flops)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, fields: Mapping[str, Any]) -> "ModelConfig":
    """The inverse of `to_dict` (after a JSON round trip); fields a config written by an older jaxloc lacks keep
    their defaults."""
    fields = dict(fields)
    if fields.get("rope_scaling"):
      fields["rope_scaling"] = RopeScaling(**fields["rope_scaling"])
    fields["eos_token_ids"] = tuple(fields.get("eos_token_ids", ()))
    fields["layer_types"] = tuple(fields.get("layer_types", ()))
    return cls(**fields)


def _as_tuple(value) -> tuple[int, ...]:
  if value is None:
    return ()
  if isinstance(value, (list, tuple)):
    return tuple(int(v) for v in value)
  return (int(value),)


def _rope(params: Mapping[str, Any], theta_default: float, where: str) -> tuple[float, RopeScaling | None]:
  """(base, scaling) of one rope parameter dict (`rope_type`/`type`, `rope_theta`, `factor`, ...)."""
  theta = float(params.get("rope_theta", theta_default))
  rope_type = params.get("rope_type", params.get("type", "default")) or "default"
  if rope_type not in SUPPORTED_ROPE_TYPES:
    raise UserError(f"unsupported rope type {rope_type!r}{where}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
  if rope_type == "default":
    return theta, None
  if rope_type == "linear":
    return theta, RopeScaling(factor=float(params["factor"]), rope_type="linear")
  try:
    return theta, RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]))
  except KeyError as e:
    raise UserError(f"llama3 rope scaling is missing {e.args[0]!r} in {dict(params)}") from None


def _rope_from_hf(hf: Mapping[str, Any], theta_default: float = 10000.0) -> tuple[float, RopeScaling | None]:
  # transformers 5.x writes `rope_parameters` (theta inside); 4.x writes `rope_theta` + `rope_scaling`.
  params = dict(hf.get("rope_parameters") or {})
  if FULL in params:  # per layer type (Gemma 3 under transformers 5.x): the full layers' rope
    params = dict(params[FULL] or {})
  scaling = hf.get("rope_scaling") or {}
  merged = {"rope_theta": hf.get("rope_theta", theta_default), **scaling, **params}
  return _rope(merged, theta_default, "")


def _sliding_rope_from_hf(hf: Mapping[str, Any], theta_default: float) -> float:
  """Gemma 3's sliding layers' rope base (`rope_parameters[sliding_attention]`, or `rope_local_base_freq`)."""
  params = dict((hf.get("rope_parameters") or {}).get(SLIDING) or {})
  theta, scaling = _rope({"rope_theta": hf.get("rope_local_base_freq", theta_default), **params}, theta_default,
                         " for sliding layers")
  if scaling is not None:
    raise UserError(f"unsupported rope scaling {scaling.rope_type!r} on sliding layers; supported: default")
  return theta


def _layer_types(model_type: str, hf: Mapping[str, Any], get, num_layers: int, window: int | None
                 ) -> tuple[str, ...]:
  """Per-layer attention kinds as transformers derives them when `layer_types` is absent; () when no layer slides."""
  if window is None:
    return ()
  given = hf.get("layer_types")
  if model_type == "mistral":  # Mistral's attention slides on every layer whatever layer_types says
    given = None
    kinds = [SLIDING] * num_layers
  elif model_type == "qwen3":
    kinds = [SLIDING if i >= get("max_window_layers") else FULL for i in range(num_layers)]
  elif model_type == "gemma2":
    kinds = [SLIDING if (i + 1) % 2 else FULL for i in range(num_layers)]
  elif model_type == "gemma3_text":
    pattern = int(hf.get("sliding_window_pattern") or hf.get("_sliding_window_pattern")
                  or get("sliding_window_pattern"))
    kinds = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
  else:
    kinds = [FULL] * num_layers
  kinds = tuple(given) if given else tuple(kinds)
  return kinds if SLIDING in kinds else ()


def config_from_hf(hf: Mapping[str, Any]) -> ModelConfig:
  """Builds a ModelConfig from the dict of an HF `config.json` (or `PretrainedConfig.to_dict()`)."""
  model_type = hf.get("model_type")
  if model_type == "gemma3":
    raise UserError("model_type 'gemma3' is the multimodal Gemma 3 checkpoint; jaxloc reads the text-only "
                    "Gemma3ForCausalLM checkpoints (model_type 'gemma3_text', e.g. gemma-3-270m and gemma-3-1b)")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise UserError(f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)} "
                    "(any Llama-architecture checkpoint, e.g. SmolLM2, declares model_type 'llama')")
  defaults = _FAMILY_DEFAULTS[model_type]

  def get(key):
    value = hf.get(key)
    return defaults.get(key) if value is None and key not in hf else value

  gemma = model_type in ("gemma2", "gemma3_text")
  # Gemma's MLP reads `hidden_activation` (Gemma 1 configs left it null and meant the tanh GELU).
  act = (hf.get("hidden_activation") or "gelu_pytorch_tanh") if gemma else hf.get("hidden_act", "silu")
  supported = "gelu_pytorch_tanh" if gemma else "silu"
  if act != supported:
    raise UserError(f"unsupported hidden activation {act!r} for {model_type}; supported: {supported}")
  if hf.get("pretraining_tp", 1) not in (1, None):
    raise UserError(f"unsupported pretraining_tp={hf['pretraining_tp']}; supported: 1")
  if model_type == "qwen2" and hf.get("use_sliding_window", False):
    raise UserError("unsupported Qwen2 option use_sliding_window=True; supported: sliding window off "
                    "(all released Qwen2.5 instruct checkpoints)")
  if hf.get("use_bidirectional_attention"):
    raise UserError(f"unsupported {model_type} option use_bidirectional_attention=True (an embedding model); "
                    "supported: causal attention")
  if model_type == "gemma3_text" and hf.get("attn_logit_softcapping") is not None:
    raise UserError(f"gemma3_text with attn_logit_softcapping={hf['attn_logit_softcapping']}: transformers' Gemma 3 "
                    "ignores it, so its meaning is ambiguous; supported: null (every released Gemma 3)")
  num_heads = int(hf["num_attention_heads"])
  num_layers = int(hf["num_hidden_layers"])
  hidden = int(hf["hidden_size"])
  theta, scaling = _rope_from_hf(hf, float(get("rope_theta") or 10000.0))
  head_dim = hf.get("head_dim") or defaults.get("head_dim") or hidden // num_heads
  if model_type == "qwen2":
    qkv_bias, o_bias, mlp_bias = True, False, False
  elif model_type == "mistral":
    qkv_bias = o_bias = mlp_bias = False
  else:
    qkv_bias = o_bias = bool(hf.get("attention_bias", False))
    mlp_bias = bool(hf.get("mlp_bias", False)) if model_type == "llama" else False
  window = get("sliding_window")
  if model_type == "qwen3" and not hf.get("use_sliding_window", False):
    window = None
  if model_type in ("llama", "qwen2", "olmo2"):
    window = None
  layer_types = _layer_types(model_type, hf, get, num_layers, window)
  family: dict[str, Any] = {}
  if model_type == "qwen3":
    family = dict(qk_norm="head")
  elif model_type == "olmo2":
    family = dict(pre_norm=False, post_norm=True, norm_scale_float32=True, qk_norm="projection")
  elif gemma:
    family = dict(post_norm=True, norm_unit_offset=True, norm_scale_float32=True, hidden_act=act, embed_scale=True,
                  query_pre_attn_scalar=float(get("query_pre_attn_scalar")),
                  attn_softcap=get("attn_logit_softcapping"), final_softcap=get("final_logit_softcapping"))
    if model_type == "gemma3_text":
      family.update(qk_norm="head", sliding_rope_theta=_sliding_rope_from_hf(hf, get("rope_local_base_freq")))
  return ModelConfig(
      model_type=model_type,
      vocab_size=int(hf["vocab_size"]),
      hidden_size=hidden,
      intermediate_size=int(hf["intermediate_size"]),
      num_layers=num_layers,
      num_heads=num_heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
      head_dim=int(head_dim),
      rms_norm_eps=float(get("rms_norm_eps")),
      rope_theta=theta,
      rope_scaling=scaling,
      tie_word_embeddings=bool(get("tie_word_embeddings")),
      qkv_bias=qkv_bias,
      o_bias=o_bias,
      mlp_bias=mlp_bias,
      max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
      bos_token_id=hf.get("bos_token_id"),
      eos_token_ids=_as_tuple(hf.get("eos_token_id")),
      pad_token_id=hf.get("pad_token_id"),
      sliding_window=int(window) if layer_types else None,
      layer_types=layer_types,
      **family,
  )


GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma2": "gemma2",
                      "gemma3": "gemma3_text"}
# llama.cpp scales Gemma 27B's queries by its hidden size per head, every other Gemma's by head_dim (the GGUF does
# not store query_pre_attn_scalar): (architecture, layers) of the 27B models.
_GGUF_GEMMA_27B = {("gemma2", 46), ("gemma3", 62)}
# llama.cpp's Gemma sliding layers when the GGUF does not say (`attention.sliding_window_pattern`,
# `rope.freq_base_swa`): every second layer but the last of each pair (Gemma 2), every layer but each sixth with rope
# base 10k (Gemma 3).
_GGUF_SLIDING_PATTERN = {"gemma2": 2, "gemma3": 6}
_GGUF_GEMMA3_SLIDING_THETA = 10_000.0


def _gguf_layer_types(pattern, num_layers: int) -> tuple[str, ...]:
  """Per-layer kinds from llama.cpp's sliding-window pattern: a bool per layer (True: sliding), or n: layer i slides
  unless i % n == n - 1 (n = 0: every layer slides)."""
  if isinstance(pattern, (list, tuple)):
    if len(pattern) != num_layers:
      raise UserError(f"GGUF sliding_window_pattern names {len(pattern)} layers; the model has {num_layers}")
    return tuple(SLIDING if flag else FULL for flag in pattern)
  n = int(pattern)
  return tuple(SLIDING if n == 0 or i % n < n - 1 else FULL for i in range(num_layers))


def config_from_gguf(fields: Mapping[str, Any], tensor_names: set[str]) -> ModelConfig:
  """Builds a ModelConfig from GGUF metadata (`fields`: key -> decoded value)."""
  arch = fields.get("general.architecture")
  if arch not in GGUF_ARCHITECTURES:
    raise UserError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)} "
                    "(Mistral GGUFs declare llama; for other families load the safetensors checkpoint)")

  def get(key, default=None):
    return fields.get(f"{arch}.{key}", default)

  hidden = int(get("embedding_length"))
  num_heads = int(get("attention.head_count"))
  num_layers = int(get("block_count"))
  head_dim = int(get("attention.key_length") or hidden // num_heads)
  rope_type = fields.get(f"{arch}.rope.scaling.type")
  scaling = None
  if arch == "gemma3" and rope_type == "linear":
    scaling = RopeScaling(factor=float(get("rope.scaling.factor")), rope_type="linear")
  elif rope_type not in (None, "none"):
    raise UserError(f"unsupported GGUF rope scaling {rope_type!r} for {arch}; supported: none"
                    + (", linear" if arch == "gemma3" else "")
                    + " (llama3-scaled checkpoints carry a rope_freqs tensor: load those from safetensors)")
  if "rope_freqs.weight" in tensor_names:
    raise UserError("GGUF files with a rope_freqs tensor (Llama-3.1 frequency scaling) are not supported; "
                    "load the safetensors checkpoint instead")
  vocab = get("vocab_size")
  if vocab is None:
    raise UserError(f"GGUF metadata has neither {arch}.vocab_size nor a tokenizer vocabulary")
  family: dict[str, Any] = {}
  if arch == "qwen3":
    family = dict(qk_norm="head")
  elif arch in ("gemma2", "gemma3"):
    scalar = hidden // num_heads if (arch, num_layers) in _GGUF_GEMMA_27B else head_dim
    window = int(get("attention.sliding_window"))
    pattern = get("attention.sliding_window_pattern", _GGUF_SLIDING_PATTERN[arch])
    family = dict(post_norm=True, norm_unit_offset=True, norm_scale_float32=True, hidden_act="gelu_pytorch_tanh",
                  embed_scale=True, query_pre_attn_scalar=float(scalar), sliding_window=window,
                  layer_types=_gguf_layer_types(pattern, num_layers))
    if arch == "gemma2":
      family.update(attn_softcap=float(get("attn_logit_softcapping", 50.0)),
                    final_softcap=float(get("final_logit_softcapping", 30.0)))
    else:
      family.update(qk_norm="head", sliding_rope_theta=float(get("rope.freq_base_swa", _GGUF_GEMMA3_SLIDING_THETA)))
  return ModelConfig(
      model_type=GGUF_ARCHITECTURES[arch],
      vocab_size=int(vocab),
      hidden_size=hidden,
      intermediate_size=int(get("feed_forward_length")),
      num_layers=num_layers,
      num_heads=num_heads,
      num_kv_heads=int(get("attention.head_count_kv") or num_heads),
      head_dim=head_dim,
      rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
      rope_theta=float(get("rope.freq_base", 10000.0)),
      rope_scaling=scaling,
      tie_word_embeddings="output.weight" not in tensor_names,
      qkv_bias="blk.0.attn_q.bias" in tensor_names,
      o_bias="blk.0.attn_output.bias" in tensor_names,
      mlp_bias="blk.0.ffn_up.bias" in tensor_names,
      max_position_embeddings=int(get("context_length", 8192)),
      bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
      eos_token_ids=_as_tuple(fields.get("tokenizer.ggml.eos_token_id")),
      pad_token_id=fields.get("tokenizer.ggml.padding_token_id"),
      **family,
  )
