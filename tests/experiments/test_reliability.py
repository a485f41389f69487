"""Every bad input of docs/reliability.md, run as a user runs it: exit status 2, one line on stderr (the last) that
says what is wrong, no traceback, before the model loads wherever the case says so (`reliability.CASES`); an input
the run goes on with: exit status 0 and one warning line saying how it is taken; Ctrl-C: exit status 130 and one line
saying what was saved (as many masks as the store holds) and how to resume."""

import os
import re

import numpy as np
import pytest

from tests.experiments import reliability

NAMESPACES = reliability.namespaces_work()


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
  return reliability.write_task(str(tmp_path_factory.mktemp("task") / "capitals.jsonl"), reliability.CAPITALS)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_model_dir, task_file):
  return reliability.make_base_run(str(tmp_path_factory.mktemp("base")), tiny_model_dir, task_file)


def _params():
  for case in reliability.CASES:
    # A case that measures (or resumes a run measured for it) is in the heavy tier; one that runs a whole
    # localization to show a warning is in the slow tier (its warning's own test is cheap: tests/test_cli.py,
    # tests/localize/test_run.py, tests/engine/test_scoring.py).
    heavy = not case.before_load or case.resumes_base_run or case.name == "resume_edited_task"
    marks = [pytest.mark.slow] if case.exit == 0 else [pytest.mark.heavy] if heavy else []
    yield pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", _params())
def test_bad_input_is_one_line(case, tmp_path, tiny_model_dir, task_file, request):
  if case.mount and not NAMESPACES:
    pytest.skip("no user and mount namespaces here (a tmpfs is how the case gets a read-only or full disk)")
  base = request.getfixturevalue("base_run") if case.resumes_base_run else None
  ctx = reliability.Context(str(tmp_path), tiny_model_dir, task_file, base)
  outcome = reliability.run_case(case, ctx)
  message = ctx.fill(case.message)
  assert outcome.returncode == case.exit, outcome.stderr[-3000:]
  assert "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
  assert outcome.error_lines == ([outcome.last_line] if case.exit == 2 else []), outcome.stderr[-3000:]
  assert message in outcome.line, outcome.stderr[-3000:]
  if case.exit == 0:  # one warning line says it
    warnings = [line for line in outcome.stderr.splitlines() if message in line]
    assert len(warnings) == 1 and warnings[0].lower().startswith("warning: "), warnings
  if case.exit == 130:  # the line is the last, and its counts are what the stores hold
    assert outcome.line == outcome.last_line and outcome.line.startswith("interrupted: "), outcome.line
    saved = re.findall(r"([\d,]+) (?:masks saved )?in (\S+\.npz)", outcome.line)
    assert saved and int(saved[0][0].replace(",", "")) > 0, outcome.line
    for count, path in saved:
      with np.load(path) as store:
        assert len(store["masks"]) == int(count.replace(",", "")), path
    assert "to resume, rerun python -m experiments.localize with the same flags" in outcome.line
  assert outcome.loaded == (not case.before_load), outcome.stderr[-3000:]
  assert outcome.checked, f"after {case.name}: {case.check}"


def test_the_reliability_page_lists_every_case():
  with open(os.path.join(reliability.ROOT, "docs", "reliability.md")) as f:
    page = f.read()
  rows = page[page.index("<!-- cases -->"):page.index("<!-- /cases -->")]
  for case in reliability.CASES:
    line = "error: " if case.exit == 2 else "interrupted: " if case.exit == 130 else ""
    assert f"| {case.tried} | `{reliability.command_shown(case)}` | `{line}" in rows, case.name
