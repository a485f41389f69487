"""Sandbox overhead per generated program, by isolation mode (the file view against the modes before it).

    python -m experiments.benchmark_sandbox --output_json=benchmark_sandbox.json
"""

from jaxloc.main.benchmark_sandbox import console

if __name__ == "__main__":
  console()
