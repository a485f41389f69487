"""The throughput benchmark's engines are the given engine with one setting changed, nothing dropped."""

import dataclasses

from jaxloc.bench import throughput
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine


def test_compared_engines_differ_from_the_flags_engine_only_where_named(tiny_model):
  engine = Engine(tiny_model, EngineConfig(memory_budget_gb=0.5, tokens_per_batch=300, activation_dtype="float32",
                                           share_prefix=False))
  previous = throughput.previous_engine(engine, generation_batch=8)
  assert previous.config == dataclasses.replace(engine.config, pack=False, residual_cache_gb=0, generation_batch=8)
  unshared = throughput.variant(engine, share_prefix=True)
  assert unshared.config == dataclasses.replace(engine.config, share_prefix=True)
  assert previous.mesh is engine.mesh and previous.model is engine.model
