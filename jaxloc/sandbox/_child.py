"""The process that jaxloc.sandbox (runner.py) starts for one untrusted program.

Run as `python -I _child.py CONFIG_JSON`; standard library only, because it runs in a
scrubbed environment where jaxloc need not be importable. It sets up isolation and then runs the
program in-process with `runpy`, so no second interpreter start is paid.

Process tree in the namespace modes (the package docstring describes all modes and their fallbacks):

    launcher (this file; new session; new mount, network, IPC, UTS and cgroup namespaces, and a pid
             namespace for its children; sets the hostname and the IPC namespace's limits)
      └─ init (pid 1 of the new pid namespace; mounts a fresh /proc; enters the file view; reaps;
               runs no user code)
           └─ program (drops capabilities and, as root, its uid; sets rlimits; joins a fresh session
                       keyring; installs the system-call filter of syscall_filter.py; runs the code)

With a file view (`config["file_view"]`, the default wherever namespaces work) the launcher builds the
program's whole file system before forking init: a fresh tmpfs root holding read-only bind mounts of
what the interpreter needs (its prefix, /usr and the /lib links, /etc/ld.so.cache, a few /dev nodes
that work as devices), the IPC namespace's own POSIX message queues at /dev/mqueue, size-limited
writable /dev/shm and /tmp (the latter for the program's directory), and a mount point for the fresh
/proc. Init mounts that /proc and only then pivots into the root and detaches the host's: in a user
namespace the kernel mounts a new proc only while the mount namespace still holds a fully visible one
(the host's). Nothing else of the host exists there: no home directories, no /etc/shadow, no checkout,
no cache, no other process. The program then needs no capability at all. Without a file view (the
fallback) the host's mounts stay visible, read-only, with private tmpfs on the world-writable
directories and the namespace's own queues over /dev/mqueue.

The harness kills the launcher's process group on timeout. The init process is in that group;
the untrusted code cannot move it out (only init or its parent can change its group) nor kill it
(pid 1 of a namespace ignores signals sent from inside). When init dies the kernel kills every
process left in its pid namespace, including ones that called setsid(). Init also has
PR_SET_PDEATHSIG so it dies with the launcher.
"""

import ctypes
import json
import os
import resource
import runpy
import stat
import sys
import traceback

SETUP_FAILED = 111  # exit status meaning "isolation could not be set up", never a verdict
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_NOATIME = 0x400
MS_NODIRATIME = 0x800
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RELATIME = 0x200000
MNT_DETACH = 2
# pivot_root has no libc wrapper: its syscall number by architecture.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41}
# What of the host a program sees besides the interpreter's prefix (read-only; missing ones skipped).
VIEW_DIRECTORIES = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin")
VIEW_FILES = ("/etc/ld.so.cache", "/etc/localtime")
VIEW_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")  # bound with devices allowed
VIEW_DEVICE_LINKS = {"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1",
                     "/dev/stderr": "/proc/self/fd/2"}
SHARED_MEMORY = "/dev/shm"  # POSIX shared memory and semaphores (multiprocessing's locks): a private tmpfs
# Per-mount flags a read-only remount must keep (in a user namespace they are locked).
_KEPT_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                     "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME}
PR_SET_PDEATHSIG = 1
PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2
CAP_DAC_READ_SEARCH = 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIGKILL = 9
# Directories any user may write to; each gets a private tmpfs so the program's writes vanish.
WORLD_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
SANDBOX_WORKDIR = "/tmp/sandbox"
POSIX_QUEUES = "/dev/mqueue"
# Message queues and semaphore sets a program's IPC namespace may hold: SysV queues hold up to
# kernel.msgmnb (16 KiB) each, so 32 of them 512 KiB; the semaphore limits are the kernel's defaults
# before 3.19 (32,000 semaphores, a few MB); shared memory is capped at the program's memory limit.
IPC_MESSAGE_QUEUES = 32
IPC_SEMAPHORES = "250 32000 32 128"  # per set, in all, operations per semop, sets

_libc = ctypes.CDLL(None, use_errno=True)


def _load_syscall_filter():
  """jaxloc/sandbox/syscall_filter.py, loaded by path before any namespace is set up (`python -I` puts neither
  jaxloc nor this directory on sys.path, and the file view would hide the file)."""
  import importlib.util

  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "syscall_filter.py")
  spec = importlib.util.spec_from_file_location("jaxloc_sandbox_syscall_filter", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


syscall_filter = _load_syscall_filter()


def _setup_failed(step):
  errno = ctypes.get_errno()
  sys.stderr.write(f"jaxloc-sandbox-setup-failed: {step}: {os.strerror(errno) if errno else ''}\n")
  sys.stderr.flush()
  os._exit(SETUP_FAILED)


def _check(result, step):
  if result != 0:
    _setup_failed(step)


def _mount(source, target, fstype, flags, data):
  enc = lambda s: None if s is None else s.encode()
  return _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))


