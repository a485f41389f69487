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


def test_a_base_model_generates_from_plain_humaneval_prompts(tokenizer):
  """The generation workload prompts through the chat template when the tokenizer has one; a base model's tokenizer
  (Gemma 3 270M's GGUF has none) gets HumanEval's plain completion prompts: the function's signature and docstring."""
  import copy

  chat, chat_format = throughput.humaneval_prompts(tokenizer, 3)
  plain = copy.deepcopy(tokenizer)
  plain.chat_template = None
  base, base_format = throughput.humaneval_prompts(plain, 3)
  assert (chat_format, base_format) == ("chat template", "plain completion")
  assert len(base) == 3 and all(p.lstrip().startswith(("def ", "from ", "import ")) for p in base), base
  assert all(b in c for b, c in zip(base, chat))  # the same problems, each inside its chat rendering
