"""The paper's method: ablate random sets of heads (stratified or Bernoulli design), fit a Lasso of the
task score on the design, rank heads by coefficient (most negative first).

Ties and zero coefficients follow `base`'s rule: each head's marginal effect in the design, in the
localized metric and then the others.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.errors import UserError
from jaxloc.lasso import solver
from jaxloc.localize import designs
from jaxloc.localize.methods.base import Context, FixedDesignPlan, Measured, Ranking, marginal_effects, rank_by

log = logging.getLogger(__name__)


def lasso(settings, masks: np.ndarray, scores: np.ndarray, metric: str) -> tuple[np.ndarray, dict[str, Any]]:
  """(coefficients [N], solver facts) of the Lasso of `scores` [M] on the design `masks` [M, L, H], with the
  run's solver settings (lasso_alpha, standardize, nonpositive, solver_dtype, check_sklearn, seed)."""
  # float64 by default: the Lasso is tiny next to the measurements, float64 FISTA converges in fewer steps
  # than float32 (which stalls at ~1e-5 relative) and matches scikit-learn to ~1e-12.
  float64 = settings.solver_dtype == "float64"
  X = masks.reshape(len(masks), -1).astype(np.float64 if float64 else np.float32)
  y = np.asarray(scores, X.dtype)
  if np.ptp(y) == 0:
    raise UserError(f"every mask scored {y[0]:.4g} on {metric}: nothing to localize (is the task "
                    "too hard or too easy for this model? try --metric=logprob or another task)")
  options = dict(standardize=settings.standardize, nonpositive=settings.nonpositive)
  facts: dict[str, Any] = {"value": "Lasso coefficient", "standardize": settings.standardize, "nonpositive": settings.nonpositive,
                           "dtype": settings.solver_dtype, "masks": int(len(masks))}
  with jax.enable_x64(float64):
    dtype = jnp.float64 if float64 else jnp.float32
    if settings.lasso_alpha == "cv":
      folds = min(5, len(masks))
      cv = solver.lasso_cv(X, y, num_folds=folds, seed=settings.seed, dtype=dtype, **options)
      fit = cv.fit
      facts.update(lasso_alpha=float(fit.alpha), alpha_selection=f"{folds}-fold cross-validation",
                   alpha_at_grid_edge=bool(int(cv.best_index) in (0, len(cv.alphas) - 1)))
      if facts["alpha_at_grid_edge"]:
        log.warning("cross-validation chose alpha %.3g at the edge of its grid: the ranking may be unreliable "
                    "(measure more masks, or fix --lasso_alpha)", float(fit.alpha))
    else:
      fit = solver.fit_lasso(X, y, float(settings.lasso_alpha), dtype=dtype, **options)
      facts.update(lasso_alpha=float(settings.lasso_alpha), alpha_selection="fixed")
    coef = np.asarray(fit.coef, np.float64)
    facts.update(intercept=float(fit.intercept), converged=bool(fit.converged), iterations=int(fit.iterations),
                 nonzero=int(np.count_nonzero(coef)))
    if settings.check_sklearn:
      from jaxloc.lasso.crosscheck import check_against_sklearn

      facts["sklearn_max_abs_diff"] = float(check_against_sklearn(X, y, float(fit.alpha), result=fit, **options))
  return coef, facts


def design_order(measured: Measured, coef: np.ndarray) -> np.ndarray:
  """Heads by coefficient, ties (zeros included) by marginal effect in each metric (base's rule)."""
  flat = measured.flat()
  return rank_by(coef, *(marginal_effects(flat, measured.metrics[m]) for m in measured.metric_order))


def lasso_ranking(settings, measured: Measured) -> Ranking:
  coef, facts = lasso(settings, measured.masks, measured.scores, measured.metric)
  return Ranking(design_order(measured, coef), coef, facts)


def check_design_settings(settings, minimum_masks: int) -> None:
  if settings.num_masks < minimum_masks:
    raise UserError(f"--num_masks={settings.num_masks} must be ≥ {minimum_masks} for {settings.method}")
  if not 0 < settings.ablation_rate < 1:
    raise UserError(f"--ablation_rate={settings.ablation_rate} must be in (0, 1)")


@dataclasses.dataclass(frozen=True)
class CompressedSensing:
  """`cs_stratified` (every head ablated equally often) or `cs_bernoulli`: --num_masks masks at
  --ablation_rate, then the Lasso (--lasso_alpha a number or cv)."""

  name: str
  design: str  # designs.DESIGN_KINDS
  uses_gradient: bool = False
  uses_objective: bool = False
  uses_attribution: bool = False
  units: tuple[str, ...] = ("heads",)

  def check(self, settings) -> None:
    check_design_settings(settings, 2)

  def measurement_settings(self, settings) -> dict[str, Any]:
    return {"num_masks": settings.num_masks, "ablation_rate": settings.ablation_rate}

  def plan(self, settings, context: Context) -> FixedDesignPlan:
    design = designs.make_design(self.design, context.num_layers, context.num_heads, num_masks=settings.num_masks,
                                 ablation_rate=settings.ablation_rate, seed=settings.seed,
                                 exclude=context.excluded)
    return FixedDesignPlan(design, lambda measured: lasso_ranking(settings, measured), exchangeable_rows=True)
