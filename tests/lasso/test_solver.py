"""The JAX FISTA Lasso against scikit-learn on problems of the paper's sizes (masks 100-400, heads
512-1024, 0/1 designs), plus the path, cross-validation, vmap, weights and argument checks.

Agreement is asserted at 1e-4 absolute on the coefficients (units of y) in the default float32;
float64 (under jax.enable_x64) is asserted much tighter, which shows the float32 gap is rounding,
not a different optimum.
"""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso, LassoCV
from sklearn.linear_model import lasso_path as sk_lasso_path

from jaxloc.errors import UserError
from jaxloc.lasso import crosscheck, solver, stability
from jaxloc.localize import designs
from jaxloc.localize.methods.base import rank_by

TOL = 1e-4


def _sparse_problem(num_masks, num_heads, kind, rate, seed):
  """0/1 design and y = 0.7 + A w + noise, w: 5 strong negative + 10 weak effects."""
  rng = np.random.default_rng(seed)
  build = designs.stratified_design if kind == "stratified" else designs.bernoulli_design
  X = build(num_masks, num_heads, rate, seed).astype(np.float64)
  w = np.zeros(num_heads)
  heads = rng.choice(num_heads, 15, replace=False)
  w[heads[:5]] = -rng.uniform(0.2, 0.6, 5)
  w[heads[5:]] = rng.choice([-1, 1], 10) * rng.uniform(0.02, 0.1, 10)
  y = 0.7 + X @ w + rng.normal(0, 0.05, num_masks)
  return X, y


@functools.lru_cache(maxsize=None)
def problem(name):
  return {
      "stratified_400x1024": lambda: _sparse_problem(400, 1024, "stratified", 0.1, 0),
      "bernoulli_100x512": lambda: _sparse_problem(100, 512, "bernoulli", 0.2, 1),
      "bernoulli_200x512": lambda: _sparse_problem(200, 512, "bernoulli", 0.1, 2),
  }[name]()


def _sklearn(X, y, alpha, positive=False, **kw):
  model = Lasso(alpha=alpha, tol=1e-12, max_iter=1_000_000, positive=positive, **kw)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    return model.fit(X, y)


def _standardized(y):
  return (y - y.mean()) / y.std()


def _alphas_for_nonzeros(X, y, targets=(5, 20, 50)):
  """Alphas whose sklearn solutions have about `targets` nonzeros (from a coarse sklearn path)."""
  Xc, yc = X - X.mean(0), y - y.mean()
  alphas, coefs, _ = sk_lasso_path(Xc, yc, eps=3e-3, alphas=60)
  nnz = (coefs != 0).sum(axis=0)
  return [float(alphas[np.argmin(np.abs(nnz - t))]) for t in targets]


@pytest.mark.parametrize("standardize", [False, True])
@pytest.mark.parametrize("name", ["stratified_400x1024", "bernoulli_100x512"])
def test_matches_sklearn_lasso(name, standardize):
  X, y = problem(name)
  target = _standardized(y) if standardize else y
  nonzeros = []
  for alpha in _alphas_for_nonzeros(X, target):
    result = solver.fit_lasso(X, y, alpha, standardize=standardize)
    assert bool(result.converged)
    reference = _sklearn(X, target, alpha)
    scale = y.std() if standardize else 1.0
    np.testing.assert_allclose(np.asarray(result.coef), reference.coef_ * scale, rtol=0, atol=TOL)
    intercept = reference.intercept_ * scale + (y.mean() if standardize else 0.0)
    assert float(result.intercept) == pytest.approx(intercept, abs=TOL)
    assert float(result.y_scale) == pytest.approx(scale, rel=1e-5)
    diff = crosscheck.check_against_sklearn(X, y, alpha, standardize=standardize, result=result)
    assert diff < TOL
    nonzeros.append(int(np.sum(reference.coef_ != 0)))
  # The alphas span the sparsity the paper uses (5 to 50 heads).
  assert min(nonzeros) <= 8 and max(nonzeros) >= 40, nonzeros


