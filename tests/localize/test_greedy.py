"""Iterative greedy: each round ablates every remaining head on top of the heads already chosen and keeps
the worst; its masks are recomputed from the saved scores, so it resumes like every other method."""

import numpy as np
import pytest

from jaxloc.localize import methods


def _run(source, score_fn, tie_fn=None):
  """Drives a mask source to the end with a scoring function of the flat masks."""
  measured = np.zeros((0,) + (source.num_layers, source.num_heads), bool)
  scores, ties = np.zeros(0), np.zeros(0)
  while (todo := source.next_masks(measured, scores, [ties] if tie_fn else ())) is not None:
    flat = todo.reshape(len(todo), -1)
    measured = np.concatenate([measured, todo])
    scores = np.concatenate([scores, score_fn(flat)])
    if tie_fn:
      ties = np.concatenate([ties, tie_fn(flat)])
  return measured, scores, ties


def test_rounds_choose_the_worst_head_given_the_heads_already_chosen():
  # Head 2 matters only once head 1 is gone: ablated alone it costs nothing, so one-shot greedy misses it.
  def score(flat):
    return 1.0 - 0.5 * flat[:, 1] - 0.3 * (flat[:, 1] & flat[:, 2]) - 0.2 * flat[:, 3]

  source = methods.make_source("greedy", 2, 3, num_masks=0, ablation_rate=0.1, seed=0, exclude=["L0H0"], rounds=3)
  assert source.expected_total() == 5 + 4 + 3  # head 0 is excluded
  measured, scores, _ = _run(source, score)
  assert len(measured) == 12 and not measured[:, 0, 0].any()
  chosen, rounds, todo = source.replay(measured, scores)
  assert todo is None and chosen == [1, 2, 3]
  # Every later round's masks keep the chosen heads ablated.
  assert measured[5:].reshape(7, -1)[:, 1].all() and measured[9:].reshape(3, -1)[:, 2].all()
  ranking, change = methods.greedy_result(source, "greedy", measured, scores, 1.0)
  assert ranking[:3].tolist() == [1, 2, 3]
  assert change[1] == pytest.approx(-0.5) and change[2] == pytest.approx(-0.3)  # marginal when chosen


def test_a_resumed_run_asks_only_for_the_rest_of_its_round():
  def score(flat):
    return 1.0 - flat @ np.array([0.0, 0.5, 0.1, 0.3, 0.2, 0.05])

  source = methods.make_source("greedy", 2, 3, num_masks=0, ablation_rate=0.1, seed=0, exclude=[], rounds=2)
  measured, scores, _ = _run(source, score)
  assert source.replay(measured, scores)[0] == [1, 3]
  rest = source.next_masks(measured[:8], scores[:8])
  np.testing.assert_array_equal(rest, measured[8:])


def test_ties_at_the_floor_go_to_the_tie_break_metric_not_to_the_lowest_index():
  # Ablating head 3 takes accuracy to 0; afterwards every head scores 0, but log-probability still differs.
  def accuracy(flat):
    return np.where(flat[:, 3], 0.0, 1.0 - 0.1 * flat[:, 0])

  def logprob(flat):
    return -(flat @ np.array([0.1, 0.2, 0.9, 2.0, 0.3, 0.4]))

  source = methods.make_source("greedy", 2, 3, num_masks=0, ablation_rate=0.1, seed=0, exclude=[], rounds=2)
  measured, scores, ties = _run(source, accuracy, logprob)
  assert source.replay(measured, scores, [ties])[0] == [3, 2]
  assert source.replay(measured, scores)[0] == [3, 0]  # without the tie-break: the lowest index


def test_localize_with_iterative_greedy_on_a_tiny_model(smollm2, tmp_path):
  from jaxloc.engine.engine import Engine
  from jaxloc.localize.run import LocalizeSettings, localize
  from tests.engine.tiny import make_tiny

  engine = Engine(make_tiny(smollm2.tokenizer), tokens_per_batch=256)
  settings = dict(model="tiny", task="counting", output_dir=str(tmp_path / "run"), method="greedy", top_k=2,
                  num_samples=6, metric="logprob", validate=False)
  heads = localize(engine, LocalizeSettings(**settings), progress=False)
  n = heads["num_layers"] * heads["num_heads"]
  assert heads["num_evaluations"] == n + (n - 1)
  again = localize(engine, LocalizeSettings(**settings), progress=False)
  assert again["timing"]["measured_this_run"] == 0 and again["top_k"] == heads["top_k"]
