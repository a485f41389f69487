"""The table printed after a localization run."""

from jaxloc.report.summary import summary_table
from jaxloc.tasks.names import task_label


def _heads(task):
  return {"task": task, "model": "m", "method": "cs_stratified", "metric": "accuracy", "num_evaluations": 10,
          "baseline": 0.9, "timing": {"total_seconds": 3.0, "measure_seconds": 2.0},
          "engine": {"compilations": 4, "seconds_per_mask": 0.2}, "solver": {},
          "heads": [{"name": "L1H2", "score": -0.5}], "top_k": ["L1H2"], "universal_heads": []}


def test_a_custom_task_is_named_by_its_file_stem():
  assert task_label("/data/runs/very/long/path/capitals_of_europe.jsonl") == "capitals_of_europe"
  assert task_label("plurals") == "plurals"
  heads = _heads("/x/y/capitals.jsonl")
  heads["heads"][0]["held_out_single_head_drop"] = {"capitals": 0.6, "counting": 0.02}
  heads.update(general_tasks={"counting": {"metric": "accuracy", "baseline": 0.95, "num_docs": 10}},
               universal={"rule": "r", "threshold": 0.3, "min_tasks": 2, "confirmed_on": "held_out"})
  ablation = {"held_out": {"num_docs": 7, "k": 1, "heads": ["L1H2"], "task_relative_drop": 0.667,
                           "general_relative_drop": {"counting": 0.04}}}
  table = summary_table(heads, ablation)
  assert "/x/y" not in table and table.startswith("capitals on m")
  assert "top-1 ablated together, held-out (7 documents per task), relative drop: capitals 67%; general: counting 4%" in table
  assert "60%" in table and "2%" in table


def test_engine_facts_are_shown():
  assert "0.200s per mask (all tasks), 4 compiled shapes" in summary_table(_heads("plurals"), None)


def test_the_confirmation_says_what_it_cost_and_what_it_turned_down():
  heads = _heads("plurals")
  heads["confirmation"] = {"masks": 7, "reused_measurements": 3, "confirmed": 10, "estimated": 0,
                           "rejected": {"L0H4": {"plurals": 0.3, "counting": 0.02, "induction": 0.41}},
                           "aliased_groups_measured": [["L1H5", "L27H4"]]}
  line = next(x for x in summary_table(heads, None).splitlines() if x.startswith("confirmation:"))
  assert line.startswith("confirmation: 7 extra masks of the 10 evaluations (heads ablated alone on every task's "
                         "identification documents; 3 of the method's own measurements reused)")
  assert "rejected 1: L0H4 (induction 41%)" in line and "aliased groups measured: L1H5/L27H4" in line
  assert "confirmation:" not in summary_table(_heads("plurals"), None)


def test_the_confirmation_names_heads_turned_away_together():
  heads = _heads("plurals")
  heads["confirmation"] = {"masks": 9, "together": 5, "masks_together": 6, "reused_measurements": 0, "confirmed": 10,
                           "estimated": 0, "rejected": {},
                           "rejected_together": {"L3H1": {"with": ["L8H1", "L20H5"], "plurals": 0.7,
                                                          "counting": 0.18, "induction": 0.02}}}
  line = next(x for x in summary_table(heads, None).splitlines() if x.startswith("confirmation:"))
  assert "documents, the first 5 together (6 masks);" in line
  assert "turned away together 1: L3H1 (counting 18% with 2 selected)" in line
