"""Measurements on disk: written atomically after every batch, resumed by a re-run with the same flags.

`measurements.npz` (contract): `masks` bool [masks, layers, heads] (True = ablated), `scores` float
[masks] (the localization metric), `baseline` float (unablated score). It also holds every other
metric the task reports, as `metric_<name>` [masks] and `baseline_<name>`, so a later analysis can
switch metric without re-measuring, and every metric per document, `docs_<name>` [masks, docs] and
`docs_baseline_<name>` [docs], which the confidence bootstrap resamples (stores written before these
existed resume without them).

The settings that make the measurements what they are (every setting that changes a score: model, parameter and
activation dtype, task and its options, a digest of the documents, samples, ablation, design, seed, ...) are saved in
the store itself, as JSON in `run_settings` (a 0-d string), with their digest in `settings_digest`, and for the reader
in `run.json` beside it. A re-run whose settings differ from the store's is refused, naming the flag, whatever other
files are missing or were copied in: the store's own `run_settings` decide, not run.json. A store saved before it
carried its settings is checked against its run.json, and refused when that is missing (nothing says what its
measurements were made with); once resumed it carries them. A setting that a store saved before it was recorded is
missing from its saved settings: it is accepted (the store cannot say which value it had), said in a warning, and
recorded from then on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any, Mapping

import numpy as np

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.localize.methods.base import Measured

log = logging.getLogger(__name__)

MEASUREMENTS = "measurements.npz"
RUN_SETTINGS = "run.json"
# The store's own copy of its settings, and their digest (`settings_digest`).
SAVED_SETTINGS, SAVED_DIGEST = "run_settings", "settings_digest"


class MeasurementStore(Measured):
  """Append-only masks and their metrics (a `Measured` that plans read), persisted after every `append`.

  labels: how a message names a setting, by key, when not as its flag --<key> (a general task's `num_samples` is
  --general_samples)."""

  def __init__(self, output_dir: str, settings: dict[str, Any], metric: str, num_layers: int, num_heads: int,
               labels: Mapping[str, str] | None = None):
    self.output_dir = output_dir
    self.settings = settings
    self.metric = metric
    self.shape = (num_layers, num_heads)
    self.masks = np.zeros((0, num_layers, num_heads), bool)
    self.metrics: dict[str, np.ndarray] = {}
    self.baselines: dict[str, float] = {}
    self.doc_metrics: dict[str, np.ndarray] | None = {}
    self.doc_baselines: dict[str, np.ndarray] | None = {}
    # Read as process 0 sees them (every process of a multi-process run resumes from the same point).
    saved = _read(self.path)
    self.resumed = saved is not None  # opened from a saved file, its settings checked
    missing = check_settings(output_dir, settings, labels, saved)
    if missing and saved is not None:
      log.warning("%s predates recording %s; its measurements are taken to match this run's (%s), recorded from now "
                  "on", self.path if SAVED_SETTINGS in saved else os.path.join(output_dir, RUN_SETTINGS),
                  ", ".join(missing), ", ".join(f"{k}={settings[k]!r}" for k in missing))
    files.write_json(os.path.join(output_dir, RUN_SETTINGS), settings)
    if saved is not None:
      self._load(saved)
      if missing or SAVED_SETTINGS not in saved:
        self._save()  # it carries its settings from now on, whatever happens to run.json

  @property
  def path(self) -> str:
    return os.path.join(self.output_dir, MEASUREMENTS)

  @property
  def baseline(self) -> float | None:
    return self.baselines.get(self.metric)

  def _load(self, data: dict[str, np.ndarray]) -> None:
    if "masks" not in data:
      raise UserError(f"{self.path} is unreadable (it has no masks); move it away to measure its task again")
    masks = data["masks"].astype(bool)
    metrics = {k[len("metric_"):]: v.astype(np.float64) for k, v in data.items() if k.startswith("metric_")}
    baselines = {k[len("baseline_"):]: float(v) for k, v in data.items() if k.startswith("baseline_")}
    doc_metrics = {k[len("docs_"):]: v.astype(np.float64) for k, v in data.items()
                   if k.startswith("docs_") and not k.startswith("docs_baseline_")}
    doc_baselines = {k[len("docs_baseline_"):]: v.astype(np.float64) for k, v in data.items()
                     if k.startswith("docs_baseline_")}
    if masks.shape[1:] != self.shape:
      raise UserError(f"{self.path} holds masks of shape {masks.shape[1:]}, this model has {self.shape}")
    if len(masks) and self.metric not in metrics:  # a run killed after its baseline has no masks yet
      raise UserError(f"{self.path} has no measurements of metric {self.metric!r}; it has {sorted(metrics)}")
    self.masks, self.metrics, self.baselines = masks, metrics, baselines
    complete = set(doc_metrics) == set(metrics) and all(len(v) == len(masks) for v in doc_metrics.values())
    self.doc_metrics, self.doc_baselines = (doc_metrics, doc_baselines) if complete else (None, None)

  def set_baseline(self, doc_metrics: dict[str, np.ndarray]) -> None:
    """The unablated model's metrics per document: name -> float [docs]."""
    self.doc_baselines = {k: np.asarray(v, np.float64).reshape(-1) for k, v in doc_metrics.items()}
    self.baselines = {k: float(v.mean()) for k, v in self.doc_baselines.items()}
    self._save()

  def append(self, masks: np.ndarray, doc_metrics: dict[str, np.ndarray]) -> None:
    """Adds masks [m, L, H] and their metrics per document, name -> float [m, docs]."""
    masks = np.asarray(masks, bool)
    if self.metric not in doc_metrics:
      raise UserError(f"the task reports metrics {sorted(doc_metrics)}; --metric={self.metric} is not one of them")
    self.masks = np.concatenate([self.masks, masks])
    for name, values in doc_metrics.items():
      values = np.asarray(values, np.float64).reshape(len(masks), -1)
      previous = self.metrics.get(name, np.zeros((0,), np.float64))
      self.metrics[name] = np.concatenate([previous, values.mean(axis=1)])
      if self.doc_metrics is not None:
        before = self.doc_metrics.get(name, np.zeros((0, values.shape[1]), np.float64))
        self.doc_metrics[name] = np.concatenate([before, values])
    self._save()

  def truncate(self, count: int) -> None:
    """Keeps the first `count` masks and their measurements (those after them disagree with the run's)."""
    self.masks = self.masks[:count]
    self.metrics = {k: v[:count] for k, v in self.metrics.items()}
    if self.doc_metrics is not None:
      self.doc_metrics = {k: v[:count] for k, v in self.doc_metrics.items()}
    self._save()

  def _save(self) -> None:
    arrays = {"masks": self.masks, "scores": self.scores,
              "baseline": np.float64(self.baseline if self.baseline is not None else np.nan),
              SAVED_SETTINGS: np.array(json.dumps(_as_saved(self.settings), sort_keys=True)),
              SAVED_DIGEST: np.array(settings_digest(self.settings))}
    arrays.update({f"metric_{k}": v for k, v in self.metrics.items()})
    arrays.update({f"baseline_{k}": np.float64(v) for k, v in self.baselines.items()})
    arrays.update({f"docs_{k}": v for k, v in (self.doc_metrics or {}).items()})
    arrays.update({f"docs_baseline_{k}": v for k, v in (self.doc_baselines or {}).items()})
    files.save_arrays(self.path, arrays)


