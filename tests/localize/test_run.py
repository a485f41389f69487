"""The runner end to end on a tiny random Llama: the engine compiles a small, bounded number of shapes for a
whole localization with validation, whatever the budget and top-k; settings errors come before any model."""

import pytest

from jaxloc.errors import UserError
from jaxloc.localize.localization import load_tasks, localize
from jaxloc.localize.settings import LocalizeSettings

# Per task: the ladder of mask shapes a run uses (1 for the baseline, the design's call size, and at most two
# rungs for validation: k + 1 and the single-head checks), for the prefix and the scoring function each.
MASK_SHAPES_PER_TASK = 4
FUNCTIONS = 2


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_a_whole_run_compiles_a_bounded_number_of_shapes(tokenizer, tmp_path):
  from jaxloc.engine.config import EngineConfig
  from jaxloc.engine.engine import Engine
  from tests.tiny import make_tiny

  compilations = {}
  for num_masks, top_k in [(10, 2), (37, 5), (300, 5), (64, 7)]:
    engine = Engine(make_tiny(tokenizer), EngineConfig(tokens_per_batch=256))
    settings = LocalizeSettings.make(model="tiny", task="counting", output_dir=str(tmp_path / f"{num_masks}-{top_k}"),
                                     num_masks=num_masks, ablation_rate=0.2, top_k=top_k, num_samples=6,
                                     metric="logprob", general_tasks=["plurals"], general_samples=6,
                                     universal_candidates=6)
    heads = localize(engine, settings, progress=False)
    assert heads["num_evaluations"] == num_masks + (heads["confirmation"] or {"masks": 0})["masks"] and heads["engine"]["seconds_per_mask"] > 0
    compilations[num_masks, top_k] = heads["engine"]["compilations"]
  tasks = 2
  assert 0 < max(compilations.values()) <= tasks * FUNCTIONS * MASK_SHAPES_PER_TASK, compilations
  assert compilations[37, 5] == compilations[300, 5], compilations  # more masks: no new shape


@pytest.mark.parametrize("changes,message", [
    (dict(metric="bleu"), "--metric=bleu is not a metric of counting"),
    (dict(general_tasks=["counting", "nope"]), "nope"),
    (dict(method="gradient_confirm", task="swearing", num_samples=10, validation_samples=10), "needs a scored"),
    (dict(task="swearing"), "swearing has 20 documents; identification \\(100\\) and held-out validation \\(100\\)"),
    (dict(selection="best"), "--selection=best must be one of specific, raw"),
    (dict(method="two_stage", num_masks=2), "≥ 3"),
    (dict(method="learned_mask", general_tasks=["swearing"], general_samples=10, validation_samples=10),
     "general task swearing is a generation task"),
    (dict(method="learned_mask", mask_l0=[]), "--mask_l0 must name"),
    (dict(ablation_rate=1.5), "ablation_rate"),
    (dict(lasso_alpha="x"), "lasso_alpha"),
])
def test_user_errors_are_found_before_any_model_loads(tmp_path, changes, message):
  settings = LocalizeSettings.make(**{"task": "counting", "output_dir": str(tmp_path), **changes})
  with pytest.raises(UserError, match=message):
    load_tasks(settings)


