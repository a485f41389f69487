"""What tasks ask of the engine, and what the engine gives back.

Axes: `masks` (one head mask each), `requests` (one prompt/continuation each).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class ScoringRequest:
  """Score `continuation` after `context` by teacher forcing.

  Tokens are `tokenizer(context)` (with the tokenizer's default special tokens when
  `add_special_tokens`) followed by `tokenizer(continuation, add_special_tokens=False)`,
  as lm-eval does. Chat-templated contexts already hold their special tokens as text and set
  `add_special_tokens=False`.

  With `joint`, the pair is encoded as lm-eval's HF backend encodes it for causal models, so that a
  task taken from lm-eval scores the very tokens lm-eval scores: the context's trailing whitespace
  moves to the continuation, `context + continuation` is tokenized as one string, and the
  continuation is what follows the context's own tokens; an empty context becomes the BOS (else
  EOS) token unless the continuation already starts with it.
  """

  context: str
  continuation: str
  add_special_tokens: bool = True
  joint: bool = False


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
  """Greedy-decode after `context` until EOS, a stop string, or `max_new_tokens`."""

  context: str
  stop: tuple[str, ...] = ()
  max_new_tokens: int = 256
  add_special_tokens: bool = True


@dataclasses.dataclass(frozen=True)
class ScoreOutputs:
  """Teacher-forced scores for every (mask, request).

  logprob: float [masks, requests], summed log-probability of the continuation tokens.
  is_greedy: bool [masks, requests], every continuation token is the argmax.
  num_tokens: int [requests], continuation length in tokens.
  """

  logprob: np.ndarray
  is_greedy: np.ndarray
  num_tokens: np.ndarray
