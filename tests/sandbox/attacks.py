"""The system-call attacks on the sandbox: one program runs each attack in a forked child and reports what the
kernel answered. tests/sandbox/test_syscall_filter.py asserts every answer in every mode this machine can run, and
docs/sandbox.md holds `expected_table()` (a test checks that it is the page's table).

    python -m tests.sandbox.attacks [MODE ...]   # the table of what each mode answers on this machine
"""

from __future__ import annotations

import dataclasses
import json
import textwrap

from jaxloc import sandbox
from jaxloc.sandbox import syscall_filter


@dataclasses.dataclass(frozen=True)
class Attack:
  name: str
  calls: str  # the system calls it makes, as the table shows them
  source: str  # the body of a function that makes them: returns what it got, raises OSError when refused
  refused_with: str = "EPERM"  # what the filter answers
  arch: str | None = None  # the one architecture it applies to


I386_ATTACK = "the i386 table from a 64-bit process"
ATTACKS = (
    Attack("nested user namespace, then a tmpfs mount", "`unshare(CLONE_NEWUSER \\| CLONE_NEWNS)`, `mount`", """
        check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare")
        mounted = libc.mount(b"none", own_directory(), b"tmpfs", 0, None) == 0
        return "namespace made, tmpfs " + ("mounted" if mounted else "refused")"""),
    Attack("child in a new user namespace", "`clone(CLONE_NEWUSER)`", """
        return "child " + str(reap(call("clone", CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)))"""),
    Attack("child in a new user namespace, by clone3", "`clone3(CLONE_NEWUSER)`", """
        args = ctypes.create_string_buffer(struct.pack("=8Q", CLONE_NEWUSER, 0, 0, 0, signal.SIGCHLD, 0, 0, 0))
        return "child " + str(reap(call("clone3", args, 64)))""", refused_with="ENOSYS"),
    Attack("join a namespace", "`setns`", """
        call("setns", os.open("/proc/self/ns/uts", os.O_RDONLY), 0)
        return "joined\""""),
    Attack("mount a tmpfs", "`mount`", """
        check(libc.mount(b"none", own_directory(), b"tmpfs", 0, None), "mount")
        return "mounted\""""),
    Attack("mount a tmpfs, new mount API", "`fsopen`", """
        return "fs context " + str(call("fsopen", b"tmpfs", 0))"""),
    Attack("change root", "`chroot`", """
        check(libc.chroot(own_directory()), "chroot")
        return "chrooted\""""),
    Attack("write the uid's user keyring", "`add_key(@u)`", """
        return "key " + str(call("add_key", b"user", b"jaxloc-attack", b"secret", 6, KEY_SPEC_USER_KEYRING))"""),
    Attack("read the session keyring", "`keyctl(KEYCTL_GET_KEYRING_ID, @s)`", """
        return "keyring " + str(call("keyctl", 0, KEY_SPEC_SESSION_KEYRING, 1))"""),
    Attack("ask for a key", "`request_key`", """
        return "key " + str(call("request_key", b"user", b"jaxloc-none", None, 0))"""),
    Attack("io_uring instance", "`io_uring_setup`", """
        return "ring fd " + str(call("io_uring_setup", 8, ctypes.create_string_buffer(120)))"""),
    Attack("eBPF map", "`bpf(BPF_MAP_CREATE)`", """
        attr = ctypes.create_string_buffer(struct.pack("=4I", 2, 4, 4, 1) + bytes(56))  # an array, 1 entry
        return "map fd " + str(call("bpf", 0, attr, 72))"""),
    Attack("performance counter", "`perf_event_open`", """
        attr = ctypes.create_string_buffer(struct.pack("=IIQQQQQIIQ", 1, 64, 0, 0, 0, 0, 0x60, 0, 0, 0))
        return "event fd " + str(call("perf_event_open", attr, 0, -1, -1, 0))"""),
    Attack("userfaultfd", "`userfaultfd(UFFD_USER_MODE_ONLY)`", """
        return "fd " + str(call("userfaultfd", os.O_CLOEXEC | 1))"""),
    Attack("trace itself", "`ptrace(PTRACE_TRACEME)`", """
        check(libc.ptrace(0, 0, None, None), "ptrace")
        return "traced\""""),
    Attack("read process memory", "`process_vm_readv`", """
        source, target = ctypes.create_string_buffer(b"secret"), ctypes.create_string_buffer(6)
        local = struct.pack("=QQ", ctypes.addressof(target), 6)
        remote = struct.pack("=QQ", ctypes.addressof(source), 6)
        return "read " + str(call("process_vm_readv", os.getpid(), local, 1, remote, 1, 0)) + " bytes\""""),
    Attack("open a process by its pid", "`pidfd_open`", """
        return "pidfd " + str(call("pidfd_open", os.getpid(), 0))"""),
    Attack("take a file descriptor from a process", "`pidfd_getfd`", """
        try:
          pidfd = os.pidfd_open(os.getpid())  # refused too, where the filter is: then the call below is tried alone
        except OSError:
          pidfd = -1
        return "fd " + str(call("pidfd_getfd", pidfd, 0, 0))"""),
    Attack("open a file by its handle", "`open_by_handle_at`", """
        handle = ctypes.create_string_buffer(struct.pack("=Ii", 128, 0) + bytes(128))
        libc.name_to_handle_at(-100, b"/usr", handle, ctypes.byref(ctypes.c_int()), 0)
        return "fd " + str(call("open_by_handle_at", os.open("/usr", os.O_RDONLY), handle, os.O_RDONLY))"""),
    Attack("load a kernel module", "`init_module`", """
        return str(call("init_module", None, 0, b""))"""),
    Attack("load a kernel module from a file", "`finit_module`", """
        return str(call("finit_module", -1, b"", 0))"""),
    Attack("unload a kernel module", "`delete_module`", """
        return str(call("delete_module", b"jaxloc_none", 0))"""),
    Attack("load a new kernel", "`kexec_load`", """
        return str(call("kexec_load", 0, 17, None, 0))"""),  # 17 segments: invalid, should it get through
    Attack("load a new kernel from a file", "`kexec_file_load`", """
        return str(call("kexec_file_load", -1, -1, 0, b"", 0))"""),
    Attack(I386_ATTACK, "`int 0x80` (getpid)", """
        return "getpid gave " + str(machine_code(b"\\xb8\\x14\\x00\\x00\\x00\\xcd\\x80\\x48\\x98\\xc3"))""",
           refused_with="killed (SIGSYS)", arch="x86_64"),
    Attack("the x32 table", "`syscall` with `__X32_SYSCALL_BIT` (getpid)", """
        return "getpid gave " + str(machine_code(b"\\xb8\\x27\\x00\\x00\\x40\\x0f\\x05\\xc3"))""", arch="x86_64"),
)

