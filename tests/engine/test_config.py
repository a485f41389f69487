"""One EngineConfig: its fields are the engine flags, an engine resolves its defaults once, and a variant made with
`dataclasses.replace` keeps every other setting (budgets included)."""

import dataclasses

import jax.numpy as jnp
import pytest

from jaxloc.bench import memory
from jaxloc.engine import planner
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.errors import UserError
from jaxloc.models.presets import PRESETS


def test_an_engine_resolves_its_defaults_and_a_variant_keeps_them(tiny_model):
  engine = Engine(tiny_model)
  config = engine.config
  assert config.memory_budget_gb == planner.default_memory_budget() / planner.GIB
  assert config.residual_cache_gb == (planner.default_memory_budget() // 4) / planner.GIB
  assert config.tokens_per_batch == planner.default_tokens_per_batch()
  assert config.activation_dtype == "float32" and engine.dtype == jnp.float32
  assert engine.shared.planner.budget == planner.default_memory_budget()  # bytes survive the GiB round trip
  variant = Engine(tiny_model, dataclasses.replace(config, pack=False, generation_batch=3), mesh=engine.mesh)
  assert variant.config == dataclasses.replace(config, pack=False, generation_batch=3)
  layout = variant.shared.planner.generation_slots(masks=10, docs=100, prefix=64, suffix=16, new=8)
  assert layout.slots * layout.rows <= 3
  assert engine.model_config is tiny_model.config


def test_bad_settings_are_user_errors(tiny_model):
  for bad, message in ((EngineConfig(memory_budget_gb=1, residual_cache_gb=1), "residual cache"),
                       (EngineConfig(activation_dtype="int8"), "activation dtype 'int8'"),
                       (EngineConfig(tokens_per_batch=0), "tokens_per_batch"),
                       (EngineConfig(memory_budget_gb=0), "memory budget")):
    with pytest.raises(UserError, match=message):
      Engine(tiny_model, bad)


def test_the_engine_flags_are_the_config_fields():
  from absl import flags

  from jaxloc import cli

  FLAGS = flags.FLAGS
  ours = "memory_budget_gb" not in FLAGS  # a command module imported by another test may have defined them
  if ours:
    cli.define_model_flags()
  typed = {"memory_budget_gb": "2", "pack": "false", "activation_dtype": "bfloat16", "residual_cache_gb": "0"}
  try:
    for name, text in typed.items():  # each flag alone: other commands' required flags stay unchecked
      FLAGS[name].parse(text)
    assert cli.settings_from_flags(EngineConfig) == EngineConfig(memory_budget_gb=2.0, pack=False,
                                                                 activation_dtype="bfloat16", residual_cache_gb=0.0)
    assert all(FLAGS[f.name].default == f.default for f in dataclasses.fields(EngineConfig))
  finally:
    for name in typed:
      FLAGS[name].unparse()
    if ours:  # leave the global flags as they were
      for flag_class in (cli.ModelFlags, EngineConfig, cli.DistributedFlags):
        for field in dataclasses.fields(flag_class):
          delattr(FLAGS, field.name)


def test_the_planner_answers_every_batch_size_from_one_budget(tiny_model):
  """Generation slots and integrated-gradient requests shrink with the budget; generation rows fill a mask slot with
  its prompts first, then more mask slots, as powers of two, and a job of more than one call's work whose prefix is
  no wider than its prompts spreads a call's rows over more mask slots; data parallelism rounds mask slots up to a
  multiple of the data axis."""
  big = planner.Planner(tiny_model.config, budget=1 << 30, tokens_per_batch=2048, dtype_bytes=4)
  small = dataclasses.replace(big, budget=1 << 21)

  def rows(p, masks=1000, docs=1000, **kw):
    layout = p.generation_slots(masks=masks, docs=docs, prefix=64, suffix=32, new=32, **kw)
    return layout.slots, layout.rows

  assert rows(big) == (1, 64)  # the CPU cap, all in one mask slot
  assert rows(big, platform="gpu") == (1, 1024)
  assert rows(big, docs=5) == (8, 8)  # a power of two: few shapes whatever the count
  assert rows(big, masks=3, docs=5) == (4, 8)
  # More than one call's work under a prefix no wider than the prompts: the call's rows over 16 mask slots, each mask
  # then able to take up several (`generator.assign_masks`); one call's work, one mask, or slots split over devices
  # stay as they were.
  def spread(p, **kw):
    layout = p.generation_slots(prefix=32, suffix=64, new=32, **kw)
    return layout.slots, layout.rows

  assert spread(big, masks=6, docs=40) == (16, 4)
  assert spread(big, masks=6, docs=40, platform="gpu") == (8, 64)  # 8 x 64 prompts: one call's work on a GPU
  assert spread(big, masks=1, docs=400) == (1, 64)
  assert spread(big, masks=3, docs=5) == (4, 8)
  assert spread(dataclasses.replace(big, data_parallel=2), masks=6, docs=40) == (2, 64)  # every insert fills all
  # An insert: rows first as 2048 tokens hold at the job's widest prompts, narrower ones more rows, then more slots.
  assert big.insert_call(16, 4, 768) == (1, 2)
  assert big.insert_call(16, 4, 768, 96) == (4, 4)
  assert big.insert_call(1, 64, 128) == (1, 16)
  assert dataclasses.replace(big, data_parallel=2).insert_call(16, 4, 64) == (16, 2)
  small_slots, small_rows = rows(small)
  assert small_slots * small_rows < 64
  assert small.generation_bytes(small_slots, small_rows, 64, 32, 32, 1, held_layers=False) <= small.budget
  assert rows(dataclasses.replace(big, data_parallel=4), masks=3, docs=5) == (4, 8)
  assert rows(dataclasses.replace(big, data_parallel=4), masks=1, docs=5) == (4, 8)
  assert rows(dataclasses.replace(big, data_parallel=3), masks=2, docs=5)[0] == 3
  with pytest.raises(UserError, match="one generation row"):
    dataclasses.replace(big, budget=1 << 10).generation_slots(masks=1, docs=1, prefix=64, suffix=32, new=32)
  # A job holds its layers laid out for decoding where that costs it no rows; else each decode call lays them out.
  assert big.generation_slots(masks=1000, docs=1000, prefix=64, suffix=32, new=32).held_layers
  unheld = big.generation_bytes(1, 64, 64, 32, 32, 1, held_layers=False)
  assert unheld < big.generation_bytes(1, 64, 64, 32, 32, 1, held_layers=True)
  # At the budget of the job with each decode call laying its layers out, holding them fits beside smaller inserts:
  # the same slots and rows, a prefill room, each insert within it.
  tight = dataclasses.replace(big, budget=unheld).generation_slots(masks=1000, docs=1000, prefix=64, suffix=32, new=32)
  assert (tight.slots, tight.rows, tight.held_layers) == (1, 64, True)
  assert tight.prefill_room is not None and tight.estimated_bytes <= unheld
  assert big.insert_call(1, 64, 32, prefix=64, room=tight.prefill_room) == (1, 32)
  assert big.insert_call(1, 64, 32, prefix=64) == (1, 64)
  assert big.insert_bytes(1, 32, 32, 64) <= tight.prefill_room < big.insert_bytes(1, 64, 32, 64)
  rows = dict(suffix=64, context=16, targets=2, steps=20, num_requests=1000)
  assert 1 <= small.attribution_rows(**rows) < big.attribution_rows(**rows) <= 1000
  assert big.attribution_rows(**{**rows, "num_requests": 7}) == 7
  assert dataclasses.replace(big, residual_cache=1 << 29).call_budget == 1 << 29


def test_a_wide_prefix_spreads_rows_over_mask_slots_where_the_decode_then_reads_less():
  """GSM8K's shape (400 masks x 100 prompts sharing a 5-shot prefix six times as wide as a prompt) on Llama-3.1-8B
  with 128 rows: one slot of 128 rows leaves 28 empty for every mask; 16 slots of 8 take a mask's prompts in 13
  passes, 19% fewer steps, each reading 15 more copies of the prefix's keys/values (`Planner.decode_reads`): fewer
  bytes at 768 prefix tokens, more at 8192, where the rows stay in one slot."""
  llama = planner.Planner(PRESETS["llama-3.1-8b"], budget=200 << 30, tokens_per_batch=65536, dtype_bytes=2,
                          generation_batch=128)

  def gsm8k(prefix):
    layout = llama.generation_slots(masks=400, docs=100, prefix=prefix, suffix=128, new=256, platform="gpu")
    return layout.slots, layout.rows

  assert gsm8k(768) == (16, 8)
  assert gsm8k(8192) == (1, 128)
  # At an 80 GB H100's default budget the job holds its layers (a decode call then copies none of its 15 GB), its
  # inserts and mask loads cut to the 3.8 GiB the held layers leave: 4 slots of 8 rows where 16 would hold 8.1 GiB.
  budget = memory.gpu80_budget(llama.model)
  h100 = dataclasses.replace(llama, budget=budget, generation_batch=None)
  layout = h100.generation_slots(masks=400, docs=100, prefix=768, suffix=128, new=256, stop_states=16,
                                 platform="gpu")
  assert (layout.slots, layout.rows, layout.held_layers) == (16, 8, True)
  assert layout.estimated_bytes <= budget and layout.prefill_room is not None
  assert h100.insert_call(16, 8, 128, prefix=768) == (16, 8)
  assert h100.insert_call(16, 8, 128, prefix=768, room=layout.prefill_room) == (4, 8)
  assert h100.load_masks(16, 768, layout.prefill_room) == 8 < h100.load_masks(16, 768)
  one, spread = (llama.generation_layout(s, r, 768, 128, 256, 1, held_layers=False) for s, r in ((1, 128), (16, 8)))
  reads_one, reads_spread = (llama.decode_reads(x, 400, 100, 768, 128, 256) for x in (one, spread))
  assert reads_spread < 0.9 * reads_one
  # A step of one slot reads the weights once, its prefix and 128 rows' caches, in every one of 400 x 256 steps.
  c, kv = llama.model, 32 * 2 * 8 * 128 * 2
  assert reads_one == 400 * 256 * (32 * planner.layer_weight_bytes(c, 2) + c.vocab_size * c.hidden_size * 2
                                   + (768 + 128 * 384) * kv)
