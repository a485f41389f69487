"""The output-major kernel layout a decode step reads where the CPU has no AVX-512 (`layers.out_major`,
`layers.project`, `decoder.kernels_output_major`): every kernel of a layer, and only the kernels, has its input axes
moved last, and attention and the MLP compute the same outputs from either layout; elsewhere the layers stay as
stored. Weights and inputs are small integers, so that every product of them is exact in float32 whatever the order of
summation: the two layouts must agree bit for bit (attention's output projection, of fractional head outputs, to
float32 rounding, as the MLP's down projection of fractional neurons)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.models import decoder
from jaxloc.models.config import ModelConfig
from jaxloc.models.decoder import Transformer, layer_params
from jaxloc.models.layers import KERNEL_INPUTS, MLP, Attention, out_major, rotary_tables

BASE = ModelConfig("llama", 64, 24, 40, 2, 6, 2, 8, 1e-6, rope_theta=1e4)
FAMILIES = {
    "llama": {},
    "qwen2 (q/k/v biases)": dict(qkv_bias=True),
    "biases everywhere": dict(qkv_bias=True, o_bias=True, mlp_bias=True),
    "per-head q/k norms": dict(qk_norm="head"),
    "projection q/k norms": dict(qk_norm="projection"),
}


def _integer_params(module, *args, seed=0):
  """The module's parameters (their shapes, without running its init) filled with integers in [-2, 2]."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), *args)["params"]
  return jax.tree.map(lambda a: jnp.asarray(rng.integers(-2, 3, a.shape), a.dtype), shapes)


def _apply(module, params, *args):
  return jax.jit(lambda p, *a: module.apply({"params": p}, *a))(params, *args)


@pytest.mark.parametrize("family", FAMILIES)
def test_out_major_moves_each_kernels_inputs_last(family, monkeypatch):
  monkeypatch.setattr(decoder, "kernels_output_major", lambda: True)
  config = dataclasses.replace(BASE, **FAMILIES[family])
  stacked = _integer_params(Transformer(config), jnp.zeros((1, 1, 3), jnp.int32), jnp.arange(3)[None, None])["layers"]
  first = jax.tree.map(lambda a: a[0], stacked)
  laid_out = layer_params(stacked, config.num_layers)[0]
  moved = []
  for (path, before), after in zip(jax.tree_util.tree_leaves_with_path(first), jax.tree.leaves(laid_out)):
    name = path[-1].key
    if name in KERNEL_INPUTS:
      held = KERNEL_INPUTS[name]
      axes = tuple(range(held, before.ndim)) + tuple(range(held))
      np.testing.assert_array_equal(after, np.transpose(before, axes))
      moved.append(name)
    else:
      np.testing.assert_array_equal(after, before)
  assert sorted(moved) == sorted(KERNEL_INPUTS)
  # Written out for BASE (D 24, F 40, K 2, G 3, Dh 8), not derived from KERNEL_INPUTS: outputs first.
  expected = {"q_kernel": (2, 3, 8, 24), "k_kernel": (2, 8, 24), "v_kernel": (2, 8, 24), "o_kernel": (24, 2, 3, 8),
              "gate_kernel": (40, 24), "up_kernel": (40, 24), "down_kernel": (24, 40)}
  shapes = {path[-1].key: a.shape for path, a in jax.tree_util.tree_leaves_with_path(laid_out)}
  assert {name: shapes[name] for name in expected} == expected


def test_layers_stay_as_stored_where_the_decode_step_reads_them_so(monkeypatch):
  """On a CPU with AVX-512 (`decoder.kernels_output_major` False) the decode step's layers are the stacked ones,
  sliced: each layer's every parameter as the checkpoint's."""
  monkeypatch.setattr(decoder, "kernels_output_major", lambda: False)
  stacked = _integer_params(Transformer(BASE), jnp.zeros((1, 1, 3), jnp.int32), jnp.arange(3)[None, None])["layers"]
  laid_out = layer_params(stacked, BASE.num_layers)
  assert len(laid_out) == BASE.num_layers
  for index, layer in enumerate(laid_out):
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b[index]), layer, stacked)  # noqa: B023


@pytest.mark.parametrize("family", FAMILIES)
def test_attention_and_mlp_agree_in_both_layouts(family):
  config = dataclasses.replace(BASE, **FAMILIES[family])
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.integers(-2, 3, (2, 3, 5, config.hidden_size)), jnp.float32)  # [M, R, S, D]
  cos, sin = (table[0] for table in rotary_tables(config, jnp.arange(5)[None, None]))  # the one rope of the layers
  mask = jnp.asarray(rng.integers(0, 2, (2, config.num_kv_heads, config.queries_per_kv)), jnp.float32)
  attention_args = (x, cos, sin, mask, None, None, None)
  stored = _integer_params(Attention(config), *attention_args, seed=2)
  expected = _apply(Attention(config), stored, *attention_args)
  got = _apply(Attention(config, out_major=True), out_major(stored), *attention_args)
  # Head outputs, keys, values and probabilities follow exact projections; y projects the head outputs, which the
  # softmax made fractional, so there only the order of summation may differ.
  np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, atol=1e-4)
  for a, b in zip(expected[1:], got[1:]):
    np.testing.assert_array_equal(a, b)

  neuron_mask = jnp.asarray(rng.integers(0, 2, (2, config.intermediate_size)), jnp.float32)
  stored = _integer_params(MLP(config), x, neuron_mask, seed=3)
  expected = _apply(MLP(config), stored, x, neuron_mask)
  got = _apply(MLP(config, out_major=True), out_major(stored), x, neuron_mask)
  np.testing.assert_allclose(got[0], expected[0], rtol=1e-6, atol=1e-4)  # down projects fractional neurons
  for a, b in zip(expected[1:], got[1:]):
    np.testing.assert_array_equal(a, b)


def test_a_kernel_in_the_stored_layout_is_refused_where_out_major_is_declared():
  """flax checks each parameter's shape against the module's declaration: a layer given the checkpoints' layout
  where it expects output-major fails loudly instead of computing with transposed weights."""
  config = BASE
  x = jnp.ones((1, 1, 2, config.hidden_size))
  stored = _integer_params(MLP(config), x)
  with pytest.raises(Exception, match="shape"):
    _apply(MLP(config, out_major=True), stored, x)
