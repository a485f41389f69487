"""Joining a multi-process run (a TPU pod, a GPU cluster, or several processes on one machine) with JAX's own
multi-controller runtime, before anything touches a device (`jaxloc.cli.run` does it for --distributed).

JAX is imported only when a run joins: `jaxloc.cli` imports this module, and a command that loads no model (the
sandbox benchmark, the report) must not start JAX.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from jaxloc.errors import UserError

log = logging.getLogger(__name__)

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
  import jax  # here, not at the top: `jaxloc.cli` imports this module, and a command that never joins a run
  # must not pay for starting JAX

  if jax.distributed.is_initialized():
    return
  given: dict[str, Any] = {"coordinator_address": coordinator_address, "num_processes": num_processes,
                           "process_id": process_id}
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
