"""Hostile generated programs are contained, scored as failures, and the harness carries on."""

import os
import shutil
import socket
import textwrap
import time
import uuid

import pytest

from jaxloc import sandbox
from jaxloc.sandbox import runner

# Short limits keep each hostile test to a few seconds.
SHORT = sandbox.Limits(timeout_s=3.0, cpu_s=2.0, memory_bytes=512 << 20, max_processes=8)
NAMESPACES = sandbox.isolation_mode() not in ("uid_only", "none")
FILE_VIEW = sandbox.isolation_mode() in sandbox.STRONG_MODES
needs_isolation = pytest.mark.skipif(
    sandbox.isolation_mode() == "none",
    reason="no namespaces and not root: the documented fallback does not contain this")
needs_file_view = pytest.mark.skipif(
    not FILE_VIEW, reason=f"no file view on this machine (mode {sandbox.isolation_mode()!r}, logged as weaker)")


def run(source, limits=SHORT):
  return sandbox.run_program(textwrap.dedent(source), limits)


def assert_harness_alive():
  result = run("print(6 * 7)")
  assert result.passed and result.stdout.strip() == "42"


def test_correct_program_passes_and_wrong_one_fails():
  assert run("assert sorted([3, 1, 2]) == [1, 2, 3]").passed
  failed = run("assert 1 + 1 == 3")
  assert failed.status == "failed" and "AssertionError" in failed.stderr


def test_syntax_error_and_sys_exit_are_failures():
  assert run("def f(:\n  pass").status == "failed"
  assert run("import sys; sys.exit(3)").returncode == 3
  assert run("import sys; sys.exit(0)").passed


def test_infinite_loop_is_stopped():
  start = time.monotonic()
  result = run("while True:\n  pass")
  assert not result.passed and result.status in ("timeout", "failed")
  assert time.monotonic() - start < SHORT.timeout_s + 2
  assert_harness_alive()


def test_sleeping_program_hits_the_wall_clock_limit():
  start = time.monotonic()
  result = run("import time; time.sleep(60)", sandbox.Limits(timeout_s=1.0))
  assert result.status == "timeout"
  assert time.monotonic() - start < 3


def test_fork_bomb_is_contained_and_cleaned_up():
  result = run("""
      import os
      while True:
        try:
          os.fork()
        except OSError:
          pass
      """)
  assert not result.passed
  if sandbox.isolation_mode() in ("namespaces", "namespaces_host_visible", "uid_only"):
    assert all(not runner._pids_of_uid(uid) for uid in sandbox.UID_POOL)
  assert_harness_alive()


@needs_isolation
def test_escaped_session_is_killed_with_the_sandbox():
  marker = f"jaxloc-escapee-{uuid.uuid4().hex}"
  result = run(f"""
      import os, time
      if os.fork() == 0:
        os.setsid()
        os.execlp("sleep", "sleep", "300", "{marker}")
      time.sleep(300)
      """, sandbox.Limits(timeout_s=1.0))
  assert result.status == "timeout"
  time.sleep(0.2)
  survivors = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        if marker.encode() in cmdline.read():
          survivors.append(int(pid))
    except OSError:
      pass
  assert not survivors


def test_the_harness_notices_an_exit_at_once():
  """Popen.wait(timeout) polls with sleeps growing to 50 ms, so a 70 ms process was noticed at 113.5 ms."""
  import subprocess

  seconds = []
  for _ in range(3):
    process = subprocess.Popen(["sleep", "0.07"])
    start = time.monotonic()
    assert runner._wait(process, 5.0) == 0
    seconds.append(time.monotonic() - start)
  assert min(seconds) < 0.1, seconds
  process = subprocess.Popen(["sleep", "10"])
  start = time.monotonic()
  assert runner._wait(process, 0.2) is None and time.monotonic() - start < 1.0
  process.kill()
  process.wait()


def test_huge_allocation_fails_with_memory_error():
  result = run("block = bytearray(4 << 30)")
  assert result.status == "failed" and "MemoryError" in result.stderr
  assert_harness_alive()


def test_huge_file_is_cut_by_the_file_size_limit():
  result = run("open('big', 'wb').write(b'x' * (64 << 20))",
               sandbox.Limits(timeout_s=5.0, file_size_bytes=1 << 20))
  assert not result.passed


