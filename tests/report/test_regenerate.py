"""`python -m experiments.report --all`: the plots and pages under docs/, drawn again from the files git keeps."""

import os
import shutil

import pytest

from jaxloc.errors import UserError
from jaxloc.main.report import ReportConfig, main
from jaxloc.report import regenerate
from tests.experiments.conftest import ROOT

DEFAULT_RUN = os.path.join(ROOT, "docs", "default_run")


def _copy(names, source, target):
  os.makedirs(target)
  for name in names:
    shutil.copy(os.path.join(source, name), target)


def test_it_lists_what_each_directorys_files_give(tmp_path):
  docs = str(tmp_path / "docs")
  _copy(["heads.json", "ablation.json", "coefficients.npy"], DEFAULT_RUN, os.path.join(docs, "full"))
  _copy(["heads.json"], DEFAULT_RUN, os.path.join(docs, "bare"))  # no coefficients, not validated
  _copy(["cross_task.json", "cross_task.md"], os.path.join(ROOT, "docs", "cross_task"), os.path.join(docs, "cross"))
  assert [os.path.relpath(p, docs) for p in regenerate.outputs(docs)] == [
      "bare/report.html", "cross/cross_task.png", "full/report.html", "full/heatmap.png", "full/ablation_curve.png",
      "full/specificity_curve.png"]


def test_it_draws_exactly_what_it_lists(tmp_path):
  docs = str(tmp_path / "docs")
  _copy(["heads.json", "ablation.json", "coefficients.npy"], DEFAULT_RUN, os.path.join(docs, "run"))
  listed = regenerate.outputs(docs)
  assert regenerate.regenerate(docs) == listed and len(listed) == 4
  for path in listed:
    with open(path, "rb") as f:
      head = f.read(16)
    assert head.startswith(b"\x89PNG" if path.endswith(".png") else b"<!DOCTYPE html>"), path
  assert len(os.listdir(os.path.join(docs, "run"))) == 3 + len(listed)


def test_it_stands_alone_and_needs_a_docs_directory(tmp_path):
  with pytest.raises(UserError, match="without --run_dir and --runs"):
    main(ReportConfig(all=True, run_dir=DEFAULT_RUN))
  with pytest.raises(UserError, match="no docs directory"):
    regenerate.outputs(str(tmp_path / "nowhere"))
