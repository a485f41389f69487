"""Rebuild a finished run's report page (`report.html`; every run writes it) and, with --plots, its PNG plots.

    python -m experiments.report --run_dir=runs/smollm2_default
"""

from jaxloc.main.report import console

if __name__ == "__main__":
  console()
