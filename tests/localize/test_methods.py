"""The method protocol and registry: every registered method is planned, measured, resumed and ranked
through the same face; the ranking rule for zero coefficients and exact ties uses measured evidence."""

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.localize import methods
from jaxloc.localize.methods.base import marginal_effects, rank_by
from tests.localize import helpers

L, H = 3, 4
N = L * H
EFFECTS = np.zeros(N)
EFFECTS[[9, 6, 10]] = [-0.4, -0.25, -0.15]  # planted heads, at high flat indices on purpose


def metrics():
  def accuracy(flat):
    return np.clip(0.9 + flat @ EFFECTS, 0, 1)

  def logprob(flat):
    return -1.0 + 2 * (flat @ EFFECTS) - 0.01 * flat @ np.arange(N)

  return {"accuracy": accuracy, "logprob": logprob}


# Every registered method, each run with its own `example_options` (a new method file brings its own: no table here).
NAMES = sorted(methods.names())


def attribution(docs=10, seed=0):
  """Per-document attributions [docs, N] planted like EFFECTS: unit 9 high in every document, 6 in 80%, 10 in 60%."""
  scores = np.random.default_rng(seed).random((docs, N)) * 0.05
  scores[:, 9] = 1.0
  scores[:int(0.8 * docs), 6] = 0.8
  scores[:int(0.6 * docs), 10] = 0.5
  return scores


def options(name):
  return dict(methods.get(name).example_options)


def test_every_method_module_is_discovered():
  """Each module of the package but `base` holds methods, and each of them is registered."""
  import pkgutil

  modules = {m.name for m in pkgutil.iter_modules(methods.__path__)} - {"base"}
  assert {type(methods.get(name)).__module__.rsplit(".", 1)[1] for name in NAMES} == modules
  assert {"cs_stratified", "two_stage", "learned_mask", "cnl"} <= set(NAMES)


def test_no_two_methods_flags_clash_and_today_flag_names_are_kept():
  """A flag belongs to one method, or to methods sharing one settings dataclass (the same field), and none is a
  run-wide setting's; the derived prefix (name + "_") and the kept ones give today's flag names."""
  from jaxloc.localize.settings import LocalizeSettings

  run_wide = set(LocalizeSettings.flag_fields()) - set(methods.flag_fields())
  seen = {}
  for name in NAMES:
    for flag, field in methods.get(name).flag_fields().items():
      assert flag not in run_wide, f"{name}'s --{flag} is a run-wide setting"
      assert seen.setdefault(flag, field) is field, f"--{flag} of {name} clashes with another method's"
  assert {methods.get(n).flag_prefix for n in ("cnl", "learned_mask", "two_stage", "cs_stratified")} == {
      "cnl_", "mask_", "screen_", ""}
  assert {"cnl_steps", "mask_steps", "mask_l0", "screen_fraction", "ablation_rate", "lasso_alpha"} <= set(seen)


