"""The table printed after a localization run."""

from jaxloc.report.summary import summary_table, task_label


def _heads(task):
  return {"task": task, "model": "m", "method": "cs_stratified", "metric": "accuracy", "num_evaluations": 10,
          "baseline": 0.9, "timing": {"total_seconds": 3.0, "measure_seconds": 2.0},
          "engine": {"compilations": 4, "seconds_per_mask": 0.2}, "solver": {},
          "heads": [{"name": "L1H2", "score": -0.5}], "top_k": ["L1H2"], "universal_heads": []}


def test_a_custom_task_is_named_by_its_file_stem():
  assert task_label("/data/runs/very/long/path/capitals_of_europe.jsonl") == "capitals_of_europe"
  assert task_label("plurals") == "plurals"
  ablation = {"heads": ["L1H2"], "task": {"name": "/x/y/capitals.jsonl", "default_metric": "accuracy",
                                           "metrics": {"accuracy": [0.9, 0.3]},
                                           "relative_drop": {"accuracy": [0.0, 0.667]}},
              "general": {}, "single_head_drops": {"L1H2": {"/x/y/capitals.jsonl": 0.6}}}
  table = summary_table(_heads("/x/y/capitals.jsonl"), ablation)
  assert "/x/y" not in table and table.startswith("capitals on m")
  assert "capitals accuracy 0.900 -> 0.300" in table and "60%" in table


def test_engine_facts_are_shown():
  assert "0.200s per mask, 4 compiled shapes" in summary_table(_heads("plurals"), None)
