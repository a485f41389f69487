"""CNL's selection rule and overlap rate on planted attributions."""

import numpy as np

from jaxloc.localize.methods import cnl


def test_documents_select_above_a_fraction_of_their_largest_attribution():
  scores = np.array([[1.0, 0.3, 0.1, 0.0],
                     [2.0, 0.1, 0.5, 0.0],
                     [0.0, 0.0, 0.0, 0.0]])  # a document with no positive attribution selects nothing
  frequency, relative, located = cnl.commonality(scores, threshold=0.2, commonality_rate=0.5)
  np.testing.assert_allclose(frequency, [2 / 3, 1 / 3, 1 / 3, 0])
  np.testing.assert_allclose(relative, [(1 + 1) / 3, (0.3 + 0.05) / 3, (0.1 + 0.25) / 3, 0])
  assert located.tolist() == [True, False, False, False]


def test_overlap_rate_of_two_halves():
  rng = np.random.default_rng(0)
  shared = rng.random((40, 50)) * 0.01
  shared[:, [3, 7, 11]] = 1.0  # every document: the same three neurons
  same = cnl.overlap(shared, 0.2, 0.4, seed=0)
  assert same["half_docs"] == [20, 20] and same["half_neurons"] == [3, 3]
  assert same["overlap_rate"] == 1.0 and same["jaccard"] == 1.0
  split = rng.random((40, 50)) * 0.01
  order = np.random.default_rng([0, 23]).permutation(40)  # the halves `overlap` draws with seed 0
  split[order[:20], 3] = 1.0
  split[order[20:], 7] = 1.0
  split[:, 11] = 1.0
  apart = cnl.overlap(split, 0.2, 0.4, seed=0)
  assert apart["half_neurons"] == [2, 2] and apart["shared_neurons"] == 1
  assert apart["overlap_rate"] == 0.5 and apart["jaccard"] == 1 / 3