def test_check_against_sklearn_runs_its_own_fit_and_x64_is_tight():
  X, y = problem("bernoulli_100x512")
  alpha = _alphas_for_nonzeros(X, y, targets=(50,))[0]
  assert crosscheck.check_against_sklearn(X, y, alpha) < TOL
  assert crosscheck.check_against_sklearn(X, y, alpha, x64=True) < 1e-7
  # A wrong answer is caught: the check measures, it does not just pass.
  wrong = solver.fit_lasso(X, y, alpha * 1.5)
  assert crosscheck.check_against_sklearn(X, y, alpha, result=wrong) > 10 * TOL


@pytest.mark.parametrize("standardize", [False, True])
def test_nonpositive_matches_sklearn_positive_on_negated_design(standardize):
  X, y = problem("stratified_400x1024")
  target = _standardized(y) if standardize else y
  scale = y.std() if standardize else 1.0
  for alpha in _alphas_for_nonzeros(X, target, targets=(5, 30)):
    result = solver.fit_lasso(X, y, alpha, nonpositive=True, standardize=standardize)
    coef = np.asarray(result.coef)
    assert coef.max() <= 0.0
    reference = _sklearn(-X, target, alpha, positive=True)
    np.testing.assert_allclose(coef, -reference.coef_ * scale, rtol=0, atol=TOL)
    assert crosscheck.check_against_sklearn(X, y, alpha, nonpositive=True, standardize=standardize,
                                        result=result) < TOL
  # The constraint binds: the unconstrained fit has positive coefficients at the same alpha.
  assert np.asarray(solver.fit_lasso(X, y, alpha, standardize=standardize).coef).max() > 0


def test_vmap_over_y_and_over_X_equals_separate_solves():
  X, y = problem("bernoulli_100x512")
  rng = np.random.default_rng(5)
  Y = np.stack([y, y[rng.permutation(len(y))], y + rng.normal(0, 0.05, len(y))])
  alpha = 0.004
  batched = jax.vmap(lambda t: solver.fit_lasso(X, t, alpha))(Y)
  assert batched.coef.shape == (3, 512) and batched.converged.shape == (3,)
  for i in range(3):
    single = solver.fit_lasso(X, Y[i], alpha)
    np.testing.assert_allclose(batched.coef[i], single.coef, rtol=0, atol=TOL)
    assert float(batched.intercept[i]) == pytest.approx(float(single.intercept), abs=TOL)
  X2, _ = _sparse_problem(100, 512, "stratified", 0.2, 9)
  Xs = np.stack([X, X2])
  batched = jax.vmap(lambda a: solver.fit_lasso(a, y, alpha))(Xs)
  for i in range(2):
    np.testing.assert_allclose(batched.coef[i], solver.fit_lasso(Xs[i], y, alpha).coef, rtol=0,
                               atol=TOL)


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_vmap_over_tasks_of_cv_and_path():
  # Several tasks measured on the same masks: one vmapped CV, equal to CV task by task.
  X, y = problem("bernoulli_200x512")
  Y = np.stack([y, 1.0 - 0.5 * y + np.random.default_rng(0).normal(0, 0.02, len(y))])
  folds = solver.kfold_assignment(len(y), 5, seed=0)
  run = lambda t: solver.lasso_cv(X, t, folds=folds, num_alphas=20, eps=1e-2)
  batched = jax.vmap(run)(Y)
  for i in range(2):
    single = run(Y[i])
    assert int(batched.best_index[i]) == int(single.best_index)
    np.testing.assert_allclose(batched.fit.coef[i], single.fit.coef, rtol=0, atol=TOL)
  paths = jax.vmap(lambda t: solver.lasso_path(X, t, num_alphas=20, eps=1e-2))(Y)
  assert paths.coef.shape == (2, 20, 512)


def test_excluded_heads_get_zero_coefficients():
  X, y = problem("bernoulli_100x512")
  X = X.copy()
  X[:, :12] = 0.0  # heads 0..11 excluded from the design: never ablated
  fit = solver.fit_lasso(X, y, 0.002)
  assert not np.any(np.asarray(fit.coef)[:12])
  assert np.sum(np.asarray(fit.coef) != 0) > 5


