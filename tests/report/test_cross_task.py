"""`experiments.cross_task`: the capability-generalization matrix from runs on disk (no model)."""

import json
import os

import pytest

from jaxloc.errors import UserError
from jaxloc.report import cross_task
from tests.experiments.conftest import run_cli


def _run(root, task, heads, task_drop, general, model="m"):
  directory = os.path.join(root, model.strip("/").replace("/", "_"), task)
  os.makedirs(directory)
  with open(os.path.join(directory, "heads.json"), "w") as f:
    json.dump({"task": task, "model": model, "method": "gradient_confirm", "num_evaluations": 60,
               "universal_heads": ["L1H5"], "metric": "accuracy", "baseline": 0.9}, f)
  with open(os.path.join(directory, "ablation.json"), "w") as f:
    json.dump({"held_out": {"num_docs": 100, "k": len(heads), "heads": heads, "task_relative_drop": task_drop,
                            "general_relative_drop": general}}, f)
  return directory


def test_the_matrix_reads_every_runs_held_out_drops(tmp_path):
  a = _run(tmp_path, "plurals", ["L8H1"], 0.7, {"counting": 0.05, "induction": 0.1})
  b = _run(tmp_path, "induction", ["L3H3", "L4H0"], 0.8, {"plurals": 0.2, "counting": 0.0})
  result = cross_task.cross_task([a, b])
  assert len(result["models"]) == 1
  block = result["models"][0]
  assert block["columns"] == ["plurals", "induction", "counting"]
  assert block["relative_drop"] == [[0.7, 0.1, 0.05], [0.2, 0.8, 0.0]]
  assert block["table"][0]["largest_general_task"] == "induction"
  assert block["table"][1]["largest_general_relative_drop"] == 0.2
  table = cross_task.markdown(result)
  assert "| plurals | **70%** | 10% | 5% |" in table and "L3H3, L4H0" in table

  out = tmp_path / "out"
  proc = run_cli("experiments.cross_task", f"--runs={a},{b}", f"--output_dir={out}")
  assert proc.returncode == 0, proc.stderr[-2000:]
  for name in ("cross_task.json", "cross_task.md", "cross_task.png"):
    assert (out / name).exists()


def test_a_directory_that_is_not_a_validated_run_is_named(tmp_path):
  with pytest.raises(UserError, match="heads.json does not exist"):
    cross_task.cross_task([str(tmp_path)])
  a = _run(tmp_path, "plurals", ["L8H1"], 0.7, {})
  with pytest.raises(UserError, match="same task"):
    cross_task.cross_task([a, a])


def test_runs_of_several_models_give_a_matrix_each_and_the_targets_side_by_side(tmp_path):
  a = _run(tmp_path, "plurals", ["L8H1"], 0.9, {"counting": 0.02, "induction": 0.1}, model="small")
  b = _run(tmp_path, "induction", ["L0H5"], 0.8, {"plurals": 0.05}, model="small")
  c = _run(tmp_path, "plurals", ["L8H0"], 0.5, {"counting": 0.52, "induction": 0.05}, model="/models/other.gguf")
  result = cross_task.cross_task([a, b, c])
  assert [m["model"] for m in result["models"]] == ["small", "other.gguf"]
  assert result["models"][1]["relative_drop"] == [[0.5, 0.52, 0.05]]
  comparison = result["comparison"]
  assert comparison["tasks"] == ["plurals", "induction"] and comparison["models"] == ["small", "other.gguf"]
  assert comparison["cells"][0][1]["largest_general_task"] == "counting" and comparison["cells"][1][1] is None
  table = cross_task.markdown(result)
  assert "### small" in table and "### other.gguf" in table
  assert "| plurals | 90% / 10% (induction); baseline 0.90 | 50% / 52% (counting); baseline 0.90 |" in table
  assert "| induction | 80% / 5% (plurals); baseline 0.90 | not run |" in table
  cross_task.plot(result, str(tmp_path / "matrix.png"))
  d = _run(tmp_path, "plurals", ["L2H2"], 0.4, {"counting": 0.0}, model="/elsewhere/other.gguf")
  assert [m["model"] for m in cross_task.cross_task([a, c, d])["models"]] == [
      "small", "/models/other.gguf", "/elsewhere/other.gguf"]  # two models of one file name stay apart
  assert (tmp_path / "matrix.png").stat().st_size > 0
  with pytest.raises(UserError, match="two runs of small localize the same task"):
    cross_task.cross_task([a, a, c])
