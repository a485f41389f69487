"""Lasso by FISTA in JAX: the solver that turns measurements into per-feature coefficients. This module owns the
public API (a fit at one alpha, a warm-started regularization path, K-fold cross-validation), its results and the
checks of its arguments; the iteration at one alpha (the prepared problem, step size, stopping rule, duality gap)
is `jaxloc.lasso.fista`.

Axes:
  masks:  rows of the design X (one model evaluation each); the Lasso's samples.
  features: columns of X (for jaxloc, units flattened `layers * units`, True/1 = ablated).
  alphas: points of a regularization path (decreasing).
  folds, subsamples: independent problems solved side by side under `jax.vmap`.

The objective is exactly scikit-learn's `Lasso`:

    min_{w, b}  1/(2 n) * sum_i s_i (y_i - x_i.w - b)^2  +  alpha * sum_j p_j |w_j|

with n = sum_i s_i (sample weights s, default all ones) and penalty weights p (default all ones).
With `fit_intercept` the intercept is eliminated as sklearn does: X and y are centered by their
(weighted) means, the centered problem is solved, and b = mean(y) - mean(X).w.

Standardization (`standardize=True`, what the paper's code does to the scores): before solving,
y is replaced by y_std = (y - mean(y)) / sd(y) (without the centering when fit_intercept=False),
where sd is the weighted population standard deviation (ddof=0) of y around its weighted mean.
`alpha` then applies to that standardized problem. Coefficients and intercept are *always reported
in the units of y* (score change when the head is ablated): coef = sd(y) * w_std. The result carries
`y_scale` = sd(y) (1 when not standardizing), so w_std = coef / y_scale. Since this is the same as
solving the unstandardized problem with alpha * sd(y), standardizing changes which alpha a number
means, not the fit: a fit ranks heads identically in standardized and in y units.

Optional sign constraint (`nonpositive=True`): w <= 0 (ablating a head can only hurt the score),
imposed by projection inside the proximal step (prox of alpha*p*|w| + indicator(w <= 0) is
min(v + step*alpha*p, 0)).

The iteration is FISTA with gradient restart, stopped on a relative change of the coefficients over a window
of steps (`jaxloc.lasso.fista`'s docstring); `max_iter` caps the steps (converged=False then). The duality gap
of the final iterate is reported for diagnosis.

Precision: the default compute dtype is float32 with tol=1e-6. On the paper's sizes (masks
100-400, heads 512-1024, 5-280 nonzeros, 0/1 designs) this agrees with sklearn (float64,
tol=1e-12) to within ~1e-5 relative to max|coef|, which is float32's floor there (a smaller tol
does not improve it); the worst cases are fits whose nonzeros approach the number of masks.
float64 (`dtype=jnp.float64` inside `with jax.enable_x64(True):`, default tol 1e-10) is there for
cross-checks that need more.

Everything below `fit_lasso`, `lasso_path` and `lasso_cv` is a pure JAX function of arrays (options
are static), so these can be `jax.vmap`ped over y and/or X (several tasks, bootstrap refits) and are
compiled once per shape and option set.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.errors import UserError
from jaxloc.lasso import fista

DEFAULT_MAX_ITER = 20_000


def _default_tol(dtype) -> float:
  return 1e-10 if jnp.dtype(dtype) == jnp.float64 else 1e-6


# ------------------------------------------------------------------------------------------------
# Results (pytrees, so they can come out of jit and vmap).


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["coef", "intercept", "alpha", "iterations", "converged", "y_scale",
                                "dual_gap"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class LassoResult:
  """One Lasso fit (leading batch axes when vmapped).

  coef:       [features] coefficients in the units of y (negative = ablating the head lowers the
              score).
  intercept:  [] the score predicted with no head ablated, in the units of y.
  alpha:      [] the penalty used (in standardized units when standardize=True).
  iterations: [] FISTA iterations taken.
  converged:  [] whether the stopping rule was met before max_iter.
  y_scale:    [] sd(y) used to standardize (1.0 when not standardizing); coef / y_scale is the
              coefficient of the standardized problem.
  dual_gap:   [] duality gap of the returned coefficients, in the units of the solved objective.
  """
  coef: jax.Array
  intercept: jax.Array
  alpha: jax.Array
  iterations: jax.Array
  converged: jax.Array
  y_scale: jax.Array
  dual_gap: jax.Array


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["alphas", "coef", "intercept", "iterations", "converged",
                                "y_scale"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class LassoPath:
  """A warm-started regularization path.

  alphas:     [alphas] decreasing penalties.
  coef:       [alphas, features] coefficients in the units of y.
  intercept:  [alphas]
  iterations: [alphas] FISTA iterations per alpha.
  converged:  [alphas]
  y_scale:    [] as in LassoResult.
  """
  alphas: jax.Array
  coef: jax.Array
  intercept: jax.Array
  iterations: jax.Array
  converged: jax.Array
  y_scale: jax.Array


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=["fit", "alphas", "mse_path", "best_index", "all_converged"],
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class LassoCVResult:
  """K-fold cross-validated Lasso (as sklearn's LassoCV).

  fit:        LassoResult on all masks at the chosen alpha (fit.alpha is that alpha), taken from a
              warm-started path on all masks solved alongside the folds (the same solution as a
              fresh fit, to the solver's tolerance).
  alphas:     [alphas] the grid searched, decreasing.
  mse_path:   [alphas, folds] held-out mean squared error (units of the solved y: standardized
              when standardize=True), as sklearn's `mse_path_`.
  best_index: [] index into alphas of the smallest mean (over folds) MSE; the first (largest alpha)
              among ties.
  all_converged: [] whether every fit of every fold and of the full path met the stopping rule.
  """
  fit: LassoResult
  alphas: jax.Array
  mse_path: jax.Array
  best_index: jax.Array
  all_converged: jax.Array


# ------------------------------------------------------------------------------------------------
# Jitted cores (options static; arrays traced, so vmap over any array argument works).

STATIC_OPTIONS = ("fit_intercept", "standardize", "nonpositive", "tol", "max_iter", "restart", "dtype")


@functools.partial(jax.jit, static_argnames=STATIC_OPTIONS)
def _fit_core(X, y, alpha, sample_weight, penalty_weights, init, *, fit_intercept, standardize,
              nonpositive, tol, max_iter, restart, dtype) -> LassoResult:
  p = fista.prepare(X, y, sample_weight, fit_intercept, standardize, dtype)
  alpha = jnp.asarray(alpha, dtype)
  pw = None if penalty_weights is None else jnp.asarray(penalty_weights, dtype)
  lip = fista.lipschitz(p)
  floor = fista.alpha_max(p, False, pw) / lip
  w0 = jnp.zeros((p.X0.shape[1],), dtype) if init is None else jnp.asarray(init, dtype) / p.y_scale
  out = fista.solve(p, alpha, pw, w0, lip, floor, nonpositive=nonpositive, tol=tol, max_iter=max_iter,
                    restart=restart)
  coef = out.coef * p.y_scale
  return LassoResult(coef=coef, intercept=fista.intercept(p, coef, fit_intercept), alpha=alpha,
                     iterations=out.iterations, converged=out.converged, y_scale=p.y_scale,
                     dual_gap=fista.dual_gap(p, out.coef, alpha, pw, nonpositive))


def path_of(p: fista.Problem, alphas, pw, *, fit_intercept, nonpositive, tol, max_iter,
             restart) -> LassoPath:
  dtype = p.X0.dtype
  lip = fista.lipschitz(p)
  floor = fista.alpha_max(p, False, pw) / lip

  def one(w, alpha):
    out = fista.solve(p, alpha, pw, w, lip, floor, nonpositive=nonpositive, tol=tol, max_iter=max_iter,
                      restart=restart)
    return out.coef, out

  _, outs = jax.lax.scan(one, jnp.zeros((p.X0.shape[1],), dtype), alphas)
  coef = outs.coef * p.y_scale
  intercept = jax.vmap(lambda c: fista.intercept(p, c, fit_intercept))(coef)
  return LassoPath(alphas=alphas, coef=coef, intercept=intercept, iterations=outs.iterations,
                   converged=outs.converged, y_scale=p.y_scale)


def _grid(p: fista.Problem, num_alphas: int, eps, nonpositive: bool):
  top = fista.alpha_max(p, nonpositive)
  resolution = jnp.finfo(jnp.float64).resolution  # sklearn's fallback when no head correlates
  fracs = jnp.linspace(0.0, 1.0, num_alphas, dtype=p.X0.dtype)
  grid = top * jnp.asarray(eps, p.X0.dtype) ** fracs
  return jnp.where(top <= resolution, jnp.full_like(grid, resolution), grid)


@functools.partial(jax.jit, static_argnames=STATIC_OPTIONS + ("num_alphas",))
def _path_core(X, y, alphas, eps, sample_weight, penalty_weights, *, num_alphas, fit_intercept,
               standardize, nonpositive, tol, max_iter, restart, dtype) -> LassoPath:
  p = fista.prepare(X, y, sample_weight, fit_intercept, standardize, dtype)
  pw = None if penalty_weights is None else jnp.asarray(penalty_weights, dtype)
  if alphas is None:
    alphas = _grid(p, num_alphas, eps, nonpositive)
  else:
    alphas = jnp.sort(jnp.asarray(alphas, dtype))[::-1]
  return path_of(p, alphas, pw, fit_intercept=fit_intercept, nonpositive=nonpositive, tol=tol,
                  max_iter=max_iter, restart=restart)


@functools.partial(jax.jit, static_argnames=STATIC_OPTIONS + ("num_alphas",))
def _cv_core(X, y, alphas, eps, train_weights, *, num_alphas, fit_intercept, standardize,
             nonpositive, tol, max_iter, restart, dtype) -> LassoCVResult:
  # Standardize once on all masks, then cross-validate the standardized problem (as the paper's
  # code does: standardize the scores, then LassoCV).
  full = fista.prepare(X, y, None, fit_intercept, standardize, dtype)
  y_solved = full.ys  # centered when fit_intercept, and scaled when standardize
  if alphas is None:
    alphas = _grid(full, num_alphas, eps, nonpositive)
  else:
    alphas = jnp.sort(jnp.asarray(alphas, dtype))[::-1]
  kw = dict(fit_intercept=fit_intercept, nonpositive=nonpositive, tol=tol, max_iter=max_iter,
            restart=restart)

  def path_for(weights):
    p = fista.prepare(X, y_solved, weights, fit_intercept, False, dtype)
    return path_of(p, alphas, None, **kw)

  # Row 0 of the batch is all masks (the refit); rows 1.. are the training sets of the folds.
  all_weights = jnp.concatenate([jnp.ones((1, X.shape[0]), dtype),
                                 jnp.asarray(train_weights, dtype)], axis=0)
  paths = jax.vmap(path_for)(all_weights)
  Xd = jnp.asarray(X, dtype)
  pred = jnp.einsum("mh,fah->fam", Xd, paths.coef[1:]) + paths.intercept[1:, :, None]
  test = 1.0 - all_weights[1:]  # [folds, masks]
  sq = jnp.square(y_solved[None, None, :] - pred)
  mse = jnp.sum(sq * test[:, None, :], axis=-1) / jnp.sum(test, axis=-1)[:, None]  # [folds, a]
  best = jnp.argmin(jnp.mean(mse, axis=0))
  coef_solved = paths.coef[0, best]
  coef = coef_solved * full.y_scale
  fit = LassoResult(
      coef=coef, intercept=fista.intercept(full, coef, fit_intercept), alpha=alphas[best],
      iterations=paths.iterations[0, best], converged=paths.converged[0, best],
      y_scale=full.y_scale,
      dual_gap=fista.dual_gap(full, coef_solved, alphas[best], None, nonpositive))
  return LassoCVResult(fit=fit, alphas=alphas, mse_path=mse.T, best_index=best,
                       all_converged=jnp.all(paths.converged))


# ------------------------------------------------------------------------------------------------
# Public API.


def resolve_precision(dtype, tol):
  dtype = jnp.dtype(jnp.float32 if dtype is None else dtype)
  if dtype not in (jnp.float32, jnp.float64):
    raise UserError(f"solver dtype must be float32 or float64, got {dtype}")
  if dtype == jnp.float64 and not jax.config.jax_enable_x64:
    raise UserError("dtype=float64 needs 64-bit JAX: run inside `with jax.enable_x64(True):`")
  tol = _default_tol(dtype) if tol is None else float(tol)
  if not tol > 0:
    raise UserError(f"tol must be > 0, got {tol!r}")
  return dtype, tol


def check_xy(X, y):
  if getattr(X, "ndim", None) != 2:
    raise UserError(f"X must be a [masks, features] matrix, got shape {getattr(X, 'shape', None)}")
  if getattr(y, "ndim", None) != 1 or y.shape[0] != X.shape[0]:
    raise UserError(
        f"y must be a vector of one score per mask ({X.shape[0]}), got shape "
        f"{getattr(y, 'shape', None)}")
  if X.shape[0] < 2:
    raise UserError(f"need at least 2 masks to fit, got {X.shape[0]}")


def _check_alpha(alpha):
  if isinstance(alpha, (int, float, np.floating, np.integer)) and not alpha >= 0:
    raise UserError(f"lasso alpha must be >= 0, got {alpha!r}")


def check_max_iter(max_iter):
  if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
    raise UserError(f"max_iter must be a positive integer, got {max_iter!r}")


def as_array(a):
  return a if isinstance(a, (jax.Array, np.ndarray)) else np.asarray(a)


def fit_lasso(X, y, alpha, *, sample_weight=None, penalty_weights=None, init=None,
              fit_intercept: bool = True, standardize: bool = False, nonpositive: bool = False,
              tol: float | None = None, max_iter: int = DEFAULT_MAX_ITER, restart: bool = True,
              dtype=None) -> LassoResult:
  """Lasso at one alpha. X: [masks, features] (0/1 or bool, 1 = ablated), y: [masks] scores.

  sample_weight: [masks] nonnegative (e.g. 0/1 for a subsample, counts for a bootstrap).
  penalty_weights: [features] positive per-head multipliers of alpha (randomized lasso).
  init: [features] warm start, in the units of y.
  tol: stopping tolerance on the relative coefficient change (default 1e-6 float32, 1e-10 float64).
  Pure and jitted: `jax.vmap(lambda y: fit_lasso(X, y, a))(Y)` solves many problems at once.
  Inside your own `jax.jit`, pass X as an argument rather than closing over a numpy array: XLA
  otherwise constant-folds X X^T at compile time, which takes seconds.
  """
  X, y = as_array(X), as_array(y)
  check_xy(X, y)
  _check_alpha(alpha)
  check_max_iter(max_iter)
  dtype, tol = resolve_precision(dtype, tol)
  return _fit_core(X, y, alpha, sample_weight, penalty_weights, init, fit_intercept=fit_intercept,
                   standardize=standardize, nonpositive=nonpositive, tol=tol, max_iter=max_iter,
                   restart=restart, dtype=dtype)


def alpha_grid(X, y, num_alphas: int = 100, eps: float = 1e-3, *, sample_weight=None,
               fit_intercept: bool = True, standardize: bool = False, nonpositive: bool = False,
               dtype=None) -> jax.Array:
  """[alphas] geometric grid from alpha_max = ||X_c^T y_c||_inf / n down to alpha_max * eps.

  Same as sklearn's `_alpha_grid` (for nonpositive: alpha_max = max(-X_c^T y_c) / n, the smallest
  alpha at which w = 0 is optimal under w <= 0; sklearn's positive=True on -X).
  """
  X, y = as_array(X), as_array(y)
  check_xy(X, y)
  _check_grid(num_alphas, eps)
  dtype, _ = resolve_precision(dtype, None)
  p = fista.prepare(X, y, sample_weight, fit_intercept, standardize, dtype)
  return _grid(p, num_alphas, eps, nonpositive)


def _check_grid(num_alphas, eps):
  if isinstance(num_alphas, bool) or not isinstance(num_alphas, int) or num_alphas < 1:
    raise UserError(f"num_alphas must be a positive integer, got {num_alphas!r}")
  if isinstance(eps, (int, float)) and not 0 < eps < 1:
    raise UserError(f"eps (alpha_min / alpha_max) must be in (0, 1), got {eps!r}")


def lasso_path(X, y, alphas=None, *, num_alphas: int = 100, eps: float = 1e-3,
               sample_weight=None, penalty_weights=None, fit_intercept: bool = True,
               standardize: bool = False, nonpositive: bool = False, tol: float | None = None,
               max_iter: int = DEFAULT_MAX_ITER, restart: bool = True, dtype=None) -> LassoPath:
  """Warm-started path over `alphas` (sorted decreasing) or over `alpha_grid(num_alphas, eps)`."""
  X, y = as_array(X), as_array(y)
  check_xy(X, y)
  check_max_iter(max_iter)
  if alphas is None:
    _check_grid(num_alphas, eps)
  else:
    alphas = as_array(alphas)
    if alphas.ndim != 1 or alphas.shape[0] < 1:
      raise UserError(f"alphas must be a non-empty vector, got shape {alphas.shape}")
    if isinstance(alphas, np.ndarray) and np.any(alphas < 0):
      raise UserError(f"lasso alphas must be >= 0, got min {alphas.min()!r}")
    num_alphas = alphas.shape[0]
  dtype, tol = resolve_precision(dtype, tol)
  return _path_core(X, y, alphas, eps, sample_weight, penalty_weights, num_alphas=num_alphas,
                    fit_intercept=fit_intercept, standardize=standardize, nonpositive=nonpositive,
                    tol=tol, max_iter=max_iter, restart=restart, dtype=dtype)


def kfold_assignment(num_samples: int, num_folds: int, seed: int) -> np.ndarray:
  """int [masks]: the fold of each mask. A seeded shuffle cut into folds whose sizes differ by at
  most one (the first num_samples % num_folds folds one larger), like KFold(shuffle=True)."""
  if isinstance(num_folds, bool) or not isinstance(num_folds, int) or num_folds < 2:
    raise UserError(f"num_folds must be an integer >= 2, got {num_folds!r}")
  if num_folds > num_samples:
    raise UserError(f"num_folds={num_folds} is more than the {num_samples} masks measured")
  order = np.random.default_rng(seed).permutation(num_samples)
  folds = np.empty(num_samples, dtype=np.int64)
  for f, chunk in enumerate(np.array_split(order, num_folds)):
    folds[chunk] = f
  return folds


def lasso_cv(X, y, *, alphas=None, num_alphas: int = 100, eps: float = 1e-3, num_folds: int = 5,
             seed: int = 0, folds=None, fit_intercept: bool = True, standardize: bool = False,
             nonpositive: bool = False, tol: float | None = None,
             max_iter: int = DEFAULT_MAX_ITER, restart: bool = True,
             dtype=None) -> LassoCVResult:
  """Alpha by K-fold cross-validation, as sklearn's LassoCV; then a refit on all masks.

  For each fold the path over the grid is fit on the other folds and scored by mean squared error
  on the held-out masks; alpha minimizes the mean MSE over folds. The grid is computed once from all
  masks (alpha_grid) unless `alphas` is given. `folds`: int [masks] fold ids 0..K-1; when None they
  come from `kfold_assignment(masks, num_folds, seed)`. All folds and the refit are solved together
  under one vmap. With standardize=True, y is standardized once on all masks before the folds.
  """
  X, y = as_array(X), as_array(y)
  check_xy(X, y)
  check_max_iter(max_iter)
  if folds is None:
    folds = kfold_assignment(X.shape[0], num_folds, seed)
  else:
    folds = np.asarray(folds)
    num_folds = int(folds.max()) + 1 if folds.size else 0
    if folds.shape != (X.shape[0],) or folds.min() < 0 or num_folds < 2 or any(
        not np.any(folds == f) for f in range(num_folds)):
      raise UserError(
          f"folds must give every mask a fold id 0..K-1 with K >= 2 and no empty fold; got "
          f"shape {folds.shape} with ids {np.unique(folds).tolist()[:10]}")
  train = (folds[None, :] != np.arange(num_folds)[:, None]).astype(np.float32)
  if alphas is None:
    _check_grid(num_alphas, eps)
  else:
    alphas = as_array(alphas)
    if isinstance(alphas, np.ndarray) and np.any(alphas < 0):
      raise UserError(f"lasso alphas must be >= 0, got min {alphas.min()!r}")
    num_alphas = alphas.shape[0]
  dtype, tol = resolve_precision(dtype, tol)
  return _cv_core(X, y, alphas, eps, train, num_alphas=num_alphas, fit_intercept=fit_intercept,
                  standardize=standardize, nonpositive=nonpositive, tol=tol, max_iter=max_iter,
                  restart=restart, dtype=dtype)