@pytest.mark.parametrize("name", NAMES)
def test_each_method_measures_resumes_and_ranks_through_the_protocol(name):
  method = methods.get(name)
  settings = helpers.settings(name, **options(name))
  settings.check()
  assert isinstance(method.measurement_settings(settings), dict)
  gradient = -EFFECTS + 0.001 * np.arange(N)  # -d score / d keep: a first-order view of the planted effects
  objective = helpers.PlantedObjective(-EFFECTS[None] * 10)  # the planted heads cost 4, 2.5, 1.5 nats
  ctx = helpers.context(L, H, excluded=[0], gradient=-gradient, objective=objective, attribution=attribution())
  plan = method.plan(settings, ctx)
  full = helpers.drive(plan, metrics(), L, H)
  assert len(full) == plan.expected_total() and not full.masks[:, 0, 0].any()  # excluded head never ablated
  ranking = plan.rank(full)
  assert sorted(ranking.order.tolist()) == list(range(N)) and ranking.values.shape == (N,)
  assert ranking.order[0] == 9  # the strongest planted head first
  # A new plan over part of the measurements asks for exactly the rest, and ranks the same in the end.
  resumed_plan = method.plan(settings, helpers.context(L, H, excluded=[0], gradient=-gradient, objective=objective,
                                                       attribution=attribution()))
  part = helpers.drive(resumed_plan, metrics(), L, H, stop_after=len(full) // 2)
  again = helpers.drive(resumed_plan, metrics(), L, H, measured=part)
  np.testing.assert_array_equal(again.masks, full.masks)
  assert resumed_plan.rank(again).order.tolist() == ranking.order.tolist()


@pytest.mark.parametrize("name", NAMES)
def test_saved_masks_from_other_settings_are_refused(name):
  settings = helpers.settings(name, **options(name))
  plan = methods.get(name).plan(settings, helpers.context(L, H, gradient=-EFFECTS,
                                                          objective=helpers.PlantedObjective(-EFFECTS[None])))
  first = plan.next_masks(helpers.drive(plan, metrics(), L, H, stop_after=0))
  if first is None:  # a method that measures no masks (cnl) refuses any
    first = np.zeros((1, L, H), bool)
  wrong = helpers.drive(plan, metrics(), L, H, stop_after=0)
  wrong.masks = ~first[:1]
  wrong.metrics = {k: np.zeros(1) for k in wrong.metrics}
  with pytest.raises(UserError, match="settings changed"):
    plan.next_masks(wrong)


def test_unknown_method_and_bad_options_are_user_errors():
  with pytest.raises(UserError, match="unknown method 'lasso'.*cs_stratified"):
    methods.get("lasso")
  for name, bad, match in [("cs_stratified", dict(num_masks=1), "num_masks"),
                           ("two_stage", dict(num_masks=2), "num_masks"),
                           ("two_stage", dict(screen_fraction=1.0), "screen_fraction"),
                           ("cs_bernoulli", dict(ablation_rate=1.0), "ablation_rate"),
                           ("greedy", dict(top_k=0), "top_k")]:
    with pytest.raises(UserError, match=match):
      helpers.settings(name, **bad).check()


def test_rank_by_breaks_exact_ties_with_the_next_key():
  assert rank_by(np.array([0.0, -1.0, 0.0, -1.0]), np.array([0.3, 0.2, -0.5, -0.1])).tolist() == [3, 1, 2, 0]


def test_heads_the_lasso_leaves_at_zero_are_ordered_by_their_marginal_effect_not_their_index():
  # A fixed large alpha zeroes every coefficient but the strongest: the rest must follow their measured
  # marginal effects (heads 6 and 10 next), not flat order (0, 1, 2, ...).
  _, measured, ranking = helpers.run("cs_stratified", metrics(), L, H, num_masks=40, ablation_rate=0.25,
                                     lasso_alpha="0.5")
  assert np.count_nonzero(ranking.values) <= 2 and ranking.order[0] == 9
  assert set(ranking.order[1:3].tolist()) == {6, 10}
  flat = measured.flat()
  expected = rank_by(ranking.values, marginal_effects(flat, measured.metrics["accuracy"]),
                     marginal_effects(flat, measured.metrics["logprob"]))
  assert ranking.order.tolist() == expected.tolist()
  zero = [h for h in ranking.order if ranking.values[h] == 0]
  assert zero != sorted(zero)  # not flat order


def test_two_stage_never_fills_its_confirmations_with_unranked_heads():
  # The screen's Lasso keeps at most one head (large alpha), yet 4 confirmation slots remain: they go to the
  # heads with the most negative marginal effect in the screen, i.e. the planted heads, not L0H0, L0H1, ...
  plan, measured, ranking = helpers.run("two_stage", metrics(), L, H, num_masks=16, screen_fraction=0.75,
                                        ablation_rate=0.25, lasso_alpha="0.5")
  screen = measured.rows(slice(0, len(plan.screen)))
  candidates = plan.candidates(measured).tolist()
  assert len(candidates) == 4 and {9, 6, 10} <= set(candidates)
  marginal = marginal_effects(screen.flat(), screen.scores)
  coefficients = plan.context.remember("screen_coefficients", None)
  assert np.count_nonzero(coefficients) <= 1
  assert candidates == rank_by(coefficients, marginal,
                               marginal_effects(screen.flat(), screen.metrics["logprob"]))[:4].tolist()
  assert ranking.order[:3].tolist() == [9, 6, 10]


def test_one_shot_greedy_on_a_budget_ablates_a_seeded_subset_and_ranks_it_first():
  plan, measured, ranking = helpers.run("one_shot_greedy", metrics(), L, H, num_masks=5, seed=3)
  heads = measured.flat().argmax(axis=1)
  assert len(heads) == 5 and len(set(heads.tolist())) == 5
  assert set(ranking.order[:5].tolist()) == set(heads.tolist())
  again = helpers.run("one_shot_greedy", metrics(), L, H, num_masks=5, seed=3)[1]
  np.testing.assert_array_equal(again.masks, measured.masks)