# Runs inside the sandbox (standard library only); NUMBERS and the attack functions are filled in.
_PRELUDE = """
import ctypes, errno, json, mmap, os, signal, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NUMBERS = {numbers!r}
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4

def check(result, what):
  if result < 0:
    raise OSError(ctypes.get_errno(), what)
  return result

def call(name, *args):
  args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
  return check(libc.syscall(NUMBERS[name], *args), name)

def own_directory():  # what a mount or chroot that got through touches (in mode none as root: the host's)
  path = "target-%d" % os.getpid()
  os.mkdir(path)
  return path.encode()

def reap(pid):
  if pid == 0:
    os._exit(0)
  os.waitpid(pid, 0)
  return pid

def machine_code(code):
  memory = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
  memory.write(code)
  result = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(memory)))()
  if result < 0:
    raise OSError(-result, "machine code")
  return result
"""
_PROGRAM_RUN = """
{functions}

results = {{}}
for name, attack in ATTACKS:
  read_end, write_end = os.pipe()
  pid = os.fork()
  if pid == 0:
    try:
      outcome = "allowed: " + attack()
    except OSError as error:
      outcome = errno.errorcode.get(error.errno, str(error.errno))
    except Exception as error:
      outcome = "error: " + repr(error)
    os.write(write_end, outcome.encode())
    os._exit(0)
  os.close(write_end)
  _, status = os.waitpid(pid, 0)
  with os.fdopen(read_end, "rb") as answer:
    outcome = answer.read().decode()
  if os.WIFSIGNALED(status):
    outcome = "killed (" + signal.Signals(os.WTERMSIG(status)).name + ")"
  results[name] = outcome
print(json.dumps(results))
"""
LIMITS = sandbox.Limits(timeout_s=20.0, cpu_s=10.0, memory_bytes=1 << 30, max_processes=8)


