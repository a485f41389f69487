"""Heads against neurons at equal budgets, for a model and task: is the capability in a few attention heads (the
compressed-sensing paper) or in MLP neurons (CNL)?

    python -m experiments.compare_units --heads_run=runs/plurals_heads --neurons_run=runs/plurals_cnl \
        --head_counts=1,3,5,10 --output_dir=runs/plurals_units

Ablates the heads run's top k heads against the neurons run's top k × head_dim neurons (the same number of zeroed
parameters: a head's o_proj slice against neurons' down_proj columns), and random heads and neurons of the same
budgets, on the held-out documents of the target and the general tasks (as the heads run drew them). Writes
compare_units.json and compare_units.png and prints the table.
"""

import os

from absl import flags

from jaxloc import cli, files
from jaxloc.api import read_run
from jaxloc.errors import UserError
from jaxloc.studies import heads_vs_neurons as compare_units
from jaxloc.report import heads_vs_neurons as report

flags.DEFINE_string("heads_run", None, "A finished heads run (experiments.localize --output_dir).", required=True)
flags.DEFINE_string("neurons_run", None, "A finished neurons run of the same model and task (--unit=neurons).",
                    required=True)
flags.DEFINE_list("head_counts", ["1", "3", "5", "10"], "Budgets in heads; each is compared with head_dim times as "
                  "many neurons.")
flags.DEFINE_integer("draws", 3, "Random sets of heads and of neurons per budget.", lower_bound=0)
flags.DEFINE_integer("seed", 0, "Seed of the random sets.")
flags.DEFINE_enum("ablation", "zero", ["zero", "mean"], "Zero ablation, or each unit's mean over the documents.")
flags.DEFINE_string("output_dir", None, "Where compare_units.json and compare_units.png go.", required=True)
cli.define_model_flags()
FLAGS = flags.FLAGS


def main(argv):
  del argv
  try:
    counts = [int(k) for k in FLAGS.head_counts]
  except ValueError:
    raise UserError(f"--head_counts must be integers, got {FLAGS.head_counts}") from None
  runs = [read_run(FLAGS.heads_run), read_run(FLAGS.neurons_run)]
  compare_units.check_pair(*runs)
  tasks = compare_units.held_out_tasks(runs[0].info)  # missing datasets are reported before the model loads
  model = runs[0].info["model"]
  if FLAGS["model"].present and FLAGS.model != model:
    raise UserError(f"the runs localized {model}; --model={FLAGS.model} would compare another model's units")
  FLAGS.model = model
  engine = cli.engine_from_flags()
  heads, neurons = (compare_units.read_ranking(run, engine.config) for run in runs)
  result = compare_units.compare(engine, heads, neurons, tasks, counts, FLAGS.draws, FLAGS.seed, FLAGS.ablation)
  print(report.markdown(result))
  files.write_json(os.path.join(FLAGS.output_dir, "compare_units.json"), result)
  report.plot(result, os.path.join(FLAGS.output_dir, "compare_units.png"))
  print(f"outputs in {FLAGS.output_dir}")


if __name__ == "__main__":
  cli.run(main)
