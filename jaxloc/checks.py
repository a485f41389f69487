"""Checks on what a user hands the Python API (`jaxloc.Model`, `jaxloc.masks`), made once at the boundary so that a
bad input is one clear `UserError` naming it (or a warning, where the call can still run) instead of NaN logits, a
silently wrapped token id or an exception from deep inside the tokenizer or the compiled call.

Pure functions over Python values, NumPy arrays and config numbers: they import nothing of the model, so the
tokenizer path (`forward.tokenize`), the mask builders (`jaxloc.masks`) and the engine's callers can all share them.

Axes: `masks` M, `layers` L, `units` U per layer (query heads H or MLP neurons F).
"""

from __future__ import annotations

import operator
import warnings
from typing import Any, Sequence

import numpy as np

from jaxloc.errors import UserError
from jaxloc.units import singular, unit_name

NO_PROMPTS = "no prompts given"


def require_prompts(prompts: Sequence[Any]) -> None:
  """Refuse an empty list of prompts: every call answers per prompt, so an empty list is always a mistake (and
  would otherwise come back as an empty answer from one call and an error from another)."""
  if len(prompts) == 0:
    raise UserError(NO_PROMPTS)


def check_texts(texts: Sequence[str]) -> None:
  """Refuse prompt strings that are not valid Unicode: a lone surrogate ("abc\\ud800", e.g. half of an emoji cut
  from a UTF-16 source) cannot be encoded as UTF-8 and fails deep inside the tokenizer."""
  for index, text in enumerate(texts):
    try:
      text.encode("utf-8")
    except UnicodeEncodeError as error:
      raise UserError(f"prompt {index} is not valid Unicode text: a lone surrogate {text[error.start]!r} at "
                      f"character {error.start} (half of a UTF-16 pair); remove it, or clean the text with "
                      f"text.encode('utf-8', 'replace').decode()") from None


def _shown(value: Any, length: int = 60) -> str:
  """`value`'s repr for a message, cut to `length` characters."""
  text = repr(value)
  return text if len(text) <= length else text[:length - 3] + "..."


def _token_id(value: Any) -> int | None:
  """`value` as a token id where it is an integer (Python, NumPy, or a 0-d integer array), else None: bools and
  floats are refused rather than silently rounded."""
  if isinstance(value, (bool, np.bool_)) or getattr(getattr(value, "dtype", None), "kind", "") == "b":
    return None
  if isinstance(value, (float, np.floating, complex, str, bytes)):
    return None
  try:
    return operator.index(value)
  except TypeError:
    return None


def _vocabulary(vocab_size: int) -> str:
  return f"token ids are integers 0-{vocab_size - 1} (the model's vocab_size is {vocab_size})"


def token_id_list(values: Any, vocab_size: int, where: str) -> list[int]:
  """`values` (a sequence of token ids) as a list of ints, each in [0, vocab_size); `where` names the sequence in
  an error ("prompt 2", "columns"), and an error adds the position of the bad id."""
  if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "iu" \
      and not ((values < 0) | (values >= vocab_size)).any():
    return values.tolist()  # the common case of a valid id array, without a Python loop over its tokens
  items = None
  if not isinstance(values, (str, bytes)):
    try:
      items = list(values)
    except TypeError:
      pass
  if items is None:
    raise UserError(f"{where} is {_shown(values)} ({type(values).__name__}), not a list of token ids: token-id prompts "
                    f"are lists of ids, e.g. [[1, 2, 3]]")
  ids = []
  for position, value in enumerate(items):
    token = _token_id(value)
    if token is None:
      raise UserError(f"{where}, position {position}: {_shown(value)} ({type(value).__name__}) is not a token id: "
                      + _vocabulary(vocab_size))
    if not 0 <= token < vocab_size:
      raise UserError(f"{where}, position {position}: token id {token} is outside the vocabulary: "
                      + _vocabulary(vocab_size))
    ids.append(token)
  return ids


def token_ids(prompts: Sequence[Any], vocab_size: int) -> list[list[int]]:
  """Prompts given as token ids (one sequence of ids per prompt), each id checked to be an integer in
  [0, vocab_size): a negative id would wrap to the end of the vocabulary, 1.5 would become 1, and an id past the
  vocabulary reads outside the embedding table."""
  try:
    items = list(prompts)
  except TypeError:
    raise UserError(f"prompts must be a list of token-id lists, not {type(prompts).__name__}") from None
  return [token_id_list(prompt, vocab_size, f"prompt {index}") for index, prompt in enumerate(items)]


