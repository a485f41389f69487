"""What compiling costs an engine, and JAX's persistent compilation cache that makes a rerun compile nothing new.

At 1B-8B parameters on an accelerator one compile takes tens of seconds, so the number of distinct shapes a run
compiles (`Engine.compile_count`) and the seconds spent on them are first-order costs. Each of the engine's jitted
functions is a `Jitted`: calling it makes that engine's `CompileTime` the one JAX's compile events are charged to
(tracing, lowering to MLIR, and the XLA compile or, on a persistent-cache hit, reading the executable back), so two
engines in one process keep their own accounts. The events are JAX's monitoring events (`jax.monitoring`); a compile
happens synchronously inside the call that needs it, before the computation is dispatched.

The persistent cache (`use_persistent_cache`) is JAX's own (`jax_compilation_cache_dir`), kept under the jaxloc cache
directory in one folder per backend and processor (an executable compiled for one CPU's instruction set must not be
loaded on another's): a rerun or a resumed run reads its executables back instead of compiling them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import threading
from typing import Any, Callable, Hashable

import jax

from jaxloc.models.loading import default_cache_dir

log = logging.getLogger(__name__)

# JAX's monitoring events of one compile: tracing to a jaxpr, lowering to MLIR, the XLA compile (or, with the
# persistent cache, its lookup and, on a hit, the executable read back instead of compiled).
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
BACKEND_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
# Above this size the cache drops its least recently used executables (JAX needs `filelock` to bound it).
CACHE_MAX_BYTES = 4 * 1024**3


@dataclasses.dataclass
class CompileTime:
  """Seconds one engine's jitted functions spent compiling, and how many executables came from the persistent
  cache instead of the compiler."""

  seconds: float = 0.0  # tracing + lowering + XLA compile (or reading a cached executable)
  backend_seconds: float = 0.0  # the XLA part alone
  cache_hits: int = 0


_charged = threading.local()  # .time: the CompileTime that compile events on this thread go to (None: nobody's)
_listening = False
_listening_lock = threading.Lock()


def _on_duration(event: str, duration_secs: float, **_: str | int) -> None:
  time = getattr(_charged, "time", None)
  if time is None:
    return
  if event in (TRACE_EVENT, LOWER_EVENT, BACKEND_EVENT):
    time.seconds += duration_secs
  if event == BACKEND_EVENT:
    time.backend_seconds += duration_secs


def _on_event(event: str, **_: Any) -> None:
  time = getattr(_charged, "time", None)
  if time is not None and event == CACHE_HIT_EVENT:
    time.cache_hits += 1


def _listen() -> None:
  """Registers the listeners once per process (JAX keeps them for its lifetime)."""
  global _listening
  with _listening_lock:
    if not _listening:
      jax.monitoring.register_event_duration_secs_listener(_on_duration)
      jax.monitoring.register_event_listener(_on_event)
      _listening = True


class Jitted:
  """`jax.jit(fn, **options)` whose compiles are charged to `time`, traced under `matmul_precision` where given.

  matmul_precision: `jax.default_matmul_precision` for the float32 matmuls and convolutions traced here (None: JAX's
    default, which is TF32 on GPUs that have it). It is part of jit's cache key, so one function traced under two
    precisions compiles twice rather than reusing the other's executable."""

  def __init__(self, fn: Callable[..., Any], time: CompileTime, matmul_precision: str | None = None,
               **options: Any):
    _listen()
    self._jitted = jax.jit(fn, **options)
    self._time = time
    self._precision = matmul_precision
    self._executables: dict[Hashable, Any] = {}

  def _traced(self) -> contextlib.AbstractContextManager[Any]:
    """The context every trace of the function runs in: the precision is read when tracing, not when jitting."""
    return contextlib.nullcontext() if self._precision is None else jax.default_matmul_precision(self._precision)

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    outer = getattr(_charged, "time", None)
    _charged.time = self._time
    try:
      with self._traced():
        return self._jitted(*args, **kwargs)
    finally:
      _charged.time = outer

  def lower(self, *args: Any, **kwargs: Any) -> Any:
    with self._traced():
      return self._jitted.lower(*args, **kwargs)

  def executable(self, *args: Any, **static: Any) -> Any:
    """The function compiled ahead of time for `args` (arrays, or `jax.ShapeDtypeStruct`s with the shardings the
    arrays will have) and the `static` arguments, kept by their shapes and dtypes: its `memory_analysis()` sizes a
    call before any memory is committed to it, and calling it (with the arrays alone) runs that very executable."""
    leaves, tree = jax.tree.flatten(args)
    key = (tree, tuple((tuple(x.shape), str(x.dtype)) for x in leaves), tuple(sorted(static.items())))
    if key not in self._executables:
      outer = getattr(_charged, "time", None)
      _charged.time = self._time
      try:
        self._executables[key] = self.lower(*args, **static).compile()
      finally:
        _charged.time = outer
    return self._executables[key]

  def compiled_shapes(self) -> int:
    """Distinct shapes (and static arguments) compiled so far, called or ahead of time."""
    # jax exposes no public count (nor does its stub declare this one)
    return self._jitted._cache_size() + len(self._executables)  # type: ignore[attr-defined]  # noqa: SLF001


def cache_directory(base: str) -> str:
  """The persistent cache's folder under `base` for this backend and processor: `<base>/<platform>-<digest>`, the
  digest of the device kind and, on CPUs, the instruction-set flags the compiler targets."""
  device = jax.devices()[0]
  identity = [device.platform, device.device_kind]
  if device.platform == "cpu":
    try:
      with open("/proc/cpuinfo", encoding="utf-8") as f:
        identity += sorted({line for line in f if line.startswith(("flags", "model name"))})
    except OSError:
      pass
  digest = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:12]
  return os.path.join(base, f"{device.platform}-{digest}")


def use_persistent_cache(setting: str) -> str:
  """Turns JAX's persistent compilation cache on for the whole process in `cache_directory` of `setting` (a folder;
  empty: compilation/ in the jaxloc cache directory), or off with "none"; returns the setting resolved (the folder,
  or "none").

  Every compile is kept, however short (JAX's default keeps only those over a second, so a rerun would still
  compile the rest); the folder is bounded by CACHE_MAX_BYTES where `filelock` is installed."""
  from jax.experimental.compilation_cache import compilation_cache

  base = "none" if setting == "none" else (setting or os.path.join(default_cache_dir(), "compilation"))
  directory = None if base == "none" else cache_directory(base)
  # jax.config's stub declares none of its flags as attributes (and `read` refuses these two).
  current = (jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
             if jax.config.jax_enable_compilation_cache else None)  # type: ignore[attr-defined]
  if directory == current:
    return base
  if directory is None:
    jax.config.update("jax_enable_compilation_cache", False)
  else:
    os.makedirs(directory, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
      import filelock  # noqa: F401  (JAX's bounded cache locks with it)

      jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    except ImportError:
      log.info("filelock not installed: the compilation cache in %s is unbounded", directory)
  compilation_cache.reset_cache()  # the cache opens its folder once per process otherwise
  log.info("persistent compilation cache: %s", directory or "off")
  return base
