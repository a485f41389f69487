"""The harness side of the sandbox: writes a program and its config, starts `_child.py` in a new session,
enforces the wall-clock timeout, cleans up, and probes the strongest isolation mode (the package docstring
describes the modes and what each protects).

In the modes that switch uid each concurrent program gets its own unprivileged uid from a pool
(`UID_POOL`), so RLIMIT_NPROC (which counts per uid) bounds each program separately. Only the last
`_OUTPUT_TAIL_CHARS` of a program's stdout and stderr are kept (RLIMIT_FSIZE bounds what it can
write to them at all).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Literal, Sequence

log = logging.getLogger(__name__)

Mode = Literal["namespaces", "user_namespace", "namespaces_host_visible", "user_namespace_host_visible",
               "uid_only", "none"]
# Each mode as (how the child isolates itself, whether it builds a file view).
MODES: dict[str, tuple[str, bool]] = {
    "namespaces": ("namespaces", True), "user_namespace": ("user_namespace", True),
    "namespaces_host_visible": ("namespaces", False), "user_namespace_host_visible": ("user_namespace", False),
    "uid_only": ("uid_only", False), "none": ("none", False)}
STRONG_MODES = ("namespaces", "user_namespace")
# What the namespace modes must give a program of its own; a cgroup namespace where the kernel allows.
REQUIRED_NAMESPACES = ("mnt", "pid", "net", "ipc", "uts")
NAMESPACE_KINDS = REQUIRED_NAMESPACES + ("cgroup", "user")
HOSTNAME = "jaxloc-sandbox"  # the programs' hostname, in their own UTS namespace
Status = Literal["passed", "failed", "timeout", "sandbox_error"]

_CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child.py")
_SETUP_FAILED = 111  # _child.SETUP_FAILED
_OUTPUT_TAIL_CHARS = 4000
# Unprivileged uids for programs, one per concurrent slot; no files on the host belong to them.
# Each jaxloc process takes its own block of 64 (1 in 256 chance that two processes share one),
# below 65536 so that containers with a 16-bit uid map can switch to them.
UID_POOL_SIZE = 64
UID_POOL = range(40000 + (os.getpid() % 256) * UID_POOL_SIZE,
                 40000 + (os.getpid() % 256 + 1) * UID_POOL_SIZE)
_uid_pool: queue.Queue[int] = queue.Queue()
for _uid in UID_POOL:
  _uid_pool.put(_uid)


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resource limits for one program. `cpu_s=None` means the same as `timeout_s`."""

  timeout_s: float = 10.0
  cpu_s: float | None = None
  memory_bytes: int = 2 << 30
  file_size_bytes: int = 16 << 20
  max_processes: int = 16
  max_open_files: int = 256
  tmpfs_bytes: int = 64 << 20


@dataclasses.dataclass(frozen=True)
class ProgramResult:
  status: Status
  returncode: int | None
  stdout: str
  stderr: str
  seconds: float

  @property
  def passed(self) -> bool:
    return self.status == "passed"


def _read_tail(path: str) -> str:
  try:
    with open(path, "rb") as output:
      output.seek(0, os.SEEK_END)
      output.seek(max(0, output.tell() - _OUTPUT_TAIL_CHARS))
      return output.read().decode("utf-8", errors="replace")
  except OSError:
    return ""


def _live_processes(matches) -> list[int]:
  """Pids of processes (zombies excluded) for which `matches(uid, process_group)` holds.

  Zombies are skipped: they hold no memory and run nothing; the machine's init reaps them on its
  own schedule (seconds, on some hosts).
  """
  pids = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as stat_file:
        stat = stat_file.read()
      uid = os.stat(f"/proc/{entry}").st_uid
    except OSError:
      continue
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
    if fields[0] != "Z" and matches(uid, int(fields[2])):
      pids.append(int(entry))
  return pids


def _pids_of_uid(uid: int) -> list[int]:
  return _live_processes(lambda process_uid, pgrp: process_uid == uid)


def _kill_uid(uid: int, deadline_s: float = 5.0) -> None:
  """SIGKILL every process of `uid` until none is left (uid_only mode)."""
  end = time.monotonic() + deadline_s
  while time.monotonic() < end:
    pids = _pids_of_uid(uid)
    if not pids:
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    time.sleep(0.01)
  log.warning("sandbox: processes of uid %d survived %.0f s of SIGKILL", uid, deadline_s)


def _kill_group(pgid: int) -> None:
  try:
    os.killpg(pgid, signal.SIGKILL)
  except OSError:
    pass


def _wait_group_gone(pgid: int, deadline_s: float = 5.0) -> None:
  """Wait until every process of the group has died.

  In the namespace modes the sandbox's init is in the group, and init dies only after the kernel
  has killed and reaped every process of its pid namespace, so a dead group is an empty sandbox.
  """
  end = time.monotonic() + deadline_s
  while time.monotonic() < end:
    if not _live_processes(lambda process_uid, pgrp: pgrp == pgid):
      return
    time.sleep(0.01)
  log.warning("sandbox: process group %d survived %.0f s after SIGKILL", pgid, deadline_s)


