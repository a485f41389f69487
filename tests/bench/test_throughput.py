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


def test_a_tokenizer_without_a_chat_template_is_refused_before_any_workload_runs(tokenizer):
  """The generation workload prompts through a chat template: a base model's tokenizer (Gemma 3 270M's GGUF has none)
  is refused first, not after minutes of scoring workloads (which would need a real engine: this one has none)."""
  import copy
  import types

  import pytest

  from jaxloc.errors import UserError

  plain = copy.deepcopy(tokenizer)
  plain.chat_template = None
  engine = types.SimpleNamespace(model_config=None, tokenizer=plain)
  with pytest.raises(UserError, match="chat template"):
    throughput.run_workloads(engine, throughput.ThroughputConfig(), None, 1.0)
