"""CLI helpers: a small custom task and `run_cli` (the tiny model directory is the root conftest's)."""

import os
import subprocess
import sys

import pytest

from tests.experiments.reliability import CAPITALS, write_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def capitals_jsonl(tmp_path):
  return write_task(str(tmp_path / "capitals.jsonl"), CAPITALS)


def run_cli(module, *args, timeout=600, **popen):
  env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout, **popen)
