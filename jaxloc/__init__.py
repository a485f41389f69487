"""jaxloc: find the attention heads of a language model that carry a capability.

From Python (a notebook), everything below is `jaxloc.<name>`:

    import jaxloc
    model = jaxloc.load("smollm2-135m")                      # a model to query under many masks at once
    model.logits(["The plural of mouse is"], masks=jaxloc.masks.single_heads(model), last=True)  # [270, 1, vocab]
    model.patch(clean, corrupted)                            # activation patching, every head in one call
    model = jaxloc.load_model("smollm2-135m")                # alias, .gguf, HF directory or hub id
    engine = jaxloc.Engine(model)                              # batched, compiled evaluation under head masks
    engine = jaxloc.Engine(model, jaxloc.EngineConfig(memory_budget_gb=4))  # its settings, as the flags give them
    jaxloc.evaluate_heads(engine, "plurals", heads=["L8H1"])   # the `experiments.evaluate` result
    jaxloc.evaluate_masks(engine, "lm_eval:boolq", masks)      # metrics per keep-mask [masks, layers, heads]
    run = jaxloc.run_localization(engine, "plurals", "runs/p", num_masks=60)   # the flags as keywords
    run = jaxloc.read_run("runs/p")                            # heads, coefficients, measurements, validation

Names are imported on first use, so `import jaxloc` is instant and a subpackage never pulls in the others.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"  # the one place the version is written (pyproject.toml reads it; CHANGELOG.md says what changed)

_EXPORTS = {
    "load_model": "jaxloc.models.loading",
    "LoadedModel": "jaxloc.models.loading",
    "Engine": "jaxloc.engine.engine",
    "EngineConfig": "jaxloc.engine.config",
    "get_task": "jaxloc.tasks.registry",
    "task_names": "jaxloc.tasks.registry",
    "evaluate_heads": "jaxloc.fixed_ablation",
    "evaluate_masks": "jaxloc.fixed_ablation",
    "keep_mask": "jaxloc.units",
    "head_name": "jaxloc.units",
    "parse_heads": "jaxloc.units",
    "LocalizeSettings": "jaxloc.localize.settings",
    "load": "jaxloc.api",
    "from_hf": "jaxloc.api",
    "Model": "jaxloc.api",
    "run_localization": "jaxloc.api",
    "read_run": "jaxloc.api",
    "Run": "jaxloc.api",
    "UserError": "jaxloc.errors",
  "Cache": "jaxloc.api.cache",
  "LogitDiff": "jaxloc.models.metrics",
}

# jaxloc.masks: the mask builder; jaxloc.interventions: site edits as data (zero, mean, patch, add, scale)
_SUBMODULES = {"masks": "jaxloc.masks", "interventions": "jaxloc.api.interventions"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ imports on first use
  from jaxloc import masks  # noqa: F401
  from jaxloc.api import interventions  # noqa: F401
  from jaxloc.api.cache import Cache  # noqa: F401
  from jaxloc.models.metrics import LogitDiff  # noqa: F401
  from jaxloc.api import Model, Run, from_hf, load, read_run, run_localization  # noqa: F401
  from jaxloc.engine.config import EngineConfig  # noqa: F401
  from jaxloc.engine.engine import Engine  # noqa: F401
  from jaxloc.errors import UserError  # noqa: F401
  from jaxloc.fixed_ablation import evaluate_heads, evaluate_masks  # noqa: F401
  from jaxloc.units import head_name, keep_mask, parse_heads  # noqa: F401
  from jaxloc.localize.settings import LocalizeSettings  # noqa: F401
  from jaxloc.models.loading import LoadedModel, load_model  # noqa: F401
  from jaxloc.tasks.registry import get_task, task_names  # noqa: F401


def __getattr__(name: str) -> Any:
  if name in _SUBMODULES:
    return importlib.import_module(_SUBMODULES[name])
  if name not in _EXPORTS:
    raise AttributeError(f"module 'jaxloc' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted({*globals(), *__all__})
