"""Run files: atomic writes (a crash mid-write never leaves a half-written output) and reads, the one helper for all.

In a multi-process run (`jax.distributed`) every process computes the same thing, but only process 0 writes
outputs (`write_json`, `save_array`, `save_arrays`, `save_figure` do nothing elsewhere), so a shared filesystem
never sees concurrent writes; a run's own files are read as process 0 sees them (`read_shared`), so a resumed
run makes the same plan on every host whether or not the others can see process 0's disk. `atomic_write` itself
writes on every process: it is also for per-host caches.

One run at a time writes a run directory (`hold_run_directory`): process 0 holds an flock on `.jaxloc.lock` in it,
which the kernel releases when the process ends however it ends (a killed run never leaves the directory held), and
writes its pid there for the message a second run gets, with a token of its own: `atomic_write`'s temporary files in
the directory are named `<name>.jaxloc-<token>.<random>.tmp`, so the next holder removes exactly those a killed holder
left (the token it finds in the lock file), never a file of the user's. A command writes no user-named file into a
run directory it does not hold (`check_writable`).

What a user can fix ends in one line (`UserError`): a disk that is full or read-only while a file is written (every
file written before is intact: each is replaced whole), a file read back truncated or corrupt (`CorruptFile`).

Fault injection, for the tests that kill a run at a chosen point: with JAXLOC_FAULT=<point>@<n>[=<action>] (several
comma-separated), the n-th call of `fault_point(<point>)` in a process SIGKILLs it (action `kill`, the default) or
fails as a full disk would (`enospc`). The points are `write:<file name>` (in `atomic_write`, once the temporary file
is written and before it replaces the file) and the ones the runner names (`RUN_FAULT_POINTS`); any other value is a
UserError (`check_faults`), so a mistyped one never lets a test pass untested.

Nothing is written through a symbolic link: the lock file is opened with O_NOFOLLOW (a link there is a UserError), and
`atomic_write`'s temporary files are created with O_EXCL|O_NOFOLLOW (`tempfile.mkstemp`) and renamed over the file,
which replaces a link rather than its target.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import io
import json
import os
import re
import secrets
import signal
import socket
import tempfile
import zipfile
import zlib
from typing import Any, Callable, IO, Iterator

import numpy as np

from jaxloc.errors import UserError

FAULT_ENV = "JAXLOC_FAULT"
LOCK_FILE = ".jaxloc.lock"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
# What marks a directory as a run's: its lock, and the files every run writes first (`localize.measurements`).
RUN_MARKERS = (LOCK_FILE, "run.json", "measurements.npz")
# How far below a run directory its own files go (general/<task>/).
RUN_DEPTH = 2
_TEMPORARY_TAG = ".jaxloc-"  # <name>.jaxloc-<holder's token>.<tempfile.mkstemp's 8 characters>.tmp
# The fault points the runner passes (`jaxloc.localize.localization`), beside atomic_write's `write:<file name>`.
RUN_FAULT_POINTS = ("between_tasks", "validation")
_FAULT_ACTIONS = ("kill", "enospc")
_fault_calls: collections.Counter = collections.Counter()
_held: dict[str, int] = {}  # run directories this process holds -> how many holds are open
_tokens: dict[str, str] = {}  # run directories this process holds the lock of -> the token of its temporary files


class CorruptFile(UserError):
  """A run file that cannot be read back (truncated, or not what its name says)."""

  def __init__(self, path: str, detail: str):
    self.path, self.detail = path, detail
    super().__init__(f"{path} is truncated or corrupt ({detail}); delete it to recompute it")


def check_faults() -> list[tuple[str, int, str]]:
  """(point, n, action) for each fault JAXLOC_FAULT sets (none when unset); a UserError naming an item that is not
  <point>@<n>[=<action>] with a known point, a count ≥ 1 and a known action."""
  spec = os.environ.get(FAULT_ENV)
  if not spec:
    return []
  faults = []
  for item in spec.split(","):
    point, _, rest = item.partition("@")
    count, _, action = rest.partition("=")
    known = point in RUN_FAULT_POINTS or (point.startswith("write:") and len(point) > len("write:"))
    if not known or not count.isdigit() or int(count) < 1 or action not in ("", *_FAULT_ACTIONS):
      raise UserError(f"{FAULT_ENV}={spec}: {item!r} is not <point>@<n>[=<action>]: the points are "
                      f"write:<file name>, {', '.join(RUN_FAULT_POINTS)}; n counts from 1; the actions are "
                      f"{', '.join(_FAULT_ACTIONS)}")
    faults.append((point, int(count), action or "kill"))
  return faults


def fault_point(name: str) -> None:
  """Where a test may kill this process or fail a write (JAXLOC_FAULT, see the module docstring)."""
  faults = [(count, action) for point, count, action in check_faults() if point == name]
  if not faults:
    return
  _fault_calls[name] += 1
  for count, action in faults:
    if count != _fault_calls[name]:
      continue
    if action == "kill":
      os.kill(os.getpid(), signal.SIGKILL)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def write_failed(path: str, error: OSError) -> UserError | None:
  """The one-line error for a write that failed for a reason the user can fix (None for others)."""
  if error.errno in _DISK_FULL:
    return UserError(f"the disk is full: writing {path} failed ({error.strerror}); the measurements saved so far and "
                     "every other file written before are intact (each file is replaced whole): free some space and "
                     "rerun the same command to resume")
  if error.errno in _NOT_WRITABLE:
    return UserError(f"cannot write {path} ({error.strerror}); every file written before is intact: make its "
                     "directory writable and rerun the same command to resume")
  return None


def atomic_write(path: str, write: Callable[[IO[bytes]], None]) -> None:
  """Calls write(f) on a temporary file beside `path`, syncs it, then renames it over `path`. A full or read-only disk
  is a UserError; `path`, as it was, is intact."""
  directory = os.path.dirname(os.path.abspath(path))
  tmp = None
  try:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=_temporary_prefix(path), suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
      fault_point(f"write:{os.path.basename(path)}")
    os.replace(tmp, path)
  except BaseException as e:
    if tmp is not None:
      with contextlib.suppress(OSError):
        os.remove(tmp)
    failed = write_failed(path, e) if isinstance(e, OSError) else None
    if failed is not None:
      raise failed from None
    raise


def _temporary_prefix(path: str) -> str:
  """The start of `atomic_write`'s temporary file for `path`: tagged with the token of the run directory this process
  holds it in (a later holder removes it if a kill leaves it, `_remove_temporaries`), or with no token elsewhere."""
  held = _holder_of(os.path.dirname(os.path.realpath(path)), _tokens)
  return os.path.basename(path) + (".jaxloc." if held is None else f"{_TEMPORARY_TAG}{_tokens[held]}.")


def _holder_of(directory: str, held: dict[str, Any]) -> str | None:
  """The key of `held` that is `directory` (a real path) or one of its RUN_DEPTH nearest ancestors (None if none)."""
  for _ in range(RUN_DEPTH + 1):
    if directory in held:
      return directory
    parent = os.path.dirname(directory)
    if parent == directory:
      break
    directory = parent
  return None


def _jsonable(value):
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"not JSON serializable: {type(value).__name__}")


def is_writer() -> bool:
  """Whether this process writes outputs: always in a single-process run, process 0 only in a multi-process one."""
  import jax

  return jax.process_index() == 0


def _write_output(path: str, write: Callable[[IO[bytes]], None]) -> None:
  if is_writer():
    atomic_write(path, write)


def write_json(path: str, payload: Any) -> None:
  _write_output(path, lambda f: f.write((json_text(payload) + "\n").encode()))


def json_text(payload: Any, depth: int = 0) -> str:
  """JSON laid out to read and diff: an object one key per line, a list of objects one object per line (a run's
  heads: one head a line, whole), any other list or value on one line."""
  inner, outer = "  " * (depth + 1), "  " * depth
  if isinstance(payload, dict) and payload:
    lines = [f"{inner}{json.dumps(_key(key))}: {json_text(value, depth + 1)}" for key, value in payload.items()]
    return "{\n" + ",\n".join(lines) + f"\n{outer}}}"
  if isinstance(payload, list) and payload and all(isinstance(item, dict) for item in payload):
    return "[\n" + ",\n".join(inner + json.dumps(item, default=_jsonable) for item in payload) + f"\n{outer}]"
  return json.dumps(payload, default=_jsonable)


def _key(key: Any) -> str:
  """An object key as `json.dumps` writes it (3 -> "3", True -> "true", None -> "null")."""
  return key if isinstance(key, str) else json.dumps(key, default=_jsonable)


def save_array(path: str, array: np.ndarray) -> None:
  """np.save, atomically (`path` should end in .npy)."""
  _write_output(path, lambda f: np.save(f, array))


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
  """np.savez, atomically."""
  _write_output(path, lambda f: np.savez(f, **arrays))


def write_text(path: str, text: str) -> None:
  _write_output(path, lambda f: f.write(text.encode()))


def save_figure(path: str, figure, dpi: int) -> None:
  """A matplotlib figure as an image (its format from the extension), atomically."""
  fmt = os.path.splitext(path)[1].lstrip(".") or "png"
  _write_output(path, lambda f: figure.savefig(f, format=fmt, dpi=dpi))


def read_shared(path: str) -> bytes | None:
  """The file's bytes as process 0 sees them (None when it has none); in a multi-process run every process
  must call this for the same paths in the same order (process 0 broadcasts)."""
  import jax

  data = None
  if jax.process_index() == 0 and os.path.isfile(path):
    with open(path, "rb") as f:
      data = f.read()
  return _from_process_0(data)


def _from_process_0(data: bytes | None) -> bytes | None:
  """Process 0's `data` on every process (every process calls this at the same point; others pass None)."""
  import jax

  if jax.process_count() == 1:
    return data
  from jax.experimental import multihost_utils

  size = int(multihost_utils.broadcast_one_to_all(np.int64(-1 if data is None else len(data))))
  if size < 0:
    return None
  # Padded to a power of two so that a handful of broadcast shapes compile, whatever the file sizes.
  buffer = np.zeros(1 << max(size - 1, 0).bit_length(), np.uint8)
  if data is not None:
    buffer[:size] = np.frombuffer(data, np.uint8)
  return multihost_utils.broadcast_one_to_all(buffer)[:size].tobytes()