@needs_isolation
def test_writing_outside_its_directory_fails(tmp_path):
  outside = tmp_path / "escape.txt"
  home_dir = os.path.expanduser("~")
  home_target = os.path.join(home_dir, f"jaxloc-sandbox-escape-{uuid.uuid4().hex}.txt")
  try:
    result = run(f"""
        for path in ({str(outside)!r}, {home_target!r}):
          try:
            open(path, "w").write("pwned")
          except OSError as error:
            print("blocked", path, error)
          else:
            raise SystemExit(0)
        raise SystemExit(1)
        """)
    assert not result.passed, result.stdout
    assert not outside.exists() and not os.path.exists(home_target)
  finally:
    if os.path.exists(home_target):
      os.remove(home_target)
  # Inside its own directory the program may write freely.
  assert run("open('scratch.txt', 'w').write('ok'); assert open('scratch.txt').read() == 'ok'"
             ).passed


@pytest.fixture()
def listener():
  """A localhost server socket that a contained program must never reach: (socket, port)."""
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.settimeout(0.5)
  yield server, server.getsockname()[1]
  server.close()


def test_socket_to_localhost_is_refused(listener):
  server, port = listener
  result = run(f"""
      import socket
      connection = socket.create_connection(("127.0.0.1", {port}), timeout=1)
      connection.sendall(b"exfiltrated")
      """)
  assert result.status == "failed"
  with pytest.raises(socket.timeout):
    server.accept()
  assert_harness_alive()


def test_parent_environment_is_invisible(monkeypatch):
  secret = uuid.uuid4().hex
  monkeypatch.setenv("JAXLOC_TEST_SECRET", secret)
  result = run(f"""
      import glob, os
      found = os.environ.get("JAXLOC_TEST_SECRET") == {secret!r}
      for path in glob.glob("/proc/*/environ"):
        try:
          found = found or {secret!r}.encode() in open(path, "rb").read()
        except OSError:
          pass
      print(sorted(os.environ))
      assert found, "secret not visible"
      """)
  assert result.status == "failed" and "secret not visible" in result.stderr
  assert secret not in result.stdout
  assert set(eval(result.stdout.strip().splitlines()[-1])) <= {"PATH", "HOME", "TMPDIR", "LANG"}


@pytest.mark.skipif(not NAMESPACES, reason="no network namespace on this machine")
def test_network_namespace_has_no_interfaces_up():
  result = run("""
      lines = open("/proc/net/dev").read().splitlines()[2:]
      print([line.split(":")[0].strip() for line in lines])
      """)
  assert result.passed and result.stdout.strip() in ("['lo']", "[]")


def test_many_programs_run_concurrently_in_order():
  sources = [f"print({index})" for index in range(12)] + ["while True: pass", "assert False"]
  results = sandbox.run_programs(sources, sandbox.Limits(timeout_s=2.0), max_workers=4)
  assert [result.stdout.strip() for result in results[:12]] == [str(i) for i in range(12)]
  assert all(result.passed for result in results[:12])
  assert [result.passed for result in results[12:]] == [False, False]


def test_python_level_network_block_in_fallback_mode():
  result = sandbox.run_program(
      "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)", SHORT, mode="none")
  assert result.status == "failed" and "network access is disabled" in result.stderr


# ---------------------------------------------------------------------------------------------------
# The file view: a program sees the interpreter, its libraries and its own directory, nothing else.


def reads(path, kind="read"):
  """A program that succeeds (exit 0) only if it can read (or list) `path`."""
  action = f"print(sorted(os.listdir({path!r})))" if kind == "list" else f"print(open({path!r}, 'rb').read()[:64])"
  return run(f"""
      import os
      try:
        {action}
      except OSError as error:
        print("blocked:", type(error).__name__)
        raise SystemExit(1)
      """)


@needs_file_view
def test_isolation_mode_on_this_machine_is_the_file_view():
  assert sandbox.isolation_mode() in sandbox.STRONG_MODES


@needs_file_view
def test_host_secrets_are_not_in_the_file_view():
  shadow = reads("/etc/shadow")
  assert not shadow.passed and "blocked" in shadow.stdout
  assert not reads("/etc/passwd").passed


