"""Multi-process runs on one machine: processes joined by jax.distributed (CPU devices, Gloo collectives) run
`experiments.localize` and `experiments.evaluate` as one job, equal to one process over the same devices; only
process 0 writes; a killed process ends the others within a bounded time and a re-launch resumes."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.experiments.conftest import ROOT, run_cli

# Several processes per test, each compiling the model: minutes in all, left out of CI (`pytest -m slow` runs them).
pytestmark = pytest.mark.slow

DEVICES_PER_PROCESS = 2


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _env(devices: int) -> dict[str, str]:
  return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", JAX_PLATFORMS="cpu",
              XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")


def _start(module: str, per_process: list[list[str]]) -> list[subprocess.Popen]:
  """One process per argument list, joined through a coordinator on a free localhost port."""
  address = f"localhost:{_free_port()}"
  return [subprocess.Popen([sys.executable, "-m", module, *args, "--distributed", f"--coordinator_address={address}",
                            f"--num_processes={len(per_process)}", f"--process_id={i}", "--heartbeat_timeout_s=10",
                            "--distributed_timeout_s=60"],
                           cwd=ROOT, env=_env(DEVICES_PER_PROCESS), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
          for i, args in enumerate(per_process)]


def _finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str, str]]:
  deadline = time.monotonic() + timeout
  results = []
  for proc in procs:
    try:
      out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      raise AssertionError("a multi-process run did not finish in time") from None
    results.append((proc.returncode, out, err))
  return results


def _single(module: str, args: list[str], devices: int):
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=_env(devices), capture_output=True,
                        text=True, timeout=300)


def _localize_args(model_dir, task, out, *extra):
  return [f"--model={model_dir}", f"--task={task}", f"--output_dir={out}", "--cache_dir=none", "--metric=logprob",
          "--num_samples=8", "--validation_samples=4", "--tokens_per_batch=64", "--progress=false", *extra]


def _measured(out):
  with np.load(os.path.join(out, "measurements.npz")) as data:
    return data["masks"], data["scores"]


def _saved(out) -> int:
  try:
    return len(_measured(out)[1])
  except (OSError, ValueError, KeyError):
    return 0


def test_two_processes_equal_one_process_and_only_process_0_writes(tiny_model_dir, capitals_jsonl, tmp_path):
  devices = 2 * DEVICES_PER_PROCESS
  extra = ["--num_masks=24", "--general_tasks=counting", "--general_samples=8", "--lasso_alpha=0.02"]
  one = str(tmp_path / "one")
  single = _single("experiments.localize", _localize_args(tiny_model_dir, capitals_jsonl, one, *extra), devices)
  assert single.returncode == 0, single.stderr[-3000:]

  # Process 1 is given its own --output_dir only to show that it writes nothing (shared or not).
  # The multi-process runs leave the conversion cache alone (orbax checkpoints are collective): a --cache_dir is given
  # and a single-process run filled it before the multi-process evaluate runs.
  two, elsewhere, cache = str(tmp_path / "two"), str(tmp_path / "process1"), f"--cache_dir={tmp_path / 'cache'}"
  start = time.monotonic()
  results = _finish(_start("experiments.localize", [_localize_args(tiny_model_dir, capitals_jsonl, d, *extra, cache)
                                                    for d in (two, elsewhere)]))
  wall = time.monotonic() - start
  for rc, _, err in results:
    assert rc == 0, err[-3000:]
  assert "joined the multi-process run as process 1 of 2 (2 of 4 devices here)" in results[1][2]
  assert not os.path.exists(elsewhere)
  masks_one, scores_one = _measured(one)
  masks_two, scores_two = _measured(two)
  assert np.array_equal(masks_one, masks_two)
  np.testing.assert_allclose(scores_two, scores_one, rtol=0, atol=1e-6)
  heads_one = json.load(open(os.path.join(one, "heads.json")))
  heads_two = json.load(open(os.path.join(two, "heads.json")))
  assert [h["name"] for h in heads_two["heads"]] == [h["name"] for h in heads_one["heads"]]
  assert heads_two["top_k"] == heads_one["top_k"]
  for name in ("ablation.json", "heatmap.png", "general/counting/measurements.npz"):
    assert os.path.exists(os.path.join(two, name)), name
  # Both processes print the same report (every process computes everything).
  assert results[0][1].split("rank")[1] == results[1][1].split("rank")[1]
  print(f"2 processes x {DEVICES_PER_PROCESS} devices: {wall:.1f} s wall, measurements equal to 1 process")
  compared = run_cli("experiments.compare_runs", f"--runs={one},{two}", f"--output_json={tmp_path / 'compare.json'}")
  assert compared.returncode == 0, compared.stderr[-2000:]
  agreement = json.load(open(tmp_path / "compare.json"))
  assert agreement["top_k_overlap"] == {"5": 5, "10": 10} and agreement["coefficient_spearman"] == pytest.approx(1.0)
  assert agreement["max_score_difference"] <= 1e-6 and "| top-5 overlap | 5 of 5 |" in compared.stdout

  evaluate = [f"--model={tiny_model_dir}", f"--task={capitals_jsonl}", "--cache_dir=none",
              f"--heads={','.join(heads_one['top_k'][:2])}", "--ablation=mean"]
  single = _single("experiments.evaluate", evaluate + [cache, f"--output_json={tmp_path / 'one.json'}"], devices)
  assert single.returncode == 0, single.stderr[-3000:]
  results = _finish(_start("experiments.evaluate", [evaluate + [cache, f"--output_json={tmp_path / name}"]
                                                    for name in ("two.json", "process1.json")]))
  for rc, _, err in results:
    assert rc == 0, err[-3000:]
    assert "conversion cache off in a multi-process run" in err
  assert not os.path.exists(tmp_path / "process1.json")
  metrics_one = json.load(open(tmp_path / "one.json"))["metrics"]
  metrics_two = json.load(open(tmp_path / "two.json"))["metrics"]
  assert metrics_two.keys() == metrics_one.keys()
  for name, value in metrics_one.items():
    assert metrics_two[name] == pytest.approx(value, abs=1e-6), name


def test_a_killed_process_ends_the_run_and_a_relaunch_resumes(tiny_model_dir, capitals_jsonl, tmp_path):
  out = str(tmp_path / "run")
  settings = ["--num_masks=400", "--validate=false", "--bootstrap=0", "--general_tasks=counting", "--general_samples=6"]
  args = _localize_args(tiny_model_dir, capitals_jsonl, out, *settings)
  procs = _start("experiments.localize", [args, args])
  deadline = time.monotonic() + 240
  while _saved(out) < 40:
    assert time.monotonic() < deadline and all(p.poll() is None for p in procs), procs[0].stderr.read()[-3000:]
    time.sleep(0.2)
  procs[1].send_signal(signal.SIGKILL)
  killed = time.monotonic()
  rc, _, err = _finish(procs[:1], timeout=60)[0]
  ended = time.monotonic() - killed
  procs[1].wait()
  assert rc != 0 and "error: process 0 of 2 failed" in err and "launch every process again" in err, err[-3000:]
  assert ended < 30, ended  # bounded: far below what a hang would take
  saved = _saved(out)
  assert saved >= 40

  results = _finish(_start("experiments.localize", [args, args]))
  for rc, _, err in results:
    assert rc == 0, err[-3000:]
  assert f"resuming after {saved} saved masks" in results[1][2]  # process 1 resumed from process 0's file
  masks, scores = _measured(out)
  assert len(scores) == 400
  single_out = str(tmp_path / "single")
  single = _single("experiments.localize", _localize_args(tiny_model_dir, capitals_jsonl, single_out, *settings),
                   2 * DEVICES_PER_PROCESS)
  assert single.returncode == 0, single.stderr[-3000:]
  masks_single, scores_single = _measured(single_out)
  assert np.array_equal(masks, masks_single)
  np.testing.assert_allclose(scores, scores_single, rtol=0, atol=1e-6)
  print(f"the other process exited {ended:.1f} s after the kill; the re-launch resumed after {saved} masks")


def test_distributed_without_a_cluster_is_an_error(tiny_model_dir, capitals_jsonl, tmp_path):
  env = {k: v for k, v in _env(1).items() if k not in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")}
  args = _localize_args(tiny_model_dir, capitals_jsonl, str(tmp_path / "run"), "--distributed")
  proc = subprocess.run([sys.executable, "-m", "experiments.localize", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 2
  assert "--coordinator_address (or JAX_COORDINATOR_ADDRESS)" in proc.stderr and "Traceback" not in proc.stderr
  proc = run_cli("experiments.localize", *args, f"--coordinator_address=localhost:{_free_port()}",
                 "--num_processes=2", "--process_id=1", "--distributed_timeout_s=2", timeout=120)
  assert proc.returncode == 2 and "no coordinator answered" in proc.stderr, proc.stderr[-2000:]
  assert not os.path.exists(tmp_path / "run")
