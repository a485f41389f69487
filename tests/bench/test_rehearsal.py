"""The rehearsal's paper-scale calls compiled without weights (`rehearsal.abstract_calls`), on a tiny Llama: the
scoring call and the generation job as the new generator lays it out, each estimate never under XLA's bytes."""

import jax.numpy as jnp
import pytest

from jaxloc.bench import rehearsal


@pytest.mark.heavy  # compiles the scoring call and the generation job's calls (~15 s)
def test_the_abstract_calls_compile_the_generators_calls_and_the_estimates_cover_xla():
  config = rehearsal.tiny_config(vocab_size=512, eos_token_id=0)
  result = rehearsal.abstract_calls("tiny", config, jnp.bfloat16, jnp.float32)
  generation = result["generation"]
  assert (generation["prefix"], generation["suffix"], generation["new_tokens"]) == (768, 128, 256)
  assert generation["mask_slots"] >= 1 and generation["rows"] == 128  # the GPU row cap, then a mask's documents
  assert generation["estimate_over_xla"] >= 1.0 and result["scoring"]["estimate_over_xla"] >= 1.0
  assert set(generation["xla_calls_gib"]) == {"prefix", "load", "insert", "decode"}
  assert 0 < generation["state_gib"] < generation["xla_peak_gib"]
  assert generation["decode_call"]["alias_bytes"] > 0  # the state is donated
  assert generation["decode_step_over_floor"] >= 1.0
