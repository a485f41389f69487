"""The engine of a command that loads a model: --model and the engine flags (`jaxloc.cli.ModelFlags`,
`EngineConfig`, defined by `cli.define_model_flags`) made into a loaded model and an `Engine` on a mesh over every
device.

Apart from `jaxloc.cli` because loading a model imports JAX: a command that never loads one (the sandbox benchmark,
the report, the comparisons of saved runs) imports `cli` without starting JAX.
"""

from __future__ import annotations

import logging

from jaxloc import cli
from jaxloc.engine import mesh as mesh_lib
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.models.loading import load_model


def engine_from_flags() -> Engine:
  """Loads --model and builds an Engine from the engine flags (`EngineConfig`) on a mesh over every device."""
  return load_engine(cli.settings_from_flags(cli.ModelFlags), cli.settings_from_flags(EngineConfig))


def load_engine(model_flags: cli.ModelFlags, config: EngineConfig) -> Engine:
  """Loads `model_flags.model` and builds an Engine with `config` on a mesh over every device."""
  mesh = mesh_lib.make_mesh(model_flags.model_parallel)
  cache_dir = None if model_flags.cache_dir == "none" else model_flags.cache_dir
  sharding_for = mesh_lib.param_sharding_for(mesh) if model_flags.model_parallel > 1 else None
  model = load_model(model_flags.model, dtype=model_flags.dtype, cache_dir=cache_dir, sharding_for=sharding_for)
  logging.info("loaded %s (%d layers x %d heads) in %.1fs", model_flags.model, model.config.num_layers,
               model.config.num_heads, model.load_seconds)
  return Engine(model, config, mesh=mesh)