def _remount_everything_read_only():
  """Best effort: every existing mount becomes read-only in this mount namespace.

  This covers world-writable directories we do not know about; the tmpfs mounts that follow are
  the only writable places. A mount that refuses (a locked mount in a container) keeps its mode;
  the uid switch still guards it.
  """
  with open("/proc/self/mountinfo") as mountinfo:
    entries = [line.split() for line in mountinfo]
  for fields in entries:
    mount_point = fields[4].encode().decode("unicode_escape")  # mountinfo escapes spaces as \040
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for option in fields[5].split(","):
      flags |= _KEPT_MOUNT_FLAGS.get(option, 0)
    _mount(None, mount_point, None, flags, None)


def _bind_read_only(source, target, device=False):
  """Binds `source` at `target` read-only; only a `device` node keeps working as one (everything else is nodev).
  Writing to a device on a read-only mount still works: read-only guards files, not devices."""
  _check(_mount(source, target, None, MS_BIND | MS_REC, None), f"bind {source}")
  flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (0 if device else MS_NODEV)
  with open("/proc/self/mountinfo") as mountinfo:  # keep the locked flags of the source mount
    for fields in (line.split() for line in mountinfo):
      if fields[4] == target:
        for option in fields[5].split(","):
          flags |= _KEPT_MOUNT_FLAGS.get(option, 0)
  _check(_mount(None, target, None, flags, None), f"make {target} read-only")


def _add_to_view(root, path):
  """Recreates `path` (a symlink, directory, file or device) under `root`, read-only."""
  target = root + path
  os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
  if os.path.islink(path):
    if not os.path.lexists(target):
      os.symlink(os.readlink(path), target)
  elif os.path.isdir(path):
    os.makedirs(target, mode=0o755, exist_ok=True)
    _bind_read_only(path, target)
  elif os.path.exists(path):
    with open(target, "a"):
      pass
    _bind_read_only(path, target, device=stat.S_ISCHR(os.stat(path).st_mode))


def _interpreter_paths():
  """The directories the running interpreter loads code from, outside /usr (e.g. a pyenv under /root)."""
  paths = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}
  paths |= {os.path.dirname(os.path.realpath(sys.executable))}
  kept = []
  for path in sorted(paths):  # a path inside another kept path comes with it
    if not any(path == k or path.startswith(k + "/") for k in kept + list(VIEW_DIRECTORIES)):
      kept.append(path)
  return kept


