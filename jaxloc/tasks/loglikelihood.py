"""The two loglikelihood task shapes every scored task reduces to.

- `TargetTask`: docs `{"prompt", "target"}`; one ScoringRequest per doc. Metrics `accuracy`
  (every target token is the argmax: greedy exactness) and `logprob` (summed target
  log-probability), each the mean over docs.
- `MultipleChoiceTask`: docs `{"query", "choices", "gold"}`; one ScoringRequest per choice, the
  choice appended to the query after `choice_delimiter` (lm-eval's target_delimiter, " ").
  Metrics `acc` (argmax of summed log-likelihood) and `acc_norm` (argmax of log-likelihood divided
  by the choice's length in characters, as lm-eval's acc_norm does; for ASCII choices this is the
  byte length). Ties go to the first choice, as np.argmax does in lm-eval.

Axes: `masks`, `requests`, `docs`, `choices` (padded to the most choices any doc has).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxloc.engine.requests import ScoreOutputs, ScoringRequest
from jaxloc.tasks.base import Doc, Task


def _check_outputs(outputs, num_requests: int) -> ScoreOutputs:
  if not isinstance(outputs, ScoreOutputs):
    raise TypeError(f"loglikelihood task expects ScoreOutputs, got {type(outputs).__name__}")
  if outputs.logprob.ndim != 2 or outputs.logprob.shape[1] != num_requests:
    raise ValueError(f"ScoreOutputs.logprob has shape {outputs.logprob.shape}; expected "
                     f"[masks, {num_requests}] for the requests this task built")
  return outputs


class TargetTask(Task):
  """Score a fixed continuation of each prompt by teacher forcing."""

  output_type = "loglikelihood"
  metric_names = ("accuracy", "logprob")
  default_metric = "accuracy"

  def requests(self, docs: Sequence[Doc], tokenizer=None) -> list[ScoringRequest]:
    return [ScoringRequest(doc["prompt"], doc["target"]) for doc in docs]

  def doc_metrics(self, docs: Sequence[Doc], outputs: ScoreOutputs) -> dict[str, np.ndarray]:
    outputs = _check_outputs(outputs, len(docs))
    return {
        "accuracy": np.asarray(outputs.is_greedy, dtype=np.float64),
        "logprob": np.asarray(outputs.logprob, dtype=np.float64),
    }


def choice_layout(docs: Sequence[Doc]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Where each doc's choices sit among the requests.

  Returns request_index int [docs, choices] (-1 for padding), choice_length float [docs, choices]
  (characters; 1 for padding) and gold int [docs].
  """
  num_choices = np.array([len(doc["choices"]) for doc in docs], dtype=np.int64)
  max_choices = int(num_choices.max()) if len(docs) else 0
  starts = np.concatenate([[0], np.cumsum(num_choices)[:-1]]).astype(np.int64)
  slot = np.arange(max_choices)[None, :]
  valid = slot < num_choices[:, None]
  request_index = np.where(valid, starts[:, None] + slot, -1)
  choice_length = np.ones((len(docs), max_choices))
  for doc_index, doc in enumerate(docs):
    choice_length[doc_index, :len(doc["choices"])] = [max(1, len(c)) for c in doc["choices"]]
  gold = np.array([doc["gold"] for doc in docs], dtype=np.int64)
  return request_index, choice_length, gold


def multiple_choice_metrics(logprob: np.ndarray, request_index: np.ndarray,
                            choice_length: np.ndarray, gold: np.ndarray) -> dict[str, np.ndarray]:
  """acc and acc_norm [masks, docs] from logprob [masks, requests]; see `choice_layout`."""
  valid = request_index >= 0
  scores = np.where(valid[None], logprob[:, np.maximum(request_index, 0)], -np.inf)
  prediction = scores.argmax(axis=2)
  normalized = np.where(valid[None], scores / choice_length[None], -np.inf)
  normalized_prediction = normalized.argmax(axis=2)
  return {
      "acc": (prediction == gold[None]).astype(np.float64),
      "acc_norm": (normalized_prediction == gold[None]).astype(np.float64),
  }


class MultipleChoiceTask(Task):
  """Pick the choice with the highest log-likelihood after the query."""

  output_type = "loglikelihood"
  metric_names = ("acc", "acc_norm")
  default_metric = "acc"
  choice_delimiter = " "
  joint = False  # lm-eval's HF encoding of each (query, choice) pair (`ScoringRequest.joint`)

  def requests(self, docs: Sequence[Doc], tokenizer=None) -> list[ScoringRequest]:
    return [ScoringRequest(doc["query"], self.choice_delimiter + choice, joint=self.joint)
            for doc in docs for choice in doc["choices"]]

  def scored_request_index(self, docs: Sequence[Doc]) -> np.ndarray:
    request_index, _, gold = choice_layout(docs)
    return request_index[np.arange(len(docs)), gold]

  def doc_metrics(self, docs: Sequence[Doc], outputs: ScoreOutputs) -> dict[str, np.ndarray]:
    request_index, choice_length, gold = choice_layout(docs)
    outputs = _check_outputs(outputs, int((request_index >= 0).sum()))
    return multiple_choice_metrics(np.asarray(outputs.logprob, dtype=np.float64), request_index,
                                   choice_length, gold)
