"""What tasks ask of the engine, and what the engine gives back.

Axes: `masks` (one head mask each), `requests` (one prompt/continuation each).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxloc.errors import UserError


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


# Seeds are 32-bit: JAX's keys (without 64-bit types) keep only a seed's low 32 bits, so larger ones would collide.
SEED_LIMIT = 2**32


def _is_int(value: object) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@dataclasses.dataclass(frozen=True)
class Sampling:
  """How a generation picks each next token: greedy (the argmax) at temperature 0, else a draw from
  softmax(logits / temperature) over the tokens that top-k, then top-p (nucleus), keep, as transformers samples.

  temperature: 0 for greedy decoding (top_k, top_p and seed then change nothing), else above 0.
  top_k: keep the k likeliest tokens (those whose logit reaches the k-th largest); None keeps every one.
  top_p: then keep the smallest set of the likeliest whose probability reaches top_p (always at least the likeliest
    token); 1 keeps every one.
  seed: the draws' seed, an int in [0, 2**32). Each draw's key is folded from it, the row's mask index and prompt
    index in the call, and the token's index in the row (`sampling.token_keys`): the same seed gives the same texts,
    and a (mask, prompt) row draws the same tokens whichever other masks or prompts share the call and however the
    engine batches it.

  Settings out of range raise a `UserError` here; `check_vocab` checks top_k against a model's vocabulary.
  """

  temperature: float = 0.0
  top_k: int | None = None
  top_p: float = 1.0
  seed: int = 0

  def __post_init__(self) -> None:
    if not isinstance(self.temperature, (int, float, np.number)) or isinstance(self.temperature, bool) or not (
        np.isfinite(self.temperature) and self.temperature >= 0):
      raise UserError(f"temperature={self.temperature!r} must be a finite number at least 0 (0: greedy decoding)")
    if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
      raise UserError(f"top_k={self.top_k!r} must be an int at least 1 (or None to keep every token)")
    if not isinstance(self.top_p, (int, float, np.number)) or isinstance(self.top_p, bool) or not (
        0 < self.top_p <= 1):
      raise UserError(f"top_p={self.top_p!r} must be a number in (0, 1] (1 keeps every token)")
    if not _is_int(self.seed) or not 0 <= self.seed < SEED_LIMIT:
      raise UserError(f"seed={self.seed!r} must be an int in [0, 2**32)")
    # Plain Python numbers, so that equal settings hash alike (requests sharing them are one job).
    object.__setattr__(self, "temperature", float(self.temperature))
    object.__setattr__(self, "top_k", None if self.top_k is None else int(self.top_k))
    object.__setattr__(self, "top_p", float(self.top_p))
    object.__setattr__(self, "seed", int(self.seed))

  @property
  def greedy(self) -> bool:
    return self.temperature == 0

  def check_vocab(self, vocab_size: int) -> Sampling:
    """These settings, after checking that top_k is at most `vocab_size` (a `UserError` where it is over)."""
    if self.top_k is not None and self.top_k > vocab_size:
      raise UserError(f"top_k={self.top_k} must be at most the vocabulary size {vocab_size}")
    return self


GREEDY = Sampling()


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
  """Decode after `context` until EOS, a stop string, or `max_new_tokens`: greedily, or sampled as `sampling` says."""

  context: str
  stop: tuple[str, ...] = ()
  max_new_tokens: int = 256
  add_special_tokens: bool = True
  sampling: Sampling = GREEDY


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
