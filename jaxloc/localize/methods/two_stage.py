"""`two_stage`: a compressed-sensing screen (a stratified design on --screen_fraction of --num_masks, then
the Lasso) and a confirmation stage that ablates the screen's best-ranked heads one at a time; ranked by
the confirmed changes, then the other heads in screen order. Needs no gradient, so it also serves
generation tasks.

The screen's candidates come from the full screen ranking (base's rule): when the Lasso leaves fewer
negative coefficients than there are confirmation slots, the remaining slots go to the heads with the
most negative marginal effect in the screen design, never to heads in index order.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxloc.errors import UserError
from jaxloc.localize import designs
from jaxloc.localize.methods.base import (Context, Measured, Ranking, check_prefix, remaining, single_head_masks,
                                          single_head_ranking)
from jaxloc.localize.methods.compressed_sensing import check_design_settings, design_order, lasso


def screen_size(num_masks: int, screen_fraction: float) -> int:
  """Masks of the screen out of a budget of num_masks (the rest confirm single heads)."""
  return min(max(2, int(round(screen_fraction * num_masks))), num_masks - 1)


@dataclasses.dataclass
class TwoStagePlan:
  settings: Any
  context: Context
  screen: np.ndarray  # bool [S, L, H]
  num_confirm: int
  screen_facts: dict = dataclasses.field(default_factory=dict)
  exchangeable_rows: bool = False  # the confirmations are chosen, not drawn

  def screen_order(self, measured: Measured) -> np.ndarray:
    """int [N] the screen's ranking. Its coefficients are kept in the run directory, so a resumed run
    confirms the same candidates (a re-solve elsewhere could reorder near-ties)."""
    screen = measured.rows(slice(0, len(self.screen)))

    def solve():
      coef, self.screen_facts = lasso(self.settings, screen.masks, screen.scores, screen.metric)
      return coef

    return design_order(screen, self.context.remember("screen_coefficients", solve))

  def candidates(self, measured: Measured) -> np.ndarray:
    excluded = self.context.excluded
    return np.asarray([h for h in self.screen_order(measured) if not excluded[h]][:self.num_confirm], np.int64)

  def next_masks(self, measured: Measured) -> np.ndarray | None:
    if len(measured) < len(self.screen):
      return remaining(measured, self.screen)
    check_prefix(measured.masks[:len(self.screen)], self.screen)
    c = self.context
    confirm = single_head_masks(self.candidates(measured), c.num_layers, c.num_heads)
    return remaining(measured.rows(slice(len(self.screen), None)), confirm)

  def expected_total(self) -> int:
    return len(self.screen) + self.num_confirm

  def rank(self, measured: Measured) -> Ranking:
    screen_order = self.screen_order(measured)
    ranking = single_head_ranking(measured.rows(slice(len(self.screen), None)), screen_order)
    ranking.facts.update(screen=f"Lasso on {len(self.screen)} stratified masks", screen_masks=len(self.screen),
                         confirmed_heads=self.num_confirm,
                         screen_solver=self.screen_facts or {"loaded_from": "screen_coefficients.npy"})
    return ranking

  def estimate(self, measured: Measured) -> Ranking:
    return self.rank(measured)  # the screen's order is remembered from the target; values are the confirmations


@dataclasses.dataclass(frozen=True)
class TwoStage:
  name: str = "two_stage"
  uses_gradient: bool = False
  uses_objective: bool = False
  uses_attribution: bool = False
  units: tuple[str, ...] = ("heads",)

  def check(self, settings) -> None:
    check_design_settings(settings, 3)  # a screen of ≥ 2 masks and ≥ 1 confirmation
    if not 0 < settings.screen_fraction < 1:
      raise UserError(f"--screen_fraction={settings.screen_fraction} must be in (0, 1)")

  def measurement_settings(self, settings) -> dict[str, Any]:
    return {"num_masks": settings.num_masks, "ablation_rate": settings.ablation_rate,
            "screen_fraction": settings.screen_fraction}

  def plan(self, settings, context: Context) -> TwoStagePlan:
    size = screen_size(settings.num_masks, settings.screen_fraction)
    screen = designs.make_design("stratified", context.num_layers, context.num_heads, num_masks=size,
                                 ablation_rate=settings.ablation_rate, seed=settings.seed, exclude=context.excluded)
    return TwoStagePlan(settings, context, screen, min(settings.num_masks - size, len(context.active_heads())))
