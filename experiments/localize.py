"""Find the attention heads that carry a capability.

    python -m experiments.localize --flagfile=experiments/configs/smollm2_default.flags

Writes measurements.npz (the target's; each general task's under the same masks in general/<task>/),
heads.json, coefficients.npy, heatmap.png, ablation.json (held-out validation), ablation_curve.png and
specificity_curve.png to --output_dir. Re-running the same command resumes an interrupted run without
re-measuring any saved mask. Every flag but the model/engine ones is a field of
`jaxloc.localize.settings.LocalizeSettings` (one definition of its default and help).
"""

import json
import os

from absl import flags

from jaxloc import cli
from jaxloc.localize import methods
from jaxloc.localize.run import load_tasks, localize
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.report.plots import write_plots
from jaxloc.report.summary import summary_table

cli.define_flags(LocalizeSettings, skip=("model",), choices={"methods": methods.names()})
flags.DEFINE_bool("progress", True, "Show a progress bar.")
cli.define_model_flags()
FLAGS = flags.FLAGS


def main(argv):
  del argv
  settings = cli.settings_from_flags(LocalizeSettings)
  tasks = load_tasks(settings)  # every user error that needs no model is reported before it loads
  engine = cli.engine_from_flags()
  heads = localize(engine, settings, tasks, progress=FLAGS.progress)
  write_plots(FLAGS.output_dir)
  ablation = None
  if os.path.exists(os.path.join(FLAGS.output_dir, "ablation.json")):
    with open(os.path.join(FLAGS.output_dir, "ablation.json")) as f:
      ablation = json.load(f)
  print(summary_table(heads, ablation))
  print(f"outputs in {FLAGS.output_dir}")


if __name__ == "__main__":
  cli.run(main)