def test_path_matches_sklearn_path():
  X, y = problem("bernoulli_200x512")
  path = solver.lasso_path(X, y, num_alphas=20, eps=1e-2)
  assert bool(np.all(path.converged))
  alphas = np.asarray(path.alphas, np.float64)
  assert np.all(np.diff(alphas) < 0)
  _, coefs, _ = sk_lasso_path(X - X.mean(0), y - y.mean(), alphas=alphas, tol=1e-12,
                              max_iter=1_000_000)
  np.testing.assert_allclose(np.asarray(path.coef), coefs.T, rtol=0, atol=TOL)
  # Given alphas in any order come back sorted decreasing and give the same fits.
  shuffled = solver.lasso_path(X, y, alphas[::-1][:5].copy())
  np.testing.assert_allclose(np.asarray(shuffled.alphas), alphas[-5:][::-1][::-1], rtol=1e-6)


@pytest.mark.parametrize("nonpositive", [False, True])
def test_alpha_grid_matches_sklearn_formula(nonpositive):
  X, y = problem("bernoulli_100x512")
  Xc, yc = X - X.mean(0), y - y.mean()
  corr = Xc.T @ yc / len(y)
  top = max(0.0, (-corr).max()) if nonpositive else np.abs(corr).max()
  grid = solver.alpha_grid(X, y, 30, 1e-3, nonpositive=nonpositive)
  np.testing.assert_allclose(np.asarray(grid), np.geomspace(top, top * 1e-3, 30), rtol=1e-5)
  # At alpha_max every coefficient is zero, just below it one is not.
  assert not np.any(np.asarray(solver.fit_lasso(X, y, grid[0], nonpositive=nonpositive).coef))
  assert np.any(np.asarray(solver.fit_lasso(X, y, grid[0] * 0.97, nonpositive=nonpositive).coef))


@pytest.mark.parametrize("standardize", [False, True])
def test_cv_picks_the_same_alpha_as_sklearn_lassocv(standardize):
  X, y = problem("bernoulli_200x512")
  folds = solver.kfold_assignment(len(y), 5, seed=3)
  ours = solver.lasso_cv(X, y, folds=folds, num_alphas=20, eps=1e-2, standardize=standardize)
  target = _standardized(y) if standardize else y
  splits = [(np.flatnonzero(folds != f), np.flatnonzero(folds == f)) for f in range(5)]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", ConvergenceWarning)
    theirs = LassoCV(alphas=np.asarray(ours.alphas, np.float64), cv=splits, tol=1e-10,
                     max_iter=100_000).fit(X, target)
  np.testing.assert_allclose(np.asarray(ours.alphas), theirs.alphas_, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(ours.mse_path), theirs.mse_path_, rtol=1e-3)
  assert int(ours.best_index) == int(np.argmin(theirs.mse_path_.mean(axis=1)))
  assert float(ours.fit.alpha) == pytest.approx(theirs.alpha_, rel=1e-6)
  assert bool(ours.all_converged)
  scale = y.std() if standardize else 1.0
  np.testing.assert_allclose(np.asarray(ours.fit.coef), theirs.coef_ * scale, rtol=0, atol=TOL)
  # The seeded default folds are reproducible and cover every mask.
  same = solver.lasso_cv(X, y, seed=3, num_folds=5, num_alphas=20, eps=1e-2,
                         standardize=standardize)
  assert int(same.best_index) == int(ours.best_index)


