"""Find the attention heads (or, with --unit=neurons, the MLP neurons) that carry a capability.

    python -m experiments.localize --flagfile=experiments/configs/smollm2_default.flags
    python -m experiments.localize --flagfile=experiments/configs/smollm2_plurals_cnl.flags  # neurons, CNL

Writes measurements.npz (the target's; each general task's under the same masks in general/<task>/),
heads.json (neurons.json), coefficients.npy, heatmap.png (neurons_per_layer.png), ablation.json (held-out
validation), ablation_curve.png and specificity_curve.png to --output_dir. Re-running the same command resumes an interrupted run without
re-measuring any saved mask. Every flag but the model/engine ones is a field of
`jaxloc.localize.settings.LocalizeSettings` (one definition of its default and help).
"""

from absl import flags

from jaxloc import cli
from jaxloc.api import run_localization
from jaxloc.localize import methods
from jaxloc.localize.run import load_tasks
from jaxloc.localize.settings import LocalizeSettings
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
  run = run_localization(engine, settings=settings, tasks=tasks, progress=FLAGS.progress)
  print(summary_table(run.info, run.ablation))
  print(f"outputs in {FLAGS.output_dir}")


if __name__ == "__main__":
  cli.run(main)
