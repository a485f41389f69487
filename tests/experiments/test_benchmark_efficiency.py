"""`experiments.benchmark_efficiency`: its flags are the fields of `EfficiencyConfig` (one default each)."""

import dataclasses
import re

from jaxloc.bench import sweep
from tests.experiments.conftest import run_cli


def test_flags_come_from_the_config_fields_and_bad_lists_exit_2(tmp_path):
  proc = run_cli("experiments.benchmark_efficiency", "--helpfull")
  config = sweep.EfficiencyConfig(output_dir="x")
  for field in dataclasses.fields(sweep.EfficiencyConfig):
    if field.name in ("model", "synthetic_sizes", "output_dir"):
      continue
    shown = " ".join(proc.stdout.split())
    flag = f"--[no]{field.name}" if isinstance(field.default, bool) else f"--{field.name}"
    assert re.search(f"{re.escape(flag)}: (<[^>]*>: )?{re.escape(field.metadata['help'][:30])}", shown), field.name
  assert "(default: '0.1,0.25,0.5,1.0')" in proc.stdout and config.budgets == [0.1, 0.25, 0.5, 1.0]
  bad = run_cli("experiments.benchmark_efficiency", f"--output_dir={tmp_path}", "--budgets=0.5,half", "--synthetic")
  assert bad.returncode == 2 and "0.5,half must be a list of numbers" in bad.stderr
  assert "Traceback" not in bad.stderr
