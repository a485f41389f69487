"""A run directory is held by one run at a time, and never stays held by a dead one; the next holder removes the
temporary files a killed holder left, and no file of the user's; no command writes into a run directory it does not
hold; a full disk or a damaged file is one line that names the file, and leaves what was written before intact."""

import collections
import json
import os
import re
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
  # What a run killed mid-write leaves: its lock file (with the token of its temporary files) and atomic_write's
  # temporary files, named with that token; beside files of the user's that look alike.
  token = open(run / files.LOCK_FILE).read().split("token ")[1].strip()
  os.makedirs(run / "general" / "plurals")
  os.makedirs(run / "data")
  leftovers = [run / f"measurements.npz.jaxloc-{token}.a1b2c3d4.tmp",
               run / "general" / "plurals" / f"measurements.npz.jaxloc-{token}.zz_99xyz.tmp"]
  for path in leftovers:
    path.write_bytes(b"half")
  users = [run / "notes.tmp", run / "backup.20240101.tmp", run / "data" / "editor.download.tmp",
           run / "measurements.npz.a1b2c3d4.tmp", run / "heads.json.jaxloc-0123456789abcdef.a1b2c3d4.tmp"]
  for path in users:
    path.write_text("not ours")
  with files.hold_run_directory(str(run)):
    assert not any(path.exists() for path in leftovers) and all(path.exists() for path in users)
    lock = open(run / files.LOCK_FILE).read()
    assert lock.startswith(f"pid {os.getpid()} on ") and token not in lock
    with files.hold_run_directory(str(run)):  # the same process holds it again
      pass
    # What this holder writes there is named with its own token.
    files.write_json(str(run / "heads.json"), {})
    mine = lock.split("token ")[1].strip()
    assert files._temporary_prefix(str(run / "general" / "x.json")) == f"x.json.jaxloc-{mine}."
  assert not (run / files.LOCK_FILE).exists()  # a run that ends leaves no lock file
  assert all(path.exists() for path in users)


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


def test_no_command_writes_into_a_run_directory_it_does_not_hold(tmp_path):
  run = tmp_path / "run"
  os.makedirs(run / "general" / "counting")
  for marker in ("run.json", "measurements.npz"):
    (run / marker).write_text("{}")
    for path in (run / "heads.json", run / "evaluations" / "result.json", run / "general" / "counting" / "x.json"):
      with pytest.raises(UserError, match=rf"--output_json={path} is inside the run directory {run} \(it holds "
                                          rf"{marker}\), which only the command that holds it writes"):
        files.check_writable(str(path), "--output_json")
    with pytest.raises(UserError, match=f"--output_dir={run} is inside the run directory"):
      files.check_output_directory(str(run), "--output_dir")
    os.remove(run / marker)
  holder = _holder(run)  # a run in progress (only its lock file so far)
  try:
    with pytest.raises(UserError, match=rf"is inside the run directory {run} \(it holds {files.LOCK_FILE}\)"):
      files.check_writable(str(run / "heads.json"), "--output_json")
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  with files.hold_run_directory(str(run)):  # the holder itself may
    files.check_writable(str(run / "heads.json"), "--output_json")
    files.check_output_directory(str(run / "general"), "--output_dir")
  (run / "run.json").write_text("{}")
  files.check_writable(str(tmp_path / "elsewhere" / "result.json"), "--output_json")  # beside a run, not in it
  files.check_writable(str(run / "a" / "b" / "c" / "result.json"), "--output_json")  # deeper than a run writes


def test_output_files_are_checked_before_the_work(tmp_path):
  files.check_writable(str(tmp_path / "new" / "result.json"), "--output_json")
  assert os.listdir(tmp_path / "new") == []
  with pytest.raises(UserError, match="--output_json=.* is a directory"):
    files.check_writable(str(tmp_path), "--output_json")
  (tmp_path / "file").write_text("")
  with pytest.raises(UserError, match=r"cannot be written \(a parent of it is a file\)"):
    files.check_writable(str(tmp_path / "file" / "result.json"), "--output_json")


def test_a_symbolic_link_at_the_lock_is_refused_and_nothing_is_written_through_it(tmp_path):
  run, victim = tmp_path / "run", tmp_path / "victim"
  os.makedirs(run)
  victim.write_text("data\n")
  os.symlink(victim, run / files.LOCK_FILE)
  with pytest.raises(UserError, match=rf"^{run / files.LOCK_FILE} is a symbolic link: jaxloc does not write through "
                                      "links in a run directory; remove it$"):
    with files.hold_run_directory(str(run)):
      pass
  assert victim.read_text() == "data\n" and os.path.islink(run / files.LOCK_FILE)
  dangling = tmp_path / "nowhere" / "created"
  os.makedirs(dangling.parent)
  os.remove(run / files.LOCK_FILE)
  os.symlink(dangling, run / files.LOCK_FILE)
  with pytest.raises(UserError, match="is a symbolic link"):
    with files.hold_run_directory(str(run)):
      pass
  assert not dangling.exists() and os.listdir(dangling.parent) == []


def test_an_output_written_over_a_symbolic_link_replaces_the_link_not_its_target(tmp_path):
  victim = tmp_path / "victim"
  victim.write_text("data\n")
  os.makedirs(tmp_path / "run")
  os.symlink(victim, tmp_path / "run" / "heads.json")
  files.write_json(str(tmp_path / "run" / "heads.json"), {"heads": []})
  assert victim.read_text() == "data\n" and not os.path.islink(tmp_path / "run" / "heads.json")


@pytest.mark.parametrize("spec", ["garbage", "between_tasks", "validation@0", "write:@1", "write:heads.json@1=explode",
                                  "betwen_tasks@1", "write:heads.json@1,,"])
def test_an_unknown_fault_is_refused_naming_the_valid_points(monkeypatch, spec):
  monkeypatch.setenv(files.FAULT_ENV, spec)
  with pytest.raises(UserError, match=rf"^JAXLOC_FAULT={spec}: .* is not <point>@<n>\[=<action>\]: the points are "
                                      r"write:<file name>, between_tasks, validation; .*kill, enospc$"):
    files.fault_point("validation")


def test_the_runner_passes_the_fault_points_it_declares():
  source = open(os.path.join(ROOT, "jaxloc", "localize", "localization.py")).read()
  assert sorted(re.findall(r'fault_point\("(\w+)"\)', source)) == sorted(files.RUN_FAULT_POINTS)
