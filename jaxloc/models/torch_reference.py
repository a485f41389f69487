"""PyTorch references for parity tests and baselines. Imports torch lazily: jaxloc never needs it to run.

Head ablation here is the paper's: a forward pre-hook on each layer's `o_proj` zeroes (or replaces)
the slice of its input that belongs to one query head. Neuron ablation is CNL's: the neuron's column
of its layer's `down_proj` weight is zeroed.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterable, Sequence

import numpy as np

from jaxloc.models import loading


def load_hf_model(spec: str, dtype: str = "float32"):
  """The `transformers` PyTorch model for a jaxloc model spec (alias, .gguf, HF directory)."""
  import torch
  from transformers import AutoModelForCausalLM

  kind, path = loading.resolve(spec)
  torch_dtype = getattr(torch, dtype)
  if kind == "gguf":
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch_dtype, trust_remote_code=False)
  else:  # a checkpoint's own code (auto_map) is never run, nor asked about
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, trust_remote_code=False)
  return model.eval()


@contextlib.contextmanager
def ablated_heads(model, heads: Iterable[tuple[int, int]], fill: Sequence | None = None):
  """Within the block, each (layer, head) has its slice of the `o_proj` input zeroed.

  fill: optional [layers][heads] -> head_dim vectors used instead of zeros (mean ablation), or [B, S, head_dim]
    values per position (activation patching, `patched_heads_loop`).
  """
  import torch

  config = model.config
  head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
  by_layer: dict[int, list[int]] = {}
  for layer, head in heads:
    by_layer.setdefault(int(layer), []).append(int(head))
  handles = []

  def make_hook(layer: int, layer_heads: list[int]):
    def hook(module, args):
      (x,) = args
      x = x.clone()
      for head in layer_heads:
        sl = slice(head * head_dim, (head + 1) * head_dim)
        x[..., sl] = 0 if fill is None else torch.as_tensor(fill[layer][head], dtype=x.dtype)
      return (x,)
    return hook

  for layer, layer_heads in by_layer.items():
    o_proj = model.model.layers[layer].self_attn.o_proj
    handles.append(o_proj.register_forward_pre_hook(make_hook(layer, layer_heads)))
  try:
    yield model
  finally:
    for handle in handles:
      handle.remove()


@contextlib.contextmanager
def zeroed_down_proj_columns(model, neurons: Iterable[tuple[int, int]]):
  """Within the block, each (layer, index) has column `index` of that layer's `down_proj` weight zeroed (restored
  after)."""
  import torch

  saved = []
  with torch.no_grad():
    for layer, index in neurons:
      weight = model.model.layers[int(layer)].mlp.down_proj.weight  # [hidden, intermediate]
      saved.append((weight, int(index), weight[:, int(index)].clone()))
      weight[:, int(index)] = 0
  try:
    yield model
  finally:
    with torch.no_grad():
      for weight, index, column in reversed(saved):
        weight[:, index] = column


def o_proj_inputs(model, input_ids) -> list:
  """Each layer's `o_proj` input [B, S, H * Dh] (every head's output, head h at h * Dh) for token ids [B, S]."""
  import torch

  captured: list = [None] * len(model.model.layers)
  handles = []
  for layer, block in enumerate(model.model.layers):
    def hook(module, args, layer=layer):
      captured[layer] = args[0].detach().clone()
    handles.append(block.self_attn.o_proj.register_forward_pre_hook(hook))
  try:
    with torch.no_grad():
      model(input_ids)
  finally:
    for handle in handles:
      handle.remove()
  return captured


def patched_heads_loop(model, clean_ids, corrupted_ids, heads: Sequence[tuple[int, int]]):
  """Activation patching as PyTorch hook libraries run it: one forward of the corrupted token ids [B, S] per head,
  that head's `o_proj` input slice replaced at every position by its value in the clean run. Returns the last
  position's logits [heads, B, V] (float32 numpy)."""
  import torch

  config = model.config
  head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
  clean = o_proj_inputs(model, clean_ids)
  out = []
  with torch.no_grad():
    for layer, head in heads:
      sl = slice(head * head_dim, (head + 1) * head_dim)
      fill = {layer: {head: clean[layer][..., sl]}}
      with ablated_heads(model, [(layer, head)], fill=fill):
        out.append(model(corrupted_ids).logits[:, -1].float().numpy())
  return np.stack(out)
