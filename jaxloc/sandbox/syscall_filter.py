"""The system-call filter of a generated program: a classic-BPF seccomp program that refuses the calls a
Python program never needs and a kernel attack usually does.

Standard library only: `_child.py` loads this file by path (it runs where jaxloc need not be importable) and
installs the filter in the program's process, after its own setup (capabilities, uid, rlimits) and right before
the program runs; every process the program starts inherits it. The filter:

- refuses (EPERM) namespace creation and entry (`unshare`, `setns`, and `clone` with any CLONE_NEW* flag): a
  nested user namespace would hand the program every capability over namespaces of its own, and with them the
  kernel's mount, network and keyring code;
- refuses mounts (old and new mount API), `chroot`, `pivot_root`;
- refuses the kernel keyrings (`keyctl`, `add_key`, `request_key`): a key left in a uid's user keyring would be
  read by the next program that gets that uid from the pool (the child also gives each program a fresh session
  keyring, `join_fresh_session_keyring`);
- refuses io_uring, `bpf`, `perf_event_open`, `userfaultfd` (large kernel attack surfaces), `ptrace`,
  `process_vm_readv`/`writev` and `pidfd_open`/`pidfd_getfd` (another process's memory or file descriptors),
  `open_by_handle_at` (reads any file by handle, past the file view, wherever the program holds
  CAP_DAC_READ_SEARCH), and the kernel module and kexec calls;
- answers `clone3` with ENOSYS rather than EPERM: its flags sit in memory, out of a filter's reach, and ENOSYS makes
  glibc (threads, posix_spawn) fall back to `clone`, whose flags the filter checks;
- kills the process on a call from another architecture's table (the i386 `int 0x80` entry on x86_64, whose
  numbers differ) and refuses x86_64's x32 numbers (`__X32_SYSCALL_BIT`), so no second table slips past the
  checks.

The numbers are the kernel's for x86_64 and aarch64 (`SYSCALLS`; tests/sandbox checks them against the kernel
headers where present); the filter cannot be built for another architecture (`UnknownArchitecture`), and there no
program runs.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

# AUDIT_ARCH_* of <linux/audit.h>: the value seccomp_data.arch holds for each table.
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}
X32_SYSCALL_BIT = 0x40000000
# Every CLONE_NEW* flag clone() takes (CLONE_NEWTIME, 0x80, only unshare and clone3 take: in clone's flags that bit
# is part of the exit signal).
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# The refused calls, grouped by what they would give a program.
REFUSED = {
    "namespaces": ("unshare", "setns"),
    "mounts": ("mount", "umount2", "pivot_root", "chroot", "open_tree", "open_tree_attr", "move_mount", "fsopen",
               "fsconfig", "fsmount", "fspick", "mount_setattr"),
    "keyrings": ("keyctl", "add_key", "request_key"),
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "bpf and perf": ("bpf", "perf_event_open", "userfaultfd"),
    "tracing": ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open", "pidfd_getfd"),
    "file handles": ("open_by_handle_at",),
    "kernel modules and kexec": ("init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load"),
}
REFUSED_CALLS = tuple(name for names in REFUSED.values() for name in names)

# System-call numbers (<asm/unistd_64.h> on x86_64, <asm-generic/unistd.h> on aarch64).
SYSCALLS = {
    "x86_64": {
        "clone": 56, "clone3": 435, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
        "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467, "keyctl": 250, "add_key": 248,
        "request_key": 249, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321,
        "perf_event_open": 298, "userfaultfd": 323, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "pidfd_open": 434, "pidfd_getfd": 438, "open_by_handle_at": 304,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320},
    "aarch64": {
        "clone": 220, "clone3": 435, "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
        "chroot": 51, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467, "keyctl": 219, "add_key": 217,
        "request_key": 218, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280,
        "perf_event_open": 241, "userfaultfd": 282, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "pidfd_open": 434, "pidfd_getfd": 438, "open_by_handle_at": 265,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294},
}

# Classic BPF (<linux/filter.h>) and seccomp (<linux/seccomp.h>) constants.
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (args little-endian: the arch check ensures it)
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
KEYCTL_JOIN_SESSION_KEYRING = 1


class UnknownArchitecture(Exception):
  """No system-call table for this machine's architecture."""


def machine() -> str:
  name = os.uname().machine  # platform.machine(), without importing platform
  return MACHINE_ALIASES.get(name, name)


def numbers(arch: str) -> dict[str, int]:
  """The system-call numbers of `arch`; UnknownArchitecture off x86_64 and aarch64."""
  if arch not in SYSCALLS:
    raise UnknownArchitecture(f"no system-call filter for architecture {arch!r} (known: {', '.join(SYSCALLS)})")
  return SYSCALLS[arch]


def instructions(arch: str) -> list[tuple[int, int, int, int]]:
  """The filter for `arch` as (code, jump if true, jump if false, constant) instructions."""
  numbers_of = numbers(arch)
  refuse = (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)
  program = [(_LD_W_ABS, 0, 0, _ARCH), (_JEQ_K, 1, 0, AUDIT_ARCH[arch]), (_RET_K, 0, 0, _RET_KILL_PROCESS),
             (_LD_W_ABS, 0, 0, _NR)]
  if arch == "x86_64":
    program += [(_JGE_K, 0, 1, X32_SYSCALL_BIT), refuse]
  program += [(_JEQ_K, 0, 1, numbers_of["clone3"]), (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),
              # clone: load its flags (the low word holds every CLONE_NEW* bit) and decide here.
              (_JEQ_K, 0, 4, numbers_of["clone"]), (_LD_W_ABS, 0, 0, _ARG0_LOW), (_JSET_K, 0, 1, CLONE_NEW_FLAGS),
              refuse, (_RET_K, 0, 0, _RET_ALLOW)]
  for name in REFUSED_CALLS:
    program += [(_JEQ_K, 0, 1, numbers_of[name]), refuse]
  return program + [(_RET_K, 0, 0, _RET_ALLOW)]


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install(arch: str | None = None) -> None:
  """Install the filter on the calling thread (and everything it starts); needs no_new_privs or
  CAP_SYS_ADMIN. Raises OSError when the kernel refuses it, UnknownArchitecture off x86_64 and aarch64."""
  program = instructions(arch or machine())
  code = b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
  libc = ctypes.CDLL(None, use_errno=True)
  fprog = _SockFprog(len(program), code)
  if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
    number = ctypes.get_errno()
    raise OSError(number, f"seccomp filter: {errno.errorcode.get(number, number)}")


def join_fresh_session_keyring() -> int:
  """Give the calling process a new, empty, anonymous session keyring (the one it inherited stays with its parent);
  its serial. Raises OSError when the kernel refuses (keyrings compiled out, or keyctl refused by a host policy:
  then the program cannot reach any keyring either)."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  serial = libc.syscall(numbers(machine())["keyctl"], KEYCTL_JOIN_SESSION_KEYRING, None)
  if serial < 0:
    number = ctypes.get_errno()
    raise OSError(number, f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {errno.errorcode.get(number, number)}")
  return serial
