"""The face every task shows the rest of jaxloc.

A task turns documents into engine requests and turns the engine's outputs for a stack of head
masks back into metrics, one value per mask. Localization only ever sees `Task`; it never knows
which capability it measures.

Axes: `masks` (head masks evaluated), `requests` (engine requests; a multiple-choice document
contributes one request per choice), `docs` (task documents).
"""

from __future__ import annotations

import abc
from typing import Any, Literal, Sequence

import numpy as np

from jaxloc.engine.requests import GenerationRequest, ScoreOutputs, ScoringRequest

Doc = dict[str, Any]
OutputType = Literal["loglikelihood", "generate"]


class Task(abc.ABC):
  """A capability measured on documents.

  Subclasses set `name`, `output_type` ("loglikelihood": the engine scores `ScoringRequest`s;
  "generate": the engine greedy-decodes `GenerationRequest`s), `metric_names` (metrics with a value
  per document, whose mean over documents is the task's value: what localization can target) and
  `default_metric` (the metric localization uses unless told otherwise; higher is better). A task
  may also report `aggregate_metric_names`: metrics of the whole document set with no per-document
  value (a corpus-level F1), computed by `compute_metrics` and never localized.
  """

  name: str
  output_type: OutputType
  metric_names: tuple[str, ...]
  default_metric: str
  aggregate_metric_names: tuple[str, ...] = ()

  @abc.abstractmethod
  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    """Documents to evaluate. `num_samples` draws a seeded subset; None means the full split."""

  @abc.abstractmethod
  def requests(self, docs: Sequence[Doc], tokenizer) -> list[ScoringRequest] | list[GenerationRequest]:
    """Engine requests for `docs`, in a fixed order that `compute_metrics` relies on."""

  @abc.abstractmethod
  def doc_metrics(self, docs: Sequence[Doc],
                  outputs: ScoreOutputs | Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    """Metrics per mask and document: name -> float [masks, docs].

    `outputs` is a `ScoreOutputs` for "loglikelihood" tasks, and for "generate" tasks a list
    (one per mask) of lists (one per request) of generated texts, cut at the first stop string.
    Per-document values let a run bootstrap over documents without re-evaluating the model.
    """

  def scored_request_index(self, docs: Sequence[Doc]) -> np.ndarray:
    """int [docs]: for each document, the position among `requests(docs)` of the request whose log-probability is
    the task's differentiable score (what gradient and learned-mask methods follow). Default: the requests are one
    per document (a prompt/target task's target); a multiple-choice task points at each document's gold choice."""
    return np.arange(len(docs))

  def compute_metrics(self, docs: Sequence[Doc],
                      outputs: ScoreOutputs | Sequence[Sequence[str]]) -> dict[str, np.ndarray]:
    """Metrics per mask: name -> float [masks], each the mean of `doc_metrics` over `docs` (a task with
    `aggregate_metric_names` overrides this to add them)."""
    return mean_over_docs(self.doc_metrics(docs, outputs))


def mean_over_docs(doc_metrics: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """name -> float [masks] from name -> float [masks, docs] (0 where there are no docs)."""
  return {name: (np.asarray(v, np.float64).mean(axis=1) if np.shape(v)[1] else
                 np.zeros(np.shape(v)[0], np.float64)) for name, v in doc_metrics.items()}
