"""Capability generalization from runs on disk: does ablating task A's heads hurt tasks B, C, ...?

    python -m experiments.cross_task --runs=runs/smollm2_default,runs/smollm2_arithmetic,runs/smollm2_induction \
        --output_dir=runs/cross_task

Reads each run's heads.json and ablation.json (held-out drops; no model is loaded) and writes
cross_task.json, cross_task.md (the matrix and the paper's Table 2 shape) and cross_task.png.
"""

import os

from absl import flags

from jaxloc import cli, files
from jaxloc.report import cross_task

flags.DEFINE_list("runs", None, "Run directories of `experiments.localize`, one per target task.", required=True)
flags.DEFINE_string("output_dir", None, "Where the table and the plot go.", required=True)
FLAGS = flags.FLAGS


def main(argv):
  del argv
  result = cross_task.cross_task(FLAGS.runs)
  files.write_json(os.path.join(FLAGS.output_dir, "cross_task.json"), result)
  table = cross_task.markdown(result)
  files.write_text(os.path.join(FLAGS.output_dir, "cross_task.md"), table + "\n")
  cross_task.plot(result, os.path.join(FLAGS.output_dir, "cross_task.png"))
  print(table)
  print(f"outputs in {FLAGS.output_dir}")


if __name__ == "__main__":
  cli.run(main)
