"""Measurement efficiency: recall of one-shot greedy's top-k heads against the evaluations each method spends.

    python -m experiments.benchmark_efficiency --tasks=plurals,arithmetic_1d_4shot --output_dir=/tmp/efficiency
    python -m experiments.benchmark_efficiency --synthetic --output_dir=/tmp/efficiency_synthetic

Every flag: `python -m experiments.benchmark_efficiency --helpfull`; the command is `jaxloc.main.benchmark_efficiency`.
"""

from jaxloc.main.benchmark_efficiency import console

if __name__ == "__main__":
  console()
