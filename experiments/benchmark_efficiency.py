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
from jaxloc.errors import UserError

flags.DEFINE_list("tasks", ["plurals", "arithmetic_1d_4shot"], "Tasks to benchmark (real mode).")
flags.DEFINE_integer("num_samples", 100, "Documents per task (seeded subset).", lower_bound=2)
flags.DEFINE_integer("sample_seed", 0, "Seed of the document subset.")
flags.DEFINE_list("methods", [], "Methods: registered method names with setting tokens (see jaxloc/bench/sweep.py); "
                  "empty = the default set.")
flags.DEFINE_list("budgets", ["0.1", "0.25", "0.5", "1.0"], "Budgets as fractions of N evaluations.")
flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "Design seeds.")
flags.DEFINE_integer("top_k", 5, "Heads compared with greedy's top-k.", lower_bound=1)
flags.DEFINE_string("headline_metric", "accuracy", "Metric of the ground truth that the recall figures use.")
flags.DEFINE_bool("iterative_greedy", False, "Also run iterative greedy's top-k (about k·N evaluations).")
flags.DEFINE_bool("noise_floor", True, "Greedy on two disjoint halves of the docs (about N more half-size "
                  "evaluations), design saturation and additivity of the top heads.")
flags.DEFINE_bool("gradient", True, "Time the mask gradient and run the methods that use it.")
flags.DEFINE_bool("synthetic", False, "Run on simulated responses instead of a model (N = 512 and 1024).")
flags.DEFINE_integer("synthetic_planted", 10, "Synthetic mode: heads with a large effect.", lower_bound=1)
flags.DEFINE_float("synthetic_interaction_scale", 0.5, "Synthetic mode: sd of pairwise interactions (logits).",
                   lower_bound=0.0)
flags.DEFINE_list("from_json", [], "Render the tables and plots of these saved efficiency.json files together "
                  "(e.g. one per task, each run with its own budgets) instead of running anything.")
flags.DEFINE_string("output_dir", None, "Where the outputs and the measurement cache go.", required=True)
cli.define_model_flags()
FLAGS = flags.FLAGS


def _numbers(values, kind, name):
  try:
    return [kind(v) for v in values]
  except ValueError:
    raise UserError(f"--{name}={','.join(values)} must be a list of {kind.__name__}s") from None


def main(argv):
  del argv
  if FLAGS.from_json:
    report = efficiency.combine_reports(FLAGS.from_json)
    print(efficiency.write_outputs(report, FLAGS.output_dir, FLAGS.top_k))
    return
  cfg = sweep.EfficiencyConfig(
      output_dir=FLAGS.output_dir, model=FLAGS.model, tasks=FLAGS.tasks, num_samples=FLAGS.num_samples,
      sample_seed=FLAGS.sample_seed, methods=FLAGS.methods or sweep.default_variants(FLAGS.synthetic),
      budgets=_numbers(FLAGS.budgets, float, "budgets"), seeds=_numbers(FLAGS.seeds, int, "seeds"),
      top_k=FLAGS.top_k, headline_metric=FLAGS.headline_metric, iterative_greedy=FLAGS.iterative_greedy,
      noise_floor=FLAGS.noise_floor, gradient=FLAGS.gradient, synthetic_planted=FLAGS.synthetic_planted,
      synthetic_interaction_scale=FLAGS.synthetic_interaction_scale)
  report = sweep.run(cfg, synthetic=FLAGS.synthetic, engine_factory=cli.engine_from_flags)
  print(efficiency.write_outputs(report, cfg.output_dir, cfg.top_k))
  logging.info("config: %s", dataclasses.asdict(cfg))


if __name__ == "__main__":
  cli.run(main)
