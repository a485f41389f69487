"""Measurements on disk: written atomically after every batch, resumed by a re-run with the same flags.

`measurements.npz` (contract): `masks` bool [masks, layers, heads] (True = ablated), `scores` float
[masks] (the localization metric), `baseline` float (unablated score). It also holds every other
metric the task reports, as `metric_<name>` [masks] and `baseline_<name>`, so a later analysis can
switch metric without re-measuring.

`run.json` beside it records the settings that make the measurements what they are (model, task,
samples, design, seed, ...). A re-run whose settings differ is refused, naming the flag.
"""

from __future__ import annotations

import json
import os
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
    os.makedirs(output_dir, exist_ok=True)
    self._check_settings()
    self._load()

  @property
  def path(self) -> str:
    return os.path.join(self.output_dir, MEASUREMENTS)

  @property
  def baseline(self) -> float | None:
    return self.baselines.get(self.metric)

  def _check_settings(self) -> None:
    path = os.path.join(self.output_dir, RUN_SETTINGS)
    if os.path.exists(path):
      with open(path) as f:
        stored = json.load(f)
      differing = [k for k in sorted(set(stored) | set(self.settings)) if stored.get(k) != self.settings.get(k)]
      if differing and os.path.exists(self.path):
        details = "; ".join(f"--{k}: saved {stored.get(k)!r}, now {self.settings.get(k)!r}" for k in differing)
        raise UserError(f"{self.output_dir} holds measurements made with other settings ({details}); rerun with "
                        "the same flags to resume, or choose another --output_dir")
    files.write_json(path, self.settings)

  def _load(self) -> None:
    if not os.path.exists(self.path):
      return
    try:
      with np.load(self.path) as data:
        masks = data["masks"].astype(bool)
        metrics = {k[len("metric_"):]: data[k].astype(np.float64) for k in data.files if k.startswith("metric_")}
        baselines = {k[len("baseline_"):]: float(data[k]) for k in data.files if k.startswith("baseline_")}
    except (OSError, ValueError, KeyError) as e:
      raise UserError(f"{self.path} is unreadable ({e}); move it away to start over") from None
    if masks.shape[1:] != self.shape:
      raise UserError(f"{self.path} holds masks of shape {masks.shape[1:]}, this model has {self.shape}")
    if self.metric not in metrics:
      raise UserError(f"{self.path} has no measurements of metric {self.metric!r}; it has {sorted(metrics)}")
    self.masks, self.metrics, self.baselines = masks, metrics, baselines

  def set_baseline(self, metrics: dict[str, float]) -> None:
    self.baselines = {k: float(v) for k, v in metrics.items()}
    self._save()

  def append(self, masks: np.ndarray, metrics: dict[str, np.ndarray]) -> None:
    masks = np.asarray(masks, bool)
    if self.metric not in metrics:
      raise UserError(f"the task reports metrics {sorted(metrics)}; --metric={self.metric} is not one of them")
    self.masks = np.concatenate([self.masks, masks])
    for name, values in metrics.items():
      previous = self.metrics.get(name, np.zeros((0,), np.float64))
      self.metrics[name] = np.concatenate([previous, np.asarray(values, np.float64)])
    self._save()

  def _save(self) -> None:
    arrays = {"masks": self.masks, "scores": self.scores,
              "baseline": np.float64(self.baseline if self.baseline is not None else np.nan)}
    arrays.update({f"metric_{k}": v for k, v in self.metrics.items()})
    arrays.update({f"baseline_{k}": np.float64(v) for k, v in self.baselines.items()})
    files.save_arrays(self.path, arrays)
