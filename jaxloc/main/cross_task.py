"""Capability generalization from runs on disk: does ablating task A's heads hurt tasks B, C, ...?

    python -m experiments.cross_task --runs=runs/smollm2_default,runs/smollm2_arithmetic,runs/smollm2_induction \
        --output_dir=runs/cross_task

Reads each run's heads.json and ablation.json (held-out drops; no model is loaded) and writes
cross_task.json, cross_task.md (the matrix and the paper's Table 2 shape) and cross_task.png. Runs of several
models give one matrix per model and a table of each target on each model, side by side.
"""

from __future__ import annotations

import dataclasses
import os

from jaxloc import cli, files
from jaxloc.config import setting
from jaxloc.report import cross_task


@dataclasses.dataclass
class CrossTaskConfig:
  runs: list = setting(None, "Run directories of `experiments.localize`, one per model and target task.", type=list,
                       required=True)
  output_dir: str = setting(None, "Where the table and the plot go.", type=str, required=True)


def main(config: CrossTaskConfig) -> dict:
  files.check_output_directory(config.output_dir, "--output_dir")
  result = cross_task.cross_task(config.runs)
  files.write_json(os.path.join(config.output_dir, "cross_task.json"), result)
  table = cross_task.markdown(result)
  files.write_text(os.path.join(config.output_dir, "cross_task.md"), table + "\n")
  cross_task.plot(result, os.path.join(config.output_dir, "cross_task.png"))
  print(table)
  print(f"outputs in {config.output_dir}")
  return result


def console() -> None:
  cli.console(CrossTaskConfig, main)
