"""The comparison page across runs (`experiments.report --runs`): every run, the cross-task matrix of each model and
method, and the heads runs of one model share, read from committed runs (no model)."""

import json
import os
import re

import pytest

from jaxloc.errors import UserError
from jaxloc.main.report import ReportConfig, main
from jaxloc.report.comparison import compare
from tests.experiments.conftest import ROOT



def _run(tmp_path, name, task, model, method, top):
  """A run directory made from the committed default run with its target, model, method and top-k replaced (the
  target's held-out drop moved to the new target's name: the matrix reads only heads.json and ablation.json)."""
  heads = json.load(open(os.path.join(ROOT, "docs", "default_run", "heads.json")))
  ablation = json.load(open(os.path.join(ROOT, "docs", "default_run", "ablation.json")))
  heads.update(task=task, model=model, method=method, top_k=top)
  general = ablation["held_out"]["general_relative_drop"]
  if task in general:
    general["plurals"] = general.pop(task)
  ablation["held_out"]["heads"] = top
  directory = tmp_path / name
  directory.mkdir()
  json.dump(heads, open(directory / "heads.json", "w"))
  json.dump(ablation, open(directory / "ablation.json", "w"))
  return str(directory)


@pytest.fixture
def runs(tmp_path):
  return [_run(tmp_path, "a", "plurals", "smollm2-135m", "gradient_confirm", ["L8H1", "L20H5", "L3H7"]),
          _run(tmp_path, "b", "arithmetic_1d_4shot", "smollm2-135m", "gradient_confirm", ["L21H2", "L20H5"]),
          _run(tmp_path, "c", "plurals", "/models/gemma3-270m", "gradient_confirm", ["L8H1", "L5H0"]),
          _run(tmp_path, "d", "plurals", "smollm2-135m", "cs_stratified", ["L8H1", "L20H5", "L12H8"])]


def test_the_comparison_holds_every_run_a_matrix_per_model_and_method_and_the_shared_heads(runs):
  result = compare(runs)
  assert [(r["task"], r["model"], r["method"]) for r in result["runs"]] == [
      ("plurals", "smollm2-135m", "gradient_confirm"), ("arithmetic_1d_4shot", "smollm2-135m", "gradient_confirm"),
      ("plurals", "gemma3-270m", "gradient_confirm"), ("plurals", "smollm2-135m", "cs_stratified")]
  smollm2 = next(m for m in result["matrices"] if m["model"] == "smollm2-135m" and m["method"] == "gradient_confirm")
  assert smollm2["rows"] == ["plurals", "arithmetic_1d_4shot"]
  assert smollm2["relative_drop"][0][smollm2["columns"].index("arithmetic_1d_4shot")] == pytest.approx(0.102, abs=1e-3)
  shared = {s["model"]: s for s in result["shared"]}
  # Heads are compared within a model: gemma's L8H1 is not SmolLM2's.
  assert shared["smollm2-135m"]["heads"] == {
      "L8H1": ["plurals · smollm2-135m · gradient_confirm", "plurals · smollm2-135m · cs_stratified"],
      "L20H5": ["plurals · smollm2-135m · gradient_confirm",
                "arithmetic_1d_4shot · smollm2-135m · gradient_confirm",
                "plurals · smollm2-135m · cs_stratified"]}
  assert shared["gemma3-270m"]["heads"] == {} and len(shared["smollm2-135m"]["pairs"]) == 3


def test_two_models_of_one_base_name_are_told_apart(tmp_path):
  runs = [_run(tmp_path, "a", "plurals", "orgA/Llama-3.2-1B", "gradient_confirm", ["L8H1"]),
          _run(tmp_path, "b", "plurals", "orgB/Llama-3.2-1B", "gradient_confirm", ["L8H1"])]
  result = compare(runs)
  assert [r["model"] for r in result["runs"]] == ["orgA/Llama-3.2-1B", "orgB/Llama-3.2-1B"]
  assert [s["heads"] for s in result["shared"]] == [{}, {}]  # not one model's head found twice


def test_the_command_writes_one_page_with_links_to_each_runs_page(runs, tmp_path):
  output = str(tmp_path / "out" / "comparison.html")
  main(ReportConfig(runs=runs, output=output))
  page = open(output).read()
  assert page.count("<a href=") == len(runs) and "<script" not in page
  assert re.search(r"<td><b>91%</b> \[84%, 97%\]</td>", page)  # the default run's held-out plurals drop
  link = re.search(r'<a href="([^"]+)">', page).group(1)
  assert link == "../a/report.html"


def test_the_commands_choice_is_checked(runs):
  for config, message in [(ReportConfig(), "give either --run_dir"),
                          (ReportConfig(run_dir=runs[0], runs=runs), "not both"),
                          (ReportConfig(runs=runs[:1]), "at least two")]:
    with pytest.raises(UserError, match=message):
      main(config)
