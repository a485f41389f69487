"""Capability generalization from runs on disk: does ablating task A's heads hurt tasks B, C, ...?

    python -m experiments.cross_task --runs=runs/smollm2_default,runs/smollm2_arithmetic,runs/smollm2_induction \
        --output_dir=runs/cross_task

Reads each run's heads.json and ablation.json (held-out drops; no model is loaded) and writes
cross_task.json, cross_task.md (the matrix and the paper's Table 2 shape) and cross_task.png. Runs of several
models give one matrix per model and a table of each target on each model, side by side.
"""

from jaxloc.main.cross_task import console

if __name__ == "__main__":
  console()
