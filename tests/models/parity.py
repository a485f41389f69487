"""Helpers shared by the real-model parity tests: jaxloc's and transformers' logits for one prompt."""

import jax.numpy as jnp
import numpy as np

from jaxloc.models.decoder import Ablation, lm_logits


def logits(model, ids, head_mask=None, neuron_mask=None) -> np.ndarray:
  """jaxloc's logits [tokens, vocab] for one token sequence, under optional keep-masks [1, L, H] / [1, L, F]."""
  tokens = jnp.asarray(ids)[None, None]
  ablation = Ablation(head_mask=head_mask, neuron_mask=neuron_mask)
  out = model.module.apply({"params": model.params}, tokens, jnp.arange(len(ids))[None, None], ablation=ablation)
  return np.asarray(lm_logits(model.config, model.params, out.hidden))[0, 0]


def torch_logits(torch_model, ids, heads=(), neurons=()) -> np.ndarray:
  """transformers' logits for the same sequence, with `heads` ablated by the o_proj pre-hook and `neurons` by
  zeroed down_proj columns."""
  import torch

  from jaxloc.models.torch_reference import ablated_heads, zeroed_down_proj_columns

  with torch.no_grad(), ablated_heads(torch_model, heads), zeroed_down_proj_columns(torch_model, neurons):
    return torch_model(torch.tensor([ids])).logits[0].numpy()


def keep_mask(config, heads) -> jnp.ndarray:
  mask = np.ones((1, config.num_layers, config.num_heads), np.float32)
  for layer, head in heads:
    mask[0, layer, head] = 0
  return jnp.asarray(mask)


def neuron_keep_mask(config, neurons) -> jnp.ndarray:
  mask = np.ones((1, config.num_layers, config.intermediate_size), np.float32)
  for layer, index in neurons:
    mask[0, layer, index] = 0
  return jnp.asarray(mask)


def check_neuron_mask_parity(model, torch_model, ids, neurons, tolerance=1e-3) -> float:
  """Ablating `neurons` matches zeroed down_proj columns to `tolerance`, changes the logits, and an all-ones
  neuron mask changes no bit. Returns the largest difference from transformers."""
  ours = logits(model, ids, neuron_mask=neuron_keep_mask(model.config, neurons))
  difference = float(np.abs(ours - torch_logits(torch_model, ids, neurons=neurons)).max())
  assert difference < tolerance
  unmasked = logits(model, ids)
  assert np.abs(ours - unmasked).max() > 1e-3
  assert np.array_equal(unmasked, logits(model, ids, neuron_mask=neuron_keep_mask(model.config, [])))
  return difference


def check_head_mask_parity(model, torch_model, ids, heads) -> None:
  """Ablating `heads` matches the o_proj pre-hook to 1e-3, changes the logits, and an all-ones mask changes no bit."""
  ours = logits(model, ids, head_mask=keep_mask(model.config, heads))
  assert np.abs(ours - torch_logits(torch_model, ids, heads)).max() < 1e-3
  unmasked = logits(model, ids)
  assert np.abs(ours - unmasked).max() > 1e-2
  assert np.array_equal(unmasked, logits(model, ids, head_mask=keep_mask(model.config, [])))
