"""`experiments.localize`: outputs, resume after kill -9 without re-measuring, refused flags."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxloc.localize import designs
from tests.experiments.conftest import ROOT, run_cli


def _args(model_dir, task, out, *extra):
  return [f"--model={model_dir}", f"--task={task}", f"--output_dir={out}", "--cache_dir=none",
          "--metric=logprob", "--num_samples=8", "--validation_samples=4", "--tokens_per_batch=64", "--progress=false", *extra]


def _saved(out):
  path = os.path.join(out, "measurements.npz")
  if not os.path.exists(path):
    return 0
  try:
    with np.load(path) as data:
      return len(data["scores"])
  except (OSError, ValueError, KeyError):
    return 0


@pytest.mark.heavy
def test_run_writes_every_output(tiny_model_dir, capitals_jsonl, tmp_path):
  out = str(tmp_path / "run")
  proc = run_cli("experiments.localize", *_args(tiny_model_dir, capitals_jsonl, out, "--num_masks=24",
                                                 "--general_tasks=counting", "--general_samples=8",
                                                 "--check_sklearn", "--lasso_alpha=0.02"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("measurements.npz", "heads.json", "coefficients.npy", "heatmap.png", "ablation.json",
               "ablation_curve.png", "specificity_curve.png", "general/counting/measurements.npz"):
    assert os.path.exists(os.path.join(out, name)), name
  heads = json.loads(open(os.path.join(out, "heads.json")).read())
  for key in ("model", "task", "method", "metric", "num_layers", "num_heads", "num_evaluations", "baseline",
              "heads", "top_k", "flags", "timing"):
    assert key in heads
  assert heads["num_evaluations"] == 24 + (heads["confirmation"] or {"masks": 0})["masks"] and len(heads["heads"]) == 3 * 4
  assert {h["name"] for h in heads["heads"]} == {f"L{l}H{h}" for l in range(3) for h in range(4)}
  # A fixed alpha: as alpha -> 0 a stratified design (every mask ablates k heads) leaves the all-ones
  # direction unpenalized but flat, and coefficients stop being well defined at the 1e-4 level.
  assert heads["solver"]["sklearn_max_abs_diff"] < 1e-4 and heads["solver"]["nonzero"] > 0
  with np.load(os.path.join(out, "measurements.npz")) as data:
    assert data["masks"].shape == (24, 3, 4) and data["masks"].dtype == bool and data["scores"].shape == (24,)
    assert np.isfinite(float(data["baseline"]))
  assert np.load(os.path.join(out, "coefficients.npy")).shape == (3, 4)
  assert heads["engine"]["compilations"] > 0 and heads["engine"]["seconds_per_mask"] > 0
  assert "rank" in proc.stdout and "held-out (4 documents per task)" in proc.stdout
  # The general task was scored under the very same masks, per document.
  with np.load(os.path.join(out, "general/counting/measurements.npz")) as general, \
       np.load(os.path.join(out, "measurements.npz")) as target:
    assert np.array_equal(general["masks"], target["masks"])
    assert target["docs_logprob"].shape == (24, 8) and general["docs_accuracy"].shape == (24, 8)
    np.testing.assert_allclose(target["docs_logprob"].mean(axis=1), target["scores"])
  ablation = json.loads(open(os.path.join(out, "ablation.json")).read())
  held_out = ablation["held_out"]
  assert held_out["num_docs"] == 4 and set(held_out["general_relative_drop"]) == {"counting"}
  assert held_out["heads"] == heads["top_k"] == ablation["heads"]
  low, high = held_out["task_relative_drop_interval"]
  assert low <= held_out["task_relative_drop"] <= high  # a paired bootstrap over the held-out documents
  assert ablation["specificity_curve"]["k"][0] == 0 and ablation["in_sample"]["num_docs"] == 8
  top = [h for h in heads["heads"] if h["name"] in heads["top_k"]]
  assert all(0 <= h["selection_frequency"] <= 1 and h["interval"][0] <= h["interval"][1] for h in top)
  assert heads["confidence"]["resampled"] == "documents and masks"


@pytest.mark.heavy
def test_resume_after_kill_loses_and_remeasures_nothing(tiny_model_dir, capitals_jsonl, tmp_path):
  out = str(tmp_path / "run")
  args = _args(tiny_model_dir, capitals_jsonl, out, "--num_masks=400", "--validate=false",
               "--general_tasks=counting", "--general_samples=6", "--bootstrap=0")
  env = dict(os.environ, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
  proc = subprocess.Popen([sys.executable, "-m", "experiments.localize", *args], cwd=ROOT, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 300
  while _saved(out) < 20 and time.time() < deadline and proc.poll() is None:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  saved = _saved(out)
  assert 0 < saved < 400, f"could not kill mid-run (saved {saved})"
  with np.load(os.path.join(out, "measurements.npz")) as data:
    before = data["scores"].copy()

  resumed = run_cli("experiments.localize", *args)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  heads = json.loads(open(os.path.join(out, "heads.json")).read())
  assert heads["num_evaluations"] == 400 + (heads["confirmation"] or {"masks": 0})["masks"]
  assert heads["timing"]["measured_this_run"] == 400 - saved
  with np.load(os.path.join(out, "measurements.npz")) as data:
    expected = designs.make_design("stratified", 3, 4, num_masks=400, ablation_rate=0.1, seed=0)
    assert np.array_equal(data["masks"], expected)
    assert np.array_equal(data["scores"][:saved], before)  # nothing measured before was lost or redone
  with np.load(os.path.join(out, "general/counting/measurements.npz")) as general:
    assert np.array_equal(general["masks"], expected)  # the general task caught up on the same masks

  changed = run_cli("experiments.localize", *[a if not a.startswith("--num_samples") else "--num_samples=6"
                                              for a in args])
  assert changed.returncode == 2 and "--num_samples: saved 8, now 6" in changed.stderr


@pytest.mark.parametrize("extra, message", [
    (["--ablation_rate=1.5"], "ablation_rate"),
    (["--method=magic"], "method"),
    (["--lasso_alpha=abc"], "lasso_alpha"),
    (["--exclude_heads=L9H9"], "out of range"),
    (["--method=two_stage", "--num_masks=2"], "≥ 3 for two_stage"),
    (["--method=two_stage", "--screen_fraction=1.0"], "screen_fraction"),
])
def test_bad_flags_exit_2(tiny_model_dir, capitals_jsonl, tmp_path, extra, message):
  proc = run_cli("experiments.localize", *_args(tiny_model_dir, capitals_jsonl, str(tmp_path / "o"), *extra))
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert message in proc.stderr and "Traceback" not in proc.stderr


def test_task_errors_come_before_the_model_loads(capitals_jsonl, tmp_path):
  """A missing model would fail the load; the bad metric and the unknown general task are reported first."""
  for extra, message in [(["--metric=bleu"], "--metric=bleu"), (["--general_tasks=counting,nope"], "nope")]:
    proc = run_cli("experiments.localize", *_args(str(tmp_path / "no_such_model"), capitals_jsonl,
                                                   str(tmp_path / "o"), *extra))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
