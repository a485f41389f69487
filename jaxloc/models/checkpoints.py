"""Checkpoint conversion: HF safetensors and GGUF files into jaxloc's parameter pytree.

No PyTorch model is ever built. Safetensors files are memory-mapped and each tensor is transposed
into the stacked [layers, ...] leaf in the target dtype, so host memory peaks near one copy of the
checkpoint (plus one leaf while it is placed on devices). GGUF tensors are dequantized with the
`gguf` package and llama.cpp's conventions are undone: the rotary permutation of Llama q/k rows, and the 1 it
adds to every Gemma norm weight. Tensor names differ by family (Llama's `post_attention_layernorm` is the norm before
the MLP, Gemma's and OLMo-2's the norm on the attention output): `_layer_leaves` maps each to the decoder's leaves.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Callable, Iterable, Mapping

import jax
import ml_dtypes
import numpy as np

from jaxloc.errors import UserError
from jaxloc.models.config import ModelConfig, config_from_gguf

_SAFETENSORS_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
}

# (parameter path such as "layers/attn/q_kernel", shape) -> where that leaf lives (None: default device).
ShardingFn = Callable[[str, tuple], "jax.sharding.Sharding | None"]


def placer(sharding_for: ShardingFn | None) -> Callable[[str, np.ndarray], Any]:
  """Puts host leaves on devices, each with the sharding `sharding_for` gives its path."""

  def place(path: str, array: np.ndarray):
    sharding = sharding_for(path, array.shape) if sharding_for else None
    return jax.device_put(array, sharding) if sharding is not None else jax.numpy.asarray(array)

  return place


class SafetensorsFile:
  """A memory-mapped .safetensors file: name -> numpy view, no copy until a tensor is used."""

  def __init__(self, path: str):
    self.path = path
    with open(path, "rb") as f:
      (header_len,) = struct.unpack("<Q", f.read(8))
      header = json.loads(f.read(header_len))
    self._data_start = 8 + header_len
    header.pop("__metadata__", None)
    self.entries = header
    self._map = np.memmap(path, dtype=np.uint8, mode="r")

  def keys(self) -> Iterable[str]:
    return self.entries.keys()

  def get(self, name: str) -> np.ndarray:
    entry = self.entries[name]
    if entry["dtype"] not in _SAFETENSORS_DTYPES:
      raise UserError(f"{self.path}: tensor {name} has unsupported dtype {entry['dtype']}")
    begin, end = entry["data_offsets"]
    raw = self._map[self._data_start + begin:self._data_start + end]
    return raw.view(_SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])


def open_safetensors_dir(directory: str) -> dict[str, SafetensorsFile]:
  """tensor name -> the file holding it, for single-file or sharded (with index) checkpoints."""
  index_path = os.path.join(directory, "model.safetensors.index.json")
  if os.path.exists(index_path):
    with open(index_path) as f:
      weight_map = json.load(f)["weight_map"]
    files = {}
    for shard in sorted(set(weight_map.values())):
      shard_path = os.path.join(directory, shard)
      if not os.path.exists(shard_path):
        raise UserError(f"{index_path} lists shard {shard}, which is missing from {directory}")
      files[shard] = SafetensorsFile(shard_path)
    return {name: files[shard] for name, shard in weight_map.items()}
  single = os.path.join(directory, "model.safetensors")
  if not os.path.exists(single):
    raise UserError(f"no model.safetensors or model.safetensors.index.json in {directory}")
  file = SafetensorsFile(single)
  return {name: file for name in file.keys()}


def _layer_leaves(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], str, Callable[[np.ndarray], np.ndarray]]]:
  """Our stacked leaf -> (per-layer shape, HF tensor suffix, HF tensor -> our per-layer array)."""
  c = config
  d, k, g, hd, f = c.hidden_size, c.num_kv_heads, c.queries_per_kv, c.head_dim, c.intermediate_size
  leaves = {
      "attn/q_kernel": ((d, k, g, hd), "self_attn.q_proj.weight", lambda w: w.T.reshape(d, k, g, hd)),
      "attn/k_kernel": ((d, k, hd), "self_attn.k_proj.weight", lambda w: w.T.reshape(d, k, hd)),
      "attn/v_kernel": ((d, k, hd), "self_attn.v_proj.weight", lambda w: w.T.reshape(d, k, hd)),
      "attn/o_kernel": ((k, g, hd, d), "self_attn.o_proj.weight", lambda w: w.T.reshape(k, g, hd, d)),
      "mlp/gate_kernel": ((d, f), "mlp.gate_proj.weight", lambda w: w.T),
      "mlp/up_kernel": ((d, f), "mlp.up_proj.weight", lambda w: w.T),
      "mlp/down_kernel": ((f, d), "mlp.down_proj.weight", lambda w: w.T),
  }
  if c.pre_norm:
    leaves["attn_norm/scale"] = ((d,), "input_layernorm.weight", lambda w: w)
    # With post-norms (Gemma), `post_attention_layernorm` is the attention output's and the MLP's input norm has its
    # own name; without (Llama), `post_attention_layernorm` is the MLP's input norm.
    pre_mlp = "pre_feedforward_layernorm" if c.post_norm else "post_attention_layernorm"
    leaves["mlp_norm/scale"] = ((d,), f"{pre_mlp}.weight", lambda w: w)
  if c.post_norm:
    leaves["post_attn_norm/scale"] = ((d,), "post_attention_layernorm.weight", lambda w: w)
    leaves["post_mlp_norm/scale"] = ((d,), "post_feedforward_layernorm.weight", lambda w: w)
  if c.qk_norm == "head":
    leaves["attn/q_norm/scale"] = ((hd,), "self_attn.q_norm.weight", lambda w: w)
    leaves["attn/k_norm/scale"] = ((hd,), "self_attn.k_norm.weight", lambda w: w)
  elif c.qk_norm == "projection":
    leaves["attn/q_norm/scale"] = ((k * g * hd,), "self_attn.q_norm.weight", lambda w: w)
    leaves["attn/k_norm/scale"] = ((k * hd,), "self_attn.k_norm.weight", lambda w: w)
  if c.qkv_bias:
    leaves["attn/q_bias"] = ((k, g, hd), "self_attn.q_proj.bias", lambda w: w.reshape(k, g, hd))
    leaves["attn/k_bias"] = ((k, hd), "self_attn.k_proj.bias", lambda w: w.reshape(k, hd))
    leaves["attn/v_bias"] = ((k, hd), "self_attn.v_proj.bias", lambda w: w.reshape(k, hd))
  if c.o_bias:
    leaves["attn/o_bias"] = ((d,), "self_attn.o_proj.bias", lambda w: w)
  if c.mlp_bias:
    for name in ("gate", "up"):
      leaves[f"mlp/{name}_bias"] = ((f,), f"mlp.{name}_proj.bias", lambda w: w)
    leaves["mlp/down_bias"] = ((d,), "mlp.down_proj.bias", lambda w: w)
  return leaves


def _nest(flat: Mapping[str, Any]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def convert_hf_tensors(config: ModelConfig, get: Callable[[str], np.ndarray], names: set[str],
                       dtype, sharding_for: ShardingFn | None = None) -> dict:
  """Builds the parameter pytree from HF-named tensors (`get(name)` returns a host array)."""
  place = placer(sharding_for)

  def fetch(name: str) -> np.ndarray:
    if name not in names:
      raise UserError(f"checkpoint is missing tensor {name!r} required by its config "
                      f"({config.model_type}, {config.num_layers} layers)")
    return get(name)

  flat = {"embed/embedding": place("embed/embedding", fetch("model.embed_tokens.weight").astype(dtype)),
          "final_norm/scale": place("final_norm/scale", fetch("model.norm.weight").astype(dtype))}
  if not config.tie_word_embeddings:
    flat["lm_head"] = place("lm_head", np.ascontiguousarray(fetch("lm_head.weight").T.astype(dtype)))
  for leaf, (shape, suffix, to_ours) in _layer_leaves(config).items():
    stacked = np.empty((config.num_layers,) + shape, dtype)
    for layer in range(config.num_layers):
      stacked[layer] = to_ours(fetch(f"model.layers.{layer}.{suffix}"))
    flat[f"layers/{leaf}"] = place(f"layers/{leaf}", stacked)
    del stacked
  return _nest(flat)


def load_safetensors_params(directory: str, config: ModelConfig, dtype, sharding_for: ShardingFn | None = None) -> dict:
  tensors = open_safetensors_dir(directory)
  return convert_hf_tensors(config, lambda name: tensors[name].get(name), set(tensors), dtype, sharding_for)


# GGUF -----------------------------------------------------------------------------------------

_GGUF_TO_HF = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight", "ffn_gate.bias": "mlp.gate_proj.bias",
    "ffn_up.bias": "mlp.up_proj.bias", "ffn_down.bias": "mlp.down_proj.bias",
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
}
# llama.cpp's Gemma names: `ffn_norm` is the MLP's input norm, and the outputs have their own norms.
_GGUF_TO_HF_POST_NORMS = {**_GGUF_TO_HF, "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                          "post_attention_norm.weight": "post_attention_layernorm.weight",
                          "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
_GGUF_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}


def _unpermute_rotary(w: np.ndarray, num_heads: int) -> np.ndarray:
  # llama.cpp stores q/k rows of each head interleaved (pairs); HF keeps the two halves apart.
  half = w.shape[0] // num_heads // 2
  return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_LARGE_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                      "tokenizer.ggml.scores")


def read_gguf(path: str):
  """(config, reader) for a GGUF file."""
  import gguf  # Imported here: only GGUF loads need it.

  if not os.path.isfile(path):
    raise UserError(f"GGUF file not found: {path}")
  try:
    reader = gguf.GGUFReader(path)
  except (ValueError, OSError, struct.error) as e:
    raise UserError(f"{path} is not a readable GGUF file: {e}") from None
  fields = {}
  for name, field in reader.fields.items():
    if name in _GGUF_LARGE_FIELDS:
      continue
    try:
      fields[name] = field.contents()
    except Exception:  # noqa: BLE001 - metadata we cannot decode and do not need
      continue
  arch = fields.get("general.architecture")
  if "tokenizer.ggml.tokens" in reader.fields:
    fields.setdefault(f"{arch}.vocab_size", len(reader.fields["tokenizer.ggml.tokens"].data))
  return config_from_gguf(fields, {t.name for t in reader.tensors}), reader


def load_gguf_params(path: str, dtype, sharding_for: ShardingFn | None = None) -> tuple[ModelConfig, dict]:
  from gguf.quants import dequantize

  config, reader = read_gguf(path)
  names = _GGUF_TO_HF_POST_NORMS if config.post_norm else _GGUF_TO_HF
  by_hf_name = {}
  for tensor in reader.tensors:
    if tensor.name in _GGUF_TOP:
      by_hf_name[_GGUF_TOP[tensor.name]] = tensor
    elif tensor.name.startswith("blk."):
      _, layer, rest = tensor.name.split(".", 2)
      if rest in names:
        by_hf_name[f"model.layers.{layer}.{names[rest]}"] = tensor

  def get(name: str) -> np.ndarray:
    tensor = by_hf_name[name]
    w = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    if config.model_type == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
      w = _unpermute_rotary(w, config.num_heads)
    elif config.model_type == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
      w = _unpermute_rotary(w, config.num_kv_heads)
    elif config.norm_unit_offset and name.endswith("norm.weight"):
      w = w - 1  # llama.cpp stores Gemma's (1 + w) norm scales with the 1 added; the decoder adds it itself
    return w

  return config, convert_hf_tensors(config, get, set(by_hf_name), dtype, sharding_for)
