"""`gradient_confirm`: one backward pass ranks every head by its first-order ablation effect (the mask
gradient); the --num_masks most negative are then ablated one at a time and ranked by the measured change,
the others follow in gradient order. Needs a teacher-forced (log-likelihood) task."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxloc.localize.methods.base import Context, FixedDesignPlan, rank_by, single_head_masks, single_head_ranking


@dataclasses.dataclass(frozen=True)
class GradientConfirm:
  name: str = "gradient_confirm"
  uses_gradient: bool = True
  uses_objective: bool = False

  def check(self, settings) -> None:
    del settings  # any --num_masks ≥ 1 (heads confirmed) works; the task kind is checked when it is loaded

  def measurement_settings(self, settings) -> dict[str, Any]:
    return {"num_masks": settings.num_masks}

  def plan(self, settings, context: Context) -> FixedDesignPlan:
    change = context.first_order_change()
    # Excluded heads go last; among the rest, the screen's order is the gradient's.
    screen = rank_by(context.excluded, change)
    candidates = [h for h in screen if not context.excluded[h]][:settings.num_masks]
    masks = single_head_masks(candidates, context.num_layers, context.num_heads)

    def rank(measured):
      ranking = single_head_ranking(measured, screen)
      ranking.facts.update(screen="mask gradient of the task's log-probability at the unablated model")
      return ranking

    return FixedDesignPlan(masks, rank)
