"""The prompt-level API and the engine type-check: mypy, with the settings of pyproject.toml's [tool.mypy] (which
files, and how strictly each is held), finds no error."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.heavy  # mypy reads jax, flax and numpy's stubs: ~25 s of CPU without its cache
def test_api_and_engine_type_check():
  pytest.importorskip("mypy")
  done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "Success" in done.stdout
