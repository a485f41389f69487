"""Specific heads, universal heads and the bootstrap confidence, on planted problems with several tasks scored
under the same masks (no model)."""

import numpy as np
import pytest

from jaxloc.localize import confidence, methods, selection, specificity
from jaxloc.localize.methods import Measured, Ranking
from tests.localize.helpers import context, drive, run, settings

L, H = 3, 4
N = L * H
SHARED, SPECIFIC, WEAK = 1, 6, 9  # SHARED breaks the target and the general task; SPECIFIC only the target


def target(flat):
  return 1.0 - 0.5 * flat[:, SHARED] - 0.4 * flat[:, SPECIFIC] - 0.05 * flat[:, WEAK]


def general(flat):
  return 1.0 - 0.6 * flat[:, SHARED]


def test_relative_drops_are_unknown_where_the_plan_has_no_estimate():
  ranking = Ranking(np.arange(4), np.array([-0.5, 0.0, 0.1, -0.2]), known=np.array([True, True, True, False]))
  drops = specificity.relative_drops(ranking, baseline=-2.0)  # |baseline|: a log-probability is negative
  np.testing.assert_allclose(drops[:3], [0.25, 0.0, -0.05])
  assert np.isnan(drops[3])
  np.testing.assert_array_equal(specificity.relative_drops(ranking, 0.0), [0, 0, 0, np.nan])  # nothing to lose


def test_a_head_breaks_tasks_when_enough_of_them_drop_by_the_threshold():
  drops = np.array([[0.9, 0.4, 0.0], [0.9, 0.1, 0.0], [0.2, np.nan, 0.5], [0.3, 0.3, np.nan]])
  np.testing.assert_array_equal(specificity.breaks(drops, 0.3, 2), [True, False, False, True])
  np.testing.assert_array_equal(specificity.breaks(drops, 0.3, 1), [True, True, True, True])


def test_a_drop_equal_to_a_bound_meets_it():
  exact = (50 / 60 - 45 / 60) / (50 / 60)  # 5 of 50 correct documents lost: 0.10000000000000003
  assert exact > 0.1
  np.testing.assert_array_equal(specificity.within(np.array([exact, 0.1001, np.nan]), 0.1), [True, False, True])
  assert specificity.breaks(np.array([[0.1 + 0.2, 0.3]]), 0.3, 2)[0]  # 0.30000000000000004 and 0.3
  assert not specificity.breaks(np.array([[0.2999, 0.3]]), 0.3, 2)[0]
  effects = specificity.Effects(["t", "g"], np.array([[0.9, 0.8], [exact, 0.11]]))
  assert selection.Specific(0.1).select([0, 1], effects, np.zeros(2, bool), [], 2) == [0]


def test_specific_selection_skips_heads_that_hurt_or_were_never_measured_on_a_general_task():
  effects = specificity.Effects(["t", "g1", "g2"], np.array([
      [0.9, 0.8, 0.5, 0.4, 0.3],
      [0.5, 0.0, 0.05, np.nan, 0.0],
      [0.0, 0.0, 0.2, 0.0, 0.0]]))
  order, excluded = [0, 1, 2, 3, 4], np.zeros(5, bool)
  assert selection.Specific(0.1).select(order, effects, excluded, [], 5) == [1, 4]
  assert selection.RAW.select(order, effects, excluded, [0], 3) == [1, 2, 3]
  excluded[1] = True
  assert selection.Specific(0.3).select(order, effects, excluded, [], 5) == [2, 4]
  assert specificity.universal_candidates(effects, order, np.zeros(5, bool), 0.3, 2, 10) == [0]


@pytest.mark.parametrize("method,options", [("cs_stratified", dict(ablation_rate=0.25, lasso_alpha="0.001")),
                                            ("one_shot_greedy", {}), ("greedy", {})])
