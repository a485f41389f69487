"""Checkpoint conversion: HF safetensors and GGUF files into jaxloc's parameter pytree.

No PyTorch model is ever built. Safetensors files are memory-mapped and each tensor is transposed
into the stacked [layers, ...] leaf in the target dtype, so host memory peaks near one copy of the
checkpoint (plus one leaf while it is placed on devices). GGUF tensors are dequantized with the
`gguf` package and llama.cpp's conventions are undone: the rotary permutation of Llama q/k rows, and the 1 it
adds to every Gemma norm weight. Tensor names differ by family (Llama's `post_attention_layernorm` is the norm before
the MLP, Gemma's and OLMo-2's the norm on the attention output): `_layer_leaves` maps each to the decoder's leaves,
and holds each leaf's conversion back, so `hf_tensors` and `write_safetensors` write a parameter pytree as an HF
checkpoint again (`export.py`).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from typing import Any, Callable, Iterable, Mapping, NamedTuple

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


class Leaf(NamedTuple):
  """One stacked decoder leaf: its per-layer shape, the HF tensor suffix it comes from, and the two directions."""

  shape: tuple[int, ...]
  suffix: str
  from_hf: Callable[[np.ndarray], np.ndarray]  # HF tensor -> our per-layer array
  to_hf: Callable[[np.ndarray], np.ndarray]  # our per-layer array -> HF tensor


def _same(w: np.ndarray) -> np.ndarray:
  return w


def _layer_leaves(config: ModelConfig) -> dict[str, Leaf]:
  """Our stacked leaf -> its `Leaf` (per-layer shape, HF tensor suffix, conversions both ways)."""
  c = config
  d, k, g, hd, f = c.hidden_size, c.num_kv_heads, c.queries_per_kv, c.head_dim, c.intermediate_size

  def flat(w: np.ndarray) -> np.ndarray:
    return w.reshape(-1)

  def out_rows(w: np.ndarray) -> np.ndarray:
    # our [D, heads..., Dh] kernels are HF's [out, D] Linear weights transposed, their output axis split per head
    return w.reshape(d, -1).T

  leaves = {
      "attn/q_kernel": Leaf((d, k, g, hd), "self_attn.q_proj.weight", lambda w: w.T.reshape(d, k, g, hd), out_rows),
      "attn/k_kernel": Leaf((d, k, hd), "self_attn.k_proj.weight", lambda w: w.T.reshape(d, k, hd), out_rows),
      "attn/v_kernel": Leaf((d, k, hd), "self_attn.v_proj.weight", lambda w: w.T.reshape(d, k, hd), out_rows),
      "attn/o_kernel": Leaf((k, g, hd, d), "self_attn.o_proj.weight", lambda w: w.T.reshape(k, g, hd, d),
                            lambda w: w.reshape(k * g * hd, d).T),
      "mlp/gate_kernel": Leaf((d, f), "mlp.gate_proj.weight", lambda w: w.T, lambda w: w.T),
      "mlp/up_kernel": Leaf((d, f), "mlp.up_proj.weight", lambda w: w.T, lambda w: w.T),
      "mlp/down_kernel": Leaf((f, d), "mlp.down_proj.weight", lambda w: w.T, lambda w: w.T),
  }
  if c.pre_norm:
    leaves["attn_norm/scale"] = Leaf((d,), "input_layernorm.weight", _same, _same)
    # With post-norms (Gemma), `post_attention_layernorm` is the attention output's and the MLP's input norm has its
    # own name; without (Llama), `post_attention_layernorm` is the MLP's input norm.
    pre_mlp = "pre_feedforward_layernorm" if c.post_norm else "post_attention_layernorm"
    leaves["mlp_norm/scale"] = Leaf((d,), f"{pre_mlp}.weight", _same, _same)
  if c.post_norm:
    leaves["post_attn_norm/scale"] = Leaf((d,), "post_attention_layernorm.weight", _same, _same)
    leaves["post_mlp_norm/scale"] = Leaf((d,), "post_feedforward_layernorm.weight", _same, _same)
  if c.qk_norm == "head":
    leaves["attn/q_norm/scale"] = Leaf((hd,), "self_attn.q_norm.weight", _same, _same)
    leaves["attn/k_norm/scale"] = Leaf((hd,), "self_attn.k_norm.weight", _same, _same)
  elif c.qk_norm == "projection":
    leaves["attn/q_norm/scale"] = Leaf((k * g * hd,), "self_attn.q_norm.weight", _same, _same)
    leaves["attn/k_norm/scale"] = Leaf((k * hd,), "self_attn.k_norm.weight", _same, _same)
  if c.qkv_bias:
    leaves["attn/q_bias"] = Leaf((k, g, hd), "self_attn.q_proj.bias", lambda w: w.reshape(k, g, hd), flat)
    leaves["attn/k_bias"] = Leaf((k, hd), "self_attn.k_proj.bias", lambda w: w.reshape(k, hd), flat)
    leaves["attn/v_bias"] = Leaf((k, hd), "self_attn.v_proj.bias", lambda w: w.reshape(k, hd), flat)
  if c.o_bias:
    leaves["attn/o_bias"] = Leaf((d,), "self_attn.o_proj.bias", _same, _same)
  if c.mlp_bias:
    for name in ("gate", "up"):
      leaves[f"mlp/{name}_bias"] = Leaf((f,), f"mlp.{name}_proj.bias", _same, _same)
    leaves["mlp/down_bias"] = Leaf((d,), "mlp.down_proj.bias", _same, _same)
  return leaves


def nest(flat: Mapping[str, Any]) -> dict:
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
  for leaf, spec in _layer_leaves(config).items():
    stacked = np.empty((config.num_layers,) + spec.shape, dtype)
    for layer in range(config.num_layers):
      stacked[layer] = spec.from_hf(fetch(f"model.layers.{layer}.{spec.suffix}"))
    flat[f"layers/{leaf}"] = place(f"layers/{leaf}", stacked)
    del stacked
  return nest(flat)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  """The inverse of `nest`: {"layers": {"attn": {"q_kernel": x}}} -> {"layers/attn/q_kernel": x}."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      flat.update(flatten(value, f"{prefix}{key}/"))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def hf_tensors(config: ModelConfig, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The inverse of `convert_hf_tensors`: HF tensor name -> host array, in the parameters' dtype. Tied embeddings
  write no `lm_head.weight` (transformers ties it to the embedding on load)."""
  flat = {path: np.asarray(jax.device_get(value)) for path, value in flatten(params).items()}
  tensors = {"model.embed_tokens.weight": flat.pop("embed/embedding"),
             "model.norm.weight": flat.pop("final_norm/scale")}
  if not config.tie_word_embeddings:
    tensors["lm_head.weight"] = np.ascontiguousarray(flat.pop("lm_head").T)
  for leaf, spec in _layer_leaves(config).items():
    stacked = flat.pop(f"layers/{leaf}")
    for layer in range(config.num_layers):
      tensors[f"model.layers.{layer}.{spec.suffix}"] = np.ascontiguousarray(spec.to_hf(stacked[layer]))
  if flat:
    raise ValueError(f"parameters with no HF tensor for a {config.model_type} config: {sorted(flat)}")
  return tensors


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
  """One .safetensors file (what `SafetensorsFile` reads): an 8-byte header length, a JSON header of names, dtypes,
  shapes and byte offsets, then the tensors' bytes back to back."""
  names = {np.dtype(dtype): name for name, dtype in _SAFETENSORS_DTYPES.items()}
  header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
  offset = 0
  for name, array in tensors.items():
    if array.dtype not in names:
      raise ValueError(f"tensor {name} has dtype {array.dtype}, which safetensors cannot hold")
    header[name] = {"dtype": names[array.dtype], "shape": list(array.shape),
                    "data_offsets": [offset, offset + array.nbytes]}
    offset += array.nbytes
  encoded = json.dumps(header, separators=(",", ":")).encode()
  encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(encoded)))
    f.write(encoded)
    for array in tensors.values():
      f.write(np.ascontiguousarray(array).tobytes())


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


