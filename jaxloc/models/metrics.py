"""Metrics of a model's logits that patching experiments and gradients read (`jaxloc.LogitDiff`): plain functions of
logits, in numpy for patched results and in jax.numpy inside a compiled gradient."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from jaxloc.errors import UserError


@dataclasses.dataclass(frozen=True)
class LogitDiff:
  """The mean over prompts of logit(correct) - logit(wrong) at each prompt's last token (IOI's logit difference).

  correct, wrong: a token id per prompt. Called on logits [..., P, V] (numpy or jax), or on logits of some columns
  [..., P, T] with `columns` (the token id of each column); returns [...]. Frozen, so a compiled gradient of it is
  reused for equal metrics."""

  correct: tuple[int, ...]
  wrong: tuple[int, ...]

  def __post_init__(self) -> None:
    if len(self.correct) != len(self.wrong) or not self.correct:
      raise UserError(f"LogitDiff takes a correct and a wrong token per prompt: {len(self.correct)} and "
                      f"{len(self.wrong)}")

  @property
  def columns(self) -> list[int]:
    """The token ids it reads, sorted: pass them as `columns=` to read only them."""
    return sorted({*self.correct, *self.wrong})

  def __call__(self, logits: Any, columns: Sequence[int] | None = None) -> Any:
    xp = np if isinstance(logits, np.ndarray) else jnp
    where = {t: i for i, t in enumerate(columns)} if columns is not None else None
    pick = (lambda ids: list(ids)) if where is None else (lambda ids: [where[t] for t in ids])  # noqa: E731
    rows = np.arange(len(self.correct))
    diff = logits[..., rows, pick(self.correct)] - logits[..., rows, pick(self.wrong)]
    return xp.mean(diff, axis=-1)
