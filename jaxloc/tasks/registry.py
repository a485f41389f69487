"""Task names -> tasks. `get_task("gsm8k")`, `get_task("arithmetic", subtasks="2da,2ds")`, a
path to a custom JSONL file (`get_task("my_task.jsonl")`, format in custom.py), or any
lm-evaluation-harness task by name or task YAML (`get_task("lm_eval:boolq")`,
`get_task("lm_eval:my_task.yaml", num_fewshot=5)`; harness.py).

Options per task (keyword arguments of `get_task`; strings are accepted, as flags give them):

| task                        | options                                                          |
|-----------------------------|------------------------------------------------------------------|
| `arithmetic`                | `subtasks`: comma-separated subset of 1dc,2da,2dm,2ds,3da,…,5ds  |
| `mmlu`                      | `subjects`: comma-separated MMLU subjects (default all 57)       |
| `induction`                 | `sequence_length`: words in the repeated sequence (default 10)   |
| `mbpp`, `humaneval`         | `timeout_s`: seconds per program in the sandbox (default 10)     |
| `lm_eval:<task or .yaml>`   | `num_fewshot`: few-shot examples (default: the task's own)       |
| every other task            | none                                                             |
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any, Callable

from jaxloc.errors import UserError
from jaxloc.tasks import arithmetic, benchmarks, chat, code, custom, gsm8k, harness, synthetic
from jaxloc.tasks.base import Task

_FACTORIES: dict[str, Callable[..., Task]] = {
    "arithmetic": arithmetic.ArithmeticTask,
    **{f"arithmetic_{subtask}":
       functools.partial(arithmetic.ArithmeticTask, (subtask,), name=f"arithmetic_{subtask}")
       for subtask in arithmetic.SUBTASKS},
    "arithmetic_1d_4shot": arithmetic.OneDigitFewShotTask,
    "gsm8k": gsm8k.GSM8KTask,
    "mbpp": code.MBPPTask,
    "humaneval": code.HumanEvalTask,
    "humaneval_solutions": code.HumanEvalSolutionsTask,
    "hellaswag": benchmarks.HellaSwagTask,
    "boolq": benchmarks.BoolQTask,
    "arc_challenge": benchmarks.ARCChallengeTask,
    "mmlu": benchmarks.MMLUTask,
    "wmdp_bio": functools.partial(benchmarks.WMDPTask, "bio"),
    "wmdp_chem": functools.partial(benchmarks.WMDPTask, "chem"),
    "wmdp_cyber": functools.partial(benchmarks.WMDPTask, "cyber"),
    "swearing": chat.SwearingTask,
    "rhyming": chat.RhymingTask,
    "counting": synthetic.CountingTask,
    "plurals": synthetic.PluralsTask,
    "induction": synthetic.InductionTask,
}


def task_names() -> list[str]:
  """Registered task names, sorted."""
  return sorted(_FACTORIES)


def _is_custom_path(name_or_path: str) -> bool:
  return name_or_path.endswith(".jsonl") or os.sep in name_or_path or os.path.isfile(name_or_path)


def get_task(name_or_path: str, **options: Any) -> Task:
  """The registered task `name_or_path`, the custom task in that JSONL file, or an lm-eval task
  (`lm_eval:<name or task YAML>`)."""
  if not isinstance(name_or_path, str) or not name_or_path:
    raise UserError(f"task must be a registered name or a .jsonl path, got {name_or_path!r}")
  if name_or_path.startswith(harness.PREFIX):
    factory = functools.partial(harness.HarnessTask, name_or_path[len(harness.PREFIX):])
  else:
    factory = _FACTORIES.get(name_or_path)
  if factory is None:
    if _is_custom_path(name_or_path):
      if options:
        raise UserError(f"custom task {name_or_path} takes no options, got {sorted(options)}")
      return custom.load_custom_task(name_or_path)
    raise UserError(f"unknown task {name_or_path!r}; registered tasks: {', '.join(task_names())}; "
                    f"or give the path of a custom .jsonl task file (one "
                    f'{{"prompt", "target"}} or {{"prompt", "choices", "label"}} object per line), or an '
                    f"lm-evaluation-harness task as lm_eval:<name or task .yaml>")
  accepted = [name for name in inspect.signature(factory).parameters if name != "name"]
  unknown = sorted(set(options) - set(accepted))
  if unknown:
    raise UserError(f"task {name_or_path!r} has no option(s) {unknown}; its options: "
                    f"{', '.join(accepted) or 'none'}")
  return factory(**options)