# What reading a damaged file raises: numpy's header and shape checks, a zip's directory and CRCs, JSON's parser.
_UNREADABLE = (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error)


def read_json(path: str) -> Any | None:
  """A JSON file as process 0 sees it (None when absent)."""
  data = read_shared(path)
  try:
    return None if data is None else json.loads(data)
  except _UNREADABLE as e:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
    raise CorruptFile(path, str(e)) from None


def read_array(path: str) -> np.ndarray | None:
  """An .npy file as process 0 sees it (None when absent)."""
  data = read_shared(path)
  try:
    return None if data is None else np.load(io.BytesIO(data))
  except _UNREADABLE as e:
    raise CorruptFile(path, str(e)) from None


def read_arrays(path: str) -> dict[str, np.ndarray] | None:
  """An .npz file as process 0 sees it (None when absent)."""
  data = read_shared(path)
  if data is None:
    return None
  try:
    with np.load(io.BytesIO(data)) as loaded:
      return {k: loaded[k] for k in loaded.files}
  except _UNREADABLE as e:
    raise CorruptFile(path, str(e) or type(e).__name__) from None


@contextlib.contextmanager
def hold_run_directory(path: str, flag: str = "--output_dir") -> Iterator[None]:
  """Holds the run directory `path` (created if missing) while the block runs: a UserError naming `flag` when it is
  a file, cannot be created or written, or another run holds it (naming that run's pid). Process 0 holds it; in a
  multi-process run every process calls this at the same point and gets process 0's answer. Re-entrant: a process
  that holds `path` holds it again at no cost."""
  key = os.path.realpath(path)
  if key in _held:
    _held[key] += 1
    try:
      yield
    finally:
      _held[key] -= 1
    return
  fd = None

  def lock() -> None:
    nonlocal fd
    fd, _tokens[key] = _lock(path, flag)

  _on_process_0(lock)
  _held[key] = 1
  try:
    yield
  finally:
    del _held[key]
    _tokens.pop(key, None)
    if fd is not None:
      # Unlinked while still held, so the next run creates a new file; one that opened this one meanwhile sees it
      # unlinked once it gets the lock, and starts over (`_lock`).
      with contextlib.suppress(OSError):
        os.unlink(os.path.join(path, LOCK_FILE))
      os.close(fd)


