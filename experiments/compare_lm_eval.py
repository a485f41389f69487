"""Check jaxloc against lm-eval's own evaluation of an lm-eval task: unablated, and with --heads ablated.

    python -m experiments.compare_lm_eval --task=lm_eval:experiments/configs/lm_eval/irregular_past.yaml \
        --heads=L1H5,L8H1 --num_samples=40 --output_json=/tmp/compare.json

lm-eval runs the task with its HF backend (transformers on the CPU, heads hooked on o_proj); jaxloc evaluates both
head sets as one batch. Prints every metric from both, the largest per-request log-likelihood difference (scored
tasks) or the share of identical generations (generation tasks). Needs pip install -e '.[test,lm-eval]'.
"""

from absl import flags

from jaxloc import cli
from jaxloc.errors import UserError
from jaxloc.files import write_json
from jaxloc.tasks.evaluation import load_task

flags.DEFINE_string("task", None, "An lm-evaluation-harness task: lm_eval:<task name or task .yaml>.", required=True)
flags.DEFINE_list("task_options", [], "Task options as key=value (num_fewshot=N).")
flags.DEFINE_list("heads", [], "Heads to ablate in the second comparison, e.g. L1H5,L8H1 (none: unablated only).")
flags.DEFINE_integer("num_samples", None, "Documents (seeded subset); default all.", lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed of the document subset.")
flags.DEFINE_integer("batch_size", 16, "lm-eval's HF batch size.", lower_bound=1)
flags.DEFINE_string("output_json", None, "Where to write the comparison.")
cli.define_model_flags()
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from jaxloc.tasks.harness import HarnessTask

  task, docs = load_task(FLAGS.task, cli.parse_options(FLAGS.task_options), num_samples=FLAGS.num_samples,
                         seed=FLAGS.seed, data_dir=None)
  if not isinstance(task, HarnessTask):
    raise UserError(f"--task={FLAGS.task} is not an lm-eval task; give lm_eval:<task name or task .yaml>")
  from jaxloc.models.torch_reference import load_hf_model
  from jaxloc.tasks.harness_reference import compare, table

  engine = cli.engine_from_flags()
  report = compare(engine, load_hf_model(FLAGS.model), engine.tokenizer, task, docs, FLAGS.heads,
                   batch_size=FLAGS.batch_size)
  print(table(report))
  if FLAGS.output_json:
    write_json(FLAGS.output_json, report)


if __name__ == "__main__":
  cli.run(main)
