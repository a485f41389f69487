"""The measurement store on disk: a resume with other settings is refused naming the flag (as the user types it),
whatever files are missing (a store carries its settings), a store or run.json written before a setting was recorded
still resumes (a store saved before it carried settings only beside its run.json), a damaged file is named,
truncation keeps a prefix."""

import json
import logging
import os

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.localize import measurements
from jaxloc.localize.measurements import MeasurementStore

SETTINGS = {"model": "m", "task": "t", "num_samples": 8, "dtype": "float32", "activation_dtype": "float32",
            "documents": "abc"}


def _store(directory, settings=SETTINGS, labels=None):
  return MeasurementStore(str(directory), dict(settings), "accuracy", 2, 3, labels=labels)


def _fill(store, count=4, seed=0):
  rng = np.random.default_rng(seed)
  store.set_baseline({"accuracy": np.ones(5)})
  store.append(rng.random((count, 2, 3)) < 0.3, {"accuracy": rng.random((count, 5))})


@pytest.mark.parametrize("change, shown", [
    ({"dtype": "bfloat16"}, "--dtype: saved 'float32', now 'bfloat16'"),
    ({"activation_dtype": "bfloat16"}, "--activation_dtype: saved 'float32', now 'bfloat16'"),
    ({"num_samples": 6}, "--general_samples: saved 8, now 6"),
    ({"documents": "def"}, "the documents of t: saved 'abc', now 'def'"),
])
def test_a_changed_setting_is_refused_naming_its_flag(tmp_path, change, shown):
  labels = {"num_samples": "--general_samples", "documents": "the documents of t"}
  _fill(_store(tmp_path, labels=labels))
  with pytest.raises(UserError, match="holds measurements made with other settings") as refused:
    _store(tmp_path, {**SETTINGS, **change}, labels)
  assert shown in str(refused.value)
  with pytest.raises(UserError) as checked:  # the check before the model loads says the same and writes nothing
    measurements.check_resume(str(tmp_path), {**SETTINGS, **change}, labels)
  assert str(checked.value) == str(refused.value)
  assert json.load(open(tmp_path / "run.json")) == SETTINGS


def test_settings_may_change_while_nothing_is_measured(tmp_path):
  _store(tmp_path)
  assert len(_store(tmp_path, {**SETTINGS, "dtype": "bfloat16"})) == 0
  assert json.load(open(tmp_path / "run.json"))["dtype"] == "bfloat16"


def _strip_settings(directory):
  """The store in `directory` as a jaxloc before stores carried their settings saved it."""
  path = directory / "measurements.npz"
  with np.load(path) as data:
    arrays = {k: data[k] for k in data.files if k not in (measurements.SAVED_SETTINGS, measurements.SAVED_DIGEST)}
  np.savez(path, **arrays)


def test_a_run_json_without_the_new_keys_resumes_and_records_them(tmp_path, caplog):
  """Stores written before dtypes and the documents' digest were recorded (docs/ runs among them)."""
  _fill(_store(tmp_path))
  _strip_settings(tmp_path)
  old = {k: v for k, v in SETTINGS.items() if k not in ("dtype", "activation_dtype", "documents")}
  with open(tmp_path / "run.json", "w") as f:
    json.dump(old, f)
  with caplog.at_level(logging.WARNING):
    resumed = _store(tmp_path, {**SETTINGS, "dtype": "bfloat16"})
  assert len(resumed) == 4
  assert "predates recording activation_dtype, documents, dtype" in caplog.text
  assert json.load(open(tmp_path / "run.json")) == {**SETTINGS, "dtype": "bfloat16"}
  with pytest.raises(UserError, match="--dtype: saved 'bfloat16', now 'float32'"):  # recorded: checked from now on
    _store(tmp_path)
  os.remove(tmp_path / "run.json")  # ... by the store itself
  with pytest.raises(UserError, match="--dtype: saved 'bfloat16', now 'float32'"):
    _store(tmp_path)
  # A key only the saved settings have (a setting since removed) is no reason to refuse.
  assert len(_store(tmp_path, {k: v for k, v in SETTINGS.items() if k != "task"} | {"dtype": "bfloat16"})) == 4


