"""The walk over XLA's optimized HLO that counts a decode step's bytes (`jaxloc.bench.decode_cost`): under XLA's own
rules with every loop once it reproduces `compiled.cost_analysis()`; it multiplies loop bodies by their trip
counts, and counts a gather by the rows it reads."""

import jax
import jax.numpy as jnp
import pytest

from jaxloc.bench import decode_cost, memory
from jaxloc.models.config import ModelConfig


def _xla_bytes(compiled) -> float:
  cost = compiled.cost_analysis()
  return (cost[0] if isinstance(cost, (list, tuple)) else cost)["bytes accessed"]


def test_the_walk_reproduces_xla_and_multiplies_a_loop_body_by_its_trips():
  weights, x = jnp.zeros((8, 256, 256)), jnp.zeros((4, 256))

  def layers(w, h):
    return jax.lax.scan(lambda h, layer: (jnp.tanh(h @ layer), None), h, w)[0]

  compiled = jax.jit(layers).lower(weights, x).compile()
  text = compiled.as_text()
  once = decode_cost.HloBytes(text, trip_counts=False, touched=False)
  assert once.total() == pytest.approx(_xla_bytes(compiled), rel=1e-3)
  body = sum(size for size, _, path in once.items() if path)
  assert body >= 256 * 256 * 4  # the layer's weights, at least once
  assert decode_cost.HloBytes(text).total() == pytest.approx(once.total() + 7 * body, rel=1e-6)


def test_a_gather_counts_the_rows_it_reads_where_xla_counts_its_whole_operand():
  table, ids = jnp.zeros((10000, 64)), jnp.zeros((8,), jnp.int32)
  compiled = jax.jit(lambda t, i: jnp.take(t, i, axis=0) * 2).lower(table, ids).compile()
  text = compiled.as_text()
  assert decode_cost.HloBytes(text, touched=False).total() == pytest.approx(_xla_bytes(compiled), rel=1e-3)
  assert decode_cost.HloBytes(text).total() < 10 * 8 * 64 * 4  # the 8 rows, not the 2.5 MB table


def test_a_decode_step_reads_at_least_its_floor():
  config = ModelConfig("llama", 512, 64, 128, 2, 4, 2, 16, 1e-5, rope_theta=10000.0)
  cost = decode_cost.step_cost(config, jnp.float32, slots=2, rows=4, prefix=16, cache=48, new=32, top=3,
                               held_layers=True)
  assert cost["hlo_check"] == pytest.approx(cost["xla_cost_analysis"], rel=1e-2)
  floor = cost["floor"]
  assert floor["total"] == floor["weights"] + floor["prefix_kv"] + floor["cache"]
  assert floor["weights"] <= memory.param_bytes(config, jnp.float32)
  assert cost["step_bytes"] >= floor["total"] and cost["ratio"] >= 1.0
  assert sum(cost["by_kind"].values()) == cost["step_bytes"]
  assert len(cost["largest"]) == 3 and cost["largest"][0]["times"] in (1, config.num_layers)
  assert "x the floor" in decode_cost.describe(cost)
