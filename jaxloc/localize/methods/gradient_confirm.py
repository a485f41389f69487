"""`gradient_confirm`: one backward pass ranks every head by its first-order ablation effect (the mask
gradient); the --num_masks most negative are then ablated one at a time and ranked by the measured change,
the others follow in gradient order. Needs a teacher-forced (log-likelihood) task."""

from __future__ import annotations

import dataclasses
import types

from jaxloc.localize.methods.base import (GRADIENT, SCORED_TARGET, Context, FixedDesignPlan, Method,
                                          confirmation_plan, rank_by)


@dataclasses.dataclass(frozen=True)
class GradientConfirm(Method):
  name: str = "gradient_confirm"
  listing_order = 60
  units = ("heads", "neurons")
  needs = frozenset({GRADIENT, SCORED_TARGET})
  run_settings = types.MappingProxyType({"num_masks": "heads confirmed by ablation, best by the gradient first"})
  efficiency_variants = ("",)
  example_options = types.MappingProxyType({"num_masks": 5})

  def plan(self, settings, context: Context) -> FixedDesignPlan:
    # Excluded heads go last; among the rest, the screen's order is the gradient's.
    screen = rank_by(context.excluded, context.first_order_change())
    return confirmation_plan(screen, settings.num_masks, context,
                             {"screen": "mask gradient of the task's log-probability at the unablated model"})


METHODS = (GradientConfirm(),)
