"""The engine: evaluate a model under a stack of head masks [masks, layers, heads] and/or neuron masks
[masks, layers, mlp] in compiled batches.

Masks here are keep-masks (1 keep, 0 ablate), the model's convention; localization designs (True =
ablated) convert with `keep = 1 - ablated`.

    engine = Engine(load_model("smollm2-135m"))                    # EngineConfig() defaults for this machine
    engine = Engine(model, EngineConfig(tokens_per_batch=256), mesh=make_mesh(2))
    out = engine.score(requests, head_masks)     # ScoreOutputs, logprob/is_greedy [M, R]
    out = engine.score(requests, neuron_masks=neuron_masks)  # the same under neuron masks
    texts = engine.generate(requests, head_masks)  # [M][R] strings, cut at stop strings
    plain = Engine(model, dataclasses.replace(engine.config, pack=False))  # a variant, same budgets

`Engine` is a facade over one job per module, sharing one `SharedResources` (placement, planner, caches, stats):
scoring (`scorer.py`), generation (`generator.py`) and attribution (`attribution.py`: the mask objective,
integrated gradients, mean-ablation statistics). Everything per call is one jitted function; shapes are bucketed
(`batching.py`) and shared between request sets (`layouts.py`) so a run compiles a handful of times, and
`compile_count` and `compile_time` report how many and how long. Short requests are packed
several to a row (`scoring.arrange`), and masks are grouped by the first layer they ablate: a batch starts there from
the unablated model's residual streams, kept per request set within the residual cache. Generation prefills the
prompts' shared prefix once per mask (below its first ablated layer, once for all masks) and decodes rows in slots
refilled as rows end. Every "how many fit" comes from one planner (`planner.py`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxloc.engine import mesh as mesh_lib
from jaxloc.engine.attribution import Attribution
from jaxloc.engine.compilation import CompileTime
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.generator import Generator
from jaxloc.engine.masks import Masks, start_layers
from jaxloc.engine.scorer import Scorer
from jaxloc.engine.resources import EngineStats, SharedResources
from jaxloc.models.config import ModelConfig
from jaxloc.models.loading import LoadedModel


class Engine:
  """Scores, generates and attributes for many head and/or neuron masks × requests on every device of a mesh.

  config: how work is cut and run (`EngineConfig`; default every setting for this machine); `engine.config` is it
    resolved (`planner.resolve`), and `engine.model_config` the model's own.
  mesh: the devices (default every device, data parallel).

  The jobs' methods are the engine's under the names callers use: `prepare`, `masks_per_call` (the shared layouts),
  `score`, `score_batches` (`Scorer`), `generate`, `generate_tokens` (`Generator`), `mask_objective`,
  `neuron_attribution`, `ablation_means` (`Attribution`).
  """

  def __init__(self, model: LoadedModel, config: EngineConfig | None = None, *, mesh: jax.sharding.Mesh | None = None):
    self.shared = SharedResources.build(model, config or EngineConfig(),
                                        mesh if mesh is not None else mesh_lib.make_mesh())
    self.scorer = Scorer(self.shared)
    self.generator = Generator(self.shared)
    self.attribution = Attribution(self.shared)
    self.prepare, self.masks_per_call = self.shared.layouts.prepare, self.shared.layouts.masks_per_call
    self.score, self.score_batches = self.scorer.score, self.scorer.score_batches
    self.generate, self.generate_tokens = self.generator.generate, self.generator.generate_tokens
    self.mask_objective = self.attribution.mask_objective
    self.neuron_attribution = self.attribution.neuron_attribution
    self.ablation_means = self.attribution.ablation_means

  @property
  def model(self) -> LoadedModel:
    return self.shared.model

  @property
  def config(self) -> EngineConfig:
    """The engine's settings, every default resolved: `dataclasses.replace` it for a variant with the same budgets."""
    return self.shared.config

  @property
  def model_config(self) -> ModelConfig:
    return self.shared.model.config

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self.shared.placement.mesh

  @property
  def params(self) -> Any:
    """The model's parameters placed on the mesh."""
    return self.shared.placement.params

  @property
  def dtype(self) -> Any:
    """The activation dtype (`EngineConfig.activation_dtype` resolved)."""
    return self.shared.placement.dtype

  @property
  def stats(self) -> EngineStats:
    return self.shared.stats

  @property
  def tokenizer(self) -> Any:
    return self.shared.model.tokenizer

  @property
  def pad_id(self) -> int:
    return self.shared.pad_id

  @property
  def compile_count(self) -> int:
    """Distinct compiled shapes so far, over all of the engine's jitted functions."""
    jitted = self.scorer.jitted + self.generator.jitted + self.attribution.jitted
    return sum(fn.compiled_shapes() for fn in jitted)

  @property
  def compile_time(self) -> CompileTime:
    """Seconds the engine's jitted functions spent compiling so far, and executables read back from the persistent
    compilation cache instead (`compilation.py`)."""
    return self.shared.stats.compile

  def start_layers(self, masks: Masks) -> np.ndarray:
    """First layer each mask ablates anything in (int [M]; num_layers for a mask that ablates nothing)."""
    return start_layers(self.model_config, masks)