def _build_file_view(tmpfs_bytes, host_workdir):
  """A new root holding only what the interpreter needs, and a writable /tmp; returns its path.

  Must run in a private mount namespace (nothing here reaches the host's mounts). The root is mounted
  on a directory of the harness's own working directory, so building it hides nothing the interpreter
  needs (a virtual environment under /tmp, say); the program's /tmp is mounted before the binds, so an
  interpreter living under /tmp is bound inside it.
  """
  root = os.path.join(host_workdir, "root")
  os.mkdir(root, 0o755)
  _check(_mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755"), "root tmpfs")
  os.mkdir(root + "/proc", 0o555)
  os.mkdir(root + "/tmp", 0o1777)
  _check(_mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=1777"),
         "program tmpfs")
  for path in list(VIEW_DIRECTORIES) + _interpreter_paths() + list(VIEW_FILES) + list(VIEW_DEVICES):
    if os.path.lexists(path):
      _add_to_view(root, path)
  os.makedirs(root + "/dev", mode=0o755, exist_ok=True)
  for link, target in VIEW_DEVICE_LINKS.items():
    os.symlink(target, root + link)
  os.mkdir(root + SHARED_MEMORY, 0o1777)
  _check(_mount("tmpfs", root + SHARED_MEMORY, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=1777"),
         f"{SHARED_MEMORY} tmpfs")
  _mount_own_queues(root + POSIX_QUEUES)
  return root


def _mount_own_queues(target):
  """The IPC namespace's own POSIX message queues at `target` (mq_open reaches them with or without it)."""
  os.makedirs(target, mode=0o755, exist_ok=True)
  _check(_mount("mqueue", target, "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), f"mount {target}")


def _bound_ipc(memory_bytes, required):
  """Caps what the new IPC namespace may hold; it starts with the kernel's defaults, under which shared
  memory is practically unbounded: segments would keep memory outside RLIMIT_AS until the program dies.

  Writes /proc/sys/kernel, whose IPC entries are those of the writer's IPC namespace. `required` is
  False in a user namespace, where older kernels refuse the writes; the program then gets the
  defaults, still within its own namespace and gone with it.
  """
  limits = {"shmmax": memory_bytes, "shmall": memory_bytes // os.sysconf("SC_PAGE_SIZE"),
            "msgmni": IPC_MESSAGE_QUEUES, "sem": IPC_SEMAPHORES}
  for name, value in limits.items():
    try:
      with open(f"/proc/sys/kernel/{name}", "w") as sysctl:
        sysctl.write(str(value))
    except OSError:
      if required:
        _setup_failed(f"set kernel.{name} of the IPC namespace")


def _enter_file_view(root):
  """pivot_root into `root`, detach the host's file system, and make the new root read-only."""
  import platform

  number = SYS_PIVOT_ROOT.get(platform.machine())
  if number is None:
    _setup_failed(f"pivot_root: unknown architecture {platform.machine()}")
  os.chdir(root)
  _check(_libc.syscall(number, b".", b"."), "pivot_root")
  _check(_libc.umount2(b".", MNT_DETACH), "detach the host root")
  os.chdir("/")
  _check(_mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755"),
         "make the root read-only")


def _count_tasks_of_uid(uid):
  """Tasks (threads count, as RLIMIT_NPROC counts them) owned by `uid`, from /proc."""
  count = 0
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/status") as status:
        fields = dict(line.split(":", 1) for line in status if ":" in line)
      if int(fields["Uid"].split()[1]) == uid:
        count += int(fields["Threads"])
    except (OSError, KeyError, ValueError):
      pass
  return count


def _block_sockets():
  """Best-effort network block for when no network namespace is available (bypassable)."""
  import _socket
  import socket

  def denied(*args, **kwargs):
    raise PermissionError("network access is disabled in the jaxloc sandbox")

  class NoSocket:
    def __init__(self, *args, **kwargs):
      denied()

  for module in (socket, _socket):
    module.socket = NoSocket
  for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo",
               "gethostbyname", "gethostbyname_ex", "gethostbyaddr"):
    if hasattr(socket, name):
      setattr(socket, name, denied)


class _CapHeader(ctypes.Structure):
  _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
  _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
              ("inheritable", ctypes.c_uint32)]


def _drop_privileges(run_uid, file_view):
  """Give up every capability; with `run_uid`, also become that unprivileged uid.

  In a file view the interpreter is reachable by anyone (its path is rebuilt with open
  directories), so nothing is kept. Without one, a program that switched uid keeps
  CAP_DAC_READ_SEARCH alone, so that it can read the interpreter wherever it is installed (e.g.
  under a 0700 /root); that also lets it read every host file, which is why the file view is the
  default. Without a uid switch (user_namespace modes) the program is root of its own user namespace
  and loses all capabilities there, so it cannot undo the read-only mounts. no_new_privs stops
  setuid binaries from regaining anything.
  """
  kept = 1 << CAP_DAC_READ_SEARCH if run_uid is not None and not file_view else 0
  with open("/proc/sys/kernel/cap_last_cap") as last_cap_file:
    last_cap = int(last_cap_file.read())
  for cap in range(last_cap + 1):
    if not kept >> cap & 1:
      _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
  if run_uid is not None:
    _check(_libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
    os.setgroups([])
    os.setgid(run_uid)
    os.setuid(run_uid)
  header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
  data = (_CapData * 2)(_CapData(kept, kept, kept), _CapData(0, 0, 0))
  _check(_libc.capset(ctypes.byref(header), data), "set capabilities")
  if kept:
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH, 0, 0),
           "ambient capability")
  _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _restrict_system_calls():
  """The last step before the program runs, in every mode: a fresh session keyring, then the system-call filter
  (syscall_filter's docstring lists what it refuses and why)."""
  try:
    syscall_filter.join_fresh_session_keyring()
  except OSError:  # keyrings compiled out, or keyctl refused by the host's own filter: out of reach either way
    pass
  except syscall_filter.UnknownArchitecture as error:  # no table for this machine: no filter either
    ctypes.set_errno(0)
    _setup_failed(f"system-call filter: {error}")
  _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")  # set already, except in mode "none"
  try:
    syscall_filter.install()
  except (OSError, syscall_filter.UnknownArchitecture) as error:
    ctypes.set_errno(0)
    _setup_failed(f"system-call filter: {error}")


def _run_program(config, program_path, workdir, base_tasks):
  """Final process: drop privileges, apply limits, run the untrusted code; never returns."""
  limits = config["limits"]
  if config["mode"] != "none":  # in mode "none" there is nothing to give up
    _drop_privileges(config["run_uid"], config.get("file_view", False))
  os.chdir(workdir)
  os.environ.clear()
  os.environ.update({"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir,
                     "LANG": "C.UTF-8"})
  cpu_s = max(1, int(limits["cpu_s"] + 0.999))
  resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
  resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
  resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2)
  resource.setrlimit(resource.RLIMIT_NPROC, (base_tasks + limits["max_processes"],) * 2)
  resource.setrlimit(resource.RLIMIT_NOFILE, (limits["max_open_files"],) * 2)
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  if config["block_sockets"]:
    _block_sockets()
  _restrict_system_calls()
  sys.argv = [program_path]
  sys.path.insert(0, workdir)
  code = 0
  try:
    runpy.run_path(program_path, run_name="__main__")
  except SystemExit as exit_request:
    status = exit_request.code
    code = status if isinstance(status, int) else (0 if status is None else 1)
  except BaseException:  # the verdict is the exit status; the traceback goes to stderr
    traceback.print_exc()
    code = 1
  try:
    sys.stdout.flush()
    sys.stderr.flush()
  finally:
    os._exit(code)


