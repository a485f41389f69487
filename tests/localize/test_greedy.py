"""Iterative greedy: each round ablates every remaining head on top of the heads already chosen and keeps
the worst; its masks are recomputed from the saved scores, so it resumes like every other method."""

import numpy as np
import pytest

from jaxloc.localize import methods
from tests.localize import helpers


def _run(score, logprob=None, **options):
  fns = {"accuracy": score, "logprob": logprob or (lambda flat: np.zeros(len(flat)))}
  return helpers.run("greedy", fns, 2, 3, **options)


def test_rounds_choose_the_worst_head_given_the_heads_already_chosen():
  # Head 2 matters only once head 1 is gone: ablated alone it costs nothing, so one-shot greedy misses it.
  def score(flat):
    return 1.0 - 0.5 * flat[:, 1] - 0.3 * (flat[:, 1] & flat[:, 2]) - 0.2 * flat[:, 3]

  ctx = helpers.context(2, 3, excluded=[0])
  plan = methods.get("greedy").plan(helpers.settings("greedy", top_k=3), ctx)
  assert plan.expected_total() == 5 + 4 + 3  # head 0 is excluded
  measured = helpers.drive(plan, {"accuracy": score, "logprob": lambda flat: np.zeros(len(flat))}, 2, 3)
  assert len(measured) == 12 and not measured.masks[:, 0, 0].any()
  chosen, _, todo = plan.replay(measured)
  assert todo is None and chosen == [1, 2, 3]
  # Every later round's masks keep the chosen heads ablated.
  assert measured.masks[5:].reshape(7, -1)[:, 1].all() and measured.masks[9:].reshape(3, -1)[:, 2].all()
  ranking = plan.rank(measured)
  assert ranking.order[:3].tolist() == [1, 2, 3]
  assert ranking.values[1] == pytest.approx(-0.5) and ranking.values[2] == pytest.approx(-0.3)  # when chosen


def test_a_resumed_run_asks_only_for_the_rest_of_its_round():
  def score(flat):
    return 1.0 - flat @ np.array([0.0, 0.5, 0.1, 0.3, 0.2, 0.05])

  plan, measured, ranking = _run(score, top_k=2)
  assert ranking.order[:2].tolist() == [1, 3]
  np.testing.assert_array_equal(plan.next_masks(measured.rows(slice(0, 8))), measured.masks[8:])


def test_ties_at_the_floor_go_to_the_tie_break_metric_not_to_the_lowest_index():
  # Ablating head 3 takes accuracy to 0; afterwards every head scores 0, but log-probability still differs.
  def accuracy(flat):
    return np.where(flat[:, 3], 0.0, 1.0 - 0.1 * flat[:, 0])

  def logprob(flat):
    return -(flat @ np.array([0.1, 0.2, 0.9, 2.0, 0.3, 0.4]))

  _, _, ranking = _run(accuracy, logprob, top_k=2)
  assert ranking.order[:2].tolist() == [3, 2]  # the lowest index would have been 0


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_localize_with_iterative_greedy_on_a_tiny_model(tokenizer, tmp_path):
  from jaxloc.engine.config import EngineConfig
  from jaxloc.engine.engine import Engine
  from jaxloc.localize.localization import LocalizeSettings, localize
  from tests.tiny import make_tiny

  engine = Engine(make_tiny(tokenizer), EngineConfig(tokens_per_batch=256))
  settings = dict(model="tiny", task="counting", output_dir=str(tmp_path / "run"), method="greedy", top_k=2,
                  num_samples=6, metric="logprob", validate=False)
  heads = localize(engine, LocalizeSettings.make(**settings), progress=False)
  n = heads["num_layers"] * heads["num_heads"]
  assert heads["num_evaluations"] == n + (n - 1) + (heads["confirmation"] or {"masks": 0})["masks"]
  again = localize(engine, LocalizeSettings.make(**settings), progress=False)
  assert again["timing"]["measured_this_run"] == 0 and again["top_k"] == heads["top_k"]
