"""The held-out table of runs (`experiments.report --runs=... --held_out_json`, `jaxloc.report.held_out`): each row
from a run's heads.json and ablation.json, and the table docs/concepts.md shows is the one the command prints for the
committed rows of the languages study."""

import json
import os

import pytest

from jaxloc.errors import UserError
from jaxloc.main.report import ReportConfig, main
from jaxloc.report import held_out
from tests.experiments.conftest import ROOT


def test_a_row_holds_the_held_out_drops_and_what_confirming_cost(runs, tmp_path):
  ablation = json.load(open(os.path.join(runs[0], "ablation.json")))["held_out"]
  row = held_out.summarize(runs[0])
  assert row["top_k"] == ablation["heads"] and row["task_drop"] == ablation["task_relative_drop"]
  general = ablation["general_relative_drop"]
  assert row["general_drop"] == max(general.values()) and row["general_drops"] == general
  assert row["worst_general"] == max(general, key=general.get)
  heads = json.load(open(os.path.join(runs[0], "heads.json")))
  assert row["confirmation_masks"] == heads["confirmation"]["masks"]
  output = tmp_path / "rows.json"
  main(ReportConfig(runs=runs, output=str(tmp_path / "c.html"), held_out_json=str(output)))
  rows = json.load(open(output))
  assert [r["method"] for r in rows] == ["gradient_confirm", "gradient_confirm", "gradient_confirm", "cs_stratified"]
  table = held_out.markdown(rows)
  assert table.count("\n") == len(rows) + 1
  assert f"{100 * row['task_drop']:.0f}% [" in table


def test_it_needs_finished_validated_runs(tmp_path):
  with pytest.raises(UserError, match="not a finished head localization run"):
    held_out.summarize(str(tmp_path))
  with pytest.raises(UserError, match="--held_out_json needs --runs"):
    main(ReportConfig(run_dir=str(tmp_path), held_out_json=str(tmp_path / "x.json")))


def test_the_docs_table_is_the_commands_table_of_the_committed_rows():
  rows = json.load(open(os.path.join(ROOT, "docs", "languages", "held_out.json")))
  concepts = open(os.path.join(ROOT, "docs", "concepts.md"), encoding="utf-8").read()
  assert held_out.markdown(rows) in concepts
