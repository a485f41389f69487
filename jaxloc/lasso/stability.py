"""Stability selection (Meinshausen & Buhlmann 2010) on top of the FISTA Lasso: how often each head is
selected over random half-subsamples of the masks, and the bound on false selections that frequency gives.

Axes: `masks` (rows of X), `heads` (columns), `alphas`, `subsamples` (refits run side by side under vmap).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.errors import UserError
from jaxloc.lasso.fista import prepare
from jaxloc.lasso.solver import (DEFAULT_MAX_ITER, STATIC_OPTIONS, as_array, check_max_iter, check_xy, path_of,
                                 resolve_precision, lasso_cv)


@dataclasses.dataclass(frozen=True)
class StabilityResult:
  """Stability selection (Meinshausen & Buhlmann 2010) over random subsamples.

  frequency:       [features] max over alphas of the fraction of subsamples in which the head has a
                   nonzero coefficient; in [0, 1].
  frequency_path:  [alphas, features] the selection frequency at each alpha.
  alphas:          [alphas] the penalties (standardized units when standardize=True).
  threshold:       the frequency at or above which a head counts as selected.
  selected:        indices of selected heads, highest frequency first.
  mean_selected:   q: mean over subsamples of the number of heads selected at any alpha.
  num_candidates:  p: heads that can be selected (columns of X that are not constant).
  num_subsamples:  B.
  """
  frequency: np.ndarray
  frequency_path: np.ndarray
  alphas: np.ndarray
  threshold: float
  selected: np.ndarray
  mean_selected: float
  num_candidates: int
  num_subsamples: int

  def false_selection_bound(self, threshold: float | None = None) -> float:
    """Meinshausen-Buhlmann bound on E[#false selections] at a threshold in (0.5, 1]."""
    return false_selection_bound(self.mean_selected, self.num_candidates,
                                 self.threshold if threshold is None else threshold)


def false_selection_bound(mean_selected: float, num_candidates: int, threshold: float) -> float:
  """E[V] <= q^2 / ((2 * threshold - 1) * p) (Meinshausen & Buhlmann 2010, Theorem 1).

  Valid for threshold in (0.5, 1] under their exchangeability assumption on the null heads.
  """
  if not 0.5 < threshold <= 1.0:
    raise UserError(f"stability threshold must be in (0.5, 1], got {threshold!r}")
  if num_candidates <= 0:
    return 0.0
  return float(mean_selected) ** 2 / ((2.0 * threshold - 1.0) * num_candidates)


def stability_selection(X, y, alpha=None, *, num_subsamples: int = 100,
                        sample_fraction: float = 0.5, penalty_weakness: float | None = None,
                        threshold: float = 0.6, seed: int = 0, fit_intercept: bool = True,
                        standardize: bool = False, nonpositive: bool = False,
                        tol: float | None = None, max_iter: int = DEFAULT_MAX_ITER,
                        dtype=None) -> StabilityResult:
  """Selection frequency of each head over random subsamples (Meinshausen & Buhlmann 2010).

  Each of `num_subsamples` refits uses floor(sample_fraction * masks) masks drawn without
  replacement (as 0/1 sample weights, so all refits share one shape and run under one vmap).
  alpha: a float, a vector of alphas (frequency is then the max over them, MB's Lambda), or None
  for the alpha chosen by `lasso_cv` on all masks. penalty_weakness kappa in (0, 1]: randomized
  lasso, each head's penalty multiplied by 1/W with W ~ Uniform[kappa, 1] drawn per refit.
  A head is selected in a refit when its coefficient is nonzero. y is standardized (if asked) once
  on all masks, so alpha means the same in every refit.
  """
  X, y = as_array(X), as_array(y)
  check_xy(X, y)
  check_max_iter(max_iter)
  if isinstance(num_subsamples, bool) or not isinstance(num_subsamples, int) or num_subsamples < 1:
    raise UserError(f"num_subsamples must be a positive integer, got {num_subsamples!r}")
  n = X.shape[0]
  size = int(math.floor(sample_fraction * n)) if 0 < sample_fraction <= 1 else 0
  if size < 2:
    raise UserError(
        f"sample_fraction must be in (0, 1] and keep at least 2 of the {n} masks, got "
        f"{sample_fraction!r}")
  if penalty_weakness is not None and not 0 < penalty_weakness <= 1:
    raise UserError(f"penalty_weakness must be in (0, 1], got {penalty_weakness!r}")
  if not 0.5 < threshold <= 1:
    raise UserError(f"stability threshold must be in (0.5, 1], got {threshold!r}")
  dtype, tol = resolve_precision(dtype, tol)
  if alpha is None:
    cv = lasso_cv(X, y, fit_intercept=fit_intercept, standardize=standardize,
                  nonpositive=nonpositive, tol=tol, max_iter=max_iter, seed=seed, dtype=dtype)
    alphas = np.asarray([cv.fit.alpha])
  else:
    alphas = np.atleast_1d(np.asarray(alpha, dtype=np.float64))
    if alphas.ndim != 1 or np.any(alphas < 0):
      raise UserError(f"alpha must be a number >= 0 or a vector of them, got {alpha!r}")
  rng = np.random.default_rng(seed)
  weights = np.zeros((num_subsamples, n), np.float32)
  for b in range(num_subsamples):
    weights[b, rng.choice(n, size=size, replace=False)] = 1.0
  if penalty_weakness is None:
    penalty = None
  else:
    num_features = X.shape[1]
    penalty = 1.0 / rng.uniform(penalty_weakness, 1.0, size=(num_subsamples, num_features))
    penalty = penalty.astype(np.float32)
  freq_path, mean_selected = _stability_core(
      X, y, np.sort(alphas)[::-1].copy(), weights, penalty, fit_intercept=fit_intercept,
      standardize=standardize, nonpositive=nonpositive, tol=tol, max_iter=max_iter, restart=True,
      dtype=dtype)
  freq_path = np.asarray(freq_path)
  frequency = freq_path.max(axis=0)
  order = np.argsort(-frequency, kind="stable")
  selected = order[frequency[order] >= threshold]
  Xn = np.asarray(X, np.float64)
  num_candidates = int(np.sum(Xn.max(axis=0) > Xn.min(axis=0)))
  return StabilityResult(frequency=frequency, frequency_path=freq_path,
                         alphas=np.sort(alphas)[::-1], threshold=float(threshold),
                         selected=selected, mean_selected=float(mean_selected),
                         num_candidates=num_candidates, num_subsamples=num_subsamples)


@functools.partial(jax.jit, static_argnames=STATIC_OPTIONS)
def _stability_core(X, y, alphas, weights, penalty, *, fit_intercept, standardize, nonpositive,
                    tol, max_iter, restart, dtype):
  full = prepare(X, y, None, fit_intercept, standardize, dtype)
  y_solved = full.ys
  alphas = jnp.asarray(alphas, dtype)

  def one(sw, pw):
    p = prepare(X, y_solved, sw, fit_intercept, False, dtype)
    path = path_of(p, alphas, pw, fit_intercept=fit_intercept, nonpositive=nonpositive, tol=tol,
                    max_iter=max_iter, restart=restart)
    return path.coef != 0  # [alphas, features]

  if penalty is None:
    chosen = jax.vmap(lambda sw: one(sw, None))(jnp.asarray(weights, dtype))
  else:
    chosen = jax.vmap(one)(jnp.asarray(weights, dtype), jnp.asarray(penalty, dtype))
  freq_path = jnp.mean(chosen.astype(dtype), axis=0)
  mean_selected = jnp.mean(jnp.sum(jnp.any(chosen, axis=1), axis=-1).astype(dtype))
  return freq_path, mean_selected
