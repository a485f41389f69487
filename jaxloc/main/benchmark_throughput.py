"""Mask-evaluation throughput: jaxloc vs PyTorch (reference style and best effort), plus generation.

    python -m experiments.benchmark_throughput --output_json=benchmark_throughput.json

Writes the JSON and prints a table. Run it on a quiet machine: every figure is from this one run. The benchmark's
own flags are `jaxloc.bench.throughput.ThroughputConfig`; the model and engine ones are `jaxloc.cli`'s, and every
engine it compares is the flags' engine with one setting changed.
"""

from __future__ import annotations

import dataclasses

from jaxloc import cli, files
from jaxloc.bench import throughput
from jaxloc.config import setting
from jaxloc.main import engine_flags


@dataclasses.dataclass
class BenchmarkThroughputConfig(throughput.ThroughputConfig):
  output_json: str = setting("benchmark_throughput.json", "Where to write the figures.")


def main(config: BenchmarkThroughputConfig) -> dict:
  files.check_writable(config.output_json, "--output_json")
  engine = engine_flags.engine_from_flags()
  report = throughput.run(engine, config)
  print(throughput.format_table(report))
  files.write_json(config.output_json, report)
  return report


def console() -> None:
  cli.console(BenchmarkThroughputConfig, main, model_flags=True)
