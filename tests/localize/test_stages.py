"""A run as explicit stages (`localize.localization.Localization`) and the selection rule as an object
(`localize.selection`): the stages run one at a time, each leaving its output; the preflight refuses bad input before
any engine exists; the API returns the run it just made, equal to the run read back from disk."""

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.localize import selection, specificity
from jaxloc.localize.localization import Localization
from jaxloc.localize.settings import LocalizeSettings


def test_the_selection_rule_is_an_object_named_by_the_settings():
  specific = LocalizeSettings.make(task="counting", output_dir="x", specific_max_general_drop=0.2).selector
  assert specific == selection.Specific(0.2) and specific.confirms(1) and not specific.confirms(0)
  raw = LocalizeSettings.make(task="counting", output_dir="x", selection="raw").selector
  assert raw is selection.RAW and not raw.confirms(3) and raw.describe().startswith("raw:")
  assert "≤ 20%" in specific.describe()
  with pytest.raises(ValueError, match="unknown selection 'best'"):
    selection.of("best", 0.1)
  # Both leave out excluded and universal units; the specific rule also units above its bound or never estimated.
  effects = specificity.Effects(["target", "general"], np.array([[0.5, 0.4, 0.3, 0.2], [0.0, 0.5, np.nan, 0.1]]))
  excluded = np.array([False, False, False, True])
  assert selection.RAW.select([0, 1, 2, 3], effects, excluded, [0], 4) == [1, 2]
  assert selection.Specific(0.1).select([3, 2, 1, 0], effects, np.zeros(4, bool), [], 4) == [3, 0]


def test_the_preflight_refuses_before_any_engine(tmp_path, tiny_model):
  too_many = LocalizeSettings.make(task="counting", output_dir=str(tmp_path), top_k=10_000, num_samples=6,
                                   general_tasks=[], validate=False)
  with pytest.raises(UserError, match="--top_k=10000 is more than"):
    Localization.preflight(too_many, config=tiny_model.config)
  with pytest.raises(UserError, match="model not found|unknown model|no such|not found"):
    Localization.preflight(LocalizeSettings.make(task="counting", output_dir=str(tmp_path), model="no-such-model"))


@pytest.mark.heavy  # a whole run on the tiny model, then the API's: ~20 s on a 2-core machine
def test_stages_run_one_at_a_time_and_the_api_returns_the_run_it_made(tokenizer, tmp_path):
  import jaxloc
  from jaxloc.engine.config import EngineConfig
  from jaxloc.engine.engine import Engine
  from tests.tiny import make_tiny

  engine = Engine(make_tiny(tokenizer), EngineConfig(tokens_per_batch=256))
  options = dict(model="tiny", task="counting", num_masks=24, ablation_rate=0.2, top_k=2, num_samples=6,
                 metric="logprob", general_tasks=["plurals"], general_samples=6, validation_samples=6,
                 universal_candidates=2, curve_k=2, bootstrap=5)
  settings = LocalizeSettings.make(output_dir=str(tmp_path / "stages"), **options)
  run = Localization.preflight(settings, config=engine.model_config)
  run.measure(engine, progress=False)
  assert [len(s) for s in run.stores] == [24, 24] and run.solution is None
  run.solve()
  assert run.solution.ranking.values.shape == (engine.model_config.num_layers * engine.model_config.num_heads,)
  assert len(run.solution.general_rankings) == 1 and run.found is None
  run.confirm()
  assert len(run.found.selected) >= 2 and run.found.confirmation is not None  # specific, with a general task
  run.validate()
  assert run.ablation["heads"] == [jaxloc.units.unit_name(*divmod(h, engine.model_config.num_heads))
                                   for h in run.found.selected[:2]]
  payload = run.report()
  assert payload["top_k"] == run.ablation["heads"] and "confirm_seconds" in payload["timing"]

  made = jaxloc.run_localization(engine, settings=LocalizeSettings.make(output_dir=str(tmp_path / "api"), **options),
                                 progress=False)
  again = jaxloc.read_run(made.directory)
  assert made.info == again.info and made.ablation == again.ablation and made.baseline == again.baseline
  for name in ("coefficients", "masks", "scores"):
    np.testing.assert_array_equal(getattr(made, name), getattr(again, name))
  assert made.metrics.keys() == again.metrics.keys()
  assert made.top_k == payload["top_k"]  # the same settings and engine: the same heads
