"""Run untrusted generated programs (mbpp / humaneval pass@1) without letting them hurt the run.

Each program runs in its own subprocess (`_child.py`, started by `runner.py`) with:
- a wall-clock timeout, after which the whole process group is SIGKILLed (the harness never waits
  longer than `timeout_s` plus cleanup, whatever the program does);
- rlimits set in the child: CPU seconds, address space, file size, process count (RLIMIT_NPROC),
  open files, no core dumps;
- a scrubbed environment (PATH, HOME, TMPDIR, LANG only) and `python -I` (no PYTHON* variables,
  no user site, no script directory on sys.path);
- its own working directory;
- a fresh session keyring and a seccomp system-call filter, in every mode (`syscall_filter`: no namespaces,
  mounts, keyrings, io_uring, bpf, perf, ptrace, modules or kexec; docs/sandbox.md has the attack table);
- and, where the OS allows, namespaces. The mode is probed once per process (`isolation()`: the
  mode, the namespaces its probe program got of its own, and a one-line description), strongest
  first:

  - `namespaces` (root, unshare() allowed: here and in CI): every namespace a program could share
    with the host is its own:
    - network: only a loopback, down;
    - pid: a fresh /proc, no other process visible; when its init dies every process in it dies,
      even after setsid();
    - IPC: SysV shared memory, message queues and semaphores, and POSIX message queues, are the
      program's own (the host's cannot be found by key or name, and what it creates dies with it);
      its shared memory is capped at its memory limit, its SysV queues and semaphores at a few MB;
    - UTS: its hostname is `HOSTNAME`, and setting it (it cannot: no capability) would change only
      its own;
    - cgroup, where the kernel allows: /proc/self/cgroup shows "/" for its own cgroup, not the
      host's paths (where refused, the other namespaces stay and the description says so);
    - mount: its root is a *file view* built for it: read-only bind mounts of the interpreter's
      prefix, /usr and the /lib links, /etc/ld.so.cache, working /dev/null, zero, full, random and
      urandom nodes, its IPC namespace's queues at /dev/mqueue, size-limited private /dev/shm and /tmp
      (the latter holding its working directory), and nothing else of the host (no home directory, no
      /etc/shadow, no checkout, no jaxloc cache).
    The program runs as an unprivileged uid with no capability and no_new_privs.
  - `user_namespace` (non-root with unprivileged user namespaces): the same namespaces and file
    view inside a user namespace; the program keeps the caller's uid (mapped to root inside its
    namespace, with no capability outside it). Where the kernel does not let a user namespace set
    its IPC limits (older kernels), the program's namespace keeps the kernel's defaults.
  - `namespaces_host_visible`, `user_namespace_host_visible`: the fallbacks where a file view
    cannot be built (pivot_root or bind mounts refused): the same namespaces, but the host's mounts
    stay visible, remounted read-only; /tmp, /var/tmp, /dev/shm and /run/lock get private tmpfs and
    /dev/mqueue the namespace's own queues; as root the program keeps CAP_DAC_READ_SEARCH to reach
    the interpreter, so it can *read* every host file.
  - `uid_only` (root, but unshare() refused, e.g. Docker's default seccomp profile): the
    unprivileged uid and capability drop, no namespaces. The network is blocked only at the Python
    level; world-writable directories stay writable; the host's SysV IPC objects and POSIX message
    queues stay reachable (those whose permissions admit any uid can be read and written, and what
    the program creates stays on the host after it), as do the host's hostname and cgroup paths.
    After the run every process of the uid is killed.
  - `none` (non-root, no user namespaces): rlimits, the scrubbed environment, the system-call filter,
    the Python-level network block and a process-group kill only. Files the caller can write are NOT
    protected, the host's IPC is reachable as in `uid_only` but with the caller's uid (its own objects
    included), and a program that calls setsid() can outlive its timeout.

  The Python-level block replaces `socket.socket` and friends before the program runs; code that
  goes through ctypes gets around it. `isolation()` logs a warning, with the description, for
  every mode weaker than the first two.

A program passes when it exits with status 0 in time. The harness never raises for anything a
program does; failures to start come back as status "sandbox_error".
"""

from __future__ import annotations

from jaxloc.sandbox.runner import (HOSTNAME, MODES, STRONG_MODES, UID_POOL, UID_POOL_SIZE, Isolation, Limits, Mode,
                                   ProgramResult, Status, default_workers, isolation, isolation_mode, probe,
                                   run_program, run_programs)

__all__ = ["HOSTNAME", "MODES", "STRONG_MODES", "UID_POOL", "UID_POOL_SIZE", "Isolation", "Limits", "Mode",
           "ProgramResult", "Status", "default_workers", "isolation", "isolation_mode", "probe", "run_program",
           "run_programs"]
