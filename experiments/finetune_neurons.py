"""CNL's enhancement experiment: fine-tune only the located neurons of a neurons run, against as many random neurons.

    python -m experiments.finetune_neurons --neurons_run=runs/smollm2_arithmetic_cnl --steps=30 \
        --learning_rate=1e-5 --output_json=runs/arithmetic_finetune.json

The neurons are the run's located set (for cnl its commonality neurons; else --count, default the run's top-k).
Training is full-batch Adam on the target's identification documents (the run's); every task is then measured on
the run's held-out documents, before and after, for the located neurons and for --draws random sets of the same
size (`jaxloc.studies.finetune`).
"""

import dataclasses

import numpy as np
from absl import flags

from jaxloc import cli, files
from jaxloc.api import read_run
from jaxloc.engine.engine import Engine
from jaxloc.errors import UserError
from jaxloc.heads import parse_units, units_per_layer
from jaxloc.studies import finetune
from jaxloc.studies.heads_vs_neurons import run_settings
from jaxloc.localize.run import load_tasks
from jaxloc.tasks.names import task_label
from jaxloc.tasks.evaluation import Evaluator

flags.DEFINE_string("neurons_run", None, "A finished neurons run (experiments.localize --unit=neurons).", required=True)
flags.DEFINE_integer("count", None, "Neurons to fine-tune (default: the run's located set, else its top-k).",
                     lower_bound=1)
flags.DEFINE_integer("steps", 30, "Full-batch Adam steps.", lower_bound=1)
flags.DEFINE_float("learning_rate", 1e-5, "Adam's learning rate (CNL's: 1e-5).", lower_bound=0.0)
flags.DEFINE_integer("draws", 1, "Random neuron sets of the same size, trained the same way.", lower_bound=0)
flags.DEFINE_integer("seed", 0, "Seed of the random sets.")
flags.DEFINE_string("output_json", None, "Where to write the result.")
flags.DEFINE_bool("progress", True, "Show progress bars.")
cli.define_model_flags()
FLAGS = flags.FLAGS


def _measure(engine, tasks) -> dict[str, dict[str, float]]:
  """Every metric of every task on its held-out documents, nothing ablated."""
  out = {}
  for t in tasks.all:
    keep = np.ones((1, engine.config.num_layers, engine.config.num_heads), np.float32)
    metrics = Evaluator(engine, t.name, t.task, t.held_out).run(keep)
    out[task_label(t.name)] = {name: float(values[0]) for name, values in metrics.items()}
  return out


def main(argv):
  del argv
  run = read_run(FLAGS.neurons_run)
  if run.unit != "neurons":
    raise UserError(f"{FLAGS.neurons_run} is a {run.unit} run; give a --unit=neurons run")
  settings = run_settings(run.info)
  tasks = load_tasks(settings)  # the run's identification and held-out documents, before the model loads
  if not tasks.target.held_out:
    raise UserError(f"{FLAGS.neurons_run} did not validate, so it kept no held-out documents")
  FLAGS.model = run.info["model"]
  engine = cli.engine_from_flags()
  located = (run.info.get("solver") or {}).get("located_neurons")
  count = FLAGS.count or located or len(run.top_k)
  c = engine.config
  per_layer = units_per_layer(c, "neurons")
  ranked = parse_units([u["name"] for u in run.units[:count]], c.num_layers, per_layer, "neurons")
  rng = np.random.default_rng([FLAGS.seed, 41])
  sets = {"located": ranked}
  for draw in range(FLAGS.draws):
    flat = rng.choice(c.num_layers * per_layer, count, replace=False)
    sets[f"random {draw + 1}"] = [tuple(divmod(int(u), per_layer)) for u in flat]
  train = Evaluator(engine, tasks.target.name, tasks.target.task, tasks.target.docs).scored_requests()
  result = {"model": run.info["model"], "task": run.info["task"], "neurons_run": FLAGS.neurons_run, "count": count,
            "steps": FLAGS.steps, "learning_rate": FLAGS.learning_rate, "train_docs": len(tasks.target.docs),
            "held_out_docs": len(tasks.target.held_out), "before": _measure(engine, tasks), "after": {}}
  for label, neurons in sets.items():
    trained = finetune.finetune(engine, train, neurons, steps=FLAGS.steps, learning_rate=FLAGS.learning_rate,
                                progress=FLAGS.progress)
    tuned = Engine(dataclasses.replace(engine.model, params=trained.params), mesh=engine.mesh,
                   activation_dtype=engine.dtype)
    result["after"][label] = {"neurons": len(neurons), "trained_parameters": trained.trained_parameters,
                              "train_loss": [trained.losses[0], trained.losses[-1]], "seconds": trained.seconds,
                              "metrics": _measure(tuned, tasks)}
  target = task_label(run.info["task"])
  metric_of = {task_label(t.name): t.metric for t in tasks.all}
  print(f"{target} on {run.info['model']}: {count} neurons fine-tuned, {FLAGS.steps} Adam steps at lr "
        f"{FLAGS.learning_rate:g} on {result['train_docs']} documents; held-out metrics:")
  rows = [("before", result["before"], None)] + [(k, v["metrics"], v["train_loss"]) for k, v in result["after"].items()]
  for label, metrics, loss in rows:
    cells = ", ".join(f"{task} {metric_of[task]} {m[metric_of[task]]:.3f}" for task, m in metrics.items())
    logprob = metrics[target].get("logprob") if metric_of[target] != "logprob" else None
    print(f"  {label:10s} {cells}" + (f"; {target} logprob {logprob:.3f}" if logprob is not None else "")
          + (f"; training loss {loss[0]:.4f} -> {loss[1]:.4f}" if loss else ""))
  if FLAGS.output_json:
    files.write_json(FLAGS.output_json, result)


if __name__ == "__main__":
  cli.run(main)
