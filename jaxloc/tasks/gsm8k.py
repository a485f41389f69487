"""GSM8K in lm-eval-harness's `gsm8k` format: 5-shot, greedy generation, exact match.

Prompt: five solved training problems, then the test question, each as
`Question: {question}\\nAnswer: {answer}` (answers with their `<<calc>>` annotations and the final
`#### N` line), joined by "\\n\\n"; the test item ends at `Answer:`. Generation stops at
`Question:`, `</s>`, `<|im_end|>` or EOS, at most 256 new tokens.

Metrics (lm-eval's two filters, then exact_match ignoring case, commas, `$`, everything up to
`#### ` and a trailing period, applied to both prediction and reference):
- `exact_match_strict`: the number after the first `#### ` (regex `#### (\\-?[0-9\\.\\,]+)`),
- `exact_match_flexible` (default): the last number in the text (regex
  `(-?[$0-9.,]{2,})|(-?[0-9]+)`); a model whose ablation breaks the `####` format but not the
  arithmetic still scores here, which is what localization should measure.

Deviation from lm-eval: lm-eval draws 5 random training examples per test question; jaxloc uses
the first five training problems for every question (lm-eval's `first_n` sampler). The prompt
prefix is then shared, which the engine computes once per mask, and it needs no training split
offline.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from jaxloc.engine.requests import GenerationRequest
from jaxloc.tasks import data
from jaxloc.tasks.base import Doc, Task

SPEC = data.DatasetSpec(
    "gsm8k", "test", "openai/gsm8k", "main", "test", ("question", "answer"),
    {"question": "Janet's ducks lay 16 eggs per day. ...", "answer": "Janet sells 16 - 3 - 4 = "
     "<<16-3-4=9>>9 duck eggs a day.\nShe makes 9 * 2 = $<<9*2=18>>18 every day at the farmer's "
     "market.\n#### 18"})

# The first five problems of the GSM8K training split, verbatim.
FEW_SHOT = (
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in "
     "May. How many clips did Natalia sell altogether in April and May?",
     "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
     "altogether in April and May.\n#### 72"),
    ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
     "How much did she earn?",
     "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = "
     "$<<0.2*50=10>>10.\n#### 10"),
    ("Betty is saving money for a new wallet which costs $100. Betty has only half of the money "
     "she needs. Her parents decided to give her $15 for that purpose, and her grandparents twice "
     "as much as her parents. How much more money does Betty need to buy the wallet?",
     "In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.\nBetty's grandparents gave her "
     "15 * 2 = $<<15*2=30>>30.\nThis means, Betty needs 100 - 50 - 30 - 15 = "
     "$<<100-50-30-15=5>>5 more.\n#### 5"),
    ("Julie is reading a 120-page book. Yesterday, she was able to read 12 pages and today, she "
     "read twice as many pages as yesterday. If she wants to read half of the remaining pages "
     "tomorrow, how many pages should she read?",
     "Maila read 12 x 2 = <<12*2=24>>24 pages today.\nSo she was able to read a total of 12 + 24 "
     "= <<12+24=36>>36 pages since yesterday.\nThere are 120 - 36 = <<120-36=84>>84 pages left to "
     "be read.\nSince she wants to read half of the remaining pages tomorrow, then she should read "
     "84/2 = <<84/2=42>>42 pages.\n#### 42"),
    ("James writes a 3-page letter to 2 different friends twice a week.  How many pages does he "
     "write a year?",
     "He writes each friend 3*2=<<3*2=6>>6 pages a week\nSo he writes 6*2=<<6*2=12>>12 pages every "
     "week\nThat means he writes 12*52=<<12*52=624>>624 pages a year\n#### 624"),
)
STOP = ("Question:", "</s>", "<|im_end|>")
MAX_NEW_TOKENS = 256
INVALID = "[invalid]"  # lm-eval's fallback when a filter finds nothing
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
_IGNORE = (",", "\\$", "(?s).*#### ", "\\.$")


def question_text(question: str) -> str:
  return f"Question: {question}\nAnswer:"


def few_shot_prefix() -> str:
  return "".join(f"{question_text(q)} {a}\n\n" for q, a in FEW_SHOT)


def strict_extract(text: str) -> str:
  """The number after the first '#### ', as lm-eval's strict-match filter."""
  match = _STRICT.search(text)
  return match.group(1).strip() if match else INVALID


def flexible_extract(text: str) -> str:
  """The last number-looking span, as lm-eval's flexible-extract filter (group_select=-1)."""
  matches = _FLEXIBLE.findall(text)
  if not matches:
    return INVALID
  groups = [group for group in matches[-1] if group]
  return groups[0].strip() if groups else INVALID


def normalize(text: str) -> str:
  for pattern in _IGNORE:
    text = re.sub(pattern, "", text)
  return text.lower()


def exact_match(prediction: str, reference_answer: str) -> bool:
  return normalize(prediction) == normalize(reference_answer)


class GSM8KTask(Task):
  name = "gsm8k"
  output_type = "generate"
  metric_names = ("exact_match_strict", "exact_match_flexible")
  default_metric = "exact_match_flexible"

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    data.check_num_samples(num_samples)
    rows = data.load_rows(SPEC, data_dir)
    docs = [{"id": f"gsm8k-{index}", "question": row["question"], "answer": row["answer"]}
            for index, row in enumerate(rows)]
    return data.sample_docs(docs, num_samples, seed)

  def requests(self, docs: Sequence[Doc], tokenizer=None) -> list[GenerationRequest]:
    prefix = few_shot_prefix()
    return [GenerationRequest(prefix + question_text(doc["question"]), stop=STOP,
                              max_new_tokens=MAX_NEW_TOKENS) for doc in docs]

  def doc_metrics(self, docs: Sequence[Doc], outputs: Sequence[Sequence[str]]
                  ) -> dict[str, np.ndarray]:
    strict = np.array([[exact_match(strict_extract(text), doc["answer"])
                        for text, doc in zip(texts, docs, strict=True)] for texts in outputs])
    flexible = np.array([[exact_match(flexible_extract(text), doc["answer"])
                          for text, doc in zip(texts, docs, strict=True)] for texts in outputs])
    return {"exact_match_strict": strict.reshape(len(outputs), len(docs)).astype(np.float64),
            "exact_match_flexible": flexible.reshape(len(outputs), len(docs)).astype(np.float64)}
