"""Resuming keeps what is intact: a target whose measurements.npz was moved away measures its masks again while the
general tasks keep theirs; general masks that differ from the target's are dropped from there on and measured again;
the run's checks need only the model's config, and the engine's scoring settings are the ones recorded."""

import logging
import os
import shutil

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.localize.localization import check_layout, engine_scoring_settings, load_tasks, localize
from jaxloc.localize.settings import LocalizeSettings

SENTINEL = 1000.0  # added to a store's saved scores: still there after a resume means it was kept, not measured again


@pytest.fixture(scope="module")
def engine(tokenizer):
  from jaxloc.engine.config import EngineConfig
  from jaxloc.engine.engine import Engine
  from tests.tiny import make_tiny

  return Engine(make_tiny(tokenizer), EngineConfig(tokens_per_batch=256))


def _settings(out):
  return LocalizeSettings.make(model="tiny", task="counting", output_dir=str(out), num_masks=8, ablation_rate=0.2,
                               num_samples=6, general_tasks=["plurals"], general_samples=6, metric="logprob",
                               validate=False, bootstrap=0)


def _load(path):
  with np.load(path) as data:
    return {k: data[k] for k in data.files}


def _mark(path, rows=slice(None), flip_row=None):
  """Adds SENTINEL to the saved scores of `rows` (flipping one head of mask `flip_row`, if given)."""
  data = _load(path)
  for key, value in data.items():
    if key == "scores" or key.startswith("metric_") or (key.startswith("docs_") and "baseline" not in key):
      value[rows] += SENTINEL
  if flip_row is not None:
    data["masks"][flip_row, 0, 0] ^= True
  np.savez(path, **data)


def test_a_moved_away_target_store_keeps_the_general_measurements(engine, tmp_path, caplog):
  out = tmp_path / "run"
  localize(engine, _settings(out), progress=False)
  target, general = out / "measurements.npz", out / "general" / "plurals" / "measurements.npz"
  before, general_before = _load(target), _load(general)
  _mark(general)
  shutil.move(target, tmp_path / "moved.npz")
  with caplog.at_level(logging.WARNING):
    heads = localize(engine, _settings(out), progress=False)
  assert f"{target} holds 0 measured masks; keeping plurals's 8" in caplog.text
  assert heads["timing"]["measured_this_run"] == 8
  after, general_after = _load(target), _load(general)
  assert np.array_equal(after["masks"], before["masks"]) and np.array_equal(after["scores"], before["scores"])
  assert np.array_equal(general_after["masks"], before["masks"])
  np.testing.assert_array_equal(general_after["scores"], general_before["scores"] + SENTINEL)  # kept, not measured


def test_general_masks_that_differ_from_the_targets_are_measured_again(engine, tmp_path, caplog):
  out = tmp_path / "run"
  localize(engine, _settings(out), progress=False)
  general = out / "general" / "plurals" / "measurements.npz"
  general_before = _load(general)
  _mark(general, flip_row=5)
  with caplog.at_level(logging.WARNING):
    localize(engine, _settings(out), progress=False)
  assert "dropping plurals's last 3 measured masks" in caplog.text
  general_after = _load(general)
  assert np.array_equal(general_after["masks"], _load(out / "measurements.npz")["masks"])
  np.testing.assert_array_equal(general_after["scores"][:5], general_before["scores"][:5] + SENTINEL)
  np.testing.assert_allclose(general_after["scores"][5:], general_before["scores"][5:], rtol=0, atol=1e-9)


def test_layout_checks_need_only_the_config_and_scoring_settings_are_recorded(engine, tmp_path):
  settings = _settings(tmp_path / "run")
  tasks = load_tasks(settings)
  config = engine.model_config
  for changes, message in [(dict(top_k=19), "--top_k=19 is more than the 18 heads there are to select"),
                           (dict(top_k=17, exclude_heads=["L0H1", "L2H5"]), "16 heads .* less 2 excluded"),
                           (dict(exclude_heads=["L3H0"]), "head L3H0 is out of range"),
                           (dict(num_masks=10**12), "--num_masks=1,000,000,000,000 would need about")]:
    with pytest.raises(UserError, match=message):
      check_layout(settings.replace(**changes), tasks, config)
  check_layout(settings.replace(top_k=18), tasks, config)
  check_layout(settings.replace(method="greedy", num_masks=10**12), tasks, config)  # greedy reads no --num_masks
  localize(engine, settings, tasks, progress=False)
  import json

  recorded = json.load(open(os.path.join(settings.output_dir, "run.json")))
  assert {k: recorded[k] for k in ("dtype", "activation_dtype", "share_prefix", "float32_matmuls")} \
      == engine_scoring_settings(engine) \
      == {"dtype": "float32", "activation_dtype": "float32", "share_prefix": True, "float32_matmuls": "highest"}
  assert len(recorded["documents"]) == 16
