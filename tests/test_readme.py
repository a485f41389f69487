"""The README's Python example runs as written (its output directory moved to a temporary one)."""

import contextlib
import io
import os
import re

import pytest

from tests.optional import optional_module

# The example loads SmolLM2, evaluates an lm-eval task and runs a small localization with its confirmation: over two
# minutes on 2 cores, so left out of CI (docs/api.md's page, tests/api/test_notebook.py, runs the same API there).
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _example() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    readme = f.read()
  match = re.search(r"<!-- python-example[^>]*-->\n```python\n(.*?)```", readme, re.S)
  assert match, "README.md has no marked Python example"
  return match.group(1)


def test_readme_python_example_runs(tmp_path, monkeypatch):
  optional_module("lm_eval")  # the example evaluates an lm-eval task
  code = _example()
  assert '"runs/notebook"' in code
  code = code.replace('"runs/notebook"', repr(str(tmp_path / "notebook")))
  monkeypatch.chdir(ROOT)  # the example names repository files by relative path, as a user in a clone would
  printed = io.StringIO()
  namespace = {}
  with contextlib.redirect_stdout(printed):
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
  run = namespace["run"]
  assert len(run.top_k) == 5 and run.coefficients.shape == (30, 9)
  assert os.path.isfile(tmp_path / "notebook" / "heads.json")
  lines = printed.getvalue().splitlines()
  assert lines[0].startswith("[] accuracy") and len(lines) == 6
  assert lines[-1] == "['L8H1', 'L20H5', 'L12H8', 'L1H6', 'L12H5']"
