"""The paper's method: ablate random sets of heads (stratified or Bernoulli design), fit a Lasso of the
task score on the design, rank heads by coefficient (most negative first).

Ties and zero coefficients follow `base`'s rule: each head's marginal effect in the design, in the
localized metric and then the others.

Its settings (`DesignSettings`: the ablation rate and the Lasso) have no flag prefix (--ablation_rate,
--lasso_alpha, ...); a method that screens with a design and a Lasso reuses them, flags included.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.lasso import solver
from jaxloc.lasso.crosscheck import check_against_sklearn
from jaxloc.localize import designs
from jaxloc.localize.methods.base import (Context, FixedDesignPlan, Measured, Method, Ranking, marginal_effects,
                                          rank_by)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class DesignSettings:
  """A random design's ablation rate and the Lasso fitted on it."""

  # No prefix (--ablation_rate, --lasso_alpha, ...): the names these flags had before prefixes were derived, kept
  # for flagfiles; a method that nests these settings shares the flags.
  flag_prefix: ClassVar[str] = ""

  ablation_rate: float = setting(0.1, "Fraction of heads each design mask ablates.", lower=1e-6, upper=1 - 1e-6,
                                 measured=True)
  lasso_alpha: str = setting("cv", "Lasso alpha: a number, or 'cv' for K-fold cross-validation.", words=("cv",),
                             lower=0.0)
  standardize: bool = setting(True, "Standardize the scores before the Lasso (as the paper's code does).")
  nonpositive: bool = setting(False, "Constrain Lasso coefficients to ≤ 0 (ablation can only hurt).")
  solver_dtype: str = setting("float64", "Precision of the Lasso solve.", choices=("float64", "float32"))
  check_sklearn: bool = setting(False, "Also solve with scikit-learn and record the largest difference.")


def lasso(options: DesignSettings, seed: int, masks: np.ndarray, scores: np.ndarray, metric: str
          ) -> tuple[np.ndarray, dict[str, Any]]:
  """(coefficients [N], solver facts) of the Lasso of `scores` [M] on the design `masks` [M, L, H], with the
  solver settings of `options` (lasso_alpha, standardize, nonpositive, solver_dtype, check_sklearn); `seed` draws
  the cross-validation folds."""
  # float64 by default: the Lasso is tiny next to the measurements, float64 FISTA converges in fewer steps
  # than float32 (which stalls at ~1e-5 relative) and matches scikit-learn to ~1e-12.
  float64 = options.solver_dtype == "float64"
  X = masks.reshape(len(masks), -1).astype(np.float64 if float64 else np.float32)
  y = np.asarray(scores, X.dtype)
  if np.ptp(y) == 0:
    raise UserError(f"every mask scored {y[0]:.4g} on {metric}: nothing to localize (is the task "
                    "too hard or too easy for this model? try --metric=logprob or another task)")
  fit_options = dict(standardize=options.standardize, nonpositive=options.nonpositive)
  facts: dict[str, Any] = {"value": "Lasso coefficient", "standardize": options.standardize,
                           "nonpositive": options.nonpositive, "dtype": options.solver_dtype, "masks": int(len(masks))}
  with jax.enable_x64(float64):
    dtype = jnp.float64 if float64 else jnp.float32
    if options.lasso_alpha == "cv":
      folds = min(5, len(masks))
      cv = solver.lasso_cv(X, y, num_folds=folds, seed=seed, dtype=dtype, **fit_options)
      fit = cv.fit
      facts.update(lasso_alpha=float(fit.alpha), alpha_selection=f"{folds}-fold cross-validation",
                   alpha_at_grid_edge=bool(int(cv.best_index) in (0, len(cv.alphas) - 1)))
      if facts["alpha_at_grid_edge"]:
        log.warning("cross-validation chose alpha %.3g at the edge of its grid: the ranking may be unreliable "
                    "(measure more masks, or fix --lasso_alpha)", float(fit.alpha))
    else:
      fit = solver.fit_lasso(X, y, float(options.lasso_alpha), dtype=dtype, **fit_options)
      facts.update(lasso_alpha=float(options.lasso_alpha), alpha_selection="fixed")
    coef = np.asarray(fit.coef, np.float64)
    facts.update(intercept=float(fit.intercept), converged=bool(fit.converged), iterations=int(fit.iterations),
                 nonzero=int(np.count_nonzero(coef)))
    if options.check_sklearn:
      facts["sklearn_max_abs_diff"] = float(check_against_sklearn(X, y, float(fit.alpha), result=fit,
                                                                  **fit_options))
  return coef, facts


def design_order(measured: Measured, coef: np.ndarray) -> np.ndarray:
  """Heads by coefficient, ties (zeros included) by marginal effect in each metric (base's rule)."""
  flat = measured.flat()
  return rank_by(coef, *(marginal_effects(flat, measured.metrics[m]) for m in measured.metric_order))


def check_design_settings(settings, minimum_masks: int) -> None:
  """The budget a design method needs (--lasso_alpha is held to its field's rule: 'cv' or a finite number ≥ 0)."""
  if settings.num_masks < minimum_masks:
    raise UserError(f"--num_masks={settings.num_masks} must be ≥ {minimum_masks} for {settings.method}")


@dataclasses.dataclass(frozen=True)
class CompressedSensing(Method):
  """A stratified (every head ablated equally often) or Bernoulli design: --num_masks masks at --ablation_rate,
  then the Lasso (--lasso_alpha a number or cv)."""

  name: str
  design: str  # designs.DESIGN_KINDS
  efficiency_variants: tuple[str, ...] = ()
  listing_order: float = math.inf
  units = ("heads",)
  settings_class = DesignSettings
  run_settings = types.MappingProxyType({"num_masks": "design masks"})
  example_options = types.MappingProxyType({"num_masks": 40, "ablation_rate": 0.25})

  def check(self, settings) -> None:
    check_design_settings(settings, 2)

  def plan(self, settings, context: Context) -> FixedDesignPlan:
    options = settings.method_settings
    design = designs.make_design(self.design, context.num_layers, context.num_heads, num_masks=settings.num_masks,
                                 ablation_rate=options.ablation_rate, seed=settings.seed, exclude=context.excluded)

    def rank(measured: Measured) -> Ranking:
      coef, facts = lasso(options, settings.seed, measured.masks, measured.scores, measured.metric)
      return Ranking(design_order(measured, coef), coef, facts)

    return FixedDesignPlan(design, rank, exchangeable_rows=True)

  def bootstrap_plan(self, settings, context: Context, ranking: Ranking) -> FixedDesignPlan:
    """The run's plan with a cross-validated alpha fixed at the value the full data chose (the alpha is part of the
    fit; re-running cross-validation per resample would cost seconds each)."""
    alpha = ranking.facts.get("lasso_alpha")
    if settings.method_settings.lasso_alpha == "cv" and alpha is not None:
      fixed = dataclasses.replace(settings.method_settings, lasso_alpha=repr(float(alpha)))
      settings = dataclasses.replace(settings, method_settings=fixed)
    return self.plan(settings, context)


# `listing_order` places them in the registry's listing (help texts, error messages, the efficiency benchmark's
# default variants): second and third, after the single-head screen.
METHODS = (
    CompressedSensing("cs_stratified", "stratified", efficiency_variants=(
        "", "logprob", "nonpositive", "r0.03-upto{cap}", "logprob-r0.03-upto{cap}"), listing_order=20),
    CompressedSensing("cs_bernoulli", "bernoulli", efficiency_variants=("upto{cap}",), listing_order=30),
)
