"""Every bad input of docs/reliability.md, run as a user runs it: exit status 2, one line on stderr (the last) that
says what is wrong, no traceback, before the model loads wherever the case says so (`reliability.CASES`)."""

import os

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
    # A case that measures (or resumes a run measured for it) is in the slow tier.
    slow = not case.before_load or case.resumes_base_run or case.name == "resume_edited_task"
    yield pytest.param(case, id=case.name, marks=[pytest.mark.heavy] if slow else [])


@pytest.mark.parametrize("case", _params())
def test_bad_input_is_one_line_exit_2(case, tmp_path, tiny_model_dir, task_file, request):
  if case.mount and not NAMESPACES:
    pytest.skip("no user and mount namespaces here (a tmpfs is how the case gets a read-only or full disk)")
  base = request.getfixturevalue("base_run") if case.resumes_base_run else None
  ctx = reliability.Context(str(tmp_path), tiny_model_dir, task_file, base)
  outcome = reliability.run_case(case, ctx)
  assert outcome.returncode == 2, outcome.stderr[-3000:]
  assert "Traceback" not in outcome.stderr and outcome.error_lines == [outcome.last_line], outcome.stderr[-3000:]
  assert ctx.fill(case.message) in outcome.last_line
  assert outcome.loaded == (not case.before_load), outcome.stderr[-3000:]
  assert outcome.checked, f"after {case.name}: {case.check}"


def test_the_reliability_page_lists_every_case():
  with open(os.path.join(reliability.ROOT, "docs", "reliability.md")) as f:
    page = f.read()
  rows = page[page.index("<!-- cases -->"):page.index("<!-- /cases -->")]
  for case in reliability.CASES:
    assert f"| {case.tried} | `{reliability.command_shown(case)}` | `error: " in rows, case.name
