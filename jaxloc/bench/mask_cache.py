"""A persistent cache of task metrics per ablation mask, so benchmark methods never pay twice for a mask.

Axes: `masks` M, `layers` L, `heads` H. Masks are bool [M, L, H], True = ablated (the design
convention); the key of a mask is its bytes (`np.packbits` of the flattened bool mask), so two
methods whose masks coincide (prefixes of one nested design, single-head masks shared by greedy and
a confirmation stage, one top-k set found by two methods) share one evaluation.

One cache holds one evaluation setting: a (model, task, documents, ablation) combination; the
caller names it with `settings` (model, task, num_samples, sample seed, ...) and a directory. On
disk it is a `MeasurementStore` (`measurements.npz` with every metric of every mask, per document, written
atomically after every evaluator batch, plus `run.json` with the settings), so a re-run reuses it
and a killed run loses at most the batch in flight. Settings that differ from the saved ones are
refused rather than mixed. With `directory=None` the cache lives in memory only (synthetic sweeps,
where an evaluation costs microseconds and rewriting a file per batch would dominate).

An evaluator is `evaluate(masks bool [M, L, H]) -> iterator of (slice of masks, {metric: [n, docs]})`
(`docs`: the cache's document count, so that a confirmation decides on intervals as a run does), or
`{metric: [n]}` (means only: `docs=None`, a simulation), yielding as batches finish
(`bench.problems.real_problem` wraps `tasks.evaluation.Evaluator.batches`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator

import numpy as np

from jaxloc.errors import UserError
from jaxloc.localize.measurements import MeasurementStore

log = logging.getLogger(__name__)

Evaluator = Callable[[np.ndarray], Iterator[tuple[slice, dict[str, np.ndarray]]]]


def mask_key(mask: np.ndarray) -> bytes:
  """The cache key of one bool mask [L, H] (or [N])."""
  return np.packbits(np.asarray(mask, bool).reshape(-1)).tobytes()


class _MemoryStore:
  """The part of MeasurementStore's face the cache uses, without a file: each metric per document [masks, docs]
  (docs = 1 for means only), and their means."""

  def __init__(self, num_layers: int, num_heads: int):
    self._masks: list[np.ndarray] = []
    self._values: dict[str, list[np.ndarray]] = {}
    self._joined: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None  # per document, means

  def __len__(self) -> int:
    return sum(len(m) for m in self._masks)

  def _join(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    if self._joined is None:
      values = {k: np.concatenate(v) for k, v in self._values.items()}
      self._joined = values, {k: v.mean(axis=1) for k, v in values.items()}
    return self._joined

  @property
  def doc_metrics(self) -> dict[str, np.ndarray]:
    return self._join()[0]

  @property
  def metrics(self) -> dict[str, np.ndarray]:
    return self._join()[1]

  def append(self, masks: np.ndarray, metrics: dict[str, np.ndarray]) -> None:
    self._masks.append(np.asarray(masks, bool))
    for name, values in metrics.items():
      self._values.setdefault(name, []).append(np.asarray(values, np.float64).reshape(len(masks), -1))
    self._joined = None


class MaskCache:
  """Metrics per mask for one evaluation setting, persisted in `directory` (None: in memory); per document too when
  the evaluator yields them (`docs`: how many).

  `evaluated` counts masks actually evaluated by this process, `served` the requested masks answered
  from the cache (saved earlier, measured earlier in this run, or repeated within one request);
  `evaluate_seconds` the wall time spent in the evaluator.
  """

  def __init__(self, directory: str | None, settings: dict[str, Any], evaluate: Evaluator, num_layers: int,
               num_heads: int, metric: str, docs: int | None = None):
    self.shape = (num_layers, num_heads)
    self.directory = directory
    self.docs = docs
    if directory is None:
      self.store = _MemoryStore(num_layers, num_heads)
      self._index: dict[bytes, int] = {}
    else:
      self.store = MeasurementStore(directory, settings, metric, num_layers, num_heads)
      self._index = {mask_key(m): i for i, m in enumerate(self.store.masks)}
      saved = {v.shape[1] for v in (self.store.doc_metrics or {}).values()} if len(self.store) else set()
      if docs is not None and saved and saved != {docs}:
        raise UserError(f"{self.store.path} holds {'means only' if saved == {1} else f'{sorted(saved)} values'} per "
                        f"mask, not the {docs} documents' values the benchmark keeps now (a cache saved before it "
                        "kept them): move it away to measure its masks again")
    self._evaluate = evaluate
    self.loaded = len(self.store)
    self.evaluated = 0
    self.served = 0
    self.evaluate_seconds = 0.0

  def __len__(self) -> int:
    return len(self.store)

  def contains(self, mask: np.ndarray) -> bool:
    return mask_key(mask) in self._index

  def measure(self, masks: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric for every mask (bool [M, L, H]): name -> float [M]; evaluates only unseen masks."""
    rows = self._rows(masks)
    return {name: values[rows] for name, values in self.store.metrics.items()}

  def per_doc(self, masks: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric for every mask per document: name -> float [M, docs]; evaluates only unseen masks. Only for a
    cache of per-document values (`docs`)."""
    if self.docs is None:
      raise ValueError("this cache keeps means only")
    rows = self._rows(masks)
    return {name: values[rows] for name, values in self.store.doc_metrics.items()}

  def _rows(self, masks: np.ndarray) -> np.ndarray:
    """The store's row of every mask (bool [M, L, H]), evaluating the unseen ones."""
    masks = np.asarray(masks, bool)
    if masks.ndim != 3 or masks.shape[1:] != self.shape:
      raise ValueError(f"masks must be [masks, {self.shape[0]}, {self.shape[1]}], got {masks.shape}")
    keys = [mask_key(m) for m in masks]
    todo, seen = [], set()
    for i, key in enumerate(keys):
      if key not in self._index and key not in seen:
        seen.add(key)
        todo.append(i)
    self.served += len(masks) - len(todo)
    if todo:
      pending = masks[todo]
      if len(todo) > 1 and self.directory is not None:
        log.info("evaluating %d new masks (%d of %d requested served from the cache)", len(todo),
                 len(masks) - len(todo), len(masks))
      start = time.perf_counter()
      for where, metrics in self._evaluate(pending):
        self.evaluate_seconds += time.perf_counter() - start
        base = len(self.store)
        self.store.append(pending[where], metrics)
        for offset, i in enumerate(range(where.start, where.stop)):
          self._index[keys[todo[i]]] = base + offset
        self.evaluated += where.stop - where.start
        start = time.perf_counter()
    return np.array([self._index[k] for k in keys], np.int64)

  def counts(self) -> dict[str, Any]:
    return {"saved_masks": len(self), "loaded_from_disk": self.loaded, "evaluated": self.evaluated,
            "served_from_cache": self.served, "evaluate_seconds": self.evaluate_seconds}
