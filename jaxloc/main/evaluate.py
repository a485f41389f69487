"""Evaluate a task with a fixed set of heads or MLP neurons ablated (or, with --curve, each prefix of a ranking).

    python -m experiments.evaluate --model=smollm2-135m --task=plurals --heads=L3H1,L10H4 \
        --num_samples=100 --output_json=/tmp/plurals.json
    python -m experiments.evaluate --model=smollm2-135m --task=plurals --neurons=L3N117,L20N5 --num_samples=100
    # a ranking judged on a localization run's held-out documents (its --num_samples=16, --validation_samples=24):
    python -m experiments.evaluate --model=qwen2.5-coder-0.5b --task=humaneval --heads=L0H6,L1H11 --curve \
        --skip_samples=16 --num_samples=24
"""

from __future__ import annotations

import dataclasses

from jaxloc import cli, files
from jaxloc.config import SEED, setting
from jaxloc.errors import UserError
from jaxloc.fixed_ablation import evaluate_heads, load_documents
from jaxloc.units import parse_units, units_per_layer
from jaxloc.main import engine_flags
from jaxloc.models.loading import read_config


@dataclasses.dataclass
class EvaluateConfig:
  task: str = setting(None, "Registered task name, a custom .jsonl file, or an lm-evaluation-harness task as "
                      "lm_eval:<task name or task .yaml>.", type=str, required=True)
  task_options: dict = setting({}, "Task options as key=value (e.g. subtasks=2da,2ds for arithmetic).")
  heads: list = setting([], "Heads to ablate, e.g. L15H13,L16H21 (none: the unablated model).")
  neurons: list = setting([], "MLP neurons to ablate instead of heads, e.g. L3N117,L20N5 (the input of down_proj at "
                          "that index is zeroed).")
  ablation: str = setting("zero", "Zero the heads (neurons), or replace them by their mean output over the evaluated "
                          "prompts.", choices=("zero", "mean"))
  num_samples: int = setting(None, "Documents to evaluate (seeded subset); default all.", type=int, lower=1)
  seed: int = setting(0, "Seed of the document subset.", **SEED)
  skip_samples: int = setting(0, "Evaluate the --num_samples documents after the first this-many of the seeded draw: "
                              "the held-out documents of a localization run with --num_samples=<this>, "
                              "--validation_samples=<--num_samples> and the same --seed.", lower=0)
  data_dir: str = setting(None, "Directory of offline dataset files (default $JAXLOC_DATA).", type=str)
  output_json: str = setting(None, "Where to write the result.", type=str)
  curve: bool = setting(False, "Treat --heads (--neurons) as a ranking: evaluate the unablated model and the top-1, "
                        "top-2, …, all ablated, as one batch (the result gains 'curve', each prefix's relative drop with "
                        "its 95% interval over the documents).")
  progress: bool = setting(True, "Show a progress bar.")


def main(config: EvaluateConfig) -> dict:
  if config.heads and config.neurons:
    raise UserError("give --heads or --neurons, not both")
  if config.curve and not (config.heads or config.neurons):
    raise UserError("--curve evaluates the prefixes of a ranking: give the ranking with --heads or --neurons")
  # An unknown task, a missing dataset, a malformed line, a unit the model does not have or an output that cannot be
  # written is reported before the model loads.
  loaded = load_documents(config.task, config.task_options, num_samples=config.num_samples, seed=config.seed,
                          data_dir=config.data_dir, skip_samples=config.skip_samples)
  if config.heads or config.neurons:
    unit = "neurons" if config.neurons else "heads"
    model_config = read_config(cli.FLAGS.model)
    parse_units(config.neurons or config.heads, model_config.num_layers, units_per_layer(model_config, unit), unit)
  if config.output_json:
    files.check_writable(config.output_json, "--output_json")
  engine = engine_flags.engine_from_flags()
  result = evaluate_heads(engine, config.task, heads=config.heads, ablation=config.ablation,
                          num_samples=config.num_samples, seed=config.seed, data_dir=config.data_dir,
                          task_options=config.task_options, progress=config.progress, curve=config.curve,
                          loaded=loaded, neurons=config.neurons, skip_samples=config.skip_samples)
  unit = "neurons" if config.neurons else "heads"
  for row in result.get("curve", []):
    print(f"{len(row[unit])} {unit} ablated: " + ", ".join(
        f"{name} {value:.4f}" + (_drop(row, name) if row[unit] else "") for name, value in row["metrics"].items()))
  for name, value in result["metrics"].items():
    print(f"{name}: {value:.4f}")
  if config.output_json:
    files.write_json(config.output_json, result)
  return result


def _drop(row: dict, name: str) -> str:
  """" (drop 12% [3%, 21%])": a curve row's relative drop in `name` with its 95% interval, where it has one (not
  for a task's aggregate-only metrics, nor against an unablated value of 0)."""
  drop = row.get("relative_drop", {}).get(name)
  interval = row.get("relative_drop_interval", {}).get(name, [None, None])
  if drop is None or None in interval:
    return ""
  return f" (drop {drop:.0%} [{interval[0]:.0%}, {interval[1]:.0%}])"


def console() -> None:
  cli.console(EvaluateConfig, main, model_flags=True)