@needs_file_view
def test_home_directories_show_only_the_way_to_the_interpreter():
  home = os.path.expanduser("~")
  listing = reads(home, "list")
  if listing.passed:  # the interpreter lives under the home directory (e.g. pyenv): only its path shows
    prefix = os.path.realpath(os.sys.base_prefix)
    assert prefix.startswith(home + "/")
    assert eval(listing.stdout.strip()) == [prefix[len(home) + 1:].split("/")[0]]
  assert not reads("/root/.bashrc").passed and not reads(os.path.join(home, ".cache"), "list").passed
  assert not reads("/home", "list").passed


def test_checkout_cache_and_other_processes_are_invisible(tmp_path):
  if not FILE_VIEW:
    pytest.skip("no file view on this machine")
  checkout_file = os.path.abspath(__file__)
  cache = tmp_path / "jaxloc-cache"
  cache.mkdir()
  (cache / "params.msgpack").write_bytes(b"weights")
  assert not reads(checkout_file).passed
  assert not reads(str(cache / "params.msgpack")).passed
  # Only the sandbox's own processes exist in its /proc: not the harness (this pytest), not anything else.
  processes = run("""
      import os
      for pid in filter(str.isdigit, os.listdir("/proc")):
        print(pid, open(f"/proc/{pid}/cmdline", "rb").read())
        try:
          print(open(f"/proc/{pid}/environ", "rb").read())
        except OSError:
          pass
      """)
  assert processes.passed and "pytest" not in processes.stdout and "sandbox/_child.py" in processes.stdout
  assert len(processes.stdout.splitlines()) <= 6 and "JAXLOC" not in processes.stdout


@needs_file_view
def test_the_interpreter_and_its_standard_library_still_work():
  result = run("""
      import ctypes, json, math, decimal, sqlite3, hashlib, subprocess, sys
      print(json.dumps({"pi": round(math.pi, 3)}), hashlib.sha256(b"x").hexdigest()[:8])
      print(subprocess.run([sys.executable, "-c", "print(41 + 1)"], capture_output=True, text=True).stdout)
      """)
  assert result.passed, result.stderr
  assert '{"pi": 3.142}' in result.stdout and "42" in result.stdout


@needs_file_view
def test_the_view_is_read_only_except_its_own_directory():
  result = run("""
      import os
      blocked = []
      for path in ("/usr/jaxloc-pwned", "/etc/jaxloc-pwned", "/jaxloc-pwned", os.__file__):
        try:
          open(path, "a").write("x")
        except OSError:
          blocked.append(path)
      print(len(blocked))
      """)
  assert result.passed and result.stdout.strip() == "4"
  assert not os.path.exists("/usr/jaxloc-pwned") and not os.path.exists("/jaxloc-pwned")


def test_user_namespace_mode_builds_the_same_file_view():
  """The mode for non-root users (root can enter it too): its init mounts /proc before detaching the host's root,
  which a user namespace requires."""
  if sandbox.probe("user_namespace") is None:
    pytest.skip("no user namespaces on this machine")
  result = sandbox.run_program(textwrap.dedent("""
      import os, subprocess, sys
      for path in ("/etc/shadow", "/etc/passwd", "/usr/jaxloc-pwned", os.__file__):
        try:
          open(path, "a").write("x")
        except OSError:
          print("blocked")
      print(subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout.strip())
      print(len([pid for pid in os.listdir("/proc") if pid.isdigit()]), sorted(os.listdir("/")))
      """), SHORT, mode="user_namespace")
  assert result.passed, result.stderr
  lines = result.stdout.splitlines()
  assert lines[:5] == ["blocked"] * 4 + ["42"]
  processes, root = lines[5].split(" ", 1)
  assert int(processes) <= 3 and "home" not in root and "work" not in root


