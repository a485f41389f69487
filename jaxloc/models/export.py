"""The edited model as a Hugging Face checkpoint: ablated heads and neurons folded into the weights.

A head's ablation scales its slice of the `o_proj` input (`decoder.py`); zeroing that slice's columns of the `o_proj`
weight gives the same output with no mask at all, so the edited model runs anywhere `transformers` runs. Likewise a
neuron is the `down_proj` input at its index: its column of `down_proj` is zeroed. Mean ablation replaces a unit's
output by a constant fill, whose image through `o_proj` (`down_proj`) is a constant vector: it goes into that
projection's bias.

Axes as in `layers.py`: `layers` L, `kv_heads` K, `queries_per_kv` G, `head_dim` Dh, `hidden` D, `mlp` F. A query
head h is (K, G) = divmod(h, G), as the decoder groups it.

Only transformers' config options decide which biases a family can hold (`config_to_hf`): `attention_bias` gives q, k,
v and o biases together (Llama, Qwen3, Gemma 2/3, OLMo-2), so an o bias comes with zero q/k/v biases, which compute
exactly what the bias-free projections computed; Llama's `mlp_bias` gives gate, up and down biases together. Qwen2
and Mistral hard-code a bias-free `o_proj`, and only Llama has an MLP bias option: mean ablation there is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Sequence

import numpy as np

from jaxloc.errors import UserError
from jaxloc.models import checkpoints
from jaxloc.models.config import ModelConfig, config_to_hf


def check_bias_holds(config: ModelConfig, unit: str) -> None:
  """Mean ablation of `unit` needs a bias on the projection the unit feeds (o_proj for heads, down_proj for neurons);
  refuses a family whose transformers config cannot give it one (`config_to_hf` decides)."""
  if unit == "heads":
    biased, option = dataclasses.replace(config, qkv_bias=True, o_bias=True), "an o_proj bias (attention_bias)"
  else:
    biased, option = dataclasses.replace(config, mlp_bias=True), "a down_proj bias (mlp_bias)"
  try:
    config_to_hf(biased)
  except UserError:
    raise UserError(f"mean ablation of {unit} folds each one's mean output into {option}, which transformers' "
                    f"{config.model_type} config cannot hold; export with --ablation=zero, or use a family that can "
                    "(Llama for both; Qwen3, Gemma 2/3, OLMo-2 for heads)") from None


def fold_ablation(config: ModelConfig, params, heads: Sequence[tuple[int, int]] = (),
                  neurons: Sequence[tuple[int, int]] = (), head_fill: np.ndarray | None = None,
                  neuron_fill: np.ndarray | None = None) -> tuple[ModelConfig, dict[str, Any]]:
  """(config, host parameters) of the model with `heads` [(layer, head)] and `neurons` [(layer, index)] ablated in its
  weights: the unmasked edited model computes what the original computes under the keep-masks that ablate them.

  head_fill [L, H, Dh] / neuron_fill [L, F]: mean ablation's fill values (`Engine.ablation_means`); None: zero
  ablation. The config gains the biases the fill needs (`check_bias_holds`).
  """
  flat = {path: np.array(value) for path, value in checkpoints.flatten(params).items()}  # host copies, edited below
  c = config
  layer_shape = (c.num_layers,)
  if head_fill is not None and heads:
    check_bias_holds(c, "heads")
    if not c.qkv_bias:  # transformers' attention_bias brings q/k/v biases too: zeros leave them unchanged
      dtype = flat["layers/attn/q_kernel"].dtype
      flat["layers/attn/q_bias"] = np.zeros(layer_shape + (c.num_kv_heads, c.queries_per_kv, c.head_dim), dtype)
      flat["layers/attn/k_bias"] = np.zeros(layer_shape + (c.num_kv_heads, c.head_dim), dtype)
      flat["layers/attn/v_bias"] = np.zeros(layer_shape + (c.num_kv_heads, c.head_dim), dtype)
    c = dataclasses.replace(c, qkv_bias=True, o_bias=True)
  if neuron_fill is not None and neurons:
    check_bias_holds(c, "neurons")
    if not c.mlp_bias:  # Llama's mlp_bias brings gate/up biases too: zeros leave them unchanged
      dtype = flat["layers/mlp/down_kernel"].dtype
      for name in ("gate", "up"):
        flat[f"layers/mlp/{name}_bias"] = np.zeros(layer_shape + (c.intermediate_size,), dtype)
    c = dataclasses.replace(c, mlp_bias=True)
  o_kernel = flat["layers/attn/o_kernel"]  # [L, K, G, Dh, D]
  if c.o_bias:
    o_bias = flat.setdefault("layers/attn/o_bias", np.zeros(layer_shape + (c.hidden_size,), o_kernel.dtype))
  for layer, head in heads:
    kv_head, query = divmod(head, c.queries_per_kv)
    if head_fill is not None:
      # the fill goes through o_proj as the head's output did; float64 so the sum adds no rounding of its own
      image = np.asarray(head_fill[layer, head], np.float64) @ o_kernel[layer, kv_head, query].astype(np.float64)
      o_bias[layer] = (o_bias[layer].astype(np.float64) + image).astype(o_bias.dtype)
    o_kernel[layer, kv_head, query] = 0
  down_kernel = flat["layers/mlp/down_kernel"]  # [L, F, D]
  if c.mlp_bias:
    down_bias = flat.setdefault("layers/mlp/down_bias", np.zeros(layer_shape + (c.hidden_size,), down_kernel.dtype))
  for layer, index in neurons:
    if neuron_fill is not None:
      image = float(neuron_fill[layer, index]) * down_kernel[layer, index].astype(np.float64)
      down_bias[layer] = (down_bias[layer].astype(np.float64) + image).astype(down_bias.dtype)
    down_kernel[layer, index] = 0
  return c, checkpoints.nest(flat)


def write_hf_checkpoint(directory: str, config: ModelConfig, params, tokenizer=None,
                        metadata: dict[str, str] | None = None) -> list[str]:
  """Writes `params` as an HF checkpoint in `directory`: config.json (transformers' config class for the family),
  model.safetensors (one file, the parameters' dtype) and the tokenizer's files. Returns the files written."""
  from transformers import AutoConfig, GenerationConfig

  hf_config = AutoConfig.for_model(**config_to_hf(config))
  hf_config.architectures = [_causal_lm_class(config)]
  os.makedirs(directory, exist_ok=True)
  hf_config.save_pretrained(directory)
  GenerationConfig.from_model_config(hf_config).save_pretrained(directory)
  checkpoints.write_safetensors(os.path.join(directory, "model.safetensors"), checkpoints.hf_tensors(config, params),
                                {"format": "pt", **(metadata or {})})
  if tokenizer is not None:
    tokenizer.save_pretrained(directory)
  return sorted(os.listdir(directory))


def _causal_lm_class(config: ModelConfig) -> str:
  from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

  return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]


def read_metadata(directory: str) -> dict[str, str]:
  """The metadata `write_hf_checkpoint` stored in model.safetensors (what was ablated, from which model)."""
  with open(os.path.join(directory, "model.safetensors"), "rb") as f:
    header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
  return header.get("__metadata__", {})
