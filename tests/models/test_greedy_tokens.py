"""`decoder.greedy_tokens`, greedy decoding's next tokens, against the argmax of `lm_logits`: tied embeddings (the
vocabulary-major layout and its argmax from maxima), an untied LM head, a final soft cap, ties (the first of equal
maxima wins, as `jnp.argmax`), and NaNs and infinities in the logits. Weights and hidden states are small integers,
so that every logit is exact in float32 whatever the matmul's order of summation, and equal logits are equal."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.models.decoder import _argmax_rows, greedy_tokens, lm_logits
from jaxloc.models.presets import PRESETS

DIM = 16


def _case(vocab: int, tied: bool, softcap: float | None, seed: int = 0):
  config = dataclasses.replace(PRESETS["smollm2-135m"], vocab_size=vocab, hidden_size=DIM, tie_word_embeddings=tied,
                               final_softcap=softcap)
  rng = np.random.default_rng(seed)
  table = rng.integers(-2, 3, (vocab, DIM)).astype(np.float32)
  # Ties across blocks of the vocabulary: rows repeated far apart (the first of each pair must win). Two of them are
  # made the largest a row can score: +-3 where every other row holds at most 2 in magnitude.
  signs = rng.choice([-1.0, 1.0], (2, DIM))
  table[5], table[vocab // 3] = 3 * signs[0], 3 * signs[1]
  for source, copy in ((5, vocab - 1), (vocab // 3, vocab // 2), (vocab - 7, 3)):
    table[copy] = table[source]
  params = {"embed": {"embedding": jnp.asarray(table)}}
  if not tied:
    params["lm_head"] = jnp.asarray(table.T)
  boosted = rng.integers(-2, 3, (2, 3, DIM)).astype(np.float32)
  boosted[0, 0], boosted[1, 2] = signs[0], signs[1]  # these two rows' maximum is a planted tie
  return config, params, jnp.asarray(boosted)


@pytest.mark.parametrize("vocab", [6144, 4099, 1000])  # blocks of 2,048; a prime vocabulary (blocks of 1); 8
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_greedy_tokens_are_the_argmax_of_the_logits(vocab, tied, softcap):
  config, params, hidden = _case(vocab, tied, softcap)
  expected = np.asarray(jnp.argmax(lm_logits(config, params, hidden), axis=-1))
  got = greedy_tokens(config, params, hidden)
  assert got.shape == hidden.shape[:-1] and got.dtype == jnp.int32
  np.testing.assert_array_equal(np.asarray(got), expected)


def test_equal_maxima_give_the_first_token():
  config, params, hidden = _case(6144, True, None)
  logits = np.asarray(lm_logits(config, params, hidden))
  got = np.asarray(greedy_tokens(config, params, hidden))
  # The planted rows: token 5 (repeated at 6143) and token 2048 (repeated at 3072) hold their row's maximum twice.
  assert logits[0, 0, 5] == logits[0, 0, 6143] == logits[0, 0].max()
  assert logits[1, 2, 2048] == logits[1, 2, 3072] == logits[1, 2].max()
  assert got[0, 0] == 5 and got[1, 2] == 2048


def test_the_argmax_from_maxima_is_jnp_argmax_with_nans_and_infinities():
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((6144, 8)).astype(np.float32)
  logits[[40, 5000], 0] = np.nan  # the first NaN wins, as in jnp.argmax (XLA's vectorized maxima skip NaNs)
  logits[[4000, 6000], 1] = np.inf
  logits[:, 2] = -np.inf
  logits[:, 3] = 1.0  # all equal: the first
  logits[[100, 3000], 4] = [np.inf, -np.inf]  # a sum of NaN without a NaN: jnp.argmax's path too
  logits[[2047, 2048], 5] = 9.0  # a tie across a block boundary
  logits[6143, 6] = np.nan
  got = np.asarray(_argmax_rows(jnp.asarray(logits)))
  np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(logits), axis=0)))
  assert list(got[:7]) == [40, 4000, 0, 0, 100, 2047, 6143]
