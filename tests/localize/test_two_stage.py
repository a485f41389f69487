"""two_stage: screen heads by compressed sensing, confirm the Lasso's top candidates by single-head ablation.

Unit tests of its mask source and ranking, and a localization run on a tiny random Llama (resume included).
"""

import json
import os

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.localize import methods


def _source(num_masks, exclude=(), ranking=(3, 1, 5, 2, 0, 4)):
  calls = []

  def rank_screen(masks, scores):
    calls.append((masks.copy(), scores.copy()))
    return np.array(ranking), {"solver": "fake"}

  source = methods.make_source("two_stage", 2, 3, num_masks=num_masks, ablation_rate=0.34, seed=0,
                               exclude=list(exclude), rounds=5, screen_fraction=0.5, rank_screen=rank_screen)
  return source, calls


def test_screen_masks_come_first_then_the_screen_top_heads_one_at_a_time():
  source, calls = _source(6, exclude=["L0H1"])
  assert len(source.screen) == 3 and source.expected_total() == 6
  assert not source.screen[:, 0, 1].any()  # excluded heads are never ablated
  todo = source.next_masks(np.zeros((0, 2, 3), bool), np.zeros(0))
  np.testing.assert_array_equal(todo, source.screen)
  assert not calls  # nothing is solved before the screen is measured
  # A resumed run that measured part of the screen gets the rest of it.
  np.testing.assert_array_equal(source.next_masks(source.screen[:1], np.zeros(1)), source.screen[1:])
  confirm = source.next_masks(source.screen, np.array([0.5, 0.4, 0.3]))
  assert len(calls) == 1 and calls[0][1].tolist() == [0.5, 0.4, 0.3]
  assert source.screen_facts == {"solver": "fake"}
  # The screen ranks 3, 1, 5, ...; head 1 (L0H1) is excluded, so 3, 5, 2 are confirmed.
  assert source.candidates.tolist() == [3, 5, 2]
  assert confirm.reshape(3, 6).argmax(axis=1).tolist() == [3, 5, 2] and np.all(confirm.sum(axis=(1, 2)) == 1)
  measured = np.concatenate([source.screen, confirm])
  assert source.next_masks(measured[:4], np.zeros(4)).shape == (2, 2, 3)
  assert source.next_masks(measured, np.zeros(6)) is None


def test_saved_masks_that_differ_from_the_plan_are_refused():
  source, _ = _source(6)
  wrong = source.screen.copy()
  wrong[0] = ~wrong[0]
  with pytest.raises(UserError, match="settings changed"):
    source.next_masks(wrong[:2], np.zeros(2))


def test_ranking_is_confirmed_change_with_tie_break_then_screen_order():
  source, _ = _source(6)
  screen_scores = np.array([0.5, 0.4, 0.3])
  confirm = source.next_masks(source.screen, screen_scores)  # heads 3, 1, 5
  measured = np.concatenate([source.screen, confirm])
  accuracy = np.concatenate([screen_scores, [0.7, 0.5, 0.5]])  # heads 1 and 5 tie on accuracy ...
  logprob_change = np.concatenate([np.zeros(3), [-0.1, -0.2, -0.9]])  # ... and head 5 loses more
  ranking, values = methods.greedy_result(source, "two_stage", measured, accuracy, 0.9, [logprob_change])
  assert ranking[:3].tolist() == [5, 1, 3]
  assert ranking[3:].tolist() == [2, 0, 4]  # unconfirmed, in the screen's order
  np.testing.assert_allclose(values[[3, 1, 5]], [-0.2, -0.4, -0.4])
  assert values[[0, 2, 4]].tolist() == [0.0, 0.0, 0.0]


def test_budgets_too_small_for_a_screen_and_a_confirmation_are_refused():
  with pytest.raises(UserError, match="≥ 3"):
    _source(2)
  assert methods.screen_size(3, 0.9) == 2 and methods.screen_size(100, 0.3) == 30


def test_localize_with_two_stage_on_a_tiny_model(smollm2, tmp_path):
  from jaxloc.engine.engine import Engine
  from jaxloc.localize.run import SCREEN_RANKING, LocalizeSettings, localize
  from tests.engine.tiny import make_tiny

  engine = Engine(make_tiny(smollm2.tokenizer), tokens_per_batch=256)
  out = str(tmp_path / "run")
  settings = dict(model="tiny", task="counting", output_dir=out, method="two_stage", num_masks=10,
                  ablation_rate=0.2, num_samples=6, metric="logprob", validate=False)
  heads = localize(engine, LocalizeSettings(**settings), progress=False)
  assert heads["num_evaluations"] == 10 and heads["method"] == "two_stage"
  assert heads["solver"]["screen_masks"] == 5 and heads["solver"]["confirmed_heads"] == 5
  assert "lasso_alpha" in heads["solver"]["screen_solver"]
  with np.load(os.path.join(out, "measurements.npz")) as data:
    masks = data["masks"]
  n = heads["num_layers"] * heads["num_heads"]
  assert masks[:5].sum(axis=(1, 2)).tolist() == [round(0.2 * n)] * 5  # 20% of the heads per screen mask
  assert masks[5:].sum(axis=(1, 2)).tolist() == [1] * 5
  screen_ranking = np.load(os.path.join(out, SCREEN_RANKING))
  confirmed = masks[5:].reshape(5, -1).argmax(axis=1)
  assert confirmed.tolist() == screen_ranking[:5].tolist()
  scores = {h["name"]: h["score"] for h in heads["heads"]}
  top = [scores[h["name"]] for h in heads["heads"][:5]]
  assert top == sorted(top) and {h["name"] for h in heads["heads"][:5]} == {
      f"L{h // heads['num_heads']}H{h % heads['num_heads']}" for h in confirmed}
  # Re-running resumes: nothing is measured again and the answer is the same.
  again = localize(engine, LocalizeSettings(**settings), progress=False)
  assert again["timing"]["measured_this_run"] == 0 and again["top_k"] == heads["top_k"]
  with pytest.raises(UserError, match="screen_fraction"):
    localize(engine, LocalizeSettings(**dict(settings, screen_fraction=0.3)), progress=False)
  assert json.load(open(os.path.join(out, "heads.json")))["solver"]["confirmed_heads"] == 5
