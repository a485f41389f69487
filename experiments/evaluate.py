"""Evaluate a task with a fixed set of heads or MLP neurons ablated (or, with --curve, each prefix of a ranking).

    python -m experiments.evaluate --model=smollm2-135m --task=plurals --heads=L3H1,L10H4 \
        --num_samples=100 --output_json=/tmp/plurals.json
    python -m experiments.evaluate --model=smollm2-135m --task=plurals --neurons=L3N117,L20N5 --num_samples=100
"""

from absl import flags

from jaxloc import cli
from jaxloc.evaluate import evaluate_heads
from jaxloc.files import write_json
from jaxloc.tasks.evaluation import load_task

flags.DEFINE_string("task", None, "Registered task name, a custom .jsonl file, or an lm-evaluation-harness task as "
                    "lm_eval:<task name or task .yaml>.", required=True)
flags.DEFINE_list("task_options", [], "Task options as key=value (e.g. subtasks=2da,2ds for arithmetic).")
flags.DEFINE_list("heads", [], "Heads to ablate, e.g. L15H13,L16H21 (none: the unablated model).")
flags.DEFINE_list("neurons", [], "MLP neurons to ablate instead of heads, e.g. L3N117,L20N5 (the input of "
                  "down_proj at that index is zeroed).")
flags.DEFINE_enum("ablation", "zero", ["zero", "mean"], "Zero the heads (neurons), or replace them by their mean "
                  "output over the evaluated prompts.")
flags.DEFINE_integer("num_samples", None, "Documents to evaluate (seeded subset); default all.", lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed of the document subset.")
flags.DEFINE_string("data_dir", None, "Directory of offline dataset files (default $JAXLOC_DATA).")
flags.DEFINE_string("output_json", None, "Where to write the result.")
flags.DEFINE_bool("curve", False, "Treat --heads (--neurons) as a ranking: evaluate the unablated model and the "
                  "top-1, top-2, …, all ablated, as one batch (the result gains 'curve').")
flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.register_multi_flags_validator(["curve", "heads", "neurons"],
                                     lambda values: not values["curve"] or values["heads"] or values["neurons"],
                                     "--curve evaluates the prefixes of a ranking: give the ranking with --heads or "
                                     "--neurons")
flags.register_multi_flags_validator(["heads", "neurons"], lambda values: not (values["heads"] and values["neurons"]),
                                     "give --heads or --neurons, not both")
cli.define_model_flags()
FLAGS = flags.FLAGS


def main(argv):
  del argv
  options = cli.parse_options(FLAGS.task_options)
  # an unknown task, a missing dataset or a malformed line is reported before the model loads
  loaded = load_task(FLAGS.task, options, num_samples=FLAGS.num_samples, seed=FLAGS.seed, data_dir=FLAGS.data_dir)
  engine = cli.engine_from_flags()
  result = evaluate_heads(engine, FLAGS.task, heads=FLAGS.heads, ablation=FLAGS.ablation,
                          num_samples=FLAGS.num_samples, seed=FLAGS.seed, data_dir=FLAGS.data_dir,
                          task_options=options, progress=FLAGS.progress, curve=FLAGS.curve, loaded=loaded,
                          neurons=FLAGS.neurons)
  unit = "neurons" if FLAGS.neurons else "heads"
  for row in result.get("curve", []):
    print(f"{len(row[unit])} {unit} ablated: " + ", ".join(f"{name} {value:.4f}"
                                                          for name, value in row["metrics"].items()))
  for name, value in result["metrics"].items():
    print(f"{name}: {value:.4f}")
  if FLAGS.output_json:
    write_json(FLAGS.output_json, result)


if __name__ == "__main__":
  cli.run(main)
