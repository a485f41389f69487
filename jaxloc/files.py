"""Run files: atomic writes (a crash mid-write never leaves a half-written output) and reads, the one helper for all.

In a multi-process run (`jax.distributed`) every process computes the same thing, but only process 0 writes
outputs (`write_json`, `save_array`, `save_arrays`, `save_figure` do nothing elsewhere), so a shared filesystem
never sees concurrent writes; a run's own files are read as process 0 sees them (`read_shared`), so a resumed
run makes the same plan on every host whether or not the others can see process 0's disk. `atomic_write` itself
writes on every process: it is also for per-host caches.
"""

from __future__ import annotations

import io
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


def is_writer() -> bool:
  """Whether this process writes outputs: always in a single-process run, process 0 only in a multi-process one."""
  import jax

  return jax.process_index() == 0


def _write_output(path: str, write: Callable[[IO[bytes]], None]) -> None:
  if is_writer():
    atomic_write(path, write)


def write_json(path: str, payload: Any) -> None:
  _write_output(path, lambda f: f.write(json.dumps(payload, indent=2, default=_jsonable).encode()))


def save_array(path: str, array: np.ndarray) -> None:
  """np.save, atomically (`path` should end in .npy)."""
  _write_output(path, lambda f: np.save(f, array))


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
  """np.savez, atomically."""
  _write_output(path, lambda f: np.savez(f, **arrays))


def write_text(path: str, text: str) -> None:
  _write_output(path, lambda f: f.write(text.encode()))


def save_figure(path: str, figure, dpi: int) -> None:
  """A matplotlib figure as an image (its format from the extension), atomically."""
  fmt = os.path.splitext(path)[1].lstrip(".") or "png"
  _write_output(path, lambda f: figure.savefig(f, format=fmt, dpi=dpi))


def read_shared(path: str) -> bytes | None:
  """The file's bytes as process 0 sees them (None when it has none); in a multi-process run every process
  must call this for the same paths in the same order (process 0 broadcasts)."""
  import jax

  def read() -> bytes | None:
    if not os.path.isfile(path):
      return None
    with open(path, "rb") as f:
      return f.read()

  if jax.process_count() == 1:
    return read()
  from jax.experimental import multihost_utils

  data = read() if jax.process_index() == 0 else None
  size = int(multihost_utils.broadcast_one_to_all(np.int64(-1 if data is None else len(data))))
  if size < 0:
    return None
  # Padded to a power of two so that a handful of broadcast shapes compile, whatever the file sizes.
  buffer = np.zeros(1 << max(size - 1, 0).bit_length(), np.uint8)
  if data is not None:
    buffer[:size] = np.frombuffer(data, np.uint8)
  return multihost_utils.broadcast_one_to_all(buffer)[:size].tobytes()


def read_json(path: str) -> Any | None:
  """A JSON file as process 0 sees it (None when absent)."""
  data = read_shared(path)
  return None if data is None else json.loads(data)


def read_array(path: str) -> np.ndarray | None:
  """An .npy file as process 0 sees it (None when absent)."""
  data = read_shared(path)
  return None if data is None else np.load(io.BytesIO(data))


def read_arrays(path: str) -> dict[str, np.ndarray] | None:
  """An .npz file as process 0 sees it (None when absent)."""
  data = read_shared(path)
  if data is None:
    return None
  with np.load(io.BytesIO(data)) as loaded:
    return {k: loaded[k] for k in loaded.files}
