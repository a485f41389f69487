"""Attention over each request's own cache, in blocks of positions (`layers.Context` per request and block: keys
[M, R, K, Dh, C], values [M, R, K, C, Dh], the products `layers._per_request`): the same outputs as attending over
the whole sequence at once, for several queries, KV heads and query groups; and a bfloat16 step stays bfloat16."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.models.config import ModelConfig
from jaxloc.models.layers import Attention, Context, rotary_tables

CONFIG = ModelConfig("llama", 64, 24, 40, 2, 6, 2, 8, 1e-6, rope_theta=1e4)  # K 2, G 3, Dh 8


def _attention(params, x, positions, cache=()):
  cos, sin = (table[0] for table in rotary_tables(CONFIG, positions))
  return Attention(CONFIG).apply({"params": params}, x, cos, sin, None, None, None, None, positions, cache=cache)


def test_the_last_queries_over_a_cache_equal_the_whole_sequence():
  rng = np.random.default_rng(0)
  earlier, later = 5, 3
  x = jnp.asarray(rng.standard_normal((2, 3, earlier + later, CONFIG.hidden_size)), jnp.float32)  # [M, R, S, D]
  positions = jnp.arange(earlier + later)[None, None]
  params = Attention(CONFIG).init(jax.random.PRNGKey(1), x, *(t[0] for t in rotary_tables(CONFIG, positions)), None,
                                  None, None, None, positions)["params"]
  whole = _attention(params, x, positions)
  first = _attention(params, x[:, :, :earlier], positions[..., :earlier])
  k, v = first[2], first[3]  # [M, R, C, K, Dh]
  k, v, valid = jnp.moveaxis(k, 2, 4), jnp.swapaxes(v, 2, 3), jnp.ones((2, 3, earlier), bool)
  blocks = tuple(Context(k[..., a:b], v[..., a:b, :], valid[..., a:b], positions[..., a:b])
                 for a, b in ((0, 2), (2, earlier)))  # two blocks, read one after the other
  last = _attention(params, x[:, :, earlier:], positions[..., earlier:], blocks)
  np.testing.assert_allclose(last[0], whole[0][:, :, earlier:], rtol=1e-5, atol=1e-5)  # y
  np.testing.assert_allclose(last[1], whole[1][:, :, earlier:], rtol=1e-5, atol=1e-5)  # head outputs
  # The probabilities over the cache, then these tokens: the whole sequence's rows of the later queries.
  np.testing.assert_allclose(last[4], whole[4][..., earlier:, :], rtol=1e-5, atol=1e-6)


def test_a_bfloat16_step_over_a_cache_stays_bfloat16():
  """The scores are float32 (then the softmax); the probabilities-times-values product and everything after it are
  in the activation dtype, as the new keys and values a decode step writes into its bfloat16 caches."""
  x = jnp.ones((1, 2, 1, CONFIG.hidden_size), jnp.bfloat16)
  positions = jnp.full((1, 1, 1), 4)
  cos, sin = (table[0] for table in rotary_tables(CONFIG, positions))
  params = Attention(CONFIG).init(jax.random.PRNGKey(0), x, cos, sin, None, None, None, None, positions)["params"]
  params = jax.tree.map(lambda a: a.astype(jnp.bfloat16), params)
  k = jnp.ones((1, 2, CONFIG.num_kv_heads, CONFIG.head_dim, 4), jnp.bfloat16)
  v = jnp.ones((1, 2, CONFIG.num_kv_heads, 4, CONFIG.head_dim), jnp.bfloat16)
  cache = Context(k, v, jnp.ones((1, 2, 4), bool), jnp.arange(4)[None, None])
  y, heads, new_k, new_v, _ = _attention(params, x, positions, (cache,))
  assert {a.dtype for a in (y, heads, new_k, new_v)} == {jnp.dtype(jnp.bfloat16)}
