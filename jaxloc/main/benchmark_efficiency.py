"""Measurement efficiency: recall of one-shot greedy's top-k heads against the evaluations each method spends.

    python -m experiments.benchmark_efficiency --tasks=plurals,arithmetic_1d_4shot --output_dir=/tmp/efficiency
    python -m experiments.benchmark_efficiency --synthetic --output_dir=/tmp/efficiency_synthetic

Writes efficiency.json, efficiency.md (tables), efficiency.png (recall and top-k drop against
evaluations) and, with --noise_floor, efficiency_diagnostics.png (how well-defined greedy's top-k is,
how saturated the designs are) to --output_dir, and keeps every measured mask under --output_dir/cache: a re-run (or a
run killed and started again) reuses them. --methods names registered methods with setting tokens
(`jaxloc.bench.variants.parse_variant`, e.g. a method's own flag as `mask_steps=30`).
"""

from __future__ import annotations

import dataclasses
import logging

from jaxloc import cli
from jaxloc.bench import sweep
from jaxloc.config import nested, setting
from jaxloc.main import engine_flags
from jaxloc.report import efficiency


@dataclasses.dataclass
class BenchmarkEfficiencyConfig:
  benchmark: sweep.EfficiencyConfig = nested(sweep.EfficiencyConfig)
  synthetic: bool = setting(False, "Run on simulated responses instead of a model (N = 512 and 1024).")
  from_json: list = setting([], "Render the tables and plots of these saved efficiency.json files together (e.g. one "
                            "per task, each run with its own budgets) instead of running anything.")


def main(config: BenchmarkEfficiencyConfig) -> None:
  cfg = config.benchmark
  if config.from_json:
    report = efficiency.combine_reports(config.from_json)
    print(efficiency.write_outputs(report, cfg.output_dir, cfg.top_k))
    return
  cfg.methods = cfg.methods or sweep.default_variants(config.synthetic)
  report = sweep.run(cfg, synthetic=config.synthetic, engine_factory=engine_flags.engine_from_flags)
  print(efficiency.write_outputs(report, cfg.output_dir, cfg.top_k))
  logging.info("config: %s", dataclasses.asdict(cfg))


def console() -> None:
  # --model is the model flags' (`engine_from_flags` loads it); synthetic sizes are set in code.
  cli.define_flags(BenchmarkEfficiencyConfig, skip=("model", "synthetic_sizes"))
  cli.define_model_flags()
  cli.run(lambda argv: main(cli.settings_from_flags(BenchmarkEfficiencyConfig)))
