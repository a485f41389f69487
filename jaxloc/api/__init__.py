"""The notebook face of jaxloc, behind `import jaxloc`: query a model under many masks (`model.py`: `load`,
`from_hf`, `Model`), run a localization and read a finished one (`runs.py`: `run_localization`, `read_run`, `Run`).

Names are imported on first use, as `jaxloc/__init__.py` does: querying a model never imports the localization.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "load": "jaxloc.api.model",
    "from_hf": "jaxloc.api.model",
    "Model": "jaxloc.api.model",
    "Cache": "jaxloc.api.cache",
    "Patching": "jaxloc.api.model",
    "TopK": "jaxloc.api.model",
    "run_localization": "jaxloc.api.runs",
    "read_run": "jaxloc.api.runs",
    "Run": "jaxloc.api.runs",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
  from jaxloc.api.cache import Cache  # noqa: F401
  from jaxloc.api.model import Model, Patching, TopK, from_hf, load  # noqa: F401
  from jaxloc.api.runs import Run, read_run, run_localization  # noqa: F401


def __getattr__(name: str) -> Any:
  if name not in _EXPORTS:
    raise AttributeError(f"module 'jaxloc.api' has no attribute {name!r}")
  value = getattr(importlib.import_module(_EXPORTS[name]), name)
  globals()[name] = value
  return value
