"""Measurement efficiency: recall of one-shot greedy's top-k heads against the evaluations each method spends.

    python -m experiments.benchmark_efficiency --tasks=plurals,arithmetic_1d_4shot --output_dir=/tmp/efficiency
    python -m experiments.benchmark_efficiency --synthetic --output_dir=/tmp/efficiency_synthetic

Writes efficiency.json, efficiency.md (tables), efficiency.png (recall and top-k drop against
evaluations) and, with --noise_floor, efficiency_diagnostics.png (how well-defined greedy's top-k is,
how saturated the designs are) to --output_dir, and keeps every measured mask under --output_dir/cache: a re-run (or a
run killed and started again) reuses them.
"""

import dataclasses
import logging

from absl import flags

from jaxloc import cli
from jaxloc.bench import sweep
from jaxloc.report import efficiency

cli.define_flags(sweep.EfficiencyConfig, skip=("model", "synthetic_sizes"))
flags.DEFINE_bool("synthetic", False, "Run on simulated responses instead of a model (N = 512 and 1024).")
flags.DEFINE_list("from_json", [], "Render the tables and plots of these saved efficiency.json files together "
                  "(e.g. one per task, each run with its own budgets) instead of running anything.")
cli.define_model_flags()
FLAGS = flags.FLAGS


def main(argv):
  del argv
  if FLAGS.from_json:
    report = efficiency.combine_reports(FLAGS.from_json)
    print(efficiency.write_outputs(report, FLAGS.output_dir, FLAGS.top_k))
    return
  cfg = cli.settings_from_flags(sweep.EfficiencyConfig)
  cfg.methods = cfg.methods or sweep.default_variants(FLAGS.synthetic)
  report = sweep.run(cfg, synthetic=FLAGS.synthetic, engine_factory=cli.engine_from_flags)
  print(efficiency.write_outputs(report, cfg.output_dir, cfg.top_k))
  logging.info("config: %s", dataclasses.asdict(cfg))


if __name__ == "__main__":
  cli.run(main)
