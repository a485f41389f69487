"""examples.json: a few held-out documents per task as the model answers them, unablated and with the top-k ablated,
on a tiny random model: the outputs are the engine's own greedy continuations under each mask."""

import numpy as np
import pytest

from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.requests import GenerationRequest
from jaxloc.localize import examples
from jaxloc.localize.validate import TaskMeasures
from jaxloc.tasks.evaluator import Evaluator, load_task


@pytest.mark.heavy  # compiles generation for two tasks: ~10 s on a quiet 2-core machine
def test_examples_hold_each_tasks_first_documents_under_both_masks(tiny_model, tmp_path):
  engine = Engine(tiny_model, EngineConfig(tokens_per_batch=256))
  evaluators = []
  for name in ("counting", "plurals"):
    task, docs = load_task(name, num_samples=5, seed=0, data_dir=None)
    evaluators.append(Evaluator.build(engine, name, task, docs).on(docs))
  scorer = TaskMeasures(evaluators, ["accuracy", "accuracy"])
  top = [3, 10, 17]  # flat head indices (names from the scorer)
  record = examples.collect(scorer, top)
  assert record["k"] == 3 and record["heads"] == [scorer.name(h) for h in top]
  assert list(record["tasks"]) == ["counting", "plurals"]
  first = evaluators[0]
  shown = record["tasks"]["counting"]["examples"]
  assert len(shown) == examples.PER_TASK
  assert [e["target"] for e in shown] == [d["target"] for d in first.docs[:examples.PER_TASK]]
  assert [e["prompt"] for e in shown] == [d["prompt"][-examples.PROMPT_CHARACTERS:] for d in first.docs[:3]]
  # The outputs are the engine's greedy continuations: unablated, then with the top units ablated.
  keep = np.ones((2, scorer.num_layers, scorer.units_per_layer), np.float32)
  keep[1].reshape(-1)[top] = 0
  asks = [GenerationRequest(d["prompt"], stop=("\n",), max_new_tokens=examples.MAX_NEW_TOKENS)
          for d in first.docs[:3]]
  texts = engine.generate(asks, head_masks=keep)
  assert [e["unablated"] for e in shown] == texts[0] and [e["ablated"] for e in shown] == texts[1]
  assert all(e["unablated_score"] in (0.0, 1.0) for e in shown)
  examples.write(str(tmp_path), scorer, top)
  assert (tmp_path / examples.FILE).is_file()
