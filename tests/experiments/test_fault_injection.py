"""A run SIGKILLed at a chosen point, then resumed with the same command, ends with the files of a run never
interrupted: the measurements (every task's) bit-identical, heads.json equal but for its timing, engine and machine
facts (seconds, compile counts, start time, matmul peaks), ablation.json, coefficients.npy and the confirmation's measurements equal.

The points (`jaxloc.files.fault_point`, set with JAXLOC_FAULT=<point>@<n>): inside the atomic write of a batch's
measurements (the temporary file written, not yet renamed), between the target's masks and the general task's,
while the confirmation's single-head measurements are saved (validation), before the held-out validation, and
inside the write of heads.json. A second run into a directory a run holds is refused naming the holder's pid, and
the holder's death frees the directory. A resume is bit-identical under several flag sets too (`FLAG_SETS`)."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.experiments.conftest import ROOT, run_cli
from tests.experiments.reliability import CAPITALS, run_command, write_task

pytestmark = pytest.mark.slow

POINTS = ["write:measurements.npz@6", "between_tasks@1", "write:confirmation.npz@1", "validation@1",
          "write:heads.json@1"]
# heads.json keys that describe this process rather than the result (`machine`: when it started, the matmul peaks
# it measured).
PROCESS_FACTS = ("timing", "engine", "machine")


def _args(model_dir, task, out):
  return [f"--model={model_dir}", f"--task={task}", f"--output_dir={out}", "--cache_dir=none", "--metric=logprob",
          "--num_samples=8", "--validation_samples=4", "--num_masks=24", "--ablation_rate=0.25",
          "--general_tasks=counting", "--general_samples=6", "--bootstrap=20", "--tokens_per_batch=64",
          "--progress=false"]


def _arrays(path):
  with np.load(path) as data:
    return {k: data[k] for k in data.files}


def _assert_same_outputs(out, reference, run_file="heads.json"):
  names = ("measurements.npz", "general/counting/measurements.npz", "confirmation.npz")
  assert os.path.exists(os.path.join(reference, "confirmation.npz")) or run_file != "heads.json"
  for name in [n for n in names if os.path.exists(os.path.join(reference, n))]:
    got, expected = _arrays(os.path.join(out, name)), _arrays(os.path.join(reference, name))
    assert got.keys() == expected.keys(), name
    for key in expected:
      assert np.array_equal(got[key], expected[key], equal_nan=expected[key].dtype.kind == "f"), (name, key)
  assert np.array_equal(np.load(os.path.join(out, "coefficients.npy")),
                        np.load(os.path.join(reference, "coefficients.npy")))
  heads, expected = (json.load(open(os.path.join(d, run_file))) for d in (out, reference))
  for facts in (heads, expected):
    for key in PROCESS_FACTS:
      facts.pop(key)
    facts["flags"].pop("output_dir")  # the two runs' own directories
  assert heads == expected
  ablation, expected = (json.load(open(os.path.join(d, "ablation.json"))) for d in (out, reference))
  assert ablation == expected
  assert not glob.glob(os.path.join(out, "**", "*.tmp"), recursive=True)  # the kill's leftovers were removed


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
  task = write_task(str(tmp_path_factory.mktemp("task") / "capitals.jsonl"), CAPITALS)
  out = str(tmp_path_factory.mktemp("reference") / "run")
  done = run_cli("experiments.localize", *_args(tiny_model_dir, task, out))
  assert done.returncode == 0, done.stderr[-3000:]
  return task, out


@pytest.mark.parametrize("point", POINTS)
def test_killed_at_a_point_and_resumed_equals_an_uninterrupted_run(point, reference, tiny_model_dir, tmp_path):
  task, expected = reference
  out = str(tmp_path / "run")
  killed = run_command("localize", _args(tiny_model_dir, task, out),
                       env=dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu", JAXLOC_FAULT=point))
  assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
  if point.startswith("write:"):
    assert glob.glob(os.path.join(out, "**", "*.tmp"), recursive=True), "not killed inside the atomic write"
  resumed = run_cli("experiments.localize", *_args(tiny_model_dir, task, out))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  _assert_same_outputs(out, expected)
  print(f"{point}: killed, resumed, outputs equal to the uninterrupted run")


# Flag sets whose resume must be bit-identical too, each killed where it measures: a general task with fewer documents
# than the target, mean ablation, neurons, and several masks per call (a resumed call holds other masks: each is
# scored as if alone), with the point where the kill lands mid-measurement.
FLAG_SETS = {
    "general_samples=4": (["--general_samples=4"], "write:measurements.npz@6"),
    "ablation=mean": (["--general_samples=4", "--ablation=mean"], "write:measurements.npz@6"),
    "neurons": (["--general_samples=4", "--unit=neurons", "--method=gradient_confirm"], "write:measurements.npz@4"),
    "masks_per_call>1": (["--general_samples=4", "--tokens_per_batch=256"], "write:measurements.npz@5"),
    "masks_per_call>1,general": (["--general_samples=4", "--tokens_per_batch=256"], "write:measurements.npz@8"),
    "masks_per_call>1,mean": (["--ablation=mean", "--tokens_per_batch=256"], "write:measurements.npz@5"),
}


@pytest.mark.parametrize("flags", FLAG_SETS)
def test_a_resume_is_bit_identical_under_every_flag_set(flags, reference, tiny_model_dir, tmp_path):
  task, _ = reference
  extra, point = FLAG_SETS[flags]
  args = {a.split("=")[0]: a for a in _args(tiny_model_dir, task, "")}
  args.update({a.split("=")[0]: a for a in extra})
  args = [a for k, a in args.items() if k != "--output_dir"]
  expected, out = str(tmp_path / "reference"), str(tmp_path / "run")
  done = run_cli("experiments.localize", *args, f"--output_dir={expected}")
  assert done.returncode == 0, done.stderr[-3000:]
  killed = run_command("localize", [*args, f"--output_dir={out}"],
                       env=dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu", JAXLOC_FAULT=point))
  assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr[-3000:])
  resumed = run_cli("experiments.localize", *args, f"--output_dir={out}")
  assert resumed.returncode == 0 and "resuming after" in resumed.stderr, resumed.stderr[-3000:]
  _assert_same_outputs(out, expected, "neurons.json" if "--unit=neurons" in args else "heads.json")
  print(f"{flags}: killed at {point}, resumed, outputs bit-identical to the uninterrupted run")


def test_a_second_run_is_refused_while_the_first_holds_the_directory(reference, tiny_model_dir, tmp_path):
  task, _ = reference
  out = str(tmp_path / "run")
  args = _args(tiny_model_dir, task, out)
  args[args.index("--num_masks=24")] = "--num_masks=4000"
  env = dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
  first = subprocess.Popen([sys.executable, "-m", "experiments.localize", *args], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 300
    while not os.path.exists(os.path.join(out, "measurements.npz")):
      assert time.time() < deadline and first.poll() is None
      time.sleep(0.1)
    second = run_cli("experiments.localize", *args)
    assert second.returncode == 2 and f"is in use by another run (pid {first.pid} on " in second.stderr, \
        second.stderr[-3000:]
    assert "] loaded " not in second.stderr  # refused before its model loaded
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  # The kill freed the directory: the next run gets past the hold to the resume check (refused here only for its
  # other budget, which keeps the test short).
  args[args.index("--num_masks=4000")] = "--num_masks=24"
  third = run_cli("experiments.localize", *args)
  assert third.returncode == 2 and "--num_masks: saved 4000, now 24" in third.stderr, third.stderr[-3000:]