def test_the_target_or_a_repeat_in_general_tasks_is_left_out_with_a_warning(tmp_path, caplog):
  """Said before any model loads, one warning line each, naming what is left out and what is measured."""
  from tests.experiments.reliability import CAPITALS, write_task

  task = write_task(str(tmp_path / "capitals.jsonl"), CAPITALS)
  settings = LocalizeSettings.make(task=task, output_dir=str(tmp_path / "run"), num_samples=8, validate=False,
                                   general_tasks=["counting", f"{tmp_path}/./capitals.jsonl", "counting"],
                                   general_samples=4)
  with caplog.at_level("WARNING"):
    tasks = load_tasks(settings)
  assert [t.name for t in tasks.general] == ["counting"]
  assert [r.getMessage() for r in caplog.records] == [
      "--general_tasks names counting more than once: each is measured once",
      f"--general_tasks includes the target, {tmp_path}/./capitals.jsonl: it is left out of the general tasks (the "
      "target's own drop is measured anyway); the general tasks are counting"]


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_selection_universal_heads_and_confidence_follow_their_stated_rules(tokenizer, tmp_path):
  """On a tiny random model (whatever its heads do): every selected head's estimated general drops are within
  the bound, every universal head's held-out single-head drops break enough tasks, and the frequencies are
  those of a top-k selection."""
  from jaxloc.engine.config import EngineConfig
  from jaxloc.engine.engine import Engine
  from tests.tiny import make_tiny

  engine = Engine(make_tiny(tokenizer), EngineConfig(tokens_per_batch=256))
  settings = LocalizeSettings.make(model="tiny", task="counting", output_dir=str(tmp_path), method="one_shot_greedy",
                                   num_masks=12, num_samples=8, validation_samples=6, metric="logprob", top_k=3,
                                   general_tasks=["plurals", "induction"], general_samples=8, curve_k=4,
                                   universal_threshold=0.02, specific_max_general_drop=0.05, bootstrap=50)
  heads = localize(engine, settings, progress=False)
  by_name = {h["name"]: h for h in heads["heads"]}
  for name in heads["top_k"]:
    estimated = by_name[name]["estimated_relative_drop"]
    assert max(estimated["plurals"], estimated["induction"]) <= 0.05
  for name in heads["universal_heads"]:
    drops = list(by_name[name]["held_out_single_head_drop"].values())
    assert sum(d >= 0.02 for d in drops) >= 2 and name not in heads["top_k"]
  assert len(heads["top_k"]) == settings.top_k
  frequencies = [h["selection_frequency"] for h in heads["heads"]]
  assert sum(frequencies) == pytest.approx(settings.top_k)  # every resample selects top_k heads
  assert heads["confidence"]["resampled"] == "documents"
  # Each general task's power to veto (a random model gets none of them right: nothing to lose, cannot veto), and
  # every confirmation decision with its documents and verdict per task.
  for g in heads["general_tasks"].values():
    assert g["power"]["docs"] == 8 and g["power"]["alpha"] == 0.05 and g["power"]["able_to_veto"] == (g["baseline"] > 0)
  made = heads["confirmation"]["decisions"]
  assert made and all(list(d["tasks"]) == ["counting", "plurals", "induction"] for d in made)
  assert all(d["tasks"]["plurals"]["docs"] >= 8 and d["tasks"]["plurals"]["verdict"] in ("pass", "unable")
             for d in made)
  assert heads["confirmation"]["decision_rule"]["rule"] == "interval"
  import json
  import os

  ablation = json.load(open(os.path.join(str(tmp_path), "ablation.json")))
  assert ablation["held_out"]["num_docs"] == 6 and ablation["in_sample"]["num_docs"] == 8
  assert ablation["specificity_curve"]["heads"][:len(heads["top_k"])] == heads["top_k"]
  curve = ablation["raw_specificity_curve"]
  for k in curve["k"]:
    drops = [g["relative_drop"][k] for g in curve["general"].values() if g["relative_drop"][k] is not None]
    drops = [d for d in drops if d == d]  # a task the tiny model cannot do has no relative drop (NaN)
    assert curve["max_general_relative_drop"][k] == (max(drops) if drops else None)


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_a_learned_mask_run_trains_confirms_validates_and_reports_its_cost(tokenizer, tmp_path):
  """learned_mask through the runner on a tiny random model: gates trained on the target and a general task,
  candidates confirmed alone, the training time converted to mask evaluations; a re-run resumes without
  training again."""
  from jaxloc.engine.config import EngineConfig
  from jaxloc.engine.engine import Engine
  from jaxloc.localize.methods import learned_mask
  from tests.tiny import make_tiny

  engine = Engine(make_tiny(tokenizer), EngineConfig(tokens_per_batch=256))
  settings = LocalizeSettings.make(model="tiny", task="counting", output_dir=str(tmp_path), method="learned_mask",
                                   num_masks=4, mask_steps=3, mask_batch_docs=4, num_samples=8, validation_samples=6,
                                   metric="logprob", top_k=2, general_tasks=["plurals"], general_samples=6,
                                   bootstrap=10)
  heads = localize(engine, settings, progress=False)
  assert heads["num_evaluations"] == 4 + heads["confirmation"]["masks"] and heads["solver"]["configurations"] == 4
  assert heads["timing"]["training_seconds"] > 0 and heads["timing"]["training_mask_evaluations"] > 0
  assert (tmp_path / "learned_log_alpha.npy").exists() and (tmp_path / learned_mask.STATE_FILE).exists()
  again = localize(engine, settings, progress=False)
  assert "training_seconds" not in again["timing"] and again["top_k"] == heads["top_k"]
