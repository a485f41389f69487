"""The FISTA iteration behind the Lasso of `solver`: the prepared (centered, weighted, standardized) problem, its
operators, the step size, and the solve at one alpha from a warm start, with its duality gap. `solver` owns the
public fits, paths and cross-validation and the objective they minimize (its docstring); this module owns how one
alpha is solved. Every function is pure JAX over arrays, so it runs under `jit`, `vmap` and `lax.scan`.

Axes:
  masks:  rows of the design X (one model evaluation each); the Lasso's samples.
  features: columns of X (units flattened `layers * units`, True/1 = ablated).

Algorithm: FISTA (Beck & Teboulle 2009) with the gradient restart of O'Donoghue & Candes (2015),
step 1/L with L the largest eigenvalue of the weighted centered Gram matrix / n (100 steps of power
iteration on the smaller of the [masks, masks] and [features, features] Gram matrices, plus 1%). Iteration
stops when the iterate reaches an exact fixed point, or when at a check (every CHECK_EVERY = 50
steps) the change of the coefficients over the last 50 steps, max_j |x_k - x_{k-50}|, is at most
tol * max(max_j |x_k|, alpha_max / L): a relative change, floored at the scale of the first
coefficient to enter the path. A window rather than one step, because on ill-conditioned fits one
step is far smaller than the distance left while 50 steps are of its order, and because float32
iterates that cycle by an ulp can never pass a one-step test below ~1e-7. `max_iter` caps the steps
(converged=False then). The duality gap of the final iterate is reported for diagnosis.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

CHECK_EVERY = 50  # FISTA steps per convergence check
POWER_STEPS = 100  # power-iteration steps for the step size


class Problem(NamedTuple):
  """Centered, weighted, possibly standardized problem; X0 is shared under vmap over y/weights."""
  X0: jax.Array        # [masks, features] X minus its unweighted column means (or X if no intercept)
  x_offset: jax.Array  # [features] weighted column means of X0 (~0 without sample weights)
  sw: jax.Array        # [masks] sample weights
  ys: jax.Array        # [masks] centered (and standardized) target
  n_eff: jax.Array     # [] sum of sample weights
  y_mean: jax.Array    # [] weighted mean of y (0 without intercept)
  y_scale: jax.Array   # [] standardization scale (1 when off)
  x_mean: jax.Array    # [features] weighted column means of X (0 without intercept)


def prepare(X, y, sample_weight, fit_intercept: bool, standardize: bool, dtype) -> Problem:
  """X [masks, features] and y [masks] as the problem FISTA solves: centered by the (weighted) means when
  `fit_intercept`, y divided by its weighted sd when `standardize` (`solver`'s docstring)."""
  X = jnp.asarray(X, dtype)
  y = jnp.asarray(y, dtype)
  n, num_features = X.shape
  sw = jnp.ones((n,), dtype) if sample_weight is None else jnp.asarray(sample_weight, dtype)
  n_eff = jnp.sum(sw)
  y_wmean = sw @ y / n_eff
  if fit_intercept:
    # Center by the plain mean first, which is shared by every weighting of the same X under vmap,
    # so the weighted offset below is small and X0 @ w loses little to cancellation.
    global_mean = jnp.mean(X, axis=0)
    X0 = X - global_mean
    x_offset = sw @ X0 / n_eff
    x_mean = global_mean + x_offset
    y_mean = y_wmean
  else:
    X0 = X
    x_offset = jnp.zeros((num_features,), dtype)
    x_mean = jnp.zeros((num_features,), dtype)
    y_mean = jnp.zeros((), dtype)
  yc = y - y_mean
  if standardize:
    sd = jnp.sqrt(sw @ jnp.square(y - y_wmean) / n_eff)
    y_scale = jnp.where(sd > 0, sd, jnp.ones((), dtype))  # constant scores: nothing to scale
  else:
    y_scale = jnp.ones((), dtype)
  return Problem(X0, x_offset, sw, yc / y_scale, n_eff, y_mean, y_scale, x_mean)


def matvec(p: Problem, w):
  """Centered predictions (X - x_mean) w, [masks]."""
  return p.X0 @ w - p.x_offset @ w


def rmatvec(p: Problem, r):
  """(X - x_mean)^T r, [features]."""
  # `r @ X0`, not `X0.T @ r`: on CPU XLA makes the transposed form ~10x slower.
  return r @ p.X0 - p.x_offset * jnp.sum(r)


def lipschitz(p: Problem):
  """Largest eigenvalue of sum_i s_i (x_i - x_mean)(x_i - x_mean)^T / n_eff, by power iteration.

  Power iteration on the smaller Gram matrix rather than `eigvalsh`: XLA's CPU eigensolver takes
  0.1-2 s at 200-400 masks, more than the whole FISTA solve. POWER_STEPS steps from a fixed random
  start reach >= 0.998 of the top eigenvalue on 0/1 designs of the paper's sizes; the 1% margin
  covers the rest, and a step a little above 1/L would still converge (with the same fixed point).
  """
  n, num_features = p.X0.shape
  if n <= num_features:
    gram = p.X0 @ p.X0.T  # shared by all problems that share X under vmap
    u = p.X0 @ p.x_offset
    gram = gram - u[:, None] - u[None, :] + p.x_offset @ p.x_offset
    root = jnp.sqrt(p.sw)
    gram = root[:, None] * gram * root[None, :]
  else:
    gram = p.X0.T @ (p.sw[:, None] * p.X0) - p.n_eff * jnp.outer(p.x_offset, p.x_offset)
  start = np.random.default_rng(0).normal(size=gram.shape[0])
  v = jnp.asarray(start / np.linalg.norm(start), gram.dtype)

  def power_step(_, state):
    v, _ = state
    u = gram @ v
    norm = jnp.linalg.norm(u)
    return u / jnp.where(norm > 0, norm, 1.0), norm

  _, top = jax.lax.fori_loop(0, POWER_STEPS, power_step, (v, jnp.zeros((), gram.dtype)))
  return jnp.maximum(1.01 * top / p.n_eff, jnp.finfo(p.X0.dtype).tiny)


def alpha_max(p: Problem, nonpositive: bool, penalty_weights=None):
  corr = rmatvec(p, p.sw * p.ys) / p.n_eff
  if penalty_weights is not None:
    corr = corr / penalty_weights
  if nonpositive:
    # w <= 0 stays at 0 unless some head's ablation correlates with a lower score.
    return jnp.maximum(jnp.max(-corr), 0.0)
  return jnp.max(jnp.abs(corr))


class Solution(NamedTuple):
  coef: jax.Array
  iterations: jax.Array
  converged: jax.Array


def solve(p: Problem, alpha, penalty_weights, w0, lipschitz, floor, *, nonpositive: bool,
           tol: float, max_iter: int, restart: bool) -> Solution:
  dtype = p.X0.dtype
  step = 1.0 / lipschitz
  thresh = step * alpha * (1.0 if penalty_weights is None else penalty_weights)

  def prox(v):
    if nonpositive:
      return jnp.minimum(v + thresh, 0.0)
    return jnp.sign(v) * jnp.maximum(jnp.abs(v) - thresh, 0.0)

  def grad(w):
    return -rmatvec(p, p.sw * (p.ys - matvec(p, w))) / p.n_eff

  def limit(x):
    return tol * jnp.maximum(jnp.max(jnp.abs(x)), floor)

  def cond(state):
    k, _, _, _, _, done = state
    return (k < max_iter) & ~done

  def body(state):
    k, x, z, t, x_check, _ = state
    x_new = prox(z - step * grad(z))
    t_new = 0.5 * (1.0 + jnp.sqrt(1.0 + 4.0 * t * t))
    beta = (t - 1.0) / t_new
    if restart:
      # Momentum points uphill: drop it (gradient restart).
      reset = jnp.vdot(z - x_new, x_new - x) > 0
      t_new = jnp.where(reset, 1.0, t_new)
      beta = jnp.where(reset, 0.0, beta)
    z_new = x_new + beta * (x_new - x)
    # Judged over a window, not one step: when convergence is slow (ill-conditioned fits) one step
    # is far smaller than the distance left, while the change over CHECK_EVERY steps is of its
    # order; and float32 iterates that cycle by an ulp cannot pass a per-step test below 1e-7.
    k = k + 1
    at_check = k % CHECK_EVERY == 0
    window_change = jnp.max(jnp.abs(x_new - x_check))
    fixed_point = jnp.all(x_new == z)
    done = fixed_point | (at_check & (window_change <= limit(x_new)))
    x_check = jnp.where(at_check, x_new, x_check)
    return k, x_new, z_new, t_new.astype(dtype), x_check, done

  w0 = w0.astype(dtype)
  init = (jnp.zeros((), jnp.int32), w0, w0, jnp.ones((), dtype), w0, jnp.zeros((), bool))
  k, x, _, _, _, done = jax.lax.while_loop(cond, body, init)
  return Solution(x, k, done)


def dual_gap(p: Problem, w, alpha, penalty_weights, nonpositive: bool):
  """Primal minus dual objective (sklearn's gap divided by n), using the scaled residual."""
  resid = p.ys - matvec(p, w)
  r = p.sw * resid
  rnorm2 = jnp.vdot(resid, r)
  corr = rmatvec(p, r) / p.n_eff
  pw = 1.0 if penalty_weights is None else penalty_weights
  corr = corr / pw
  dual_norm = jnp.max(-corr) if nonpositive else jnp.max(jnp.abs(corr))
  s = jnp.where(dual_norm > alpha, alpha / jnp.where(dual_norm > 0, dual_norm, 1.0), 1.0)
  penalty = alpha * jnp.sum(pw * jnp.abs(w))
  return (0.5 * rnorm2 * (1 + s * s) - s * jnp.vdot(p.ys, r)) / p.n_eff + penalty


def intercept(p: Problem, coef_y_units, fit_intercept: bool):
  if not fit_intercept:
    return jnp.zeros((), coef_y_units.dtype)
  return p.y_mean - p.x_mean @ coef_y_units
