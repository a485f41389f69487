"""Design diagnostics: ablation counts, aliased heads, conditioning, and the warning at the paper's settings."""

import numpy as np

from jaxloc.localize import aliasing, designs


def test_the_paper_settings_alias_heads_and_say_so():
  design = designs.make_design("stratified", 30, 9, num_masks=100, ablation_rate=0.02, seed=0)
  found = aliasing.diagnose(design)
  assert (found.ablations_min, found.ablations_max) == (1, 2)
  assert found.identical_groups and all(len(g) >= 2 for g in found.identical_groups)
  flat = design.reshape(100, -1)
  for group in found.identical_groups:
    assert all(np.array_equal(flat[:, group[0]], flat[:, h]) for h in group[1:])
  assert found.mutual_coherence > 0.999 and found.rank <= 99
  assert "always ablated together" in found.warning() and "--num_masks" in found.warning()
  named = found.facts(lambda h: f"L{h // 9}H{h % 9}")
  assert named["identical_groups"][0][0].startswith("L") and named["ablations_per_head"]["max"] == 2


def test_a_large_design_has_no_aliases_and_no_warning():
  design = designs.make_design("stratified", 30, 9, num_masks=300, ablation_rate=0.1, seed=0)
  found = aliasing.diagnose(design)
  assert found.identical_groups == [] and found.never_ablated == [] and found.warning() is None
  assert found.ablations_min >= aliasing.MIN_ABLATIONS and found.mutual_coherence < aliasing.COLLINEAR
  assert found.rank == 269 and found.smallest_singular_value > 1e-6  # stratified: columns sum to a constant


def test_identical_never_ablated_and_collinear_columns_are_told_apart():
  rng = np.random.default_rng(0)
  X = np.zeros((40, 5), bool)
  X[:10, 0] = X[:10, 1] = True  # identical columns
  X[:, 2] = rng.random(40) < 0.5
  X[:, 3] = rng.random(40) < 0.5  # unrelated to 2
  found = aliasing.diagnose(X, excluded=np.array([0, 0, 0, 0, 1], bool))  # head 4: never ablated, but excluded
  assert found.identical_groups == [[0, 1]] and found.never_ablated == [] and found.num_active == 4
  assert found.group_of(1) == [0, 1] and found.group_of(2) == [2] and found.collinear_pairs == []
  X[:, 3] = X[:, 2]
  X[np.flatnonzero(X[:, 2])[0], 3] = False  # now nearly collinear with 2
  found = aliasing.diagnose(X)
  assert found.never_ablated == [4] and [(a, b) for a, b, _ in found.collinear_pairs] == [(2, 3)]
  assert found.collinear_pairs[0][2] > aliasing.COLLINEAR and found.aliased == [[0, 1]]


def test_a_run_that_measured_no_mask_has_no_design():
  """CNL measures no mask at all (its ranking is attribution alone): no design, not a crash."""
  assert aliasing.of_measurements(np.zeros((0, 3, 4), bool), np.zeros(12, bool)) is None
  single = np.ones((2, 3, 4), bool)
  single[0, 0, 1] = single[1, 2, 3] = False
  assert aliasing.of_measurements(~single, np.zeros(12, bool)) is None  # one unit per mask is no design either
