"""Measurement designs: exact balance of stratified designs, rates of Bernoulli ones, exclusion,
seeding, the layered face, and refusal of bad arguments."""

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.localize import designs


@pytest.mark.parametrize("num_masks,num_heads,rate", [
    (300, 512, 0.1), (101, 270, 0.5), (50, 1024, 0.03), (37, 10, 0.9), (400, 7, 0.3), (1, 64, 0.25),
])
def test_stratified_exact_counts(num_masks, num_heads, rate):
  design = designs.stratified_design(num_masks, num_heads, rate, seed=3)
  k = round(rate * num_heads)
  assert design.shape == (num_masks, num_heads) and design.dtype == bool
  np.testing.assert_array_equal(design.sum(axis=1), k)  # every mask ablates exactly k
  counts = design.sum(axis=0)
  total = num_masks * k
  assert counts.sum() == total
  assert counts.max() - counts.min() <= 1  # balance within +-1
  assert counts.min() == total // num_heads


def test_stratified_with_exclusion_balances_remaining_heads():
  excluded = [0, 5, 17, 511]
  design = designs.stratified_design(200, 512, 0.2, seed=1, exclude=excluded)
  assert not design[:, excluded].any()
  active = np.setdiff1d(np.arange(512), excluded)
  k = round(0.2 * active.size)
  np.testing.assert_array_equal(design.sum(axis=1), k)
  counts = design[:, active].sum(axis=0)
  assert counts.max() - counts.min() <= 1


def test_stratified_high_rate_many_permutation_boundaries():
  # k close to N makes almost every mask straddle two permutations: the duplicate repair must hold.
  for seed in range(5):
    design = designs.stratified_design(97, 13, 0.9, seed=seed)
    np.testing.assert_array_equal(design.sum(axis=1), 12)
    counts = design.sum(axis=0)
    assert counts.max() - counts.min() <= 1


@pytest.mark.parametrize("rate", [0.05, 0.3])
def test_bernoulli_rate_within_binomial_tolerance(rate):
  num_masks, num_heads = 400, 512
  design = designs.bernoulli_design(num_masks, num_heads, rate, seed=11)
  trials = num_masks * num_heads
  sd = np.sqrt(rate * (1 - rate) / trials)
  assert abs(design.mean() - rate) < 5 * sd
  # Heads are independent: per-head counts spread like Binomial(M, rate), unlike stratified.
  counts = design.sum(axis=0)
  assert counts.var() == pytest.approx(num_masks * rate * (1 - rate), rel=0.25)


def test_bernoulli_exclusion_and_rate_over_remaining():
  excluded = np.zeros(270, bool)
  excluded[:30] = True
  design = designs.bernoulli_design(500, 270, 0.25, seed=0, exclude=excluded)
  assert not design[:, :30].any()
  rate = design[:, 30:].mean()
  assert abs(rate - 0.25) < 5 * np.sqrt(0.25 * 0.75 / (500 * 240))


@pytest.mark.parametrize("build", [designs.bernoulli_design, designs.stratified_design])
def test_reproducible_for_a_seed_and_different_for_another(build):
  a = build(64, 270, 0.1, seed=7)
  b = build(64, 270, 0.1, seed=7)
  c = build(64, 270, 0.1, seed=8)
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()


def test_single_head_design_identity_rows():
  design = designs.single_head_design(12, exclude=[3, 4])
  assert design.shape == (10, 12)
  np.testing.assert_array_equal(design.sum(axis=1), 1)
  np.testing.assert_array_equal(np.flatnonzero(design.any(axis=0)),
                                np.setdiff1d(np.arange(12), [3, 4]))
  np.testing.assert_array_equal(design.argmax(axis=1), np.setdiff1d(np.arange(12), [3, 4]))


def test_layered_design_layout_and_exclusions():
  design = designs.make_design("stratified", 30, 9, num_masks=40, ablation_rate=0.1, seed=0,
                               exclude=["L0H0", (29, 8), 10])
  assert design.shape == (40, 30, 9)
  assert not design[:, 0, 0].any() and not design[:, 29, 8].any() and not design[:, 1, 1].any()
  flat = design.reshape(40, 270)
  np.testing.assert_array_equal(designs.unflatten_design(flat, 30, 9), design)
  np.testing.assert_array_equal(flat.sum(axis=1), round(0.1 * 267))
  assert designs.excluded_heads(["L15H3"], 270, num_heads=9).nonzero()[0].tolist() == [15 * 9 + 3]
  single = designs.make_design("single_head", 2, 3)
  assert single.shape == (6, 2, 3) and single.sum() == 6


@pytest.mark.parametrize("kwargs", [
    dict(ablation_rate=0.0), dict(ablation_rate=1.0), dict(ablation_rate=-0.1),
    dict(ablation_rate=1.5), dict(ablation_rate="a lot"), dict(num_masks=0),
    dict(num_masks=-3), dict(num_masks=2.5), dict(ablation_rate=0.001),  # rate * N < 1
    dict(exclude=list(range(100))), dict(exclude=[100]), dict(exclude=["L10H0"]),
    dict(exclude=["head3"]), dict(seed=-1), dict(seed="x"),
])
@pytest.mark.parametrize("build", [designs.bernoulli_design, designs.stratified_design])
def test_bad_arguments_raise_user_error(build, kwargs):
  args = dict(num_masks=10, num_heads_total=100, ablation_rate=0.1, seed=0)
  args.update(kwargs)
  with pytest.raises(UserError):
    build(args["num_masks"], args["num_heads_total"], args["ablation_rate"], args["seed"],
          args.get("exclude"), num_heads=10)


def test_bad_layered_arguments_raise_user_error():
  with pytest.raises(UserError, match="unknown design"):
    designs.make_design("random", 2, 3, num_masks=4, ablation_rate=0.5)
  with pytest.raises(UserError, match="needs num_masks"):
    designs.make_design("bernoulli", 2, 3)
  with pytest.raises(UserError, match="round"):  # k = round(0.99 * 6) = 6 = N: nothing varies
    designs.stratified_design(4, 6, 0.99, seed=0)
  with pytest.raises(UserError):
    designs.unflatten_design(np.zeros((2, 7), bool), 2, 3)
