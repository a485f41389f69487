"""`gradient_confirm`: one backward pass ranks every head by its first-order ablation effect (the mask
gradient); the --num_masks most negative are then ablated one at a time and ranked by the measured change,
the others follow in gradient order. Needs a teacher-forced (log-likelihood) task."""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxloc.localize.methods.base import Context, FixedDesignPlan, confirmation_plan, rank_by


@dataclasses.dataclass(frozen=True)
class GradientConfirm:
  name: str = "gradient_confirm"
  uses_gradient: bool = True
  uses_objective: bool = False
  uses_attribution: bool = False
  units: tuple[str, ...] = ("heads", "neurons")

  def check(self, settings) -> None:
    del settings  # any --num_masks ≥ 1 (heads confirmed) works; the task kind is checked when it is loaded

  def measurement_settings(self, settings) -> dict[str, Any]:
    return {"num_masks": settings.num_masks}

  def plan(self, settings, context: Context) -> FixedDesignPlan:
    # Excluded heads go last; among the rest, the screen's order is the gradient's.
    screen = rank_by(context.excluded, context.first_order_change())
    return confirmation_plan(screen, settings.num_masks, context,
                             {"screen": "mask gradient of the task's log-probability at the unablated model"})
