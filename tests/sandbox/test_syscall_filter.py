"""The system-call filter and the fresh session keyring (jaxloc/sandbox/syscall_filter.py): the filter as a program
(run by a small classic-BPF interpreter here, for both architectures), its numbers against the kernel headers, and
every attack of tests/sandbox/attacks.py in every mode this machine can run."""

import ctypes
import errno
import functools
import os
import queue
import re
import struct
import subprocess
import sys
import textwrap
import uuid

import pytest

from jaxloc import sandbox
from jaxloc.sandbox import runner, syscall_filter
from tests.sandbox import attacks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHORT = sandbox.Limits(timeout_s=10.0, cpu_s=5.0, memory_bytes=512 << 20, max_processes=8)
ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
HEADERS = {"x86_64": ("/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h"),
           "aarch64": ("/usr/include/asm-generic/unistd.h",)}
# A few calls every program makes, which the filter must allow.
ORDINARY = {"x86_64": {"read": 0, "write": 1, "openat": 257, "mmap": 9, "exit_group": 231, "getrandom": 318},
            "aarch64": {"read": 63, "write": 64, "openat": 56, "mmap": 222, "exit_group": 94, "getrandom": 278}}
CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
# What glibc passes for a thread and for fork (the exit signal, SIGCHLD, sits in the low byte).
THREAD_FLAGS, FORK_FLAGS = 0x3D0F00, 0x01200011


def evaluate(program, arch, number, arg0=0):
  """What `program` (syscall_filter.instructions) answers a call: a classic-BPF interpreter for the instructions the
  filter uses, over a seccomp_data built here."""
  data = struct.pack("=iIQ6Q", number, syscall_filter.AUDIT_ARCH.get(arch, 0x40000003), 0, arg0, 0, 0, 0, 0, 0)
  accumulator, pc = 0, 0
  while True:
    code, jump_true, jump_false, constant = program[pc]
    if code == 0x20:  # load a word of seccomp_data
      accumulator = struct.unpack_from("=I", data, constant)[0]
      pc += 1
    elif code == 0x06:
      return constant
    else:
      taken = {0x15: accumulator == constant, 0x35: accumulator >= constant, 0x45: bool(accumulator & constant)}[code]
      pc += 1 + (jump_true if taken else jump_false)


@pytest.mark.parametrize("arch", sorted(syscall_filter.SYSCALLS))
def test_the_filter_refuses_what_it_lists_and_allows_the_rest(arch):
  program = syscall_filter.instructions(arch)
  numbers = syscall_filter.SYSCALLS[arch]
  for name in syscall_filter.REFUSED_CALLS:
    assert evaluate(program, arch, numbers[name]) == EPERM, name
  for name, number in ORDINARY[arch].items():
    assert evaluate(program, arch, number) == ALLOW, name
  clone = numbers["clone"]
  for flags in (CLONE_NEWUSER, CLONE_NEWNET | FORK_FLAGS, CLONE_NEWNS | THREAD_FLAGS):
    assert evaluate(program, arch, clone, flags) == EPERM, hex(flags)
  for flags in (THREAD_FLAGS, FORK_FLAGS, 0x80 | FORK_FLAGS):  # 0x80 is part of the exit signal, not CLONE_NEWTIME
    assert evaluate(program, arch, clone, flags) == ALLOW, hex(flags)
  assert evaluate(program, arch, numbers["clone3"]) == ENOSYS  # glibc falls back to clone
  other = "aarch64" if arch == "x86_64" else "x86_64"
  assert evaluate(program, other, ORDINARY[arch]["read"]) == KILL  # another architecture's table
  assert program[-1] == (0x06, 0, 0, ALLOW)
  assert all(pc + 1 + max(jump_true, jump_false) < len(program) and max(jump_true, jump_false) < 256
             for pc, (code, jump_true, jump_false, _) in enumerate(program) if code not in (0x06, 0x20))


def test_x32_numbers_are_refused():
  program = syscall_filter.instructions("x86_64")
  assert evaluate(program, "x86_64", syscall_filter.X32_SYSCALL_BIT | ORDINARY["x86_64"]["read"]) == EPERM


def test_an_unknown_architecture_has_no_filter():
  with pytest.raises(syscall_filter.UnknownArchitecture, match="riscv64"):
    syscall_filter.instructions("riscv64")


def test_on_an_unknown_architecture_the_child_says_so_in_one_setup_line():
  """The child's last step (`_child._restrict_system_calls`) on a machine with no table: the one-line setup failure
  (exit status SETUP_FAILED), no traceback; in a subprocess, as the child itself runs."""
  child = os.path.join(ROOT, "jaxloc", "sandbox", "_child.py")
  code = textwrap.dedent(f"""
      import importlib.util
      spec = importlib.util.spec_from_file_location("child", {child!r})
      child = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(child)
      child.syscall_filter.machine = lambda: "riscv64"
      child._restrict_system_calls()
      """)
  result = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60)
  assert result.returncode == 111, result.stderr  # _child.SETUP_FAILED
  assert result.stderr.splitlines() == [
      "jaxloc-sandbox-setup-failed: system-call filter: no system-call filter for architecture 'riscv64' (known: "
      "x86_64, aarch64): "]