def test_a_store_carries_its_settings_whatever_files_are_missing(tmp_path):
  """Only the .npz copied into a new directory (no run.json): a resume under other settings is refused naming the
  flags, one under the same settings resumes."""
  _fill(_store(tmp_path / "run"))
  copy = tmp_path / "copy"
  copy.mkdir()
  (copy / "measurements.npz").write_bytes((tmp_path / "run" / "measurements.npz").read_bytes())
  changed = {**SETTINGS, "dtype": "bfloat16", "num_samples": 6}
  for attempt in (lambda: _store(copy, changed), lambda: measurements.check_resume(str(copy), changed)):
    with pytest.raises(UserError, match="--dtype: saved 'float32', now 'bfloat16'; --num_samples: saved 8, now 6"):
      attempt()
  assert not (copy / "run.json").exists()  # refused before writing anything
  # run.json does not decide: one of other settings beside the store changes nothing
  with open(copy / "run.json", "w") as f:
    json.dump(changed, f)
  with pytest.raises(UserError, match="--dtype: saved 'float32', now 'bfloat16'"):
    _store(copy, changed)
  assert len(_store(copy)) == 4
  with np.load(copy / "measurements.npz") as data:
    assert json.loads(str(data["run_settings"])) == SETTINGS
    assert str(data["settings_digest"]) == measurements.settings_digest(SETTINGS)


def test_a_store_saved_before_it_carried_settings_resumes_only_beside_its_run_json(tmp_path):
  _fill(_store(tmp_path))
  _strip_settings(tmp_path)
  os.remove(tmp_path / "run.json")
  for attempt in (lambda: _store(tmp_path), lambda: measurements.check_resume(str(tmp_path), SETTINGS)):
    with pytest.raises(UserError, match="was saved before stores carried their settings, and the run.json that "
                                        "records them is not beside it"):
      attempt()
  with open(tmp_path / "run.json", "w") as f:
    json.dump(SETTINGS, f)
  with pytest.raises(UserError, match="--dtype: saved 'float32', now 'bfloat16'"):
    _store(tmp_path, {**SETTINGS, "dtype": "bfloat16"})
  assert len(_store(tmp_path)) == 4  # checked against its run.json, and from now on carrying them
  with np.load(tmp_path / "measurements.npz") as data:
    assert json.loads(str(data["run_settings"])) == SETTINGS


def test_saved_settings_that_do_not_match_their_digest_are_refused(tmp_path):
  _fill(_store(tmp_path))
  path = tmp_path / "measurements.npz"
  with np.load(path) as data:
    arrays = {k: data[k] for k in data.files}
  arrays["run_settings"] = np.array(json.dumps({**SETTINGS, "dtype": "bfloat16"}))
  np.savez(path, **arrays)
  with pytest.raises(UserError, match="saved settings do not match their digest"):
    _store(tmp_path, {**SETTINGS, "dtype": "bfloat16"})


def test_a_truncated_store_is_named_with_what_to_do(tmp_path):
  _fill(_store(tmp_path))
  path = tmp_path / "measurements.npz"
  os.truncate(path, os.path.getsize(path) // 2)
  for attempt in (lambda: _store(tmp_path), lambda: measurements.check_resume(str(tmp_path), SETTINGS)):
    with pytest.raises(UserError, match=f"{path} is truncated or corrupt .*move it away .* the other tasks' "
                                        "measurements in this run are kept"):
      attempt()


def test_truncate_keeps_the_first_masks_and_their_documents(tmp_path):
  store = _store(tmp_path)
  _fill(store, count=6)
  masks, scores, docs = store.masks.copy(), store.scores.copy(), store.doc_metrics["accuracy"].copy()
  store.truncate(2)
  again = _store(tmp_path)
  assert np.array_equal(again.masks, masks[:2]) and np.array_equal(again.scores, scores[:2])
  assert np.array_equal(again.doc_metrics["accuracy"], docs[:2]) and again.baseline == 1.0
