"""Held-out drops and their intervals (paired bootstrap over documents)."""

import numpy as np

from jaxloc.localize import validate


def test_the_interval_of_a_drop_is_paired_over_documents_and_covers_it():
  rng = np.random.default_rng(0)
  base = (rng.random(100) < 0.5).astype(float)
  ablated = base.copy()
  ablated[np.flatnonzero(base)[:10]] = 0  # 10 of the 44 correct documents fail: a 23% drop
  intervals = validate.drop_interval(np.stack([base, ablated, base]))
  drop = validate.relative_drop(base.mean(), ablated.mean())
  assert intervals.shape == (3, 2)
  np.testing.assert_array_equal(intervals[[0, 2]], 0.0)  # unchanged documents: no uncertainty
  assert intervals[1, 0] < drop < intervals[1, 1] and intervals[1, 1] - intervals[1, 0] < 0.3
  # Unpaired noise would be far wider: the same drop spread over independent documents.
  other = (rng.random(100) < base.mean() * (1 - drop)).astype(float)
  wide = validate.drop_interval(np.stack([base, other]))[1]
  assert wide[1] - wide[0] > intervals[1, 1] - intervals[1, 0]