def check_columns(columns: Any, vocab_size: int) -> list[int]:
  """Vocabulary columns to read logits at (`Model.patch(..., columns=)`), as a list of ints in [0, vocab_size)."""
  return token_id_list(columns, vocab_size, "columns")


def check_keep_masks(values: np.ndarray, unit: str, labels: Sequence[str] | None = None) -> None:
  """Refuse keep-masks float [M, L, U] with a value that is not finite or lies outside [0, 1] (1 keeps a unit, 0
  ablates it, a value between scales it): NaN would make every logit NaN and 7 would amplify a unit past anything
  the model computes. The error names the first bad value's mask (and label), unit and value."""
  bad = ~((values >= 0) & (values <= 1))  # NaN fails both comparisons
  if not bad.any():
    return
  where = np.argwhere(bad)
  mask, layer, index = (int(i) for i in where[0])
  label = f" ({labels[mask]!r})" if labels is not None and mask < len(labels) and labels[mask] != f"mask {mask}" \
      else ""
  more = f" ({len(where)} bad values in all)" if len(where) > 1 else ""
  raise UserError(f"mask {mask}{label}, {unit_name(layer, index, unit)}: {float(values[mask, layer, index]):g} is not "
                  f"a keep-mask value{more}: {singular(unit)} keep-masks must be finite and in [0, 1] (1 keeps a "
                  f"unit, 0 ablates it, a value between scales it)")


def check_design_values(ablated: np.ndarray) -> None:
  """Refuse a localization design (True / 1 = ablated, [M, L, H]) with a value that is not finite or lies outside
  [0, 1]: casting it to bool would silently make NaN or 7 an ablation."""
  if ablated.dtype == bool:
    return
  try:
    values = np.asarray(ablated, np.float64)
  except (TypeError, ValueError):
    raise UserError(f"a design must be booleans (True = ablated) or numbers in [0, 1], not {ablated.dtype}") from None
  bad = ~((values >= 0) & (values <= 1))
  if bad.any():
    where = np.argwhere(bad)
    mask, layer, head = (int(i) for i in where[0])
    raise UserError(f"design mask {mask}, {unit_name(layer, head)}: {float(values[mask, layer, head]):g} is not a "
                    f"design value: a design's values must be finite and in [0, 1] (True / 1 ablated, False / 0 "
                    f"kept)")


def require_masks(num_masks: int) -> None:
  """Refuse a mask set of no masks: a call answers per mask, and zero masks have no answer."""
  if num_masks == 0:
    raise UserError("the mask set has no masks: give at least one (jaxloc.masks.none(model) is the unablated model)")


def warn_past_positions(lengths: Sequence[int], max_positions: int, new_tokens: int = 0, stacklevel: int = 2
                        ) -> None:
  """Warn (`warnings.warn`) when a prompt's tokens, plus `new_tokens` generated after them, run past the model's
  `max_positions` (`ModelConfig.max_position_embeddings`): the call still runs, but positions the model was never
  trained on give outputs to distrust. The wording follows the engine's scoring warning
  (`scoring_kernels.tokenize`), which cuts such requests instead.

  stacklevel: as `warnings.warn`'s, counted from the caller of this function (2: the caller's caller)."""
  over = [i for i, length in enumerate(lengths) if int(length) + new_tokens > max_positions]
  if not over:
    return
  longest = max(over, key=lambda i: int(lengths[i]))
  what = "prompts" if new_tokens == 0 else f"prompts with max_new_tokens={new_tokens}"
  tokens = f"{int(lengths[longest]):,} tokens" + ("" if new_tokens == 0 else
                                                  f" + {new_tokens:,} new = {int(lengths[longest]) + new_tokens:,}")
  warnings.warn(f"{len(over)} of {len(lengths)} {what} are longer than the model's {max_positions:,} positions "
                f"(max_position_embeddings): the longest, prompt {longest}, has {tokens}; outputs past position "
                f"{max_positions:,} are outside what the model was trained on (prompts {over[:10]}"
                f"{', ...' if len(over) > 10 else ''})", stacklevel=stacklevel + 1)