def check_writable(path: str, flag: str) -> None:
  """A UserError naming `flag` unless the file `path` can be written (its directory is created when missing) outside
  any run directory this process does not hold (`run_directory_of`): checked before the work whose result it will
  hold. Process 0 checks (the others write nothing); every process gets its answer."""

  def check() -> None:
    if os.path.isdir(path):
      raise UserError(f"{flag}={path} is a directory: give a file path")
    directory = os.path.dirname(os.path.abspath(path))
    _refuse_run_directory(directory, flag, path)
    try:
      os.makedirs(directory, exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=directory, prefix=_temporary_prefix(path), suffix=".tmp")
      os.close(fd)
      os.remove(tmp)
    except OSError as e:
      raise UserError(f"{flag}={path} cannot be written ({_why(e)}): give a path in a writable directory") from None

  _on_process_0(check)


def check_output_directory(path: str, flag: str) -> None:
  """A UserError naming `flag` when the directory `path` is, or lies within, a run directory this process does not
  hold (`run_directory_of`): for commands that write files of their own into a directory. Process 0 checks; every
  process gets its answer."""
  _on_process_0(lambda: _refuse_run_directory(os.path.abspath(path), flag, path))


def run_directory_of(directory: str) -> tuple[str, str] | None:
  """(run directory, the file that marks it) when `directory` or one of its RUN_DEPTH nearest ancestors holds one
  of RUN_MARKERS (a run's lock, run.json or measurements.npz) and this process does not hold it; None otherwise."""
  directory = os.path.realpath(directory)
  if _holder_of(directory, _held) is not None:
    return None
  for _ in range(RUN_DEPTH + 1):
    for marker in RUN_MARKERS:
      if os.path.isfile(os.path.join(directory, marker)):
        return directory, marker
    parent = os.path.dirname(directory)
    if parent == directory:
      break
    directory = parent
  return None


