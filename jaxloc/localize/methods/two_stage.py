"""`two_stage`: a compressed-sensing screen (a stratified design on --screen_fraction of --num_masks, then
the Lasso) and a confirmation stage that ablates the screen's best-ranked heads one at a time; ranked by
the confirmed changes, then the other heads in screen order. Needs no gradient, so it also serves
generation tasks.

The screen's candidates come from the full screen ranking (base's rule): when the Lasso leaves fewer
negative coefficients than there are confirmation slots, the remaining slots go to the heads with the
most negative marginal effect in the screen design, never to heads in index order.

Settings: --screen_fraction (prefix "screen_") and the screen's design and Lasso, compressed sensing's
(`DesignSettings`: --ablation_rate, --lasso_alpha, ...).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, ClassVar

import numpy as np

from jaxloc.config import nested, setting
from jaxloc.localize import designs
from jaxloc.localize.methods.base import (Context, Measured, Method, Ranking, check_prefix, remaining,
                                          single_head_masks, single_head_ranking)
from jaxloc.localize.methods.compressed_sensing import DesignSettings, check_design_settings, design_order, lasso


def screen_size(num_masks: int, screen_fraction: float) -> int:
  """Masks of the screen out of a budget of num_masks (the rest confirm single heads)."""
  return min(max(2, int(round(screen_fraction * num_masks))), num_masks - 1)


@dataclasses.dataclass
class TwoStageSettings:
  # Not the derived "two_stage_": the name --screen_fraction had before prefixes were derived, kept for flagfiles.
  flag_prefix: ClassVar[str] = "screen_"

  fraction: float = setting(0.5, "Fraction of --num_masks spent on the compressed-sensing screen; the rest ablate "
                            "the screen's top heads one at a time.", lower=1e-6, upper=1 - 1e-6, measured=True)
  design: DesignSettings = nested(DesignSettings)


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
      coef, self.screen_facts = lasso(self.settings.method_settings.design, self.settings.seed, screen.masks,
                                      screen.scores, screen.metric)
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
class TwoStage(Method):
  name: str = "two_stage"
  listing_order = 50
  units = ("heads",)
  settings_class = TwoStageSettings
  run_settings = types.MappingProxyType({"num_masks": "screen masks plus single-head confirmations"})
  efficiency_variants = ("", "logprob")
  example_options = types.MappingProxyType({"num_masks": 30, "ablation_rate": 0.25})

  def check(self, settings) -> None:
    check_design_settings(settings, 3)  # a screen of ≥ 2 masks, ≥ 1 confirmation

  def plan(self, settings, context: Context) -> TwoStagePlan:
    options = settings.method_settings
    size = screen_size(settings.num_masks, options.fraction)
    screen = designs.make_design("stratified", context.num_layers, context.num_heads, num_masks=size,
                                 ablation_rate=options.design.ablation_rate, seed=settings.seed,
                                 exclude=context.excluded)
    return TwoStagePlan(settings, context, screen, min(settings.num_masks - size, len(context.active_heads())))


METHODS = (TwoStage(),)
