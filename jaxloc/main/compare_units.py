"""Heads against neurons at equal budgets, for a model and task: is the capability in a few attention heads (the
compressed-sensing paper) or in MLP neurons (CNL)?

    python -m experiments.compare_units --heads_run=runs/plurals_heads --neurons_run=runs/plurals_cnl \
        --head_counts=1,3,5,10 --output_dir=runs/plurals_units

Ablates the heads run's top k heads against the neurons run's top k × head_dim neurons (the same number of zeroed
parameters: a head's o_proj slice against neurons' down_proj columns), and random heads and neurons of the same
budgets, on the held-out documents of the target and the general tasks (as the heads run drew them). Writes
compare_units.json and compare_units.png and prints the table.
"""

from __future__ import annotations

import dataclasses
import os

from jaxloc import cli, files
from jaxloc.api import read_run
from jaxloc.config import SEED, setting
from jaxloc.errors import UserError
from jaxloc.main import engine_flags
from jaxloc.report import heads_vs_neurons as report
from jaxloc.studies import heads_vs_neurons


@dataclasses.dataclass
class CompareUnitsConfig:
  heads_run: str = setting(None, "A finished heads run (experiments.localize --output_dir).", type=str,
                           required=True)
  neurons_run: str = setting(None, "A finished neurons run of the same model and task (--unit=neurons).", type=str,
                             required=True)
  head_counts: list = setting([1, 3, 5, 10], "Budgets in heads; each is compared with head_dim times as many "
                              "neurons.", element=int)
  draws: int = setting(3, "Random sets of heads and of neurons per budget.", lower=0)
  seed: int = setting(0, "Seed of the random sets.", **SEED)
  ablation: str = setting("zero", "Zero ablation, or each unit's mean over the documents.", choices=("zero", "mean"))
  output_dir: str = setting(None, "Where compare_units.json and compare_units.png go.", type=str, required=True)


def main(config: CompareUnitsConfig) -> dict:
  files.check_output_directory(config.output_dir, "--output_dir")
  runs = [read_run(config.heads_run), read_run(config.neurons_run)]
  heads_vs_neurons.check_pair(*runs)
  tasks = heads_vs_neurons.held_out_tasks(runs[0].info)  # missing datasets are reported before the model loads
  model = runs[0].info["model"]
  if cli.FLAGS["model"].present and cli.FLAGS.model != model:
    raise UserError(f"the runs localized {model}; --model={cli.FLAGS.model} would compare another model's units")
  cli.FLAGS.model = model
  engine = engine_flags.engine_from_flags()
  heads, neurons = (heads_vs_neurons.read_ranking(run, engine.model_config) for run in runs)
  result = heads_vs_neurons.compare(engine, heads, neurons, tasks, config.head_counts, config.draws, config.seed,
                                    config.ablation)
  print(report.markdown(result))
  files.write_json(os.path.join(config.output_dir, "compare_units.json"), result)
  report.plot(result, os.path.join(config.output_dir, "compare_units.png"))
  print(f"outputs in {config.output_dir}")
  return result


def console() -> None:
  cli.console(CompareUnitsConfig, main, model_flags=True)
