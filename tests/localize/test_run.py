"""The runner end to end on a tiny random Llama: the engine compiles a small, bounded number of shapes for a
whole localization with validation, whatever the budget and top-k; settings errors come before any model."""

import pytest

from jaxloc.errors import UserError
from jaxloc.localize.run import load_tasks, localize
from jaxloc.localize.settings import LocalizeSettings

# Per task: the ladder of mask shapes a run uses (1 for the baseline, the design's call size, and at most two
# rungs for validation: k + 1 and the single-head checks), for the prefix and the scoring function each.
MASK_SHAPES_PER_TASK = 4
FUNCTIONS = 2


def test_a_whole_run_compiles_a_bounded_number_of_shapes(smollm2, tmp_path):
  from jaxloc.engine.engine import Engine
  from tests.engine.tiny import make_tiny

  compilations = {}
  for num_masks, top_k in [(10, 2), (37, 5), (300, 5), (64, 7)]:
    engine = Engine(make_tiny(smollm2.tokenizer), tokens_per_batch=256)
    settings = LocalizeSettings(model="tiny", task="counting", output_dir=str(tmp_path / f"{num_masks}-{top_k}"),
                                num_masks=num_masks, ablation_rate=0.2, top_k=top_k, num_samples=6,
                                metric="logprob", general_tasks=["plurals"], general_samples=6,
                                universal_candidates=6)
    heads = localize(engine, settings, progress=False)
    assert heads["num_evaluations"] == num_masks and heads["engine"]["seconds_per_mask"] > 0
    compilations[num_masks, top_k] = heads["engine"]["compilations"]
  tasks = 2
  assert 0 < max(compilations.values()) <= tasks * FUNCTIONS * MASK_SHAPES_PER_TASK, compilations
  assert compilations[37, 5] == compilations[300, 5], compilations  # more masks: no new shape


@pytest.mark.parametrize("changes,message", [
    (dict(metric="bleu"), "--metric=bleu is not a metric of counting"),
    (dict(general_tasks=["counting", "nope"]), "nope"),
    (dict(method="gradient_confirm", task="swearing"), "needs a scored"),
    (dict(method="two_stage", num_masks=2), "≥ 3"),
    (dict(ablation_rate=1.5), "ablation_rate"),
    (dict(lasso_alpha="x"), "lasso_alpha"),
])
def test_user_errors_are_found_before_any_model_loads(tmp_path, changes, message):
  settings = LocalizeSettings(**{"task": "counting", "output_dir": str(tmp_path), **changes})
  with pytest.raises(UserError, match=message):
    load_tasks(settings)
