"""Attacks on the namespaces a generated program could share with the host: SysV IPC, POSIX message queues, the
hostname, cgroup paths, and (the table) every namespace's identity against the harness's own.

Each attack runs in every namespace mode this machine can run (root: `namespaces` and its host-visible fallback,
and the `user_namespace` modes, which root can enter too); the weaker modes (`uid_only`, `none`) share these with the
host by design and say so (tested at the end).
"""

import ctypes
import functools
import os
import random
import socket
import textwrap
import uuid

import pytest

from jaxloc import sandbox
from jaxloc.sandbox import runner

SHORT = sandbox.Limits(timeout_s=5.0, cpu_s=3.0, memory_bytes=512 << 20, max_processes=8)
NAMESPACE_MODES = ("namespaces", "user_namespace", "namespaces_host_visible", "user_namespace_host_visible")
NAMESPACE_KINDS = ("mnt", "pid", "net", "ipc", "uts", "cgroup")

IPC_CREAT, IPC_RMID, IPC_PRIVATE = 0o1000, 0, 0
O_RDONLY, O_RDWR, O_CREAT, O_NONBLOCK = 0, 2, 0o100, 0o4000

# The same ctypes declarations, on the host (here) and inside the program (PRELUDE).
PRELUDE = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_receive.restype = ctypes.c_ssize_t
"""
exec(PRELUDE)  # noqa: S102 - defines libc and rt here exactly as the programs get them


@functools.cache
def mode_runs(mode):
  return sandbox.run_program("print('ok')", SHORT, mode=mode).passed


@pytest.fixture(params=NAMESPACE_MODES)
def mode(request):
  if not mode_runs(request.param):
    pytest.skip(f"mode {request.param!r} cannot run on this machine (probed: {sandbox.isolation_mode()!r})")
  return request.param


def run(source, mode, limits=SHORT):
  return sandbox.run_program(PRELUDE + textwrap.dedent(source), limits, mode=mode)


def random_key():
  return random.randint(0x10000000, 0x7FFFFFFF)


def sysv_rows(kind):
  """The host's SysV IPC objects of one kind (`shm`, `msg`, `sem`) as dicts of /proc/sysvipc's columns."""
  with open(f"/proc/sysvipc/{kind}") as table:
    header, *lines = table.read().splitlines()
  return [dict(zip(header.split(), map(int, line.split()))) for line in lines]


def remove_sysv(kind, identifier):
  control = {"shm": libc.shmctl, "msg": libc.msgctl, "sem": libc.semctl}[kind]
  if kind == "sem":
    control(identifier, 0, IPC_RMID)
  else:
    control(identifier, IPC_RMID, None)


@pytest.fixture()
def host_segment():
  """A host SysV shared-memory segment (key, secret) that any uid may read and write, as a careless host
  process might leave one."""
  key, secret = random_key(), f"secret-{uuid.uuid4().hex}".encode()
  shmid = libc.shmget(key, 4096, IPC_CREAT | 0o666)
  assert shmid >= 0, os.strerror(ctypes.get_errno())
  address = libc.shmat(shmid, None, 0)
  ctypes.memmove(address, secret, len(secret))
  yield key, secret, lambda: ctypes.string_at(address, len(secret))
  libc.shmdt(ctypes.c_void_p(address))
  libc.shmctl(shmid, IPC_RMID, None)


def test_host_shared_memory_is_neither_readable_nor_writable(mode, host_segment):
  key, secret, host_contents = host_segment
  result = run(f"""
      shmid = libc.shmget({key}, 0, 0)
      if shmid >= 0:  # the host's segment: read it and overwrite it
        address = libc.shmat(shmid, None, 0)
        print("read", ctypes.string_at(address, {len(secret)}))
        ctypes.memmove(address, b"pwned", 5)
      else:
        print("no segment with the host's key:", errno.errorcode[ctypes.get_errno()])
      # The program may make a segment with that key: it must be its own.
      own = libc.shmget({key}, 4096, 0o1000 | 0o600)
      assert own >= 0, ctypes.get_errno()
      ctypes.memmove(libc.shmat(own, None, 0), b"own segment", 11)
      """, mode)
  assert result.passed, result.stderr
  assert secret.decode() not in result.stdout, result.stdout
  assert host_contents() == secret


def test_ipc_objects_the_program_creates_do_not_reach_the_host(mode):
  keys = {"shm": random_key(), "msg": random_key(), "sem": random_key()}
  private_size = 4096 * 37 + 123  # a size to find the key-less (IPC_PRIVATE) segment by
  result = run(f"""
      created = [libc.shmget({keys['shm']}, 4096, 0o1000 | 0o600), libc.shmget(0, {private_size}, 0o1000 | 0o600),
                 libc.msgget({keys['msg']}, 0o1000 | 0o600), libc.semget({keys['sem']}, 3, 0o1000 | 0o600)]
      print(created)
      assert min(created) >= 0, errno.errorcode[ctypes.get_errno()]  # SysV IPC works inside, in its own namespace
      """, mode)
  leaked = [(kind, row) for kind in keys for row in sysv_rows(kind)
            if row["key"] == keys[kind] or (kind == "shm" and row["size"] == private_size)]
  for kind, row in leaked:  # leave the host as it was, then fail
    remove_sysv(kind, row[{"shm": "shmid", "msg": "msqid", "sem": "semid"}[kind]])
  assert result.passed, result.stderr
  assert not leaked, leaked


def test_host_posix_message_queue_is_not_reachable(mode):
  name, own_name = f"/jaxloc-test-{uuid.uuid4().hex}".encode(), f"/jaxloc-test-{uuid.uuid4().hex}".encode()
  secret = f"secret-{uuid.uuid4().hex}".encode()
  queue = rt.mq_open(name, O_CREAT | O_RDWR | O_NONBLOCK, 0o666, None)
  assert queue >= 0, os.strerror(ctypes.get_errno())
  os.fchmod(queue, 0o666)  # open to every uid (mq_open's mode went through the umask)
  try:
    assert rt.mq_send(queue, secret, len(secret), 0) == 0
    result = run(f"""
        queue = rt.mq_open({name!r}, {O_RDWR | O_NONBLOCK})
        if queue >= 0:  # the host's queue: take its message and leave another
          buffer = ctypes.create_string_buffer(1 << 16)
          length = rt.mq_receive(queue, buffer, len(buffer), None)
          print("read", buffer.raw[:length])
          rt.mq_send(queue, b"pwned", 5, 0)
        else:
          print("no queue with the host's name:", errno.errorcode[ctypes.get_errno()])
        assert rt.mq_open({own_name!r}, {O_CREAT | O_RDWR}, 0o600, None) >= 0, ctypes.get_errno()
        import os
        print("listed", sorted(os.listdir("/dev/mqueue")) if os.path.isdir("/dev/mqueue") else None)
        """, mode)
    assert result.passed, result.stderr
    assert secret.decode() not in result.stdout, result.stdout
    # /dev/mqueue, where the program has one, lists its own queues, not the host's.
    listed = eval(result.stdout.split("listed", 1)[1])
    if sandbox.MODES[mode][1] or os.path.ismount("/dev/mqueue"):
      assert listed == [own_name.decode()[1:]]
    else:
      assert listed is None or name.decode()[1:] not in listed
    buffer = ctypes.create_string_buffer(1 << 16)
    length = rt.mq_receive(queue, buffer, len(buffer), None)
    assert buffer.raw[:length] == secret
    assert rt.mq_receive(queue, buffer, len(buffer), None) == -1  # nothing else was left in it
    assert rt.mq_open(own_name, O_RDONLY) == -1, "the program's own queue appeared on the host"
  finally:
    rt.mq_close(queue)
    rt.mq_unlink(name)
    rt.mq_unlink(own_name)


def test_hostname_is_the_sandboxs_own(mode):
  host_name = socket.gethostname()
  result = run("""
      import socket
      attempt = libc.sethostname(b"jaxloc-pwned", 12)
      print(attempt, socket.gethostname())
      """, mode)
  assert result.passed, result.stderr
  assert socket.gethostname() == host_name
  seen = result.stdout.split()[-1]
  assert seen != host_name and seen == sandbox.HOSTNAME


def test_cgroup_paths_are_namespaced(mode):
  if not os.path.exists("/proc/self/ns/cgroup"):
    pytest.skip("this kernel has no cgroup namespaces")
  result = run("print(open('/proc/self/cgroup').read())", mode)
  assert result.passed, result.stderr
  lines = result.stdout.strip().splitlines()
  assert lines and all(line.split(":", 2)[2] == "/" for line in lines), lines


@pytest.mark.parametrize("kind", NAMESPACE_KINDS)
def test_every_namespace_is_the_programs_own(mode, kind):
  if not os.path.exists(f"/proc/self/ns/{kind}"):
    pytest.skip(f"this kernel has no {kind} namespaces")
  result = run(f"import os; print(os.readlink('/proc/self/ns/{kind}'))", mode)
  assert result.passed, result.stderr
  assert result.stdout.strip() != os.readlink(f"/proc/self/ns/{kind}")


def test_shared_memory_is_bounded_by_the_memory_limit(mode):
  """A new IPC namespace starts with the kernel's default limits (shared memory practically unbounded): segments
  would hold memory outside RLIMIT_AS until the program dies."""
  memory = SHORT.memory_bytes
  result = run(f"""
      too_big = libc.shmget(0, {memory + 4096}, 0o1000 | 0o600)
      first = libc.shmget(0, {memory * 3 // 5}, 0o1000 | 0o600)
      second = libc.shmget(0, {memory * 3 // 5}, 0o1000 | 0o600)
      print(too_big, first >= 0, second)
      """, mode)
  assert result.passed, result.stderr
  assert result.stdout.split() == ["-1", "True", "-1"]


def test_weaker_modes_say_that_the_hosts_ipc_stays_reachable(monkeypatch, caplog):
  for mode in ("uid_only", "none"):
    description = sandbox.probe(mode).description
    assert sandbox.probe(mode).own_namespaces == ()
    for shared in ("SysV IPC", "POSIX message queues", "hostname", "cgroup"):
      assert shared in description, description
  # Where only uid_only works, the warning says so.
  monkeypatch.setattr(runner, "probe", lambda mode: None if mode != "uid_only" else runner.Isolation(
      "uid_only", (), runner._describe("uid_only", ())))
  with caplog.at_level("WARNING", logger=runner.log.name):
    assert runner.isolation.__wrapped__().mode == "uid_only"
  assert "weaker mode" in caplog.text and "SysV IPC" in caplog.text and "POSIX message queues" in caplog.text


def test_a_mode_without_a_cgroup_namespace_says_so():
  """Where the kernel refuses a cgroup namespace the child goes on without one; the description records it."""
  own = tuple(kind for kind in runner.NAMESPACE_KINDS if kind != "cgroup")
  description = runner._describe("namespaces", own)
  assert "no cgroup namespace" in description and "host's cgroup paths" in description
  assert "no cgroup namespace" not in runner._describe("namespaces", runner.NAMESPACE_KINDS)


def test_the_probed_mode_has_every_required_namespace_of_its_own():
  probed = sandbox.isolation()
  if probed.mode in ("uid_only", "none"):
    pytest.skip(f"no namespaces on this machine ({probed.description})")
  assert set(runner.REQUIRED_NAMESPACES) <= set(probed.own_namespaces), probed.description
  assert probed.mode in probed.description
