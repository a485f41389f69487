"""`--unit=neurons`: cnl and gradient_confirm over MLP neurons, `evaluate --neurons`, refused combinations."""

import json
import os

import numpy as np
import pytest

from jaxloc.localize.methods import cnl
from tests.experiments.conftest import run_cli

# Each test is a CLI run (or several) in a subprocess: minutes in all, left out of CI (`pytest -m slow` runs them).
pytestmark = pytest.mark.slow

NEURONS = 3 * 48  # the tiny model: 3 layers x 48 MLP neurons


def _args(model_dir, task, out, *extra):
  return [f"--model={model_dir}", f"--task={task}", f"--output_dir={out}", "--cache_dir=none", "--metric=logprob",
          "--num_samples=8", "--validation_samples=4", "--progress=false", "--unit=neurons",
          "--general_tasks=counting", "--general_samples=8", "--top_k=6", *extra]


def test_cnl_run_writes_neurons_json_and_reports_the_overlap(tiny_model_dir, capitals_jsonl, tmp_path):
  out = str(tmp_path / "cnl")
  proc = run_cli("experiments.localize", *_args(tiny_model_dir, capitals_jsonl, out, "--method=cnl", "--cnl_steps=8"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in ("neurons.json", "coefficients.npy", "attribution.npy", "neurons_per_layer.png", "ablation.json",
               "ablation_curve.png", "specificity_curve.png"):
    assert os.path.exists(os.path.join(out, name)), name
  assert not os.path.exists(os.path.join(out, "heads.json"))
  info = json.loads(open(os.path.join(out, "neurons.json")).read())
  assert info["unit"] == "neurons" and info["num_neurons"] == 48
  assert info["num_evaluations"] == (info["confirmation"] or {"masks": 0})["masks"]  # cnl measures no masks
  assert len(info["neurons"]) == NEURONS and {n["name"] for n in info["neurons"]} == {
      f"L{l}N{i}" for l in range(3) for i in range(48)}
  assert len(info["top_k"]) == 6 and all(n.startswith("L") and "N" in n for n in info["top_k"])
  # The ranking is CNL's: recompute it from the saved attributions.
  attribution = np.load(os.path.join(out, "attribution.npy"))
  assert attribution.shape == (8, NEURONS)
  frequency, _, located = cnl.commonality(attribution, 0.2, 0.4)
  by_name = {n["name"]: n for n in info["neurons"]}
  first = by_name[info["top_k"][0]]
  assert first["score"] == pytest.approx(-frequency.max())
  solver = info["solver"]
  assert solver["located_neurons"] == int(located.sum()) and solver["integrated_gradient_steps"] == 8
  assert solver["half_docs"] == [4, 4] and "overlap_rate" in solver and "jaccard" in solver
  assert "commonality neurons" in proc.stdout and "overlap rate between two halves" in proc.stdout
  ablation = json.loads(open(os.path.join(out, "ablation.json")).read())
  assert ablation["unit"] == "neurons" and ablation["neurons"] == info["top_k"]
  assert ablation["held_out"]["neurons"] == info["top_k"] and "single_neuron_drops" in ablation
  # Resuming a finished run reuses the attributions (no new integrated gradients).
  again = run_cli("experiments.localize", *_args(tiny_model_dir, capitals_jsonl, out, "--method=cnl", "--cnl_steps=8"))
  assert again.returncode == 0, again.stderr[-3000:]
  assert json.loads(open(os.path.join(out, "neurons.json")).read())["top_k"] == info["top_k"]
  assert "attribution_seconds" not in json.loads(open(os.path.join(out, "neurons.json")).read())["timing"]


def test_gradient_confirm_over_neurons_and_evaluate_agree(tiny_model_dir, capitals_jsonl, tmp_path):
  out = str(tmp_path / "gc")
  proc = run_cli("experiments.localize", *_args(tiny_model_dir, capitals_jsonl, out, "--method=gradient_confirm",
                                                 "--num_masks=10", "--bootstrap=0"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  info = json.loads(open(os.path.join(out, "neurons.json")).read())
  assert info["num_evaluations"] == 10 + (info["confirmation"] or {"masks": 0})["masks"]
  with np.load(os.path.join(out, "measurements.npz")) as data:
    assert data["masks"].shape == (10, 3, 48) and (data["masks"].reshape(10, -1).sum(axis=1) == 1).all()
  ablation = json.loads(open(os.path.join(out, "ablation.json")).read())
  # evaluate --neurons on the held-out documents' task gives the run's in-sample drop for the same neurons.
  result_path = str(tmp_path / "eval.json")
  ev = run_cli("experiments.evaluate", f"--model={tiny_model_dir}", f"--task={capitals_jsonl}", "--cache_dir=none",
               "--num_samples=8", "--progress=false", "--neurons=" + ",".join(info["top_k"]),
               f"--output_json={result_path}")
  assert ev.returncode == 0, ev.stderr[-3000:]
  result = json.loads(open(result_path).read())
  assert result["neurons"] == info["top_k"] and "heads" not in result
  base = run_cli("experiments.evaluate", f"--model={tiny_model_dir}", f"--task={capitals_jsonl}", "--cache_dir=none",
                 "--num_samples=8", "--progress=false", f"--output_json={result_path}")
  baseline = json.loads(open(result_path).read())["metrics"]["logprob"]
  drop = (baseline - result["metrics"]["logprob"]) / abs(baseline)
  assert base.returncode == 0
  assert drop == pytest.approx(ablation["in_sample"]["task_relative_drop"], abs=1e-4)


@pytest.mark.parametrize("extra, message", [
    (["--method=cs_stratified"], "--method=cs_stratified localizes heads, not neurons"),
    (["--method=cnl", "--unit=heads"], "--method=cnl localizes neurons, not heads"),
    (["--method=cnl", "--cnl_threshold=1.5"], "--cnl_threshold=1.5: 1.5 is not a number in the range"),
])
def test_refused_neuron_settings_exit_2_before_the_model_loads(capitals_jsonl, tmp_path, extra, message):
  proc = run_cli("experiments.localize", *_args("/no/such/model", capitals_jsonl, str(tmp_path / "x"), *extra))
  assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


def test_evaluate_refuses_heads_with_neurons_and_bad_names(tiny_model_dir, capitals_jsonl):
  both = run_cli("experiments.evaluate", f"--model={tiny_model_dir}", f"--task={capitals_jsonl}",
                 "--heads=L0H1", "--neurons=L0N1")
  assert both.returncode != 0 and "give --heads or --neurons, not both" in both.stderr
  bad = run_cli("experiments.evaluate", f"--model={tiny_model_dir}", f"--task={capitals_jsonl}", "--cache_dir=none",
                "--neurons=L0N48", "--progress=false")
  assert bad.returncode == 2 and "neuron L0N48 is out of range" in bad.stderr


def test_compare_units_matches_each_run_held_out_curve(tiny_model_dir, capitals_jsonl, tmp_path):
  """The top-k heads' held-out drop equals the heads run's own specificity curve at k (the same documents), and so
  does the top neurons' for the neurons run; budgets zero equal parameters; random draws are reported."""
  heads_out, neurons_out, out = (str(tmp_path / name) for name in ("heads", "neurons", "units"))
  common = [f"--model={tiny_model_dir}", f"--task={capitals_jsonl}", "--cache_dir=none", "--metric=logprob",
            "--num_samples=8", "--validation_samples=4", "--progress=false", "--general_tasks=counting",
            "--general_samples=8", "--bootstrap=0", "--selection=raw"]
  for args in ([f"--output_dir={heads_out}", "--num_masks=24", "--lasso_alpha=0.02"],
               [f"--output_dir={neurons_out}", "--unit=neurons", "--method=cnl", "--cnl_steps=4", "--top_k=16",
                "--curve_k=16"]):
    proc = run_cli("experiments.localize", *common, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
  proc = run_cli("experiments.compare_units", f"--heads_run={heads_out}", f"--neurons_run={neurons_out}",
                 "--head_counts=1,2", "--draws=2", "--cache_dir=none", f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(open(os.path.join(out, "compare_units.json")).read())
  assert os.path.exists(os.path.join(out, "compare_units.png")) and "| heads | neurons |" in proc.stdout
  assert [b["heads"] for b in result["budgets"]] == [1, 2] and [b["neurons"] for b in result["budgets"]] == [8, 16]
  assert result["budgets"][1]["parameters"] == 2 * 8 * 32  # head_dim 8, hidden 32
  heads_curve = json.loads(open(os.path.join(heads_out, "ablation.json")).read())["specificity_curve"]
  neurons_curve = json.loads(open(os.path.join(neurons_out, "ablation.json")).read())["specificity_curve"]
  for budget in result["budgets"]:
    k, n = budget["heads"], budget["neurons"]
    assert budget["top_heads"]["units"] == heads_curve["heads"][:k]
    assert budget["top_heads"]["target"] == pytest.approx(heads_curve["task"]["relative_drop"][k], abs=1e-9)
    assert budget["top_neurons"]["units"] == neurons_curve["neurons"][:n]
    j = neurons_curve["k"].index(n)
    assert budget["top_neurons"]["target"] == pytest.approx(neurons_curve["task"]["relative_drop"][j], abs=1e-9)
    assert len(budget["random_heads"]["tasks"]["capitals"]["draws"]) == 2
  wrong = run_cli("experiments.compare_units", f"--heads_run={neurons_out}", f"--neurons_run={heads_out}",
                  f"--output_dir={out}")
  assert wrong.returncode == 2 and "--heads_run must be a heads run" in wrong.stderr
