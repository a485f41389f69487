"""Sandbox overhead per generated program, by isolation mode (the file view against the modes before it).

    python -m experiments.benchmark_sandbox --output_json=benchmark_sandbox.json

Each mode runs the same trivial programs through the shipped sandbox (`jaxloc.bench.sandbox_overhead`); modes this
machine cannot run are reported as unavailable. Nothing this module imports starts JAX, whose threads and memory in
the measuring process would be part of what is measured (a test holds it to that).
"""

from __future__ import annotations

import dataclasses

from jaxloc import cli, sandbox
from jaxloc.bench import sandbox_overhead
from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.files import check_writable, write_json


@dataclasses.dataclass
class BenchmarkSandboxConfig:
  programs: int = setting(200, "Trivial programs per mode.", lower=1)
  modes: list = setting(["namespaces", "namespaces_host_visible", "uid_only", "none"],
                        "Isolation modes to compare (described in the jaxloc.sandbox docstring).")
  output_json: str = setting(None, "Where to write the figures.", type=str)


def main(config: BenchmarkSandboxConfig) -> dict:
  if config.output_json:
    check_writable(config.output_json, "--output_json")
  unknown = [m for m in config.modes if m not in sandbox.MODES]
  if unknown:
    raise UserError(f"unknown --modes {unknown}; valid: {', '.join(sandbox.MODES)}")
  rows = sandbox_overhead.measure(config.modes, config.programs)
  probed = sandbox.isolation()
  print(f"isolation mode probed on this machine: {probed.description}")
  print(sandbox_overhead.format_table(rows))
  result = {"isolation_mode": probed.mode, "isolation": probed.description, "rows": rows}
  if config.output_json:
    write_json(config.output_json, result)
  return result


def console() -> None:
  cli.console(BenchmarkSandboxConfig, main)
