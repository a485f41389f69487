"""Run untrusted generated programs (mbpp / humaneval pass@1) without letting them hurt the run.

Each program runs in its own subprocess (`_child.py`, started by `runner.py`) with:
- a wall-clock timeout, after which the whole process group is SIGKILLed (the harness never waits
  longer than `timeout_s` plus cleanup, whatever the program does);
- rlimits set in the child: CPU seconds, address space, file size, process count (RLIMIT_NPROC),
  open files, no core dumps;
- a scrubbed environment (PATH, HOME, TMPDIR, LANG only) and `python -I` (no PYTHON* variables,
  no user site, no script directory on sys.path);
- its own working directory;
- and, where the OS allows, namespaces. The mode is probed once per process (`isolation_mode()`),
  strongest first:

  - `namespaces` (root, unshare() allowed: here and in CI): own network namespace with only a
    down loopback; own pid namespace with a fresh /proc (no other process visible; when its init
    dies every process in it dies, even after setsid()); own mount namespace whose root is a *file
    view* built for the program: read-only bind mounts of the interpreter's prefix, /usr and the
    /lib links, /etc/ld.so.cache and /dev/null-style devices, a size-limited private /tmp holding
    its working directory, and nothing else of the host (no home directory, no /etc/shadow, no
    checkout, no jaxloc cache). The program runs as an unprivileged uid with no capability and
    no_new_privs.
  - `user_namespace` (non-root with unprivileged user namespaces): the same namespaces and file
    view; the program keeps the caller's uid (mapped to root inside its namespace, with no
    capability outside it).
  - `namespaces_host_visible`, `user_namespace_host_visible`: the fallbacks where a file view
    cannot be built (pivot_root or bind mounts refused): the host's mounts stay visible but are
    remounted read-only, /tmp, /var/tmp, /dev/shm and /run/lock get private tmpfs; as root the
    program keeps CAP_DAC_READ_SEARCH to reach the interpreter, so it can *read* every host file.
  - `uid_only` (root, but unshare() refused, e.g. Docker's default seccomp profile): the
    unprivileged uid and capability drop; the network is blocked only at the Python level;
    world-writable directories stay writable; after the run every process of the uid is killed.
  - `none` (non-root, no user namespaces): rlimits, the scrubbed environment, the Python-level
    network block and a process-group kill only. Files the caller can write are NOT protected,
    and a program that calls setsid() can outlive its timeout.

  The Python-level block replaces `socket.socket` and friends before the program runs; code that
  goes through ctypes gets around it. `isolation_mode()` logs a warning for every mode weaker than
  the first two.

A program passes when it exits with status 0 in time. The harness never raises for anything a
program does; failures to start come back as status "sandbox_error".
"""

from __future__ import annotations

from jaxloc.sandbox.runner import (MODES, STRONG_MODES, UID_POOL, UID_POOL_SIZE, Limits, Mode, ProgramResult, Status,
                                   default_workers, isolation_mode, run_program, run_programs)

__all__ = ["MODES", "STRONG_MODES", "UID_POOL", "UID_POOL_SIZE", "Limits", "Mode", "ProgramResult", "Status",
           "default_workers", "isolation_mode", "run_program", "run_programs"]
