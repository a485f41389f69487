"""CLI helpers: a small custom task and `run_cli` (the tiny model directory is the root conftest's)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def capitals_jsonl(tmp_path):
  rows = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
          ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Peru", "Lima"), ("Kenya", "Nairobi"),
          ("Norway", "Oslo"), ("Greece", "Athens"), ("Cuba", "Havana"), ("Chile", "Santiago")]
  path = tmp_path / "capitals.jsonl"
  with open(path, "w") as f:
    for country, city in rows:
      f.write(json.dumps({"prompt": f"The capital of {country} is", "target": f" {city}"}) + "\n")
  return str(path)


def run_cli(module, *args, timeout=600, **popen):
  env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=timeout, **popen)
