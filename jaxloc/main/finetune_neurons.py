"""CNL's enhancement experiment: fine-tune only the located neurons of a neurons run, against as many random neurons.

    python -m experiments.finetune_neurons --neurons_run=runs/smollm2_arithmetic_cnl --steps=30 \
        --learning_rate=1e-5 --output_json=runs/arithmetic_finetune.json

The neurons are the run's located set (for cnl its commonality neurons; else --count, default the run's top-k).
Training is full-batch Adam on the target's identification documents (the run's); every task is then measured on
the run's held-out documents, before and after, for the located neurons and for --draws random sets of the same
size (`jaxloc.studies.finetune`). The model is the run's; the engine flags apply to every engine the study builds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxloc import cli, files
from jaxloc.api import read_run
from jaxloc.config import SEED, setting
from jaxloc.engine.engine import Engine
from jaxloc.errors import UserError
from jaxloc.units import parse_units, units_per_layer
from jaxloc.localize.localization import load_tasks
from jaxloc.main import engine_flags
from jaxloc.studies import finetune
from jaxloc.studies.heads_vs_neurons import run_settings
from jaxloc.tasks.evaluator import Evaluator
from jaxloc.tasks.names import task_label


@dataclasses.dataclass
class FinetuneNeuronsConfig:
  neurons_run: str = setting(None, "A finished neurons run (experiments.localize --unit=neurons).", type=str,
                             required=True)
  count: int = setting(None, "Neurons to fine-tune (default: the run's located set, else its top-k).", type=int,
                       lower=1)
  steps: int = setting(30, "Full-batch Adam steps.", lower=1)
  learning_rate: float = setting(1e-5, "Adam's learning rate (CNL's: 1e-5).", lower=0.0)
  draws: int = setting(1, "Random neuron sets of the same size, trained the same way.", lower=0)
  seed: int = setting(0, "Seed of the random sets.", **SEED)
  output_json: str = setting(None, "Where to write the result.", type=str)
  progress: bool = setting(True, "Show progress bars.")


def _measure(engine, tasks) -> dict[str, dict[str, float]]:
  """Every metric of every task on its held-out documents, nothing ablated."""
  out = {}
  for t in tasks.all:
    keep = np.ones((1, engine.model_config.num_layers, engine.model_config.num_heads), np.float32)
    metrics = Evaluator(engine, t.name, t.task, t.held_out).run(keep)
    out[task_label(t.name)] = {name: float(values[0]) for name, values in metrics.items()}
  return out


def main(config: FinetuneNeuronsConfig) -> dict:
  if config.output_json:
    files.check_writable(config.output_json, "--output_json")
  run = read_run(config.neurons_run)
  if run.unit != "neurons":
    raise UserError(f"{config.neurons_run} is a {run.unit} run; give a --unit=neurons run")
  settings = run_settings(run.info)
  tasks = load_tasks(settings)  # the run's identification and held-out documents, before the model loads
  if not tasks.target.held_out:
    raise UserError(f"{config.neurons_run} did not validate, so it kept no held-out documents")
  cli.FLAGS.model = run.info["model"]
  engine = engine_flags.engine_from_flags()
  located = (run.info.get("solver") or {}).get("located_neurons")
  count = config.count or located or len(run.top_k)
  c = engine.model_config
  per_layer = units_per_layer(c, "neurons")
  ranked = parse_units([u["name"] for u in run.units[:count]], c.num_layers, per_layer, "neurons")
  rng = np.random.default_rng([config.seed, 41])
  sets = {"located": ranked}
  for draw in range(config.draws):
    flat = rng.choice(c.num_layers * per_layer, count, replace=False)
    sets[f"random {draw + 1}"] = [tuple(divmod(int(u), per_layer)) for u in flat]
  train = Evaluator(engine, tasks.target.name, tasks.target.task, tasks.target.docs).scored_requests()
  result = {"model": run.info["model"], "task": run.info["task"], "neurons_run": config.neurons_run, "count": count,
            "steps": config.steps, "learning_rate": config.learning_rate, "train_docs": len(tasks.target.docs),
            "held_out_docs": len(tasks.target.held_out), "before": _measure(engine, tasks), "after": {}}
  for label, neurons in sets.items():
    trained = finetune.finetune(engine, train, neurons, steps=config.steps, learning_rate=config.learning_rate,
                                progress=config.progress)
    tuned = Engine(dataclasses.replace(engine.model, params=trained.params), engine.config, mesh=engine.mesh)
    result["after"][label] = {"neurons": len(neurons), "trained_parameters": trained.trained_parameters,
                              "train_loss": [trained.losses[0], trained.losses[-1]], "seconds": trained.seconds,
                              "metrics": _measure(tuned, tasks)}
  target = task_label(run.info["task"])
  metric_of = {task_label(t.name): t.metric for t in tasks.all}
  print(f"{target} on {run.info['model']}: {count} neurons fine-tuned, {config.steps} Adam steps at lr "
        f"{config.learning_rate:g} on {result['train_docs']} documents; held-out metrics:")
  rows = [("before", result["before"], None)] + [(k, v["metrics"], v["train_loss"]) for k, v in result["after"].items()]
  for label, metrics, loss in rows:
    cells = ", ".join(f"{task} {metric_of[task]} {m[metric_of[task]]:.3f}" for task, m in metrics.items())
    logprob = metrics[target].get("logprob") if metric_of[target] != "logprob" else None
    print(f"  {label:10s} {cells}" + (f"; {target} logprob {logprob:.3f}" if logprob is not None else "")
          + (f"; training loss {loss[0]:.4f} -> {loss[1]:.4f}" if loss else ""))
  if config.output_json:
    files.write_json(config.output_json, result)
  return result


def console() -> None:
  cli.console(FinetuneNeuronsConfig, main, model_flags=True)
