"""A design-based run reports what its design can tell apart (heads.json "design", the printed summary), and a run
of single-head measurements reports no design."""

from jaxloc.localize.localization import localize
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.report.summary import summary_table


def _run(tiny_model, tmp_path, **changes):
  from jaxloc.engine.engine import Engine

  settings = LocalizeSettings.make(**{"model": "tiny", "task": "counting", "output_dir": str(tmp_path),
                                      "num_samples": 6, "metric": "logprob", "general_tasks": [], "validate": False,
                                      "bootstrap": 0, **changes})
  return localize(Engine(tiny_model), settings, progress=False)


def test_a_small_design_names_its_aliased_heads_and_warns(tiny_model, tmp_path):
  # 3 layers x 6 heads, 6 masks at a 10% rate: 2 heads per mask, each head ablated in at most one mask.
  heads = _run(tiny_model, tmp_path, method="cs_stratified", num_masks=6, ablation_rate=0.1)
  design = heads["design"]
  assert design["num_masks"] == 6 and design["ablations_per_head"]["max"] <= 1
  assert design["identical_groups"] and all(name.startswith("L") for g in design["identical_groups"] for name in g)
  assert "cannot tell every head apart" in design["warning"]
  assert f"warning: {design['warning']}" in summary_table(heads, None)


def test_single_head_measurements_are_no_design(tiny_model, tmp_path):
  heads = _run(tiny_model, tmp_path, method="one_shot_greedy", num_masks=18)
  assert heads["design"] is None and "design:" not in summary_table(heads, None)
