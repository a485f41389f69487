"""The scikit-learn cross-check of the FISTA Lasso (optional: `--check_sklearn`, and the solver tests)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.lasso.solver import DEFAULT_MAX_ITER, LassoResult, check_xy, fit_lasso


def check_against_sklearn(X, y, alpha, *, fit_intercept: bool = True, standardize: bool = False,
                          nonpositive: bool = False, x64: bool = False, tol: float | None = None,
                          max_iter: int = DEFAULT_MAX_ITER, result: LassoResult | None = None,
                          sklearn_tol: float = 1e-12, sklearn_max_iter: int = 1_000_000) -> float:
  """Largest |coef_jax - coef_sklearn| (units of y) on the same objective.

  sklearn's `Lasso(alpha, tol=1e-12)` runs in float64 on y standardized exactly as `fit_lasso`
  does; the sign-constrained problem is sklearn's `positive=True` on -X. The JAX side is `result`
  if given (it must come from the same options), else `fit_lasso` in float32, or in float64 under
  `jax.enable_x64` when x64=True.
  """
  import warnings

  from sklearn.exceptions import ConvergenceWarning
  from sklearn.linear_model import Lasso

  Xn = np.asarray(X, np.float64)
  yn = np.asarray(y, np.float64)
  check_xy(Xn, yn)
  if result is None:
    if x64:
      with jax.enable_x64(True):
        result = fit_lasso(Xn, yn, alpha, fit_intercept=fit_intercept, standardize=standardize,
                           nonpositive=nonpositive, tol=tol, max_iter=max_iter,
                           dtype=jnp.float64)
        coef = np.asarray(result.coef, np.float64)
    else:
      result = fit_lasso(Xn, yn, alpha, fit_intercept=fit_intercept, standardize=standardize,
                         nonpositive=nonpositive, tol=tol, max_iter=max_iter)
      coef = np.asarray(result.coef, np.float64)
  else:
    coef = np.asarray(result.coef, np.float64)
  scale = 1.0
  target = yn
  if standardize:
    mean = yn.mean()
    scale = yn.std() if yn.std() > 0 else 1.0
    target = ((yn - mean) if fit_intercept else yn) / scale
  model = Lasso(alpha=float(alpha), fit_intercept=fit_intercept, tol=sklearn_tol,
                max_iter=sklearn_max_iter, positive=nonpositive)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    model.fit(-Xn if nonpositive else Xn, target)
  reference = (-model.coef_ if nonpositive else model.coef_) * scale
  return float(np.max(np.abs(coef - reference)))
