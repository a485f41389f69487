"""A scale rehearsal: the real localization pipeline on a random model shaped like a real checkpoint, measured.

The point is not the heads it finds (random weights carry no capability) but what running at that shape costs: wall
time, peak host memory, what was compiled and how long that took, and the planner's choices (masks per call, rows,
chunks, widths) for every request set of the run. `random_model` builds such a model with any tokenizer, so that a
machine without the embedded SmolLM2 package (an accelerator image) can run it from a saved tokenizer folder.
"""

from __future__ import annotations

import dataclasses
import resource
import tempfile
import time
from typing import Any

import jax.numpy as jnp

from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.models import presets
from jaxloc.models.config import ModelConfig
from jaxloc.models.llama import Transformer
from jaxloc.models.loading import LoadedModel

# A design small enough for two CPU cores at 1B parameters: one gradient over every head, a few single-head
# confirmations, few documents, two short general tasks, validation on as many held-out documents.
SMALL_DESIGN = dict(task="plurals", method="gradient_confirm", num_masks=8, num_samples=8,
                    general_tasks=["induction", "arithmetic_1d_4shot"], general_samples=8, validation_samples=8,
                    top_k=3, curve_k=2, universal_candidates=2, bootstrap=10, metric="logprob")


def tiny_config(vocab_size: int, eos_token_id: int) -> ModelConfig:
  """A tiny Llama for CPU smoke runs of anything that takes a preset (the kit's --small)."""
  return ModelConfig("llama", vocab_size, 64, 128, 2, 4, 2, 16, 1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                     eos_token_ids=(eos_token_id,))


def random_model(name: str, config: ModelConfig, dtype, tokenizer) -> LoadedModel:
  """Random weights of `config` made on the devices, with `tokenizer` (its ids must fit the vocabulary)."""
  start = time.perf_counter()
  module = Transformer(config, param_dtype=dtype)
  params = presets.random_params(module, config, dtype)
  return LoadedModel(name, config, params, module, tokenizer, dtype, "random weights", time.perf_counter() - start)


def peak_host_bytes() -> int:
  """This process's peak resident memory (Linux reports kilobytes)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rehearse(model: LoadedModel, engine_config: EngineConfig | None = None, output_dir: str | None = None,
             **design: Any) -> dict[str, Any]:
  """Runs one localization (`SMALL_DESIGN`, overridden by `design`) on `model` and reports its costs."""
  from jaxloc.localize.run import localize
  from jaxloc.localize.settings import LocalizeSettings

  engine = Engine(model, engine_config or EngineConfig())
  directory = output_dir or tempfile.mkdtemp(prefix="jaxloc_rehearsal_")
  values = {**SMALL_DESIGN, **design}
  settings = LocalizeSettings.make(model=model.name, output_dir=directory, **values)
  start = time.perf_counter()
  payload = localize(engine, settings, progress=False)
  seconds = time.perf_counter() - start
  c = model.config
  return {
      "model": model.name, "dtype": jnp.dtype(model.dtype).name, "layers": c.num_layers, "heads": c.num_heads,
      "kv_heads": c.num_kv_heads, "vocab": c.vocab_size, "design": values, "wall_seconds": seconds,
      "load_seconds": model.load_seconds, "peak_host_gib": peak_host_bytes() / 2**30, "engine": payload["engine"],
      "timing": payload["timing"],
      "planner": {"budget_gib": engine.shared.planner.call_budget / 2**30,
                  "tokens_per_batch": engine.config.tokens_per_batch,
                  "scoring_shapes": [dataclasses.asdict(s) for s in engine.shared.layouts.shapes]},
      "output_dir": directory}
