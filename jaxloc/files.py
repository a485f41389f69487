"""Atomic file writes: a crash mid-write never leaves a half-written output (the one helper for all)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, IO

import numpy as np


def atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> None:
  """Calls write(f) on a temporary file beside `path`, syncs it, then renames it over `path`."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=os.path.basename(path) + ".", suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def _jsonable(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"not JSON serializable: {type(value).__name__}")


def write_json(path: str, payload: Any) -> None:
  atomic_write(path, lambda f: f.write(json.dumps(payload, indent=2, default=_jsonable).encode()))


def save_array(path: str, array: np.ndarray) -> None:
  """np.save, atomically (`path` should end in .npy)."""
  atomic_write(path, lambda f: np.save(f, array))


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
  """np.savez, atomically."""
  atomic_write(path, lambda f: np.savez(f, **arrays))