# Metadata arrays too large to decode for a config (the tokenizer's); only their lengths are kept.
_GGUF_LARGE_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                      "tokenizer.ggml.scores")
# GGUF metadata value types (the spec's numbering) -> struct formats; 8 is a string, 9 an array.
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _GGUFHeader:
  """Reads a GGUF header (the metadata key/values, then one info per tensor) from a memory map, position by
  position; reading past the end raises struct.error."""

  def __init__(self, data, byte_order: str):
    self.data, self.order, self.position = data, byte_order, 0

  def take(self, fmt: str):
    (value,) = struct.unpack_from(self.order + fmt, self.data, self.position)
    self.position += struct.calcsize(fmt)
    return value

  def string(self) -> str:
    size = self.take("Q")
    if self.position + size > len(self.data):
      raise struct.error("string past the end of the file")
    self.position += size
    return bytes(self.data[self.position - size:self.position]).decode("utf-8", errors="replace")

  def value(self, kind: int, keep: bool = True):
    """A metadata value; an array that is not kept is skipped and its length returned."""
    if kind == _GGUF_STRING:
      return self.string()
    if kind != _GGUF_ARRAY:
      return self.take(_GGUF_SCALARS[kind])
    item_kind, count = self.take("I"), self.take("Q")
    if keep:
      return [self.value(item_kind) for _ in range(count)]
    if item_kind == _GGUF_STRING:
      for _ in range(count):
        size = self.take("Q")  # taken before the += reads the position
        self.position += size
    else:
      self.position += count * struct.calcsize(_GGUF_SCALARS[item_kind])
    return count


