"""The comparison page across runs (`experiments.report --runs`): every run, the cross-task matrix of each model and
method, and the heads runs of one model share, read from committed runs (no model)."""

import re

import pytest

from jaxloc.errors import UserError
from jaxloc.main.report import ReportConfig, main
from jaxloc.report.comparison import compare
from tests.report.conftest import fake_run



def test_the_comparison_holds_every_run_a_matrix_per_model_and_method_and_the_shared_heads(runs):
  result = compare(runs)
  assert [(r["task"], r["model"], r["method"]) for r in result["runs"]] == [
      ("plurals", "smollm2-135m", "gradient_confirm"), ("arithmetic_1d_4shot", "smollm2-135m", "gradient_confirm"),
      ("plurals", "gemma3-270m", "gradient_confirm"), ("plurals", "smollm2-135m", "cs_stratified")]
  smollm2 = next(m for m in result["matrices"] if m["model"] == "smollm2-135m" and m["method"] == "gradient_confirm")
  assert smollm2["rows"] == ["plurals", "arithmetic_1d_4shot"]
  assert smollm2["relative_drop"][0][smollm2["columns"].index("arithmetic_1d_4shot")] == pytest.approx(0.163, abs=1e-3)
  shared = {s["model"]: s for s in result["shared"]}
  # Heads are compared within a model: gemma's L8H1 is not SmolLM2's.
  assert shared["smollm2-135m"]["heads"] == {
      "L8H1": ["plurals · smollm2-135m · gradient_confirm", "plurals · smollm2-135m · cs_stratified"],
      "L20H5": ["plurals · smollm2-135m · gradient_confirm",
                "arithmetic_1d_4shot · smollm2-135m · gradient_confirm",
                "plurals · smollm2-135m · cs_stratified"]}
  assert shared["gemma3-270m"]["heads"] == {} and len(shared["smollm2-135m"]["pairs"]) == 3


def test_two_models_of_one_base_name_are_told_apart(tmp_path):
  runs = [fake_run(tmp_path, "a", "plurals", "orgA/Llama-3.2-1B", "gradient_confirm", ["L8H1"]),
          fake_run(tmp_path, "b", "plurals", "orgB/Llama-3.2-1B", "gradient_confirm", ["L8H1"])]
  result = compare(runs)
  assert [r["model"] for r in result["runs"]] == ["orgA/Llama-3.2-1B", "orgB/Llama-3.2-1B"]
  assert [s["heads"] for s in result["shared"]] == [{}, {}]  # not one model's head found twice


def test_the_command_writes_one_page_with_links_to_each_runs_page(runs, tmp_path):
  output = str(tmp_path / "out" / "comparison.html")
  main(ReportConfig(runs=runs, output=output))
  page = open(output).read()
  assert page.count("<a href=") == len(runs) and "<script" not in page
  assert re.search(r"<td><b>93%</b> \[87%, 98%\]</td>", page)  # the default run's held-out plurals drop
  link = re.search(r'<a href="([^"]+)">', page).group(1)
  assert link == "../a/report.html"


def test_the_commands_choice_is_checked(runs):
  for config, message in [(ReportConfig(), "give either --run_dir"),
                          (ReportConfig(run_dir=runs[0], runs=runs), "not both"),
                          (ReportConfig(runs=runs[:1]), "at least two")]:
    with pytest.raises(UserError, match=message):
      main(config)
