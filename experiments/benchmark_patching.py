"""Activation patching over every head in one compiled call against a PyTorch hook loop, and many masks in one call.

    python -m experiments.benchmark_patching --output_json=benchmark_patching.json
"""

from jaxloc.main.benchmark_patching import console

if __name__ == "__main__":
  console()
