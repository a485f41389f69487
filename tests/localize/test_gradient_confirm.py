"""gradient_confirm: screen heads by the mask gradient, confirm the top candidates by single-head ablation.

Unit tests of its plan and ranking, and a localization run on a tiny random Llama (resume included).
"""

import json
import os

import numpy as np
import pytest

from jaxloc.localize import methods
from tests.localize import helpers

CHANGE = np.array([0.0, -3.0, -1.0, -5.0, 0.5, -2.0])  # first-order change of ablating each head


def _plan(excluded=()):
  return methods.get("gradient_confirm").plan(helpers.settings("gradient_confirm", num_masks=3),
                                              helpers.context(2, 3, excluded=excluded, gradient=CHANGE))


def test_candidates_are_the_most_negative_first_order_changes_without_excluded_heads():
  plan = _plan(excluded=[3])
  assert plan.expected_total() == 3
  todo = plan.design
  assert todo.shape == (3, 2, 3) and todo.reshape(3, 6).argmax(axis=1).tolist() == [1, 5, 2]  # head 3 excluded
  assert np.all(todo.reshape(3, 6).sum(axis=1) == 1)


def test_ranking_is_confirmed_change_with_log_probability_tie_break_then_gradient_order():
  plan = _plan()  # confirms heads 3, 1, 5
  accuracy = {3: 0.7, 1: 0.5, 5: 0.5}  # heads 1 and 5 tie on accuracy ...
  logprob = {3: -0.1, 1: -0.2, 5: -0.9}  # ... and head 5 loses more log-probability
  fns = {"accuracy": lambda flat: np.where(flat.any(1), [accuracy.get(h, 0.9) for h in flat.argmax(1)], 0.9),
         "logprob": lambda flat: np.where(flat.any(1), [logprob.get(h, 0.0) for h in flat.argmax(1)], 0.0)}
  ranking = plan.rank(helpers.drive(plan, fns, 2, 3))
  assert ranking.order[:3].tolist() == [5, 1, 3]
  assert ranking.order[3:].tolist() == [2, 0, 4]  # unconfirmed, in gradient order
  np.testing.assert_allclose(ranking.values[[3, 1, 5]], [-0.2, -0.4, -0.4])
  assert ranking.values[[0, 2, 4]].tolist() == [0.0, 0.0, 0.0]


def test_one_shot_greedy_breaks_accuracy_ties_by_the_other_metric():
  scores = np.array([0.8, 0.6, 0.6, 0.9])
  fns = {"accuracy": lambda flat: np.where(flat.any(1), scores[flat.argmax(1)], 0.9),
         "logprob": lambda flat: np.where(flat.any(1), np.array([-0.1, -0.2, -0.5, 0.0])[flat.argmax(1)], 0.0)}
  _, _, ranking = helpers.run("one_shot_greedy", fns, 1, 4)
  assert ranking.order.tolist() == [2, 1, 0, 3]  # without the tie-break: 1 before 2


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_localize_with_gradient_confirm_on_a_tiny_model(tokenizer, tmp_path):
  from jaxloc.engine.config import EngineConfig
  from jaxloc.engine.engine import Engine
  from jaxloc.localize.localization import LocalizeSettings, localize
  from tests.tiny import make_tiny

  engine = Engine(make_tiny(tokenizer), EngineConfig(tokens_per_batch=256))
  out = str(tmp_path / "run")
  settings = dict(model="tiny", task="counting", output_dir=out, method="gradient_confirm", num_masks=4,
                  num_samples=6, metric="logprob", validate=False)
  heads = localize(engine, LocalizeSettings.make(**settings), progress=False)
  assert heads["num_evaluations"] == 4 + (heads["confirmation"] or {"masks": 0})["masks"] and heads["method"] == "gradient_confirm"
  gradient_change = np.load(os.path.join(out, "gradient.npy"))
  expected = np.argsort(gradient_change, kind="stable")[:4]
  names = [f"L{h // 6}H{h % 6}" for h in expected]
  scores = {h["name"]: h["score"] for h in heads["heads"]}
  # The confirmed heads are the gradient's top 4, ranked by their measured change.
  assert {h["name"] for h in heads["heads"][:4]} == set(names)
  confirmed = [scores[h["name"]] for h in heads["heads"][:4]]
  assert confirmed == sorted(confirmed) and any(c != 0 for c in confirmed)
  with np.load(os.path.join(out, "measurements.npz")) as data:
    assert data["masks"].sum(axis=(1, 2)).tolist() == [1, 1, 1, 1]
  # Re-running resumes: nothing is measured again and the answer is the same.
  again = localize(engine, LocalizeSettings.make(**settings), progress=False)
  assert again["timing"]["measured_this_run"] == 0 and again["top_k"] == heads["top_k"]
  # Another number of confirmations is a different measurement plan: refused, naming the flag.
  from jaxloc.errors import UserError

  with pytest.raises(UserError, match="num_masks"):
    localize(engine, LocalizeSettings.make(**dict(settings, num_masks=5)), progress=False)
  assert json.load(open(os.path.join(out, "heads.json")))["solver"]["measured_heads"] == 4