def test_every_method_estimates_each_task_from_the_same_masks(method, options):
  """The target's top head is shared with the general task: the estimates flag it as universal and the
  specific selection puts the target-only head first."""
  plan, measured, ranking = run(method, {"accuracy": target}, L, H, num_masks=120, top_k=2, **options)
  on_general = Measured(measured.masks, {"accuracy": general(measured.flat())}, {"accuracy": 1.0}, "accuracy")
  effects = specificity.Effects(["target", "general"], np.stack([
      specificity.relative_drops(ranking, 1.0),
      specificity.relative_drops(specificity.estimate(plan, on_general), 1.0)]))
  order = [int(h) for h in ranking.order]
  assert order[0] == SHARED
  assert specificity.universal_candidates(effects, order, np.zeros(N, bool), 0.3, 2, 5) == [SHARED]
  assert selection.Specific(0.1).select(order, effects, np.zeros(N, bool), [], 1) == [SPECIFIC]
  assert selection.RAW.select(order, effects, np.zeros(N, bool), [], 1) == [SHARED]


def test_a_general_task_that_never_moves_has_no_effect_anywhere():
  plan, measured, _ = run("cs_stratified", {"accuracy": target}, L, H, num_masks=40, lasso_alpha="0.001")
  flat = Measured(measured.masks, {"accuracy": np.ones(len(measured))}, {"accuracy": 1.0}, "accuracy")
  np.testing.assert_array_equal(specificity.estimate(plan, flat).values, np.zeros(N))


def _with_docs(measured: Measured, per_doc) -> Measured:
  """The measurements with per-document values: per_doc(flat masks) -> [M, docs] (the mean is the score)."""
  docs = per_doc(measured.flat())
  base = per_doc(np.zeros((1, N), bool))[0]
  return Measured(measured.masks, {"accuracy": docs.mean(axis=1)}, {"accuracy": float(base.mean())}, "accuracy",
                  {"accuracy": docs}, {"accuracy": base})


def test_bootstrap_is_sure_of_a_head_every_document_needs_and_unsure_of_one_a_few_need():
  rng = np.random.default_rng(0)
  needs_weak = rng.random(40) < 0.15  # WEAK matters to 6 of 40 documents; SPECIFIC to all

  def per_doc(flat):
    return (1.0 - 0.8 * flat[:, [SPECIFIC]] - 1.0 * flat[:, [WEAK]] * needs_weak[None]
            - 0.15 * flat[:, [2]] * ~needs_weak[None]).clip(0, 1)

  s = settings("one_shot_greedy", top_k=1)
  plan = methods.get("one_shot_greedy").plan(s, context(L, H))
  measured = _with_docs(drive(plan, {"accuracy": lambda f: per_doc(f).mean(axis=1)}, L, H), per_doc)

  def select(rankings):
    return [int(h) for h in rankings[0].order][:1]

  conf = confidence.bootstrap([plan], [measured], select, top_k=1, resamples=200, seed=0)
  assert conf.resampled == "documents"  # single-head ablations are not draws of a design: only documents
  assert conf.selection_frequency[SPECIFIC] == 1.0
  assert conf.high[SPECIFIC] < -0.5  # the interval of its measured change stays far from 0
  assert conf.low[WEAK] < conf.high[WEAK] and conf.low[2] < conf.high[2]
  assert conf.selection_frequency.sum() == pytest.approx(1.0)


def test_bootstrap_resamples_the_masks_of_a_random_design_and_needs_something_to_resample():
  s = settings("cs_stratified", num_masks=60, lasso_alpha="0.001", ablation_rate=0.25)
  plan = methods.get("cs_stratified").plan(s, context(L, H))
  measured = drive(plan, {"accuracy": target}, L, H)

  def select(rankings):
    return [int(h) for h in rankings[0].order][:2]

  conf = confidence.bootstrap([plan], [measured], select, top_k=2, resamples=30, seed=0)
  assert conf.resampled == "masks"  # no per-document values kept
  assert conf.selection_frequency[SHARED] == conf.selection_frequency[SPECIFIC] == 1.0
  assert conf.low[SHARED] <= -0.45 <= conf.high[SHARED] + 0.05
  one_shot = methods.get("one_shot_greedy").plan(settings("one_shot_greedy"), context(L, H))
  assert confidence.bootstrap([one_shot], [drive(one_shot, {"accuracy": target}, L, H)], select, 2, 10, 0) is None
