"""two_stage: screen heads by compressed sensing, confirm the Lasso's top candidates by single-head ablation.

Unit tests of its plan and ranking, and a localization run on a tiny random Llama (resume included).
"""

import json
import os

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.localize import methods
from jaxloc.localize.methods.two_stage import screen_size
from tests.localize import helpers

EFFECTS = np.array([0.0, -0.1, -0.05, -0.5, 0.0, -0.3])


def _fns():
  return {"accuracy": lambda flat: 0.9 + flat @ EFFECTS, "logprob": lambda flat: -1.0 + 2 * flat @ EFFECTS}


def _plan(num_masks=12, excluded=(), **options):
  settings = helpers.settings("two_stage", num_masks=num_masks, ablation_rate=0.34, **options)
  settings.check()
  return methods.get("two_stage").plan(settings, helpers.context(2, 3, excluded=excluded))


def test_screen_masks_come_first_then_the_screen_top_heads_one_at_a_time():
  plan = _plan(excluded=[1])
  assert len(plan.screen) == 6 and plan.expected_total() == 6 + 5  # 5 active heads to confirm at most
  assert not plan.screen[:, 0, 1].any()  # excluded heads are never ablated
  part = helpers.drive(plan, _fns(), 2, 3, stop_after=2)
  np.testing.assert_array_equal(plan.next_masks(part), plan.screen[2:])  # a resumed screen gets the rest
  screen = helpers.drive(plan, _fns(), 2, 3, stop_after=6)
  confirm = plan.next_masks(screen)
  heads = confirm.reshape(len(confirm), 6).argmax(axis=1).tolist()
  assert heads[:2] == [3, 5] and 1 not in heads and np.all(confirm.sum(axis=(1, 2)) == 1)
  assert plan.next_masks(helpers.drive(plan, _fns(), 2, 3)) is None


def test_ranking_is_confirmed_change_then_screen_order():
  plan = _plan(num_masks=9, screen_fraction=0.67)
  measured = helpers.drive(plan, _fns(), 2, 3)
  confirmed = measured.flat()[len(plan.screen):].argmax(axis=1).tolist()
  ranking = plan.rank(measured)
  screen_order = plan.screen_order(measured).tolist()
  assert ranking.order[:3].tolist() == sorted(confirmed, key=lambda h: (EFFECTS[h], screen_order.index(h)))
  assert ranking.order[3:].tolist() == [h for h in screen_order if h not in confirmed]
  np.testing.assert_allclose(ranking.values[confirmed], EFFECTS[confirmed])
  unconfirmed = [h for h in range(6) if h not in confirmed]
  assert ranking.values[unconfirmed].tolist() == [0.0] * len(unconfirmed)
  assert ranking.facts["screen_masks"] == 6 and ranking.facts["confirmed_heads"] == 3


def test_budgets_too_small_for_a_screen_and_a_confirmation_are_refused():
  with pytest.raises(UserError, match="≥ 3"):
    _plan(num_masks=2)
  assert screen_size(3, 0.9) == 2 and screen_size(100, 0.3) == 30


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_localize_with_two_stage_on_a_tiny_model(tokenizer, tmp_path):
  from jaxloc.engine.config import EngineConfig
  from jaxloc.engine.engine import Engine
  from jaxloc.localize.localization import LocalizeSettings, localize
  from tests.tiny import make_tiny

  engine = Engine(make_tiny(tokenizer), EngineConfig(tokens_per_batch=256))
  out = str(tmp_path / "run")
  settings = dict(model="tiny", task="counting", output_dir=out, method="two_stage", num_masks=10,
                  ablation_rate=0.2, num_samples=6, metric="logprob", validate=False, selection="raw")
  heads = localize(engine, LocalizeSettings.make(**settings), progress=False)
  assert heads["num_evaluations"] == 10 and heads["method"] == "two_stage"  # raw: nothing to confirm
  assert heads["solver"]["screen_masks"] == 5 and heads["solver"]["confirmed_heads"] == 5
  assert "lasso_alpha" in heads["solver"]["screen_solver"]
  with np.load(os.path.join(out, "measurements.npz")) as data:
    masks = data["masks"]
  n = heads["num_layers"] * heads["num_heads"]
  assert masks[:5].sum(axis=(1, 2)).tolist() == [round(0.2 * n)] * 5  # 20% of the heads per screen mask
  assert masks[5:].sum(axis=(1, 2)).tolist() == [1] * 5
  assert os.path.exists(os.path.join(out, "screen_coefficients.npy"))  # a resumed run confirms the same heads
  confirmed = masks[5:].reshape(5, -1).argmax(axis=1)
  scores = {h["name"]: h["score"] for h in heads["heads"]}
  top = [scores[h["name"]] for h in heads["heads"][:5]]
  assert top == sorted(top) and {h["name"] for h in heads["heads"][:5]} == {
      f"L{h // heads['num_heads']}H{h % heads['num_heads']}" for h in confirmed}
  # Re-running resumes: nothing is measured again and the answer is the same.
  again = localize(engine, LocalizeSettings.make(**settings), progress=False)
  assert again["timing"]["measured_this_run"] == 0 and again["top_k"] == heads["top_k"]
  with pytest.raises(UserError, match="screen_fraction"):
    localize(engine, LocalizeSettings.make(**dict(settings, screen_fraction=0.3)), progress=False)
  assert json.load(open(os.path.join(out, "heads.json")))["solver"]["confirmed_heads"] == 5
