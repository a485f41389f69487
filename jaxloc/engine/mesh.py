"""Devices as data: a `Mesh` with a `data` axis (masks × requests) and a `model` axis (tensor parallel).

Parameters are placed by a few (path pattern, PartitionSpec) rules; activations are placed on the
data axis and `jax.jit` propagates the rest. In a multi-process run (a pod, or several processes on one
machine), `jaxloc.engine.distributed.initialize_distributed` comes first; the mesh then spans every process's
devices and each process feeds the same global batch (designs and tasks are deterministic), so no host-local
bookkeeping is needed; only process 0 writes files (`jaxloc.files`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from jaxloc.errors import UserError

DATA, MODEL = "data", "model"

# Tensor-parallel layout (Megatron style): heads and MLP columns split over `model`; o_proj and
# down_proj rows split to match; the vocabulary split for the embedding/LM head. Stacked layer
# leaves lead with the layers axis, which is never split.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"layers/attn/q_kernel", P(None, None, MODEL, None, None)),
    (r"layers/attn/[kv]_kernel", P(None, None, MODEL, None)),
    (r"layers/attn/q_bias", P(None, MODEL, None, None)),
    (r"layers/attn/[kv]_bias", P(None, MODEL, None)),
    (r"layers/attn/o_kernel", P(None, MODEL, None, None, None)),
    (r"layers/mlp/(gate|up)_kernel", P(None, None, MODEL)),
    (r"layers/mlp/(gate|up)_bias", P(None, MODEL)),
    (r"layers/mlp/down_kernel", P(None, MODEL, None)),
    (r"embed/embedding", P(MODEL, None)),
    (r"lm_head", P(None, MODEL)),
)


def make_mesh(model_parallel: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, model) mesh over all devices (every host's, after `distributed.initialize_distributed`)."""
  devices = list(devices if devices is not None else jax.devices())
  if model_parallel < 1 or len(devices) % model_parallel:
    raise UserError(f"--model_parallel={model_parallel} must be ≥ 1 and divide the {len(devices)} devices")
  grid = np.asarray(devices).reshape(len(devices) // model_parallel, model_parallel)
  return Mesh(grid, (DATA, MODEL))


def param_sharding_for(mesh: Mesh, config: Any = None) -> Callable[[str, tuple[int, ...] | None], NamedSharding]:
  """Parameter path -> NamedSharding per PARAM_RULES; a dimension that does not divide is replicated."""
  model_size = mesh.shape[MODEL]

  def sharding_for(path: str, shape: tuple[int, ...] | None = None) -> NamedSharding:
    spec = P()
    if model_size > 1:
      for pattern, rule in PARAM_RULES:
        if re.fullmatch(pattern, path):
          spec = rule
          break
      if shape is not None:
        spec = P(*[axis if axis is None or dim % model_size == 0 else None
                   for axis, dim in zip(tuple(spec) + (None,) * (len(shape) - len(spec)), shape)])
    return NamedSharding(mesh, spec)

  del config
  return sharding_for


def shard_params(params: Any, mesh: Mesh) -> Any:
  """Places an already-loaded parameter pytree on the mesh."""
  sharding_for = param_sharding_for(mesh)

  def place(path: tuple[Any, ...], leaf: Any) -> jax.Array:
    sharding = sharding_for("/".join(k.key for k in path), leaf.shape)
    if jax.process_count() == 1 or (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable):
      return jax.device_put(leaf, sharding)
    # Several processes, a process-local value (numpy, or on one local device, as a restored cache gives): every
    # process holds it in full, so each places its own shards (devices cannot send to other hosts' devices).
    return put(np.asarray(leaf), sharding)

  return jax.tree_util.tree_map_with_path(place, params)


def data_sharding(mesh: Mesh, ndim: int, axis: int = 0) -> NamedSharding:
  """Splits dimension `axis` of an `ndim`-array over the data axis; the rest replicated."""
  spec: list[str | None] = [None] * ndim
  spec[axis] = DATA
  return NamedSharding(mesh, P(*spec))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def put(array: ArrayLike, sharding: NamedSharding) -> jax.Array:
  """A global array from a host array every process holds in full (single- and multi-host)."""
  array = np.asarray(array)
  if jax.process_count() == 1:
    return jax.device_put(array, sharding)
  return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def to_host(array: jax.Array) -> np.ndarray:
  """The full value of a (possibly multi-host) global array on every host."""
  if jax.process_count() == 1 or array.is_fully_replicated:
    return np.asarray(array)
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(array, tiled=True))
