"""Rebuild a finished run's report page (`report.html`; every run writes it) and, with --plots, its PNG plots.

    python -m experiments.report --run_dir=runs/smollm2_default
    python -m experiments.report --runs=runs/smollm2_default,runs/smollm2_arithmetic --output=runs/comparison.html
    python -m experiments.report --all  # every plot and page under docs/, from the files git keeps
"""

from jaxloc.main.report import console

if __name__ == "__main__":
  console()
