"""Mask-evaluation throughput: jaxloc vs PyTorch (reference style and best effort), plus generation.

    python -m experiments.benchmark_throughput --output_json=benchmark_throughput.json

Writes the JSON and prints a table. Run it on a quiet machine: every figure is from this one run.
"""

from jaxloc.main.benchmark_throughput import console

if __name__ == "__main__":
  console()