def check_resume(output_dir: str, settings: dict[str, Any], labels: Mapping[str, str] | None = None) -> None:
  """What opening the store in `output_dir` with `settings` would refuse (its file unreadable, or measurements made
  with other settings), found without writing anything: a run checks it before its model loads."""
  saved = _read(os.path.join(output_dir, MEASUREMENTS))
  check_settings(output_dir, settings, labels, saved)


def settings_digest(settings: Any) -> str:
  """A digest of settings (a dict, or a list of them) as saved (`_as_saved`), independent of key order."""
  return hashlib.sha256(json.dumps(_as_saved(settings), sort_keys=True).encode()).hexdigest()[:16]


def check_settings(output_dir: str, settings: dict[str, Any], labels: Mapping[str, str] | None,
                   saved: Mapping[str, np.ndarray] | None) -> list[str]:
  """With measurements saved (`saved`, the store's arrays), a UserError naming every setting that differs from those
  they were made with: the store's own (`run_settings`), or for a store saved before it carried them, run.json's (a
  UserError when it has none); returns the settings they do not record (saved before they were). Without
  measurements, nothing is refused and nothing is missing."""
  if saved is None:
    return []
  path = os.path.join(output_dir, MEASUREMENTS)
  if SAVED_SETTINGS in saved:
    stored = _saved_settings(path, saved)
  else:
    stored = files.read_json(os.path.join(output_dir, RUN_SETTINGS))
    if stored is None:
      raise UserError(f"{path} was saved before stores carried their settings, and the {RUN_SETTINGS} that records "
                      f"them is not beside it: nothing says what its measurements were made with; put the run's "
                      f"{RUN_SETTINGS} back beside it to resume, or move it away to measure again")
  # Flags first, in order; then what no flag names (the documents' digest).
  differing = [k for k in sorted(settings, key=lambda k: (k in (labels or {}) and not labels[k].startswith("--"), k))
               if k in stored and stored[k] != _as_saved(settings[k])]
  if differing:
    labels = labels or {}
    details = "; ".join(f"{labels.get(k, '--' + k)}: saved {stored[k]!r}, now {settings[k]!r}" for k in differing)
    raise UserError(f"{output_dir} holds measurements made with other settings ({details}); rerun with the same flags "
                    "to resume, or choose another --output_dir")
  return [k for k in sorted(settings) if k not in stored]


def _saved_settings(path: str, saved: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The settings a store carries, checked against their digest."""
  try:
    stored = json.loads(str(saved[SAVED_SETTINGS]))
    intact = isinstance(stored, dict) and str(saved.get(SAVED_DIGEST, "")) == settings_digest(stored)
  except ValueError:
    intact = False
  if not intact:
    raise UserError(f"{path} is corrupt (its saved settings do not match their digest); move it away (or delete it) "
                    "to measure its task again: the other tasks' measurements in this run are kept")
  return stored


def _as_saved(value: Any) -> Any:
  """A setting as it reads back from run.json (tuples become lists)."""
  return json.loads(json.dumps(value, default=str))


def _read(path: str) -> dict[str, np.ndarray] | None:
  try:
    return files.read_arrays(path)
  except files.CorruptFile as e:
    raise UserError(f"{path} is truncated or corrupt ({e.detail}); move it away (or delete it) to measure its task "
                    "again: the other tasks' measurements in this run are kept") from None
