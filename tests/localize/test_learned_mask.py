"""learned_mask: hard-concrete gates trained on a planted relaxed objective find the heads that break the target
and spare the general task, end with hard 0/1 gates, and a training killed midway resumes to the same gates."""

import numpy as np
import pytest

from jaxloc.localize.methods import learned_mask
from tests.localize import helpers

L, H = 4, 6
N = L * H
TARGET = np.zeros(N)
TARGET[[17, 5, 11]] = [3.0, 2.5, 2.0]  # nats each planted head costs the target when fully ablated
GENERAL = np.zeros(N)
GENERAL[[5, 20]] = [3.0, 1.0]  # head 5 breaks the general task too; head 20 only the general task


def train(directory=None, objective=None, **overrides):
  settings = helpers.settings("learned_mask", **{"num_masks": 4, "mask_steps": 60, **overrides})
  settings.check()
  objective = objective or helpers.PlantedObjective(np.stack([TARGET, GENERAL]))
  ctx = helpers.context(L, H, directory=directory, objective=objective)
  return learned_mask.train(settings, ctx, progress=False), ctx


def ablated_sets(log_alpha):
  gates = np.asarray(learned_mask.deterministic_ablation(log_alpha))
  return gates, [set(np.flatnonzero(row > 0.5).tolist()) for row in gates]


def test_the_specific_planted_heads_are_learned_and_the_gates_end_hard():
  trained, ctx = train()
  gates, sets = ablated_sets(trained["log_alpha"])
  assert np.all((gates == 0) | (gates == 1))  # every gate of every configuration is hard
  assert all(s == {17, 11} for s in sets), sets  # head 5 would break the general task
  assert set(learned_mask.screen_order(trained["log_alpha"], ctx.excluded)[:2].tolist()) == {17, 11}
  # The loss went down: the target loses its probability, the general task keeps it.
  assert trained["losses"][-1].max() < trained["losses"][0].min() - 0.5


def test_without_the_general_penalty_the_shared_head_is_ablated_too():
  trained, _ = train(mask_general_weight=0.0)
  _, sets = ablated_sets(trained["log_alpha"])
  assert all(5 in s for s in sets), sets


def test_a_strong_l0_penalty_keeps_fewer_heads():
  weak, _ = train(mask_l0=[0.001], mask_general_weight=0.0)
  strong, _ = train(mask_l0=[0.3], mask_general_weight=0.0)
  assert len(ablated_sets(strong["log_alpha"])[1][0]) < len(ablated_sets(weak["log_alpha"])[1][0])


def test_excluded_heads_are_never_ablated():
  settings = helpers.settings("learned_mask", num_masks=4, mask_steps=30)
  ctx = helpers.context(L, H, excluded=[17], objective=helpers.PlantedObjective(TARGET[None]))
  trained = learned_mask.train(settings, ctx, progress=False)
  assert 17 not in ablated_sets(trained["log_alpha"])[1][0]
  assert learned_mask.screen_order(trained["log_alpha"], ctx.excluded)[-1] == 17


def test_a_training_killed_midway_resumes_to_the_same_gates(tmp_path):
  full, _ = train(str(tmp_path / "full"))
  killed = helpers.PlantedObjective(np.stack([TARGET, GENERAL]), fail_at=23)
  with pytest.raises(KeyboardInterrupt):
    train(str(tmp_path / "resumed"), killed)
  saved = np.load(tmp_path / "resumed" / learned_mask.STATE_FILE)
  assert int(saved["step"]) == 20  # the last checkpoint before the kill
  again = helpers.PlantedObjective(np.stack([TARGET, GENERAL]))
  resumed, _ = train(str(tmp_path / "resumed"), again)
  assert again.calls == 60 - 20
  np.testing.assert_array_equal(resumed["log_alpha"], full["log_alpha"])
  np.testing.assert_array_equal(resumed["losses"], full["losses"])


def test_a_plan_confirms_the_learned_candidates_alone_and_keeps_its_gates_for_a_resume(tmp_path):
  from jaxloc.localize import methods

  settings = helpers.settings("learned_mask", num_masks=3, mask_steps=60)
  objective = helpers.PlantedObjective(np.stack([TARGET, GENERAL]))
  plan = methods.get("learned_mask").plan(settings, helpers.context(L, H, directory=str(tmp_path), objective=objective))
  masks = plan.next_masks(helpers.drive(plan, {"accuracy": lambda f: 1 - f @ TARGET / 10}, L, H, stop_after=0))
  assert masks.sum(axis=(1, 2)).tolist() == [1, 1, 1]  # single heads
  assert {17, 11} <= set(np.flatnonzero(masks.reshape(3, -1).any(axis=0)).tolist())
  calls = objective.calls
  methods.get("learned_mask").plan(settings, helpers.context(L, H, directory=str(tmp_path), objective=objective))
  assert objective.calls == calls  # the gates are read back, not retrained
