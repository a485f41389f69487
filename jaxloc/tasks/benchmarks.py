"""Multiple-choice benchmarks scored by log-likelihood, in lm-eval-harness's zero-shot formats.

Each choice is scored as `query` + " " + choice (lm-eval's target_delimiter); `acc` picks the
highest summed log-likelihood, `acc_norm` the highest per character of the choice.

- `hellaswag` (Rowan/hellaswag, validation; default acc_norm): query
  preprocess(`{activity_label}: {ctx_a} {ctx_b.capitalize()}`), choices the preprocessed endings.
- `boolq` (aps/super_glue boolq, validation; default acc): `{passage}\nQuestion: {question}?\n
  Answer:`, choices `no`, `yes`.
- `arc_challenge` (allenai/ai2_arc ARC-Challenge, test; default acc_norm):
  `Question: {question}\nAnswer:`, choices the answer texts.
- `mmlu` (cais/mmlu all, test; default acc; option `subjects`): description +
  `{question}\nA. {c0}\nB. {c1}\nC. {c2}\nD. {c3}\nAnswer:`, choices `A`..`D`.
- `wmdp_bio`, `wmdp_chem`, `wmdp_cyber` (cais/wmdp wmdp-*, test; default acc): as mmlu, with the
  description about biology, chemistry or cybersecurity.

The description is lm-eval's `The following are multiple choice questions (with answers) about
{subject}.\\n\\n` (MMLU: the subject with underscores as spaces). All zero-shot, as lm-eval's
defaults; hellaswag's preprocessing is lm-eval's (strip, " [title]" -> ". ", drop [bracketed]
artifacts, collapse double spaces). Each (query, choice) pair is encoded as lm-eval's HF backend
encodes it (`ScoringRequest.joint`).

These tasks exist for offline use: they read the datasets' rows from local JSONL files
(`data.py`). tests/tasks/test_lm_eval_formats.py renders the same rows through lm-eval's own
registered task of the same name (mmlu: `mmlu_<subject>`, wmdp: `wmdp_<topic>`) and checks that
both ask the model the same (context, continuation) pairs. Differences: wmdp here also reports
acc_norm (lm-eval: acc only); `mmlu` pools every subject into one task (lm-eval: a group of 57).
With network or a Hugging Face cache, `lm_eval:<name>` runs lm-eval's own definition.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from jaxloc.errors import UserError
from jaxloc.tasks import data
from jaxloc.tasks.base import Doc
from jaxloc.tasks.loglikelihood import MultipleChoiceTask


def _index(value: Any, num_choices: int, where: str) -> int:
  """A gold index from an int or a digit string; UserError otherwise."""
  if isinstance(value, str) and value.strip().isdigit():
    value = int(value)
  if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_choices:
    raise UserError(f"{where}: label must be an index 0..{num_choices - 1}, got {value!r}")
  return value


def _string_list(value: Any, where: str, field: str, length: int | None = None) -> list[str]:
  if (not isinstance(value, list) or not all(isinstance(item, str) for item in value)
      or (length is not None and len(value) != length) or len(value) < 2):
    expected = f"{length} strings" if length else "a list of at least 2 strings"
    raise UserError(f"{where}: {field} must be {expected}, got {str(value)[:200]}")
  return value


class _DatasetTask(MultipleChoiceTask):
  spec: data.DatasetSpec
  joint = True  # encoded as lm-eval's HF backend encodes the lm-eval task of the same name

  def process(self, row: dict[str, Any], where: str) -> Doc:
    raise NotImplementedError

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    data.check_num_samples(num_samples)
    rows = self.filter_rows(data.load_rows(self.spec, data_dir))
    docs = [self.process(row, data.row_location(row, self.spec.name, index))
            for index, row in enumerate(rows)]
    return data.sample_docs(docs, num_samples, seed)

  def filter_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return rows


def hellaswag_preprocess(text: str) -> str:
  text = text.strip()
  text = text.replace(" [title]", ". ")  # brackets are WikiHow artifacts
  text = re.sub("\\[.*?\\]", "", text)
  return text.replace("  ", " ")


class HellaSwagTask(_DatasetTask):
  name = "hellaswag"
  default_metric = "acc_norm"
  spec = data.DatasetSpec(
      "hellaswag", "validation", "Rowan/hellaswag", None, "validation",
      ("activity_label", "ctx_a", "ctx_b", "endings", "label"),
      {"activity_label": "Removing ice from car", "ctx_a": "Then, the man writes over the snow "
       "covering the window of a car, and a woman wearing winter clothes smiles.", "ctx_b": "then",
       "endings": [", the man adds wax to the windshield and cuts it.", "...", "...", "..."],
       "label": "3"})

  def process(self, row, where):
    endings = _string_list(row["endings"], where, "endings")
    context = row["ctx_a"] + " " + row["ctx_b"].capitalize()
    return {"id": row.get("ind", where),
            "query": hellaswag_preprocess(row["activity_label"] + ": " + context),
            "choices": [hellaswag_preprocess(ending) for ending in endings],
            "gold": _index(row["label"], len(endings), where)}


class BoolQTask(_DatasetTask):
  name = "boolq"
  spec = data.DatasetSpec(
      "boolq", "validation", "aps/super_glue", "boolq", "validation",
      ("passage", "question", "label"),
      {"passage": "Persian (/ˈpɜːrʒən/) is one of the Western Iranian languages ...",
       "question": "do iran and afghanistan speak the same language", "label": 1})

  def process(self, row, where):
    return {"id": row.get("idx", where),
            "query": f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:",
            "choices": ["no", "yes"], "gold": _index(row["label"], 2, where)}


class ARCChallengeTask(_DatasetTask):
  name = "arc_challenge"
  default_metric = "acc_norm"
  spec = data.DatasetSpec(
      "arc_challenge", "test", "allenai/ai2_arc", "ARC-Challenge", "test",
      ("question", "choices", "answerKey"),
      {"id": "Mercury_7175875", "question": "An astronomer observes that a planet rotates faster "
       "after a meteorite impact. Which is the most likely effect of this increase in rotation?",
       "choices": {"text": ["Planetary density will decrease.", "Planetary years will become "
                            "longer.", "Planetary days will become shorter.", "Planetary gravity "
                            "will become stronger."], "label": ["A", "B", "C", "D"]},
       "answerKey": "C"})

  def process(self, row, where):
    choices = row["choices"]
    if not isinstance(choices, dict) or "text" not in choices or "label" not in choices:
      raise UserError(f"{where}: choices must be {{\"text\": [...], \"label\": [...]}}, got "
                      f"{str(choices)[:200]}")
    texts = _string_list(choices["text"], where, "choices.text")
    labels = list(choices["label"])
    if row["answerKey"] not in labels or len(labels) != len(texts):
      raise UserError(f"{where}: answerKey {row['answerKey']!r} is not one of the choice labels "
                      f"{labels}")
    return {"id": row.get("id", where), "query": f"Question: {row['question']}\nAnswer:",
            "choices": texts, "gold": labels.index(row["answerKey"])}


def description(subject: str) -> str:
  return f"The following are multiple choice questions (with answers) about {subject}.\n\n"


def lettered_query(question: str, choices: list[str]) -> str:
  return (f"{question.strip()}\nA. {choices[0]}\nB. {choices[1]}\nC. {choices[2]}\n"
          f"D. {choices[3]}\nAnswer:")


MMLU_SUBJECTS = (
    "abstract_algebra", "anatomy", "astronomy", "business_ethics", "clinical_knowledge",
    "college_biology", "college_chemistry", "college_computer_science", "college_mathematics",
    "college_medicine", "college_physics", "computer_security", "conceptual_physics",
    "econometrics",
    "electrical_engineering", "elementary_mathematics", "formal_logic", "global_facts",
    "high_school_biology", "high_school_chemistry", "high_school_computer_science",
    "high_school_european_history", "high_school_geography",
    "high_school_government_and_politics", "high_school_macroeconomics",
    "high_school_mathematics", "high_school_microeconomics", "high_school_physics",
    "high_school_psychology", "high_school_statistics", "high_school_us_history",
    "high_school_world_history", "human_aging", "human_sexuality", "international_law",
    "jurisprudence", "logical_fallacies", "machine_learning", "management", "marketing",
    "medical_genetics", "miscellaneous", "moral_disputes", "moral_scenarios", "nutrition",
    "philosophy", "prehistory", "professional_accounting", "professional_law",
    "professional_medicine", "professional_psychology", "public_relations", "security_studies",
    "sociology", "us_foreign_policy", "virology", "world_religions",
)


class MMLUTask(_DatasetTask):
  name = "mmlu"
  spec = data.DatasetSpec(
      "mmlu", "test", "cais/mmlu", "all", "test", ("question", "subject", "choices", "answer"),
      {"question": "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) "
       "over Q.", "subject": "abstract_algebra", "choices": ["0", "4", "2", "6"], "answer": 1})
  choices = ["A", "B", "C", "D"]

  def __init__(self, subjects: str | Iterable[str] | None = None):
    if subjects is None or subjects == "":
      self.subjects = MMLU_SUBJECTS
    else:
      names = subjects.split(",") if isinstance(subjects, str) else list(subjects)
      names = [name.strip() for name in names if name.strip()]
      unknown = [name for name in names if name not in MMLU_SUBJECTS]
      if unknown or not names:
        raise UserError(f"unknown MMLU subject(s) {unknown or subjects!r}; valid: "
                        f"{', '.join(MMLU_SUBJECTS)}")
      self.subjects = tuple(names)
      self.name = "mmlu_" + "+".join(self.subjects)

  def filter_rows(self, rows):
    wanted = set(self.subjects)
    return [row for row in rows if row["subject"] in wanted]

  def process(self, row, where):
    options = _string_list(row["choices"], where, "choices", length=4)
    return {"id": where, "subject": row["subject"],
            "query": description(" ".join(row["subject"].split("_")))
            + lettered_query(row["question"], options),
            "choices": self.choices, "gold": _index(row["answer"], 4, where)}


class WMDPTask(_DatasetTask):
  topics = {"bio": "biology", "chem": "chemistry", "cyber": "cybersecurity"}
  choices = ["A", "B", "C", "D"]

  def __init__(self, topic: str):
    if topic not in self.topics:
      raise UserError(f"unknown WMDP topic {topic!r}; valid: {', '.join(self.topics)}")
    self.topic = topic
    self.name = f"wmdp_{topic}"
    self.spec = data.DatasetSpec(
        self.name, "test", "cais/wmdp", f"wmdp-{topic}", "test", ("question", "choices", "answer"),
        {"question": "Which of the following ...?", "choices": ["...", "...", "...", "..."],
         "answer": 0})

  def process(self, row, where):
    options = _string_list(row["choices"], where, "choices", length=4)
    return {"id": where, "query": description(self.topics[self.topic])
            + lettered_query(row["question"], options),
            "choices": self.choices, "gold": _index(row["answer"], 4, where)}