@pytest.mark.parametrize("arch", sorted(syscall_filter.SYSCALLS))
def test_the_numbers_are_the_kernel_headers(arch):
  header = next((path for path in HEADERS[arch] if os.path.exists(path)), None)
  if header is None:
    pytest.skip(f"no {arch} kernel headers here")
  with open(header) as text:
    defined = {name: int(number) for name, number in re.findall(r"#define __NR_(\w+)\s+(\d+)\b", text.read())}
  checked = {name: number for name, number in syscall_filter.SYSCALLS[arch].items() if name in defined}
  assert checked == {name: defined[name] for name in checked}
  assert len(checked) >= len(syscall_filter.SYSCALLS[arch]) - 1  # headers older than open_tree_attr lack it


@functools.cache
def mode_runs(mode):
  return sandbox.run_program("print('ok')", SHORT, mode=mode).passed


@pytest.fixture(params=list(sandbox.MODES))
def mode(request):
  if not mode_runs(request.param):
    pytest.skip(f"mode {request.param!r} cannot run on this machine (probed: {sandbox.isolation_mode()!r})")
  return request.param


i386_table_available = functools.cache(attacks.i386_table_available)


def test_every_attack_is_refused(mode):
  answers = attacks.run(mode)
  expected = {attack.name: attack.refused_with for attack in attacks.applicable()}
  if attacks.I386_ATTACK in expected and not i386_table_available():  # no IA32 emulation: SIGSEGV either way
    expected[attacks.I386_ATTACK] = answers[attacks.I386_ATTACK] = "no i386 table in this kernel"
  assert answers == expected


def test_the_docs_table_is_the_attack_list():
  with open(os.path.join(ROOT, "docs", "sandbox.md"), encoding="utf-8") as page:
    assert attacks.expected_table() in page.read(), "regenerate with: python -c 'from tests.sandbox import " \
                                                    "attacks; print(attacks.expected_table())'"


def run(source, mode):
  prelude = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.syscall.restype = ctypes.c_long\n"
  return sandbox.run_program(prelude + textwrap.dedent(source), SHORT, mode=mode)


def test_a_key_one_program_writes_is_not_read_by_the_next_with_its_uid(mode, monkeypatch):
  """The 64-uid pool wraps: the later program gets the same uid, whose user keyring outlives every program."""
  if mode not in ("namespaces", "namespaces_host_visible", "uid_only"):
    pytest.skip("no uid switch in this mode: its programs have the caller's uid (or a user namespace's own)")
  one_uid = queue.Queue()
  one_uid.put(runner.UID_POOL[0])
  monkeypatch.setattr(runner, "_uid_pool", one_uid)
  secret = f"jaxloc-leak-{uuid.uuid4().hex}"
  write = run(f"""
      serial = libc.syscall({syscall_filter.SYSCALLS[syscall_filter.machine()]['add_key']}, b"user", b"{secret}",
                            b"payload", ctypes.c_long(7), ctypes.c_long(-4))  # the uid's user keyring
      print(serial, ctypes.get_errno())
      """, mode)
  read = run(f"print(sum('{secret}' in line for line in open('/proc/keys')))", mode)
  assert write.passed and read.passed, write.stderr + read.stderr
  assert write.stdout.split() == ["-1", str(errno.EPERM)]
  assert read.stdout.strip() == "0"


def test_the_harness_session_keyring_is_not_the_programs(mode):
  """A key in the harness's session keyring that only its possessors may see: the program, with a fresh session
  keyring, does not possess it (with the harness's keyring it would, and /proc/keys would list it)."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  numbers = syscall_filter.SYSCALLS[syscall_filter.machine()]
  description = f"jaxloc-harness-{uuid.uuid4().hex}"
  serial = libc.syscall(numbers["add_key"], b"user", description.encode(), b"secret", ctypes.c_long(6),
                        ctypes.c_long(-3))
  if serial < 0:
    pytest.skip(f"no keyrings here: {os.strerror(ctypes.get_errno())}")
  try:
    assert libc.syscall(numbers["keyctl"], ctypes.c_long(5), ctypes.c_long(serial), ctypes.c_long(0x3F000000)) == 0
    with open("/proc/keys") as keys:
      assert description in keys.read()  # the harness possesses it
    result = run(f"print(sum('{description}' in line for line in open('/proc/keys')))", mode)
    assert result.passed, result.stderr
    assert result.stdout.strip() == "0"
  finally:
    libc.syscall(numbers["keyctl"], ctypes.c_long(21), ctypes.c_long(serial))  # KEYCTL_INVALIDATE