def _exit_like(status):
  """Exit with the wait status of a child: its exit code, or 128 + the signal that killed it."""
  if os.WIFEXITED(status):
    os._exit(os.WEXITSTATUS(status))
  os._exit(128 + os.WTERMSIG(status))


def _run_init(config, program_path, workdir, base_tasks, root):
  """pid 1 of the sandbox's pid namespace: mount its /proc (in the file view at `root`, then enter
  that view), and reap everything until the program exits."""
  _libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
  _check(_mount("proc", (root or "") + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "mount /proc")
  if root:
    _enter_file_view(root)
  program_pid = os.fork()
  if program_pid == 0:
    _run_program(config, program_path, workdir, base_tasks)
  while True:
    try:
      pid, status = os.wait()
    except ChildProcessError:
      os._exit(SETUP_FAILED)
    if pid == program_pid:
      _exit_like(status)  # returning from init makes the kernel kill the rest of the namespace


def main():
  with open(sys.argv[1]) as config_file:
    config = json.load(config_file)
  host_workdir = config["workdir"]
  with open(os.path.join(host_workdir, "program.py"), "rb") as program_file:
    program = program_file.read()

  if config["mode"] in ("uid_only", "none"):  # no namespaces: run right here
    base_tasks = 0 if config["run_uid"] is not None else _count_tasks_of_uid(os.getuid())
    _run_program(config, os.path.join(host_workdir, "program.py"), host_workdir, base_tasks)

  uid, gid = os.getuid(), os.getgid()
  user_namespace = config["mode"] == "user_namespace"
  # Without a uid switch the program shares our uid, whose existing tasks count against NPROC.
  base_tasks = 0 if config["run_uid"] is not None else _count_tasks_of_uid(uid)
  flags = (CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
           | (CLONE_NEWUSER if user_namespace else 0))
  # A kernel without cgroup namespaces (or one that refuses them) still gets every other one; the
  # harness's probe sees which namespaces a program got and says so in the mode's description.
  if _libc.unshare(flags | CLONE_NEWCGROUP) != 0:
    _check(_libc.unshare(flags), "unshare")
  if user_namespace:
    try:
      for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                         ("/proc/self/gid_map", f"0 {gid} 1")):
        with open(path, "w") as map_file:
          map_file.write(text)
    except OSError:
      _setup_failed("user namespace id maps")
  hostname = config["hostname"].encode()
  _check(_libc.sethostname(hostname, len(hostname)), "set the hostname")
  _bound_ipc(config["limits"]["memory_bytes"], required=not user_namespace)
  # Private propagation first, so that nothing mounted below can leak into the host.
  _check(_mount(None, "/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
  root = None
  if config.get("file_view"):
    root = _build_file_view(config["limits"]["tmpfs_bytes"], host_workdir)
    workdir = os.path.join(root + "/tmp", "sandbox")
  else:
    _remount_everything_read_only()
    tmpfs_options = f"size={config['limits']['tmpfs_bytes']},mode=1777"
    for directory in WORLD_WRITABLE_DIRS:
      if os.path.isdir(directory) and not os.path.islink(directory):
        _check(_mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs_options),
               f"mount tmpfs on {directory}")
    if os.path.isdir(POSIX_QUEUES) and not os.path.islink(POSIX_QUEUES):  # hides the host's queues
      _mount_own_queues(POSIX_QUEUES)
    workdir = SANDBOX_WORKDIR
  os.mkdir(workdir, 0o700)
  program_path = os.path.join(workdir, "program.py")
  with open(program_path, "wb") as program_file:
    program_file.write(program)
  if config["run_uid"] is not None:
    for path in (workdir, program_path):
      os.chown(path, config["run_uid"], config["run_uid"])
  if root:
    program_path = os.path.join(SANDBOX_WORKDIR, "program.py")

  init_pid = os.fork()
  if init_pid == 0:
    _run_init(config, program_path, SANDBOX_WORKDIR, base_tasks, root)
  _, status = os.waitpid(init_pid, 0)
  _exit_like(status)


if __name__ == "__main__":
  main()
