"""Compile discipline: a whole localization (identification, general tasks, validation, single-head checks) compiles
a handful of shapes whatever its task mix, and a rerun reads every one of them back from the persistent compilation
cache instead of compiling it."""

import os

import numpy as np
import pytest

from jaxloc.engine import compilation
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.requests import ScoringRequest
from jaxloc.localize.localization import localize
from jaxloc.localize.settings import LocalizeSettings
from tests.tiny import make_tiny

# Three general tasks of different lengths beside the target: counting (long rows, no shared prefix), plurals (a short
# shared prefix), induction (no prefix), arithmetic_1d_4shot (a 4-shot prefix). Each task's identification documents
# get a shape of their own; its held-out documents, scored in a few calls, pad into one of those (`Layouts.prepare`
# few_calls). Each shape costs a scoring kernel and its unablated streams, one more with a shared prefix: four shapes
# here make 10 (11 when held-out documents were laid out in shapes of their own).
GENERAL = ["plurals", "induction", "arithmetic_1d_4shot"]
CAPITALS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "scale", "capitals.jsonl")
MAX_COMPILATIONS = 10


def run(tokenizer, directory, cache):
  engine = Engine(make_tiny(tokenizer), EngineConfig(compilation_cache=cache))
  settings = LocalizeSettings.make(model="tiny", task="counting", output_dir=str(directory), method="one_shot_greedy",
                                   num_samples=12, general_tasks=GENERAL, general_samples=12, validation_samples=12,
                                   metric="logprob", top_k=3, curve_k=4, universal_candidates=4, bootstrap=10)
  return localize(engine, settings, progress=False)["engine"], engine


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_a_run_with_three_general_tasks_compiles_few_shapes_and_a_rerun_none(tokenizer, tmp_path):
  first, engine = run(tokenizer, tmp_path / "first", str(tmp_path / "cache"))
  assert 0 < first["compilations"] <= MAX_COMPILATIONS, first
  assert first["compile_cache_hits"] == 0 and first["compile_seconds"] > first["xla_compile_seconds"] > 0
  assert len(engine.shared.layouts.shapes) <= 4  # eight request sets (four tasks, their held-out documents)
  second, _ = run(tokenizer, tmp_path / "second", str(tmp_path / "cache"))
  assert second["compilations"] == first["compilations"]
  assert second["compile_cache_hits"] == second["compilations"]  # every executable read back, none compiled


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_one_shot_greedy_on_a_custom_task_compiles_one_shape_per_task(tokenizer, tmp_path):
  """BUILD.md's greedy row: a custom JSONL task (37 documents, 20 held out) and three general tasks (40, 20 held
  out). Held-out documents pad into the identification shapes: four shapes, eight compiles (17 before)."""
  engine = Engine(make_tiny(tokenizer), EngineConfig(compilation_cache="none"))
  settings = LocalizeSettings.make(model="tiny", task=CAPITALS, output_dir=str(tmp_path), method="one_shot_greedy",
                                   num_samples=37, general_tasks=["counting", "induction", "arithmetic_1d_4shot"],
                                   general_samples=40, validation_samples=20, metric="logprob", top_k=5)
  facts = localize(engine, settings, progress=False)["engine"]
  assert len(engine.shared.layouts.shapes) == 4 and facts["compilations"] <= 8, (facts, engine.shared.layouts.shapes)


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_compile_time_is_charged_to_the_engine_that_compiled(tiny_model, tmp_path):
  requests = [ScoringRequest("The capital of France is", " Paris"), ScoringRequest("One two three", " four")]
  masks = np.ones((2, tiny_model.config.num_layers, tiny_model.config.num_heads), np.float32)
  first = Engine(tiny_model, EngineConfig(compilation_cache="none"))
  second = Engine(tiny_model, EngineConfig(compilation_cache="none"))
  first.score(requests, masks)
  assert first.compile_time.seconds > 0 and second.compile_time.seconds == 0
  seconds = first.compile_time.seconds
  first.score(requests, masks)  # compiled already: nothing more
  assert first.compile_time.seconds == seconds
  second.score(requests, masks)
  assert second.compile_time.seconds > 0 and second.compile_time.cache_hits == 0


def test_the_cache_folder_is_per_backend_and_processor(tmp_path):
  folder = compilation.cache_directory(str(tmp_path))
  assert folder.startswith(str(tmp_path)) and folder == compilation.cache_directory(str(tmp_path))
  assert compilation.use_persistent_cache("none") == "none"
