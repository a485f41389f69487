"""A run directory is held by one run at a time, and never stays held by a dead one; a full disk or a damaged file
is one line that names the file, and leaves what was written before intact."""

import collections
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from jaxloc import files
from jaxloc.errors import UserError
from tests.experiments.conftest import ROOT

HOLD = ("import sys, time\nfrom jaxloc import files\nwith files.hold_run_directory(sys.argv[1]):\n"
        "  print('held', flush=True)\n  time.sleep(600)\n")


def _holder(directory):
  proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_held_directory_is_refused_naming_the_holder_and_freed_when_it_is_killed(tmp_path):
  run = tmp_path / "run"
  holder = _holder(run)
  try:
    with pytest.raises(UserError, match=rf"--output_dir={run} is in use by another run \(pid {holder.pid} on "):
      with files.hold_run_directory(str(run)):
        pass
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # What a run killed mid-write leaves: its lock file and atomic_write's temporary files.
  os.makedirs(run / "general" / "plurals")
  leftovers = [run / "measurements.npz.a1b2c3d4.tmp", run / "general" / "plurals" / "measurements.npz.zz_99xyz.tmp"]
  for path in leftovers:
    path.write_bytes(b"half")
  (run / "notes.tmp").write_text("not ours")
  with files.hold_run_directory(str(run)):
    assert not any(path.exists() for path in leftovers) and (run / "notes.tmp").exists()
    assert open(run / files.LOCK_FILE).read().startswith(f"pid {os.getpid()} on ")
    with files.hold_run_directory(str(run)):  # the same process holds it again
      pass
  assert not (run / files.LOCK_FILE).exists()  # a run that ends leaves no lock file


def test_a_full_disk_is_one_line_and_the_file_it_replaces_is_intact(tmp_path, monkeypatch):
  path = tmp_path / "heads.json"
  files.write_json(str(path), {"before": 1})
  monkeypatch.setenv(files.FAULT_ENV, "write:heads.json@1=enospc")
  monkeypatch.setattr(files, "_fault_calls", collections.Counter())
  with pytest.raises(UserError, match=f"the disk is full: writing {path} failed .*the measurements saved so far"):
    files.write_json(str(path), {"after": 2})
  assert json.load(open(path)) == {"before": 1} and os.listdir(tmp_path) == ["heads.json"]
  files.write_json(str(path), {"after": 2})  # the second write is not the first: it goes through
  assert json.load(open(path)) == {"after": 2}


@pytest.mark.parametrize("name, save, read", [
    ("gradient.npy", lambda p: np.save(p, np.arange(50.0)), files.read_array),
    ("confirmation.npz", lambda p: np.savez(p, heads=np.arange(50), drops=np.ones((50, 3))), files.read_arrays),
    ("run.json", lambda p: open(p, "w").write(json.dumps({"model": "m" * 100})), files.read_json),
])
def test_a_truncated_file_is_named_with_what_to_do(tmp_path, name, save, read):
  path = str(tmp_path / name)
  save(path)
  os.truncate(path, os.path.getsize(path) // 2)
  with pytest.raises(files.CorruptFile, match=f"{path} is truncated or corrupt .*; delete it to recompute it"):
    read(path)


def test_output_files_are_checked_before_the_work(tmp_path):
  files.check_writable(str(tmp_path / "new" / "result.json"), "--output_json")
  assert os.listdir(tmp_path / "new") == []
  with pytest.raises(UserError, match="--output_json=.* is a directory"):
    files.check_writable(str(tmp_path), "--output_json")
  (tmp_path / "file").write_text("")
  with pytest.raises(UserError, match=r"cannot be written \(a parent of it is a file\)"):
    files.check_writable(str(tmp_path / "file" / "result.json"), "--output_json")
