"""Optional extras in tests: skipped for users without them; CI installs every extra, so there (CI set) a missing one
fails instead of hiding behind a skip."""

import importlib
import os

import pytest


def optional_module(name: str):
  """The module `name`, or a skip (a failure in CI) when it is not installed."""
  if os.environ.get("CI"):
    return importlib.import_module(name)
  return pytest.importorskip(name)