def test_sample_weights_equal_subsets_and_duplicates():
  X, y = problem("bernoulli_100x512")
  alpha = 0.004
  keep = np.zeros(len(y), np.float32)
  keep[::2] = 1
  weighted = solver.fit_lasso(X, y, alpha, sample_weight=keep)
  subset = solver.fit_lasso(X[::2], y[::2], alpha)
  np.testing.assert_allclose(weighted.coef, subset.coef, rtol=0, atol=TOL)
  assert float(weighted.intercept) == pytest.approx(float(subset.intercept), abs=TOL)
  counts = np.random.default_rng(0).integers(0, 3, len(y)).astype(np.float32)
  duplicated = solver.fit_lasso(np.repeat(X, counts.astype(int), 0),
                                np.repeat(y, counts.astype(int)), alpha)
  np.testing.assert_allclose(solver.fit_lasso(X, y, alpha, sample_weight=counts).coef,
                             duplicated.coef, rtol=0, atol=TOL)


def test_penalty_weights_equal_column_scaling_in_sklearn():
  X, y = problem("bernoulli_100x512")
  alpha = 0.004
  weights = np.random.default_rng(1).uniform(1.0, 2.0, X.shape[1])
  ours = solver.fit_lasso(X, y, alpha, penalty_weights=weights)
  reference = _sklearn(X / weights, y, alpha)
  np.testing.assert_allclose(np.asarray(ours.coef), reference.coef_ / weights, rtol=0, atol=TOL)


def test_standardizing_is_the_same_fit_at_alpha_times_sd():
  X, y = problem("stratified_400x1024")
  alpha = 0.05
  standardized = solver.fit_lasso(X, y, alpha, standardize=True)
  plain = solver.fit_lasso(X, y, alpha * y.std())
  np.testing.assert_allclose(standardized.coef, plain.coef, rtol=0, atol=TOL)
  np.testing.assert_array_equal(rank_by(standardized.coef)[:5],
                                rank_by(plain.coef)[:5])


def test_dual_gap_small_at_the_returned_solution():
  X, y = problem("bernoulli_100x512")
  result = solver.fit_lasso(X, y, 0.004)
  assert 0 <= float(result.dual_gap) < 1e-5 * float(np.mean((y - y.mean()) ** 2))
  early = solver.fit_lasso(X, y, 0.004, max_iter=3)
  assert not bool(early.converged) and int(early.iterations) == 3
  assert float(early.dual_gap) > float(result.dual_gap)


def test_kfold_assignment():
  folds = solver.kfold_assignment(23, 5, seed=0)
  np.testing.assert_array_equal(np.bincount(folds), [5, 5, 5, 4, 4])
  np.testing.assert_array_equal(folds, solver.kfold_assignment(23, 5, seed=0))
  assert (folds != solver.kfold_assignment(23, 5, seed=1)).any()


def test_false_selection_bound():
  assert stability.false_selection_bound(10, 500, 0.75) == pytest.approx(100 / (0.5 * 500))
  with pytest.raises(UserError):
    stability.false_selection_bound(10, 500, 0.5)


def test_bad_arguments_raise_user_error():
  X, y = problem("bernoulli_100x512")
  with pytest.raises(UserError, match="alpha"):
    solver.fit_lasso(X, y, -0.1)
  with pytest.raises(UserError, match="one score per mask"):
    solver.fit_lasso(X, y[:-1], 0.1)
  with pytest.raises(UserError, match="matrix"):
    solver.fit_lasso(y, y, 0.1)
  with pytest.raises(UserError, match="enable_x64"):
    solver.fit_lasso(X, y, 0.1, dtype=jnp.float64)
  with pytest.raises(UserError, match="max_iter"):
    solver.fit_lasso(X, y, 0.1, max_iter=0)
  with pytest.raises(UserError, match="num_folds"):
    solver.lasso_cv(X, y, num_folds=1)
  with pytest.raises(UserError, match="folds"):
    solver.lasso_cv(X, y, folds=np.zeros(len(y), int))
  with pytest.raises(UserError, match="eps"):
    solver.lasso_path(X, y, eps=2.0)
  with pytest.raises(UserError, match="threshold"):
    stability.stability_selection(X, y, 0.01, threshold=0.4)
  with pytest.raises(UserError, match="sample_fraction"):
    stability.stability_selection(X, y, 0.01, sample_fraction=0.0)
  with pytest.raises(UserError, match="penalty_weakness"):
    stability.stability_selection(X, y, 0.01, penalty_weakness=1.5)