def _wait(process: subprocess.Popen, timeout_s: float) -> int | None:
  """The process's exit status, or None if it is still running after `timeout_s`.

  Waits on a pidfd, which wakes the moment the process exits. `Popen.wait(timeout)` polls instead, with
  sleeps growing to 50 ms, which rounded every program's time up to its next poll (63.5, 113.5, 163.5 ms
  after the start): a program 1 ms over a poll cost 50 ms more.
  """
  try:
    pidfd = os.pidfd_open(process.pid)
  except (AttributeError, OSError):  # Python < 3.9 or Linux < 5.3
    try:
      return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      return None
  try:
    exited = select.poll()
    exited.register(pidfd, select.POLLIN)
    if not exited.poll(timeout_s * 1000):
      return None
  finally:
    os.close(pidfd)
  return process.wait()


def _run_in_mode(source: str, limits: Limits, mode: Mode) -> ProgramResult:
  start = time.monotonic()
  child_mode, file_view = MODES[mode]
  switches_uid = child_mode in ("namespaces", "uid_only")
  run_uid = _uid_pool.get() if switches_uid else None
  workdir = tempfile.mkdtemp(prefix="jaxloc-sandbox-")
  try:
    program_path = os.path.join(workdir, "program.py")
    with open(program_path, "w", encoding="utf-8") as program_file:
      program_file.write(source)
    config = {
        "mode": child_mode,
        "file_view": file_view,
        "workdir": workdir,
        "run_uid": run_uid,
        "hostname": HOSTNAME,
        "block_sockets": child_mode in ("uid_only", "none"),
        "limits": {
            "cpu_s": limits.timeout_s if limits.cpu_s is None else limits.cpu_s,
            "memory_bytes": int(limits.memory_bytes),
            "file_size_bytes": int(limits.file_size_bytes),
            "max_processes": int(limits.max_processes),
            "max_open_files": int(limits.max_open_files),
            "tmpfs_bytes": int(limits.tmpfs_bytes),
        },
    }
    config_path = os.path.join(workdir, "config.json")
    with open(config_path, "w") as config_file:
      json.dump(config, config_file)
    if mode == "uid_only":  # the program works in this host directory as run_uid
      for path in (workdir, program_path):
        os.chown(path, run_uid, run_uid)
    stdout_path = os.path.join(workdir, "stdout")
    stderr_path = os.path.join(workdir, "stderr")
    timed_out = False
    with open(stdout_path, "wb") as stdout_file, open(stderr_path, "wb") as stderr_file:
      if run_uid is not None:  # the program's own, so that it may reopen them (/dev/stdout)
        os.fchown(stdout_file.fileno(), run_uid, run_uid)
        os.fchown(stderr_file.fileno(), run_uid, run_uid)
      try:
        process = subprocess.Popen(
            [sys.executable, "-I", _CHILD_SCRIPT, config_path], stdin=subprocess.DEVNULL,
            stdout=stdout_file, stderr=stderr_file, cwd=workdir, start_new_session=True,
            close_fds=True, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"})
      except OSError as error:
        return ProgramResult("sandbox_error", None, "", f"could not start: {error}",
                             time.monotonic() - start)
      try:
        returncode = _wait(process, limits.timeout_s)
        if returncode is None:
          timed_out = True
          _kill_group(process.pid)
          returncode = process.wait()
      finally:
        # Children that outlived the program (in the weaker modes) go with its group; this also
        # runs when the wait itself is interrupted (KeyboardInterrupt), so nothing is left behind.
        _kill_group(process.pid)
        if mode == "uid_only":  # setsid() escapes the group but not the uid
          _kill_uid(run_uid)
    if timed_out and mode != "uid_only":  # free the slot's uid of the old sandbox before reuse
      _wait_group_gone(process.pid)
    stdout, stderr = _read_tail(stdout_path), _read_tail(stderr_path)
    if timed_out:
      status = "timeout"
    elif returncode == _SETUP_FAILED and "jaxloc-sandbox-setup-failed" in stderr:
      status = "sandbox_error"
    else:
      status = "passed" if returncode == 0 else "failed"
    return ProgramResult(status, returncode, stdout, stderr, time.monotonic() - start)
  finally:
    if run_uid is not None:
      _uid_pool.put(run_uid)
    shutil.rmtree(workdir, ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class Isolation:
  """A mode as probed on this machine: the namespaces its programs got of their own (compared with the
  harness's), and a one-line description of what it protects and what stays shared with the host."""

  mode: Mode
  own_namespaces: tuple[str, ...]
  description: str


def _host_namespaces() -> dict[str, str]:
  links = {}
  for kind in NAMESPACE_KINDS:
    try:
      links[kind] = os.readlink(f"/proc/self/ns/{kind}")
    except OSError:  # a kernel without this kind of namespace
      pass
  return links


def _describe(mode: Mode, own: Sequence[str]) -> str:
  """What a mode with these namespaces of its own protects, and what it leaves shared with the host."""
  child_mode, file_view = MODES[mode]
  if child_mode in ("uid_only", "none"):
    user = "an unprivileged uid" if child_mode == "uid_only" else "the caller's uid"
    return (f"{mode}: no namespaces; runs as {user}; the host's SysV IPC (shared memory, message queues, "
            "semaphores) and POSIX message queues stay reachable (what their permissions open to that uid, and "
            "what it creates stays after it), as do the host's hostname and cgroup paths; network blocked only "
            "at the Python level")
  parts = [f"{mode}: own {', '.join(kind for kind in NAMESPACE_KINDS if kind in own)} namespaces",
           "a file view" if file_view else "host files readable (mounts read-only)"]
  if "cgroup" not in own:
    parts.append("no cgroup namespace (" + ("not in this kernel" if "cgroup" not in _host_namespaces()
                                            else "refused here") + "): the host's cgroup paths show in /proc")
  return "; ".join(parts)


# Prints the program's namespaces, one "kind link" per line (the link names the namespace's inode).
_NAMESPACE_PROBE = ("import os\n"
                    f"for kind in {NAMESPACE_KINDS!r}:\n"
                    "  try:\n"
                    "    print(kind, os.readlink(f'/proc/self/ns/{kind}'))\n"
                    "  except OSError:\n"
                    "    print(kind, '-')\n")


def probe(mode: Mode) -> Isolation | None:
  """Runs one program in `mode`; its Isolation, or None where the mode does not work on this machine (or a
  namespace mode leaves one of REQUIRED_NAMESPACES shared with the host)."""
  result = _run_in_mode(_NAMESPACE_PROBE, Limits(timeout_s=20.0), mode)
  seen = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
  if not result.passed or set(seen) != set(NAMESPACE_KINDS):
    log.info("sandbox: mode %r unavailable: %s", mode, result.stderr.strip()[-500:])
    return None
  host = _host_namespaces()
  own = tuple(kind for kind in NAMESPACE_KINDS if kind in host and seen[kind] not in ("-", host[kind]))
  missing = [kind for kind in REQUIRED_NAMESPACES if kind not in own]
  if MODES[mode][0] not in ("uid_only", "none") and missing:
    log.info("sandbox: mode %r unavailable: its programs share the host's %s namespaces", mode, ", ".join(missing))
    return None
  return Isolation(mode, own, _describe(mode, own))


@functools.cache
def isolation() -> Isolation:
  """The strongest mode that works on this machine, probed once per process, with what it protects."""
  candidates: list[Mode] = (["namespaces", "namespaces_host_visible", "uid_only"] if os.geteuid() == 0
                            else ["user_namespace", "user_namespace_host_visible"])
  for mode in candidates:
    probed = probe(mode)
    if probed is not None:
      if mode not in STRONG_MODES:
        log.warning("sandbox: running generated code in the weaker mode (%s; see the jaxloc.sandbox docstring)",
                    probed.description)
      else:
        log.info("sandbox: %s", probed.description)
      return probed
  log.warning("sandbox: no isolation available (%s; see the jaxloc.sandbox docstring)", _describe("none", ()))
  return Isolation("none", (), _describe("none", ()))


def isolation_mode() -> Mode:
  """The strongest mode that works on this machine (`isolation().mode`)."""
  return isolation().mode


def run_program(source: str, limits: Limits = Limits(), *, mode: Mode | None = None
                ) -> ProgramResult:
  """Run one Python program in the sandbox; never raises for anything the program does."""
  try:
    result = _run_in_mode(source, limits, mode or isolation_mode())
    if result.status == "sandbox_error":
      log.warning("sandbox: could not run a program (%s); scored as a failure",
                  result.stderr.strip()[-300:])
    return result
  except Exception as error:  # a sandbox fault must not take the evaluation down
    log.exception("sandbox: harness error")
    return ProgramResult("sandbox_error", None, "", repr(error), 0.0)


def default_workers() -> int:
  return max(2, min(8, os.cpu_count() or 2))


def run_programs(sources: Sequence[str], limits: Limits = Limits(), *,
                 max_workers: int | None = None, mode: Mode | None = None
                 ) -> list[ProgramResult]:
  """Run many programs concurrently (bounded pool); results in the order of `sources`.

  Identical sources run once: ablation masks often leave a generation unchanged.
  """
  mode = mode or isolation_mode()
  unique_sources = list(dict.fromkeys(sources))
  workers = min(max_workers or default_workers(), UID_POOL_SIZE, max(1, len(unique_sources)))
  with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
    results = dict(zip(unique_sources,
                       pool.map(lambda source: run_program(source, limits, mode=mode),
                                unique_sources)))
  return [results[source] for source in sources]