def gguf_metadata(path: str) -> tuple[dict[str, Any], set[str]]:
  """(metadata fields, tensor names) of a GGUF file, from its header alone (milliseconds: no tensor is read). The
  tokenizer's large arrays are left out; their vocabulary size is kept as `<arch>.vocab_size` unless given. A
  UserError names the file when it is no GGUF file or is truncated (its tensors need more bytes than it holds)."""
  from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # Imported here: only GGUF loads need it.

  if not os.path.isfile(path):
    raise UserError(f"GGUF file not found: {path}")
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    if f.read(4) != b"GGUF":
      raise UserError(f"{path} is not a readable GGUF file: it does not start with the GGUF magic")
    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  with data:
    (version,) = struct.unpack_from("<I", data, 4) if size >= 8 else (0,)
    header = _GGUFHeader(data, "<" if version & 0xFFFF else ">")  # a file written on a big-endian host reads 0 here
    header.position = 4
    try:
      version = header.take("I")
      if version not in (2, 3):
        raise UserError(f"{path} is GGUF version {version}; supported: 2, 3")
      num_tensors, num_fields = header.take("Q"), header.take("Q")
      fields: dict[str, Any] = {}
      for _ in range(num_fields):
        name = header.string()
        fields[name] = header.value(header.take("I"), keep=name not in _GGUF_LARGE_FIELDS)
      ends = {}
      for _ in range(num_tensors):
        name = header.string()
        dims = [header.take("Q") for _ in range(header.take("I"))]
        kind, offset = header.take("I"), header.take("Q")
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        ends[name] = offset + int(np.prod(dims, dtype=np.int64)) // block * type_size
    except (struct.error, ValueError, KeyError) as e:
      if isinstance(e, UserError):
        raise
      if isinstance(e, struct.error):
        raise UserError(f"{path} is truncated: its header ends past its {size:,} bytes; download it again") from None
      raise UserError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None
  alignment = int(fields.get("general.alignment", 32))
  data_start = -(-header.position // alignment) * alignment
  needed = data_start + max(ends.values(), default=0)
  if needed > size:
    raise UserError(f"{path} is truncated: it has {size:,} bytes, its tensors need {needed:,}; download it again")
  tokens = fields.get("tokenizer.ggml.tokens")
  if tokens is not None:
    fields.setdefault(f"{fields.get('general.architecture')}.vocab_size", tokens)
  for name in _GGUF_LARGE_FIELDS:
    fields.pop(name, None)
  return fields, set(ends)


def gguf_config(path: str) -> ModelConfig:
  """A GGUF file's model config, from its header (`gguf_metadata`)."""
  return config_from_gguf(*gguf_metadata(path))


def read_gguf(path: str):
  """(config, reader) for a GGUF file; a truncated file is named as such before its tensors are mapped."""
  import gguf  # Imported here: only GGUF loads need it.

  config = gguf_config(path)
  try:
    reader = gguf.GGUFReader(path)
  except (ValueError, OSError, struct.error) as e:
    raise UserError(f"{path} is not a readable GGUF file: {e}") from None
  return config, reader


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
