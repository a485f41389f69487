"""Find the attention heads that carry a capability.

    python -m experiments.localize --flagfile=experiments/configs/smollm2_default.flags

Writes measurements.npz, heads.json, coefficients.npy, heatmap.png, ablation.json and
ablation_curve.png to --output_dir. Re-running the same command resumes an interrupted run without
re-measuring any saved mask.
"""

import json
import os

from absl import flags

from jaxloc import cli
from jaxloc.localize import methods
from jaxloc.localize.run import LocalizeSettings, localize
from jaxloc.report.plots import write_plots
from jaxloc.report.summary import summary_table

flags.DEFINE_string("task", None, "Registered task name or a custom .jsonl file.", required=True)
flags.DEFINE_list("task_options", [], "Task options as key=value.")
flags.DEFINE_enum("method", "cs_stratified", list(methods.METHODS), "Localization method.")
flags.DEFINE_integer("num_masks", 300, "Masks (model evaluations) for compressed sensing and two_stage (screen "
                     "plus confirmations); for gradient_confirm, the heads confirmed by single-head ablation "
                     "after one gradient pass (e.g. 10% of the heads).", lower_bound=1)
flags.DEFINE_float("screen_fraction", 0.5, "two_stage: fraction of --num_masks spent on the compressed-sensing "
                   "screen; the rest ablate the screen's top heads one at a time.", lower_bound=1e-6,
                   upper_bound=1 - 1e-6)
flags.DEFINE_float("ablation_rate", 0.1, "Fraction of heads each compressed-sensing mask ablates.",
                   lower_bound=1e-6, upper_bound=1 - 1e-6)
flags.DEFINE_integer("num_samples", 100, "Task documents used for identification (seeded subset).",
                     lower_bound=1)
flags.DEFINE_string("metric", None, "Task metric to localize (default: the task's default metric).")
flags.DEFINE_string("lasso_alpha", "cv", "Lasso alpha: a number, or 'cv' for K-fold cross-validation.")
flags.DEFINE_bool("standardize", True, "Standardize the scores before the Lasso (as the paper's code does).")
flags.DEFINE_bool("nonpositive", False, "Constrain coefficients to ≤ 0 (ablation can only hurt).")
flags.DEFINE_integer("top_k", 5, "Heads reported and validated (and rounds of iterative greedy).", lower_bound=1)
flags.DEFINE_list("exclude_heads", [], "Heads never ablated, e.g. L0H1,L1H3 (known universal heads).")
flags.DEFINE_integer("seed", 0, "Seed of the design and the document subset.")
flags.DEFINE_string("data_dir", None, "Directory of offline dataset files (default $JAXLOC_DATA).")
flags.DEFINE_enum("ablation", "zero", ["zero", "mean"], "Zero ablation or mean ablation.")
flags.DEFINE_enum("solver_dtype", "float64", ["float64", "float32"], "Precision of the Lasso solve.")
flags.DEFINE_bool("check_sklearn", False, "Also solve with scikit-learn and record the largest difference.")
flags.DEFINE_bool("validate", True, "Ablate the top-k heads and measure the task and the general tasks.")
flags.DEFINE_list("general_tasks", ["counting", "plurals", "induction", "arithmetic_1d_4shot"],
                  "Tasks that check specificity (and detect universal heads).")
flags.DEFINE_integer("general_samples", 100, "Documents per general task.", lower_bound=1)
flags.DEFINE_float("universal_threshold", 0.5, "Relative drop on every general task that marks a head "
                   "universal.", lower_bound=1e-6, upper_bound=1.0)
flags.DEFINE_integer("universal_candidates", 10, "Top-ranked heads tested for universality.", lower_bound=0)
flags.DEFINE_string("output_dir", None, "Where outputs go (and where a resumed run finds them).", required=True)
flags.DEFINE_bool("progress", True, "Show a progress bar.")
cli.define_model_flags()
FLAGS = flags.FLAGS


def main(argv):
  del argv
  settings = LocalizeSettings(
      model=FLAGS.model, task=FLAGS.task, output_dir=FLAGS.output_dir, method=FLAGS.method,
      task_options=cli.parse_options(FLAGS.task_options), num_masks=FLAGS.num_masks,
      ablation_rate=FLAGS.ablation_rate, num_samples=FLAGS.num_samples, metric=FLAGS.metric,
      lasso_alpha=FLAGS.lasso_alpha, standardize=FLAGS.standardize, nonpositive=FLAGS.nonpositive,
      top_k=FLAGS.top_k, exclude_heads=FLAGS.exclude_heads, seed=FLAGS.seed, data_dir=FLAGS.data_dir,
      ablation=FLAGS.ablation, check_sklearn=FLAGS.check_sklearn, solver_dtype=FLAGS.solver_dtype,
      validate=FLAGS.validate,
      general_tasks=FLAGS.general_tasks, general_samples=FLAGS.general_samples,
      universal_threshold=FLAGS.universal_threshold, universal_candidates=FLAGS.universal_candidates,
      screen_fraction=FLAGS.screen_fraction)
  settings.check()
  engine = cli.engine_from_flags()
  heads = localize(engine, settings, progress=FLAGS.progress)
  write_plots(FLAGS.output_dir)
  ablation = None
  if os.path.exists(os.path.join(FLAGS.output_dir, "ablation.json")):
    with open(os.path.join(FLAGS.output_dir, "ablation.json")) as f:
      ablation = json.load(f)
  print(summary_table(heads, ablation))
  print(f"outputs in {FLAGS.output_dir}")


if __name__ == "__main__":
  cli.run(main)
