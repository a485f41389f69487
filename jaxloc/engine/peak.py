"""The machine's matmul peak: the yardstick a timing is read against (a run records it at its start and end, the
throughput benchmark before and after its workloads), since the same job on a shared machine can take twice as long
in a busy hour."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from jaxloc.models.provenance import describe

if TYPE_CHECKING:
  from jaxloc.engine.engine import Engine


def matmul_peak(shapes: Sequence[tuple[int, int, int]] = ((2048, 2048, 2048),), dtype: DTypeLike = jnp.float32,
                repeats: int = 10) -> dict[str, float]:
  """Median GFLOP/s of jitted `a @ b` for each (m, k, n)."""
  result = {}
  for m, k, n in shapes:
    a = jnp.ones((m, k), dtype)
    b = jnp.ones((k, n), dtype)
    f = jax.jit(lambda x, y: x @ y)
    f(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      f(a, b).block_until_ready()
      times.append(time.perf_counter() - start)
    result[f"{m}x{k}x{n}"] = 2 * m * k * n / float(np.median(times)) / 1e9
  return result


def machine_peak(dtype: DTypeLike = jnp.float32) -> float:
  """GFLOP/s of one quick matmul in `dtype` on the default device (1024³ on a CPU, 4096³ elsewhere; a few tenths
  of a second): what a run records beside its timings (`heads.json` "machine")."""
  size = 1024 if jax.default_backend() == "cpu" else 4096
  return max(matmul_peak(((size, size, size),), dtype, repeats=5).values())


def machine_facts(dtype: DTypeLike, at: str = "start") -> dict[str, Any]:
  """The run file's "machine" record: at the start, the UTC time, CPU count, backend and the matmul peak; at the
  end, the peak again (a peak that moved says the machine was shared)."""
  facts: dict[str, Any] = {f"matmul_peak_gflops_{at}": machine_peak(dtype)}
  if at == "start":
    facts = {"started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu_count": os.cpu_count(),
             "backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind, **facts}
  return facts


def provenance(engine: Engine) -> dict[str, Any]:
  """The run file's "model_provenance" (`jaxloc.models.provenance.describe`) of an engine's model."""
  model = engine.model
  return describe(model.name, model.source, model.dtype)
