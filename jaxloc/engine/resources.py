"""The resources the engine's jobs (scoring, generation, attribution) share (`SharedResources`): the model and its
resolved config, one placement, one memory planner, the request layouts and their compiled shapes (`layouts.py`), the
residual streams, the stats and what compiling cost (`compilation.py`).

Layouts are cached because a localization scores the same request set many times; residual streams because a batch
of masks that ablates nothing below layer l resumes at l from the unablated model's streams of its request set.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Hashable

import jax.numpy as jnp
from jax.sharding import Mesh

from jaxloc.engine import compilation
from jaxloc.engine.config import FLOAT32_MATMULS, EngineConfig
from jaxloc.engine.layouts import Layouts
from jaxloc.engine.placement import Placement
from jaxloc.engine.planner import Planner, resolve
from jaxloc.errors import UserError
from jaxloc.models.config import ModelConfig
from jaxloc.models.loading import LoadedModel


@dataclasses.dataclass
class EngineStats:
  """What the engine did, for throughput reports."""

  calls: int = 0
  mask_evaluations: int = 0
  tokens: int = 0  # real tokens computed (shared prefix counted once per mask), padding excluded
  padded_tokens: int = 0
  layer_tokens: int = 0  # scoring: real tokens times the layers computed for them (fewer past a batch's start layer)
  targets: int = 0  # scoring: real continuation tokens scored (the LM head runs at each)
  seconds: float = 0.0
  compile: compilation.CompileTime = dataclasses.field(default_factory=compilation.CompileTime)


def pad_id_of(model: LoadedModel) -> int:
  """The token that pads rows: the tokenizer's pad token, else its EOS, else the config's pad token, else 0."""
  tok = model.tokenizer
  for candidate in (getattr(tok, "pad_token_id", None), getattr(tok, "eos_token_id", None),
                    model.config.pad_token_id):
    if candidate is not None:
      return int(candidate)
  return 0


class ResidualCache:
  """Values with a size in bytes, kept within `capacity` bytes, least recently used dropped first."""

  def __init__(self, capacity: int):
    self.capacity = capacity
    self._kept: dict[Hashable, tuple[Any, int]] = {}  # key -> (value, bytes), least recently used first

  def get(self, key: Hashable) -> Any:
    """The value kept for `key` (now the most recently used), or None."""
    if key not in self._kept:
      return None
    self._kept[key] = self._kept.pop(key)
    return self._kept[key][0]

  def make_room(self, size: int) -> None:
    """Drops values until `size` more bytes fit: called before computing a new value, so the old ones are freed
    first."""
    while self._kept and sum(b for _, b in self._kept.values()) + size > self.capacity:
      self._kept.pop(next(iter(self._kept)))

  def put(self, key: Hashable, value: Any, size: int) -> None:
    self._kept[key] = value, size


@dataclasses.dataclass
class SharedResources:
  """One engine's model, resolved config (`planner.resolve`), placement, planner, caches and stats."""

  model: LoadedModel
  config: EngineConfig
  placement: Placement
  planner: Planner
  pad_id: int
  layouts: Layouts
  residuals: ResidualCache
  stats: EngineStats

  @classmethod
  def build(cls, model: LoadedModel, config: EngineConfig, mesh: Mesh) -> "SharedResources":
    config = resolve(config, model.dtype)
    if config.float32_matmuls not in FLOAT32_MATMULS:  # the flag is an enum; this catches the Python API
      raise UserError(f"--float32_matmuls={config.float32_matmuls} must be one of {', '.join(FLOAT32_MATMULS)}")
    config = dataclasses.replace(config, compilation_cache=compilation.use_persistent_cache(config.compilation_cache))
    placement = Placement.build(model.params, mesh, getattr(jnp, config.activation_dtype))
    planner = Planner.of(config, model.config, placement.data_parallel)
    pad = pad_id_of(model)
    return cls(model, config, placement, planner, pad, Layouts(model, config, planner, pad),
               ResidualCache(planner.residual_cache), EngineStats())

  @property
  def module(self) -> Any:
    return self.model.module

  @property
  def matmul_precision(self) -> str | None:
    """`EngineConfig.float32_matmuls` where activations are float32, else None: bfloat16 matmuls keep JAX's
    default, which the setting does not govern."""
    return self.config.float32_matmuls if self.config.activation_dtype == "float32" else None

  def jit(self, fn: Callable[..., Any], **options: Any) -> compilation.Jitted:
    """`jax.jit(fn, **options)`, its compiles charged to this engine (`stats.compile`) and its float32 matmuls at
    `matmul_precision`: set here, for every jitted function of the engine, because JAX's default on GPUs is TF32."""
    return compilation.Jitted(fn, self.stats.compile, matmul_precision=self.matmul_precision, **options)

  @property
  def model_config(self) -> ModelConfig:
    return self.model.config
