"""Held-out drops and their intervals (paired bootstrap over documents)."""

import re

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


class _CountingEvaluator:
  """Scores each document 1 per kept head in layer 0 and counts the masks it is asked to run."""

  class engine:  # noqa: N801 - the face validate reads: engine.model_config
    class model_config:  # noqa: N801
      num_layers, num_heads = 2, 3

  name, docs, unit, units_per_layer = "t", [0, 1, 2], "heads", 3

  def __init__(self):
    self.masks_run = 0

  def run(self, keep, per_doc=False):
    self.masks_run += len(keep)
    score = np.asarray(keep)[:, 0, :].sum(axis=1)
    return {"m": np.repeat(score[:, None], len(self.docs), axis=1) + np.arange(len(self.docs))}


def test_a_scorer_evaluates_each_distinct_mask_once_across_reports():
  evaluator = _CountingEvaluator()
  scorer = validate.TaskMeasures([evaluator], ["m"])
  drops = validate.single_head_drops([0, 1, 4], scorer)  # unablated + 3 heads
  assert evaluator.masks_run == 4
  np.testing.assert_allclose(drops[:, 0], [1 / 4, 1 / 4, 0.0])  # baseline mean 4 (3 kept + doc offsets 0..2)
  curve = validate.ablation_curve([0, 2, 1], 3, scorer)  # unablated and "head 0 alone" are already known
  assert evaluator.masks_run == 4 + 2
  np.testing.assert_allclose(curve["task"]["scores"], [4, 3, 2, 1])
  validate.ablation_curve([0, 2], 2, scorer)  # a prefix of the first curve: nothing new
  assert evaluator.masks_run == 6


def test_a_scorer_with_a_description_shows_the_masks_it_scores(capsys):
  scorer = validate.TaskMeasures([_CountingEvaluator()], ["m"], progress="scoring on held-out documents")
  validate.single_head_drops([0, 1], scorer)
  validate.single_head_drops([0, 1], scorer)  # cached: the bar does not move
  scorer.close()
  err = capsys.readouterr().err
  counts = [int(n) for n in re.findall(r": (\d+)task·mask \[", err)]
  assert "scoring on held-out documents" in err and max(counts) == 3  # the unablated model and two heads


def test_a_long_curve_measures_a_ladder_of_k():
  points = validate.curve_points(320, also=[100])
  assert points[:13] == list(range(13)) and points[-1] == 320 and 100 in points
  assert len(points) < 30 and points == sorted(set(points))
  assert validate.curve_points(5) == [0, 1, 2, 3, 4, 5]
