"""Compressed sensing recovers planted heads from a synthetic linear response, and stability
selection separates them from null heads.

Setting: N = 512 heads, 5 planted with single-ablation drops U(0.15, 0.35) from a baseline accuracy
of 0.8, dense background effects of sd 0.003, accuracy over 100 samples (binomial sd ~0.04 per
evaluation), M = 300 masks at ablation rate 0.1 (~51 heads per mask). The Lasso coefficient of a
head has a standard error of about sigma / sqrt(M r (1 - r)) ~ 0.045 / 5.2 ~ 0.009, so the weakest
planted head (drop >= 0.15) sits ~17 standard errors below the nulls, whose background effects
are ~0.003. We therefore require all 5 planted heads in the top 5, not merely 4 of 5: missing one
here would mean a bug, not bad luck.
"""

import numpy as np
import pytest

from jaxloc.lasso import solver, stability
from jaxloc.localize import designs
from jaxloc.localize.methods.base import rank_by
from jaxloc.bench.simulator import SyntheticResponse

NUM_HEADS, NUM_MASKS, RATE = 512, 300, 0.1


def _measure(kind, seed):
  sim = SyntheticResponse(NUM_HEADS, num_planted=5, link="linear", seed=seed)
  build = designs.stratified_design if kind == "stratified" else designs.bernoulli_design
  masks = build(NUM_MASKS, NUM_HEADS, RATE, seed=seed)
  return sim, masks, sim.evaluate(masks, np.random.default_rng(1000 + seed))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("kind", ["stratified", "bernoulli"])
def test_cv_lasso_recovers_all_five_planted_heads(kind, seed):
  sim, masks, scores = _measure(kind, seed)
  # The CV choice lies near alpha_max / 20 here; a grid down to alpha_max / 50 covers it cheaply.
  cv = solver.lasso_cv(masks, scores, standardize=True, num_alphas=15, eps=2e-2, seed=seed)
  top5 = rank_by(cv.fit.coef)[:5]
  assert set(top5) == set(sim.true_top_k(5))
  # Coefficients are in accuracy units: the planted ones approximate the true drops (shrunk).
  coef = np.asarray(cv.fit.coef)
  np.testing.assert_allclose(coef[sim.planted], sim.true_effects[sim.planted], atol=0.06)
  assert float(cv.fit.intercept) == pytest.approx(sim.baseline, abs=0.03)


def test_random_scores_recover_nothing():
  # The same pipeline on scores unrelated to the masks finds the planted heads only by chance.
  sim, masks, scores = _measure("stratified", 0)
  shuffled = np.random.default_rng(0).permutation(scores)
  fit = solver.fit_lasso(masks, shuffled, 0.05, standardize=True)
  assert len(set(rank_by(fit.coef)[:5]) & set(sim.planted)) <= 1


@pytest.mark.parametrize("penalty_weakness", [None, 0.5])
def test_stability_selection_separates_planted_from_null_heads(penalty_weakness):
  sim, masks, scores = _measure("stratified", 0)
  alpha_max = float(solver.alpha_grid(masks, scores, 1, standardize=True)[0])
  result = stability.stability_selection(
      masks, scores, alpha_max * np.array([0.3, 0.2]), num_subsamples=50,
      penalty_weakness=penalty_weakness, threshold=0.75, standardize=True, seed=0)
  null = np.setdiff1d(np.arange(NUM_HEADS), sim.planted)
  assert result.frequency.shape == (NUM_HEADS,)
  assert np.all((result.frequency >= 0) & (result.frequency <= 1))
  assert result.frequency[sim.planted].min() >= 0.9
  assert result.frequency[null].max() <= 0.3
  assert result.frequency[null].mean() <= 0.01
  assert set(result.selected) == set(sim.planted)
  # Few heads are selected per subsample, so the Meinshausen-Buhlmann bound is informative.
  assert result.num_candidates == NUM_HEADS
  assert 0 < result.false_selection_bound() < 1.0
  assert result.false_selection_bound(0.9) < result.false_selection_bound(0.6)
  again = stability.stability_selection(
      masks, scores, alpha_max * np.array([0.3, 0.2]), num_subsamples=50,
      penalty_weakness=penalty_weakness, threshold=0.75, standardize=True, seed=0)
  np.testing.assert_array_equal(result.frequency, again.frequency)