def applicable(arch: str | None = None) -> tuple[Attack, ...]:
  arch = arch or syscall_filter.machine()
  return tuple(attack for attack in ATTACKS if attack.arch in (None, arch))


def program(arch: str | None = None) -> str:
  attacks = applicable(arch)
  functions = "\n".join(_function(f"attack_{i}", attack) for i, attack in enumerate(attacks))
  table = ", ".join(f"({attack.name!r}, attack_{i})" for i, attack in enumerate(attacks))
  return program_prelude(arch) + _PROGRAM_RUN.format(functions=functions + f"\n\nATTACKS = [{table}]")


def _function(name: str, attack: Attack) -> str:
  return f"def {name}():\n" + textwrap.indent(textwrap.dedent(attack.source).strip("\n"), "  ") + "\n"


def program_prelude(arch: str | None = None) -> str:
  """The helpers every attack uses (`call`, `check`, `machine_code`, ...), with the numbers of `arch`."""
  return _PRELUDE.format(numbers=syscall_filter.numbers(arch or syscall_filter.machine()))


def run(mode: str) -> dict[str, str]:
  """What the kernel answered each applicable attack in `mode`, by attack name ("allowed: ..." where it went
  through, an errno name, or "killed (SIGNAL)")."""
  result = sandbox.run_program(program(), LIMITS, mode=mode)
  if not result.passed:
    raise RuntimeError(f"the attack program did not run in mode {mode!r}: {result.status} {result.stderr[-2000:]}")
  return json.loads(result.stdout.strip().splitlines()[-1])


def i386_table_available() -> bool:
  """Whether this kernel runs i386 calls from a 64-bit process at all (without IA32 emulation `int 0x80` is a
  SIGSEGV, filter or not); tried in a subprocess of the harness, unfiltered."""
  import subprocess
  import sys

  attack = next(attack for attack in ATTACKS if attack.name == I386_ATTACK)
  source = program_prelude("x86_64") + _function("attack", attack) + "\nprint(attack())\n"
  tried = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=60)
  return tried.returncode == 0 and tried.stdout.startswith("getpid gave")


def expected_table() -> str:
  """The attacks and what the filter answers each, as docs/sandbox.md shows them."""
  lines = ["| attack | system calls | the filter answers |", "|---|---|---|"]
  for attack in ATTACKS:
    arch = f" ({attack.arch} only)" if attack.arch else ""
    lines.append(f"| {attack.name}{arch} | {attack.calls} | {attack.refused_with} |")
  return "\n".join(lines)


def observed_table(results: dict[str, dict[str, str]]) -> str:
  """What each mode answered (`results`: mode -> run(mode)), one column per mode."""
  modes = list(results)
  lines = ["| attack | system calls | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
  for attack in applicable():
    lines.append(f"| {attack.name} | {attack.calls} | "
                 + " | ".join(results[mode].get(attack.name, "-") for mode in modes) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  import sys

  observed = {}
  for mode in sys.argv[1:] or sandbox.MODES:
    try:
      observed[mode] = run(mode)
    except RuntimeError as error:
      print(f"mode {mode}: {error}")
  print(observed_table(observed))
