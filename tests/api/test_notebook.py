"""docs/api.md runs as it stands, and says what its code prints (`tests/api/notebook.py`)."""

import os

import pytest

from tests.api import notebook

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "api.md")


def test_the_recorded_outputs_are_compared_number_by_number():
  assert notebook.same("drops by 2.196\n", "drops by 2.19\n")
  assert not notebook.same("drops by 2.196\n", "drops by 3.196\n")
  assert not notebook.same("L1H4 recovers\n", "L1H5 recovers\n")
  page = "x\n```python\nprint(1)\n```\n\n```text\n1\n```\ny\n```python\nz = 2\n```\n"
  assert notebook.recorded(page) == ["1\n", ""]
  assert notebook.run(page) == ["1\n", ""]
  assert notebook.with_outputs(page, ["2\n", ""]).count("```text\n2\n```") == 1


@pytest.mark.heavy  # SmolLM2 under 270, 100 and single masks: about a minute on two quiet cores
def test_api_page_runs_and_prints_what_it_records():
  with open(PAGE, encoding="utf-8") as f:
    page = f.read()
  printed = notebook.run(page)
  pages = notebook.recorded(page)
  assert len(printed) == len(pages) >= 7
  for i, (out, recorded) in enumerate(zip(printed, pages)):
    assert notebook.same(out, recorded), f"block {i} of docs/api.md printed:\n{out}\nthe page records:\n{recorded}"