@needs_isolation
def test_socket_through_ctypes_is_refused(listener):
  server, port = listener
  result = run(f"""
      import ctypes, socket, struct
      libc = ctypes.CDLL(None, use_errno=True)
      fd = libc.socket(2, 1, 0)  # AF_INET, SOCK_STREAM, straight to the kernel
      address = struct.pack("<H", 2) + struct.pack("!H4s8x", {port}, socket.inet_aton("127.0.0.1"))
      buffer = ctypes.create_string_buffer(address)
      assert fd >= 0 and libc.connect(fd, buffer, len(address)) == 0, ctypes.get_errno()
      """)
  assert not result.passed
  with pytest.raises(socket.timeout):
    server.accept()


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
@needs_isolation
def test_daemon_cannot_write_a_marker_after_the_timeout(tmp_path):
  marker = tmp_path / "late-marker"
  result = run(f"""
      import os, time
      if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
          time.sleep(2)
          for path in ({str(marker)!r}, "late-marker"):
            try:
              open(path, "w").write("still alive")
            except OSError:
              pass
          os._exit(0)
        os._exit(0)
      time.sleep(60)
      """, sandbox.Limits(timeout_s=1.0))
  assert result.status == "timeout"
  time.sleep(2.5)
  assert not marker.exists()


def test_filling_the_disk_is_bounded(tmp_path):
  before = shutil.disk_usage(tmp_path).free
  result = run("""
      index = 0
      while True:
        with open(f"fill{index}", "wb") as f:
          f.write(b"x" * (1 << 20))
        index += 1
      """, sandbox.Limits(timeout_s=10.0, tmpfs_bytes=32 << 20))
  assert not result.passed
  assert before - shutil.disk_usage(tmp_path).free < (64 << 20)  # the host's disk did not fill
  assert_harness_alive()


def test_printing_a_gigabyte_keeps_only_a_bounded_tail():
  result = run("""
      import sys
      line = "y" * 1023 + "\\n"
      for _ in range(1 << 20):
        sys.stdout.write(line)
      """, sandbox.Limits(timeout_s=20.0, file_size_bytes=8 << 20))
  assert not result.passed
  assert len(result.stdout) <= 4000 and len(result.stderr) <= 4000


@pytest.mark.skipif(os.geteuid() != 0 or not NAMESPACES, reason="the host-visible fallback needs root namespaces")
def test_host_visible_fallback_still_runs_programs_and_is_read_only():
  """The weaker fallback (used where no file view can be built) keeps working: host files readable, not
  writable."""
  result = sandbox.run_program("print(len(open('/etc/passwd').read()) > 0)\nopen('/usr/jaxloc-x', 'w')",
                               SHORT, mode="namespaces_host_visible")
  assert result.status == "failed" and result.stdout.strip() == "True"
  assert not os.path.exists("/usr/jaxloc-x")


def test_sandbox_overhead_benchmark_measures_each_mode():
  from jaxloc.bench import sandbox_overhead

  rows = sandbox_overhead.measure([sandbox.isolation_mode(), "none"], count=6, warmup=1)
  assert [r["mode"] for r in rows] == [sandbox.isolation_mode(), "none"]
  assert all(r["available"] and r["passed"] == 6 and r["median_ms"] > 0 for r in rows)
  assert "| none |" in sandbox_overhead.format_table(rows)


def test_sandbox_benchmark_command_checks_its_modes_and_writes_its_figures(tmp_path):
  import json

  from jaxloc.errors import UserError
  from jaxloc.main import benchmark_sandbox

  with pytest.raises(UserError, match="bogus"):
    benchmark_sandbox.main(benchmark_sandbox.BenchmarkSandboxConfig(modes=["none", "bogus"]))
  output = tmp_path / "sandbox.json"
  benchmark_sandbox.main(benchmark_sandbox.BenchmarkSandboxConfig(programs=3, modes=["none"], output_json=str(output)))
  written = json.loads(output.read_text())
  assert (written["isolation_mode"], written["isolation"]) == (sandbox.isolation_mode(), sandbox.isolation().description)
  assert [(r["mode"], r["programs"], r["passed"]) for r in written["rows"]] == [("none", 3, 3)]


@needs_file_view
def test_an_interpreter_in_a_virtual_environment_under_tmp_is_in_the_view(tmp_path):
  """A venv under /tmp (as a CI job might make) must stay reachable although the view gets its own /tmp."""
  import subprocess
  import sys

  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  probe = ("from jaxloc import sandbox; "
           "r = sandbox.run_program('import subprocess, sys; "
           "print(subprocess.run([sys.executable, \"-c\", \"print(6 * 7)\"], capture_output=True, text=True).stdout)'); "
           "print(r.status, r.stdout.strip(), r.stderr[-300:])")
  out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": root})
  assert out.stdout.split()[:2] == ["passed", "42"], out.stdout + out.stderr
