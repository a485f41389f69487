"""How far two finished localization runs agree (e.g. --dtype=bfloat16 against float32, or two seeds).

    python -m experiments.compare_runs --runs=runs/smollm2_default,runs/smollm2_default_bf16 \
        --output_json=runs/bf16_vs_f32.json

Prints a table: top-5/top-10 overlap of the rankings, the overlap of the selections, the Spearman rank
correlation and largest difference of the coefficients, the largest score difference over the masks both runs
measured, the baselines and the held-out drops. No model is loaded.
"""

from __future__ import annotations

import dataclasses

from jaxloc import cli, files
from jaxloc.api import read_run
from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.report import agreement


@dataclasses.dataclass
class CompareRunsConfig:
  runs: list = setting(None, "Two run directories (experiments.localize --output_dir).", type=list, required=True)
  output_json: str = setting(None, "Where to write the comparison (optional).", type=str)


def main(config: CompareRunsConfig) -> dict:
  if config.output_json:
    files.check_writable(config.output_json, "--output_json")
  if len(config.runs) != 2:
    raise UserError(f"--runs needs two run directories, got {len(config.runs)}")
  runs = [read_run(directory) for directory in config.runs]
  keys = [(r.info["model"], r.info["task"], r.info["metric"]) for r in runs]
  if keys[0] != keys[1]:
    raise UserError(f"the runs answer different questions (model, task, metric): {keys[0]} and {keys[1]}")
  result = agreement.agreement(*runs)
  print(agreement.markdown(result))
  if config.output_json:
    files.write_json(config.output_json, result)
  return result


def console() -> None:
  cli.console(CompareRunsConfig, main)
