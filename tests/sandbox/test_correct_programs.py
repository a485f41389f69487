"""Correct generated programs pass in every sandbox mode this machine can run: what a sandbox refuses must never be
what an ordinary program needs (a refused /dev/null or a missing /dev/shm under-counts pass@1)."""

import functools
import textwrap

import pytest

from jaxloc import sandbox

# Each uses what MBPP / HumanEval solutions and their tests reach for; each fails loudly when it does not work.
PROGRAMS = {
    "devnull": """
        import os
        with open(os.devnull, "w") as sink:
          sink.write("discarded")
        with open(os.devnull, "rb") as source:
          assert source.read() == b""
        """,
    "subprocess_devnull": """
        import subprocess, sys
        done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        assert done.returncode == 0
        assert subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout == "42\\n"
        """,
    "multiprocessing": """
        import multiprocessing

        def square(x):
          return x * x

        if __name__ == "__main__":
          lock = multiprocessing.Lock()
          with lock:
            pass
          with multiprocessing.Pool(2) as pool:
            assert pool.map(square, range(6)) == [0, 1, 4, 9, 16, 25]
          queue = multiprocessing.Queue()
          worker = multiprocessing.Process(target=queue.put, args=("done",))
          worker.start()
          assert queue.get(timeout=10) == "done"
          worker.join()
          assert worker.exitcode == 0
        """,
    "shared_memory": """
        from multiprocessing import shared_memory
        block = shared_memory.SharedMemory(create=True, size=64)
        block.buf[:3] = b"abc"
        other = shared_memory.SharedMemory(name=block.name)
        assert bytes(other.buf[:3]) == b"abc"
        other.close()
        block.close()
        block.unlink()
        """,
    "tempfile": """
        import os, tempfile
        with tempfile.TemporaryDirectory() as directory:
          path = os.path.join(directory, "x.txt")
          open(path, "w").write("ok")
          assert open(path).read() == "ok"
        with tempfile.NamedTemporaryFile("w+") as named:
          named.write("ok")
          named.seek(0)
          assert named.read() == "ok"
        """,
    "random_devices": """
        import os, random, secrets, uuid
        assert len(os.urandom(32)) == 32 and len(secrets.token_hex(8)) == 16 and uuid.uuid4().version == 4
        with open("/dev/urandom", "rb") as urandom, open("/dev/random", "rb") as rand:
          assert len(urandom.read(16)) == 16 and len(rand.read(16)) == 16
        with open("/dev/zero", "rb") as zero:
          assert zero.read(8) == bytes(8)
        try:
          open("/dev/full", "wb", buffering=0).write(b"x")  # /dev/full: every write fails with ENOSPC
          raise AssertionError("/dev/full took a write")
        except OSError as error:
          assert error.errno == 28, error
        random.SystemRandom().random()
        """,
    "threading": """
        import concurrent.futures, threading
        results = []
        threads = [threading.Thread(target=results.append, args=(i,)) for i in range(4)]
        for thread in threads:
          thread.start()
        for thread in threads:
          thread.join()
        assert sorted(results) == [0, 1, 2, 3]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
          assert list(pool.map(abs, [-1, -2])) == [1, 2]
        """,
    "standard_streams": """
        import sys
        with open("/dev/stdout", "w") as out:
          out.write("through /dev/stdout\\n")
        print("to stderr", file=sys.stderr)
        """,
}


@functools.cache
def mode_runs(mode):
  return sandbox.run_program("print('ok')", sandbox.Limits(timeout_s=10.0), mode=mode).passed


@pytest.mark.parametrize("mode", list(sandbox.MODES))
def test_correct_programs_pass(mode):
  if not mode_runs(mode):
    pytest.skip(f"mode {mode!r} cannot run on this machine (probed: {sandbox.isolation_mode()!r})")
  names = sorted(PROGRAMS)
  results = sandbox.run_programs([textwrap.dedent(PROGRAMS[name]) for name in names], sandbox.Limits(), mode=mode)
  failed = {name: f"{result.status} {result.returncode}: {result.stderr[-800:]}"
            for name, result in zip(names, results) if not result.passed}
  assert not failed, failed
