"""Check jaxloc against lm-eval's own evaluation of an lm-eval task: unablated, and with --heads ablated.

    python -m experiments.compare_lm_eval --task=lm_eval:jaxloc/configs/lm_eval/irregular_past.yaml \
        --heads=L1H5,L8H1 --num_samples=40 --output_json=/tmp/compare.json

The task file ships in the package: installed, `jaxloc-compare-lm-eval` takes it as
--task=lm_eval:<jaxloc.configs.DIRECTORY>/lm_eval/irregular_past.yaml.

lm-eval runs the task with its HF backend (transformers on the CPU, heads hooked on o_proj); jaxloc evaluates both
head sets as one batch. Prints every metric from both, the largest per-request log-likelihood difference (scored
tasks) or the share of identical generations (generation tasks). Needs pip install -e '.[test,lm-eval]'.
"""

from __future__ import annotations

import dataclasses

from jaxloc import cli
from jaxloc.config import SEED, setting
from jaxloc.errors import UserError
from jaxloc.files import check_writable, write_json
from jaxloc.main import engine_flags
from jaxloc.models.torch_reference import load_hf_model
from jaxloc.tasks.evaluator import load_task
from jaxloc.tasks.harness import HarnessTask
from jaxloc.tasks.harness_reference import compare, table


@dataclasses.dataclass
class CompareLmEvalConfig:
  task: str = setting(None, "An lm-evaluation-harness task: lm_eval:<task name or task .yaml>.", type=str,
                      required=True)
  task_options: dict = setting({}, "Task options as key=value (num_fewshot=N).")
  heads: list = setting([], "Heads to ablate in the second comparison, e.g. L1H5,L8H1 (none: unablated only).")
  num_samples: int = setting(None, "Documents (seeded subset); default all.", type=int, lower=1)
  seed: int = setting(0, "Seed of the document subset.", **SEED)
  batch_size: int = setting(16, "lm-eval's HF batch size.", lower=1)
  output_json: str = setting(None, "Where to write the comparison.", type=str)


def main(config: CompareLmEvalConfig) -> dict:
  if config.output_json:
    check_writable(config.output_json, "--output_json")

  task, docs = load_task(config.task, config.task_options, num_samples=config.num_samples, seed=config.seed,
                         data_dir=None)
  if not isinstance(task, HarnessTask):
    raise UserError(f"--task={config.task} is not an lm-eval task; give lm_eval:<task name or task .yaml>")
  engine = engine_flags.engine_from_flags()
  report = compare(engine, load_hf_model(cli.FLAGS.model), engine.tokenizer, task, docs, config.heads,
                   batch_size=config.batch_size)
  print(table(report))
  if config.output_json:
    write_json(config.output_json, report)
  return report


def console() -> None:
  cli.console(CompareLmEvalConfig, main, model_flags=True)
