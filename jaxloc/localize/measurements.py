"""Measurements on disk: written atomically after every batch, resumed by a re-run with the same flags.

`measurements.npz` (contract): `masks` bool [masks, layers, heads] (True = ablated), `scores` float
[masks] (the localization metric), `baseline` float (unablated score). It also holds every other
metric the task reports, as `metric_<name>` [masks] and `baseline_<name>`, so a later analysis can
switch metric without re-measuring, and every metric per document, `docs_<name>` [masks, docs] and
`docs_baseline_<name>` [docs], which the confidence bootstrap resamples (stores written before these
existed resume without them).

`run.json` beside it records the settings that make the measurements what they are (model, task,
samples, design, seed, ...). A re-run whose settings differ is refused, naming the flag.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

import numpy as np

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.localize.methods.base import Measured

MEASUREMENTS = "measurements.npz"
RUN_SETTINGS = "run.json"


class MeasurementStore(Measured):
  """Append-only masks and their metrics (a `Measured` that plans read), persisted after every `append`."""

  def __init__(self, output_dir: str, settings: dict[str, Any], metric: str, num_layers: int, num_heads: int):
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
    try:
      saved = files.read_arrays(self.path)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
      raise UserError(f"{self.path} is unreadable ({e}); move it away to start over") from None
    self._check_settings(has_measurements=saved is not None)
    if saved is not None:
      self._load(saved)

  @property
  def path(self) -> str:
    return os.path.join(self.output_dir, MEASUREMENTS)

  @property
  def baseline(self) -> float | None:
    return self.baselines.get(self.metric)

  def _check_settings(self, has_measurements: bool) -> None:
    path = os.path.join(self.output_dir, RUN_SETTINGS)
    stored = files.read_json(path)
    if stored is not None:
      differing = [k for k in sorted(set(stored) | set(self.settings)) if stored.get(k) != self.settings.get(k)]
      if differing and has_measurements:
        details = "; ".join(f"--{k}: saved {stored.get(k)!r}, now {self.settings.get(k)!r}" for k in differing)
        raise UserError(f"{self.output_dir} holds measurements made with other settings ({details}); rerun with "
                        "the same flags to resume, or choose another --output_dir")
    files.write_json(path, self.settings)

  def _load(self, data: dict[str, np.ndarray]) -> None:
    if "masks" not in data:
      raise UserError(f"{self.path} is unreadable (it has no masks); move it away to start over")
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

  def _save(self) -> None:
    arrays = {"masks": self.masks, "scores": self.scores,
              "baseline": np.float64(self.baseline if self.baseline is not None else np.nan)}
    arrays.update({f"metric_{k}": v for k, v in self.metrics.items()})
    arrays.update({f"baseline_{k}": np.float64(v) for k, v in self.baselines.items()})
    arrays.update({f"docs_{k}": v for k, v in (self.doc_metrics or {}).items()})
    arrays.update({f"docs_baseline_{k}": v for k, v in (self.doc_baselines or {}).items()})
    files.save_arrays(self.path, arrays)
