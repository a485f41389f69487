"""The synthetic response: seeded, planted heads are the true top-k, saturation, interactions, and
noise of the stated size."""

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.localize import designs
from jaxloc.bench.simulator import SyntheticResponse


def test_deterministic_given_seed():
  masks = designs.bernoulli_design(20, 270, 0.1, seed=0)
  a, b, c = (SyntheticResponse(270, seed=s) for s in (4, 4, 5))
  np.testing.assert_array_equal(a.true_effects, b.true_effects)
  np.testing.assert_array_equal(a.evaluate(masks, 1), b.evaluate(masks, np.random.default_rng(1)))
  assert not np.array_equal(a.true_effects, c.true_effects)
  assert not np.array_equal(a.evaluate(masks, 1), a.evaluate(masks, 2))


@pytest.mark.parametrize("link", ["linear", "logistic"])
def test_planted_heads_are_the_true_top_k(link):
  sim = SyntheticResponse(512, num_planted=5, planted_drop=(0.1, 0.3), link=link, seed=2)
  assert sim.baseline == pytest.approx(0.8)
  np.testing.assert_array_equal(np.sort(sim.true_top_k(5)), np.sort(sim.planted))
  drops = -sim.true_effects[sim.planted]
  assert np.all((drops >= 0.1 - 1e-12) & (drops <= 0.3 + 1e-12))
  assert np.all(np.diff(drops) <= 0)  # planted is ordered largest drop first
  others = np.delete(sim.true_effects, sim.planted)
  assert np.abs(others).max() < 0.05


def test_saturation_floors_accuracy():
  sim = SyntheticResponse(100, num_planted=5, planted_drop=(0.3, 0.4), link="linear",
                          num_samples=None, seed=0)
  all_planted = np.zeros((1, 100), bool)
  all_planted[0, sim.planted] = True
  assert sim.expected(all_planted)[0] == 0.0  # the sum of drops exceeds 0.8; clipped at 0
  logistic = SyntheticResponse(100, num_planted=5, planted_drop=(0.3, 0.4), link="logistic",
                               seed=0)
  p = logistic.expected(all_planted)[0]
  assert 0.0 < p < 0.8 - 0.3  # below any single drop, above 0
  everything = np.ones((1, 100), bool)
  assert 0.0 <= sim.expected(everything)[0] <= 1.0


def test_interactions_change_only_joint_ablations():
  plain = SyntheticResponse(64, interaction_scale=0.0, num_samples=None, seed=3)
  coupled = SyntheticResponse(64, interaction_scale=0.2, num_samples=None, seed=3)
  np.testing.assert_allclose(plain.true_effects, coupled.true_effects)
  pair = np.zeros((1, 64), bool)
  pair[0, plain.planted[:2]] = True
  additive = plain.baseline + plain.true_effects[plain.planted[:2]].sum()
  assert plain.expected(pair)[0] == pytest.approx(additive)
  assert coupled.expected(pair)[0] != pytest.approx(additive)


def test_binomial_noise_matches_num_samples():
  sim = SyntheticResponse(64, num_samples=100, seed=0)
  masks = np.zeros((4000, 64), bool)
  scores = sim.evaluate(masks, 0)
  assert np.allclose(scores * 100, np.round(scores * 100))  # multiples of 1/100
  assert scores.mean() == pytest.approx(0.8, abs=0.003)
  assert scores.std() == pytest.approx(np.sqrt(0.8 * 0.2 / 100), rel=0.05)


def test_logprob_metric_has_gaussian_noise_of_the_given_scale():
  sim = SyntheticResponse(64, metric="logprob", noise_scale=0.02, seed=0)
  assert sim.baseline == pytest.approx(np.log(0.8))
  scores = sim.evaluate(np.zeros((4000, 64), bool), 0)
  assert scores.std() == pytest.approx(0.02, rel=0.05)
  assert sim.true_effects[sim.planted[0]] < np.log(1 - 0.15 / 0.8) + 1e-9  # drop >= 0.15 in p


def test_accepts_layered_masks():
  sim = SyntheticResponse(270, num_samples=None, seed=0)
  layered = designs.make_design("bernoulli", 30, 9, num_masks=5, ablation_rate=0.1, seed=0)
  np.testing.assert_allclose(sim.expected(layered), sim.expected(layered.reshape(len(layered), -1)))


@pytest.mark.parametrize("kwargs", [
    dict(num_heads=0), dict(num_planted=600), dict(planted_drop=(0.2, 0.9)),
    dict(baseline_accuracy=1.0), dict(link="probit"), dict(metric="f1"), dict(num_samples=0),
    dict(noise_scale=-1.0),
])
def test_bad_arguments_raise_user_error(kwargs):
  args = dict(num_heads=512)
  args.update(kwargs)
  with pytest.raises(UserError):
    SyntheticResponse(**args)
  with pytest.raises(UserError):
    SyntheticResponse(16).evaluate(np.zeros((2, 15), bool), 0)
