"""Devices as data: a `Mesh` with a `data` axis (masks × requests) and a `model` axis (tensor parallel).

Parameters are placed by a few (path pattern, PartitionSpec) rules; activations are placed on the
data axis and `jax.jit` propagates the rest. In a multi-process run (a pod, or several processes on one
machine), `initialize_distributed` comes first; the mesh then spans every process's devices and each
process feeds the same global batch (designs and tasks are deterministic), so no host-local bookkeeping is
needed; only process 0 writes files (`jaxloc.files`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxloc.errors import UserError

log = logging.getLogger(__name__)

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


DISTRIBUTED_ENV = {"coordinator_address": "JAX_COORDINATOR_ADDRESS", "num_processes": "JAX_NUM_PROCESSES",
                   "process_id": "JAX_PROCESS_ID"}


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, *, timeout_s: int = 300,
                           heartbeat_timeout_s: int = 100) -> None:
  """Joins a multi-process run (TPU pod, GPU cluster, or several processes on one machine) with JAX's own
  multi-controller runtime; must come before anything touches a device.

  Each of the three is taken from its argument, else its environment variable (`DISTRIBUTED_ENV`), else left
  to JAX's cluster detection (Cloud TPU, SLURM, Open MPI, ...). Failing to join is a UserError naming what is
  missing, never a silent single-process run. Joining waits at most `timeout_s` for every process; once joined,
  a process that stops answering for `heartbeat_timeout_s` makes every other one exit with JAX's error
  ("Terminating process because the JAX distributed service detected fatal errors ...") instead of hanging.
  """
  if jax.distributed.is_initialized():
    return
  given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
  for name, variable in DISTRIBUTED_ENV.items():
    if given[name] is None and os.environ.get(variable):
      value = os.environ[variable]
      try:
        given[name] = value if name == "coordinator_address" else int(value)
      except ValueError:
        raise UserError(f"{variable}={value!r} must be an integer") from None
  address = given["coordinator_address"]
  if address and given["process_id"]:
    _wait_for_coordinator(address, timeout_s)
  if address:
    log.info("joining the multi-process run at %s (waiting up to %d s for every process)", address, timeout_s)
  try:
    jax.distributed.initialize(**given, initialization_timeout=timeout_s,
                               heartbeat_timeout_seconds=heartbeat_timeout_s)
  except (RuntimeError, ValueError, TypeError) as e:
    missing = [f"--{name} (or {DISTRIBUTED_ENV[name]})" for name, value in given.items() if value is None]
    hint = (f"; give {', '.join(missing)}, or run where JAX detects the cluster (Cloud TPU, SLURM, Open MPI)"
            if missing else "")
    raise UserError(f"--distributed: could not join the multi-process run ({e}){hint}") from None
  log.info("joined the multi-process run as process %d of %d (%d of %d devices here)", jax.process_index(),
           jax.process_count(), jax.local_device_count(), jax.device_count())


def _wait_for_coordinator(address: str, timeout_s: float) -> None:
  """A clear error when process 0's coordinator cannot be reached (JAX itself aborts the process)."""
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise UserError(f"--coordinator_address={address!r} must be host:port")
  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
        return
    except OSError as e:
      if time.monotonic() > deadline:
        raise UserError(f"--distributed: no coordinator answered at {address} within {timeout_s} s ({e}); "
                        "start process 0 there (it hosts the coordinator) or fix --coordinator_address") from None
      time.sleep(0.5)


def make_mesh(model_parallel: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, model) mesh over all devices (every host's, after `initialize_distributed`)."""
  devices = list(devices if devices is not None else jax.devices())
  if model_parallel < 1 or len(devices) % model_parallel:
    raise UserError(f"--model_parallel={model_parallel} must be ≥ 1 and divide the {len(devices)} devices")
  grid = np.asarray(devices).reshape(len(devices) // model_parallel, model_parallel)
  return Mesh(grid, (DATA, MODEL))


def param_sharding_for(mesh: Mesh, config=None):
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


def shard_params(params, mesh: Mesh):
  """Places an already-loaded parameter pytree on the mesh."""
  sharding_for = param_sharding_for(mesh)

  def place(path, leaf):
    sharding = sharding_for("/".join(k.key for k in path), leaf.shape)
    if jax.process_count() == 1 or (isinstance(leaf, jax.Array) and not leaf.is_fully_addressable):
      return jax.device_put(leaf, sharding)
    # Several processes, a process-local value (numpy, or on one local device, as a restored cache gives): every
    # process holds it in full, so each places its own shards (devices cannot send to other hosts' devices).
    return put(np.asarray(leaf), sharding)

  return jax.tree_util.tree_map_with_path(place, params)


def data_sharding(mesh: Mesh, ndim: int, axis: int = 0) -> NamedSharding:
  """Splits dimension `axis` of an `ndim`-array over the data axis; the rest replicated."""
  spec = [None] * ndim
  spec[axis] = DATA
  return NamedSharding(mesh, P(*spec))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def put(array: np.ndarray, sharding: NamedSharding) -> jax.Array:
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