def _refuse_run_directory(directory: str, flag: str, given: str) -> None:
  found = run_directory_of(directory)
  if found is not None:
    run, marker = found
    raise UserError(f"{flag}={given} is inside the run directory {run} (it holds {marker}), which only the command "
                    "that holds it writes (localize, report): give a path outside it")


def _why(error: OSError) -> str:
  """Why a path could not be created, in words: makedirs says "File exists" when a parent is a file."""
  if error.errno in (errno.EEXIST, errno.ENOTDIR):
    return "a parent of it is a file"
  return error.strerror or str(error)


def _on_process_0(check: Callable[[], None]) -> None:
  """Runs `check` on process 0; its UserError, if any, is raised on every process (which all call this at the same
  point), so that none goes on alone."""
  problem = None
  if is_writer():
    try:
      check()
    except UserError as e:
      problem = str(e).encode()
  problem = _from_process_0(problem)
  if problem is not None:
    raise UserError(problem.decode())


def _lock(path: str, flag: str) -> tuple[int, str]:
  """An open descriptor of `path`'s lock file, flocked, with this process's pid and a new token written in it; and
  the token (`_temporary_prefix`). The temporary files of the holder before it (a killed run: the token it left in
  the file) are removed."""
  if os.path.exists(path) and not os.path.isdir(path):
    raise UserError(f"{flag}={path} is a file, not a directory: give a directory (it is created when missing)")
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise UserError(f"{flag}={path} cannot be created ({_why(e)}): give a directory in a writable place") from None
  lock_path = os.path.join(path, LOCK_FILE)
  while True:
    try:
      # O_NOFOLLOW: a link here (dangling or not) would have the pid and token written into its target.
      fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
      if os.path.islink(lock_path):
        raise UserError(f"{lock_path} is a symbolic link: jaxloc does not write through links in a run directory; "
                        "remove it") from None
      raise UserError(f"{flag}={path} is not writable ({e.strerror}): give a writable directory") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _lock_contents(fd)[0] or "pid unknown"
      os.close(fd)
      raise UserError(f"{flag}={path} is in use by another run ({holder}); wait for it to end or give another "
                      f"{flag}") from None
    try:
      if os.stat(lock_path).st_ino == os.fstat(fd).st_ino:
        break
    except FileNotFoundError:
      pass
    os.close(fd)  # the holder it waited for unlinked this file on release: lock the new one
  token = secrets.token_hex(8)
  try:
    previous = _lock_contents(fd)[1]
    if previous is not None:
      _remove_temporaries(path, previous)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\ntoken {token}\n".encode(), 0)
  except OSError as e:
    os.close(fd)
    raise write_failed(lock_path, e) or e from None
  return fd, token


def _lock_contents(fd: int) -> tuple[str, str | None]:
  """What a lock file says: its holder ("pid <pid> on <host>", for messages) and the token of the holder's temporary
  files (None when it has none: a lock file of a jaxloc before tokens, or one a holder had not written yet)."""
  lines = os.pread(fd, 4096, 0).decode(errors="replace").splitlines()
  token = next((line[len("token "):].strip() for line in lines if line.startswith("token ")), None)
  return (lines[0].strip() if lines else ""), (token if token and re.fullmatch(r"[0-9a-f]+", token) else None)


def _remove_temporaries(path: str, token: str) -> None:
  """Removes the temporary files `atomic_write` left, killed mid-write, in a run directory down to general/<task>/ while
  the holder whose lock file says `token` held it: those named <name>.jaxloc-<token>.<8 characters>.tmp, which only
  that holder wrote (any other file stays, whatever its name)."""
  mine = re.compile(rf"^.+{re.escape(_TEMPORARY_TAG + token)}\.[a-z0-9_]{{8}}\.tmp$")
  top = os.path.normpath(path)
  for root, directories, names in os.walk(top):
    if os.path.relpath(root, top).count(os.sep) >= RUN_DEPTH - 1:
      directories[:] = []  # nothing deeper is a run's
    for name in names:
      if mine.match(name):
        with contextlib.suppress(FileNotFoundError):
          os.remove(os.path.join(root, name))


def jsonable(payload: Any) -> Any:
  """`payload` as `write_json` writes it and `read_json` reads it back (numpy values as Python's, tuples as lists)."""
  return json.loads(json.dumps(payload, default=_jsonable))
