"""Finished runs made from the committed default run, for the pages and tables that read run files."""

import json
import os

import pytest

from tests.experiments.conftest import ROOT


def fake_run(tmp_path, name, task, model, method, top):
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
  return [fake_run(tmp_path, "a", "plurals", "smollm2-135m", "gradient_confirm", ["L8H1", "L20H5", "L3H7"]),
          fake_run(tmp_path, "b", "arithmetic_1d_4shot", "smollm2-135m", "gradient_confirm", ["L21H2", "L20H5"]),
          fake_run(tmp_path, "c", "plurals", "/models/gemma3-270m", "gradient_confirm", ["L8H1", "L5H0"]),
          fake_run(tmp_path, "d", "plurals", "smollm2-135m", "cs_stratified", ["L8H1", "L20H5", "L12H8"])]
