"""Custom tasks from a user's JSONL file.

One JSON object per line, every line the same shape:
- `{"prompt": str, "target": str}`: scored by teacher forcing; tokens are `tokenizer(prompt)` with
  the tokenizer's default special tokens, then `tokenizer(target, add_special_tokens=False)`, so
  put the separating space at the start of the target (`" Paris"`). Metrics: `accuracy` (1 when
  every target token is the argmax; greedy exactness) and `logprob` (summed target log-probability),
  each the mean over samples. Default metric: `accuracy`.
- `{"prompt": str, "choices": [str, ...], "label": int}`: multiple choice by log-likelihood, each
  choice appended to the prompt exactly as written (so, like `target`, start it with the space it
  needs). Metrics: `acc` and `acc_norm` (log-likelihood per character of the choice, lm-eval's
  normalization). Default metric: `acc`.
An optional `"id"` (string or integer, unique) names the sample. Blank lines are skipped. Any
other problem — bad JSON, a missing, unknown or mistyped field, a label out of range, mixed
shapes, duplicate ids, an empty file — is a UserError with the file path and the 1-based line
number. Nothing is silently dropped. Lines without an id that repeat an earlier line exactly are
kept, each a document of its own, with one warning that counts them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from jaxloc.errors import UserError
from jaxloc.tasks import data
from jaxloc.tasks.base import Doc, Task
from jaxloc.tasks.loglikelihood import MultipleChoiceTask, TargetTask

log = logging.getLogger(__name__)

_TARGET_KEYS = {"prompt", "target"}
_CHOICE_KEYS = {"prompt", "choices", "label"}
_OPTIONAL_KEYS = {"id"}
_SHAPES = ('{"prompt": "...", "target": "..."} or '
           '{"prompt": "...", "choices": ["...", "..."], "label": 0}, optionally with "id"')


def _validate_line(row: Any, where: str) -> tuple[str, Doc]:
  """(shape, doc) for one parsed line; shape is "target" or "choices"."""
  if not isinstance(row, dict):
    raise UserError(f"{where}: expected a JSON object {_SHAPES}, got {type(row).__name__}")
  keys = set(row)
  shape = "choices" if "choices" in keys or "label" in keys else "target"
  required = _CHOICE_KEYS if shape == "choices" else _TARGET_KEYS
  if "target" in keys and shape == "choices":
    raise UserError(f"{where}: has both \"target\" and \"choices\"/\"label\"; a line is either "
                    f"{_SHAPES}")
  missing = sorted(required - keys)
  if missing:
    raise UserError(f"{where}: missing field(s) {missing}; expected {_SHAPES}")
  unknown = sorted(keys - required - _OPTIONAL_KEYS)
  if unknown:
    raise UserError(f"{where}: unknown field(s) {unknown}; allowed fields are "
                    f"{sorted(required | _OPTIONAL_KEYS)}")
  if not isinstance(row["prompt"], str) or not row["prompt"]:
    raise UserError(f"{where}: \"prompt\" must be a non-empty string, got {row['prompt']!r}")
  if "id" in row and (isinstance(row["id"], bool) or not isinstance(row["id"], (str, int))):
    raise UserError(f"{where}: \"id\" must be a string or an integer, got {row['id']!r}")
  if shape == "target":
    if not isinstance(row["target"], str) or not row["target"]:
      raise UserError(f"{where}: \"target\" must be a non-empty string, got {row['target']!r}")
    return shape, {"prompt": row["prompt"], "target": row["target"], "id": row.get("id")}
  choices, label = row["choices"], row["label"]
  if (not isinstance(choices, list) or len(choices) < 2
      or not all(isinstance(choice, str) and choice for choice in choices)):
    raise UserError(f"{where}: \"choices\" must be a list of at least 2 non-empty strings, got "
                    f"{json.dumps(choices)[:200]}")
  if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(choices):
    raise UserError(f"{where}: \"label\" must be an integer index into choices, 0 to "
                    f"{len(choices) - 1}, got {label!r}")
  return shape, {"query": row["prompt"], "choices": list(choices), "gold": label,
                 "id": row.get("id")}


def read_custom_file(path: str | os.PathLike) -> tuple[str, list[Doc]]:
  """(shape, docs) of a custom task file, every line validated."""
  path = Path(path)
  if not path.is_file():
    raise UserError(f"custom task file not found: {path} (a custom task is a .jsonl file with one "
                    f"object per line: {_SHAPES})")
  file_shape, first_line = None, None
  docs: list[Doc] = []
  seen_ids: dict[Any, int] = {}
  seen_lines: dict[str, int] = {}  # a line without an id, as parsed -> the line it first appears on
  repeats: list[tuple[int, int]] = []  # (line, the earlier line it repeats)
  for line_number, row in data.read_jsonl(path):
    where = f"{path}:{line_number}"
    shape, doc = _validate_line(row, where)
    if file_shape is None:
      file_shape, first_line = shape, line_number
    elif shape != file_shape:
      raise UserError(f"{where}: this line is a {shape!r} line but line {first_line} is a "
                      f"{file_shape!r} line; one file holds one shape")
    if doc["id"] is not None:
      if doc["id"] in seen_ids:
        raise UserError(f"{where}: id {doc['id']!r} already used on line {seen_ids[doc['id']]}")
      seen_ids[doc["id"]] = line_number
    else:
      doc["id"] = f"line{line_number}"
      content = json.dumps(row, sort_keys=True)
      if content in seen_lines:
        repeats.append((line_number, seen_lines[content]))
      seen_lines.setdefault(content, line_number)
    docs.append(doc)
  if not docs:
    raise UserError(f"{path}: no samples (the file is empty); expected one object per line: "
                    f"{_SHAPES}")
  if repeats:
    log.warning("%s has %d line%s without an \"id\" repeating an earlier line exactly (the first, line %d, repeats "
                "line %d): each counts as a document of its own; remove the repeats to count each once", path,
                len(repeats), "" if len(repeats) == 1 else "s", *repeats[0])
  return file_shape, docs


class _CustomDocs:
  """Docs come from the file; `data_dir` has no meaning for a custom task."""

  path: Path
  docs: list[Doc]

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    return data.sample_docs(self.docs, num_samples, seed)


class CustomTargetTask(_CustomDocs, TargetTask):
  def __init__(self, path: Path, docs: list[Doc]):
    self.name, self.path, self.docs = str(path), path, docs


class CustomChoiceTask(_CustomDocs, MultipleChoiceTask):
  choice_delimiter = ""  # choices are appended exactly as the user wrote them

  def __init__(self, path: Path, docs: list[Doc]):
    self.name, self.path, self.docs = str(path), path, docs


def load_custom_task(path: str | os.PathLike) -> Task:
  """The task a custom JSONL file describes (validated eagerly, so errors surface at once)."""
  shape, docs = read_custom_file(path)
  return (CustomTargetTask if shape == "target" else CustomChoiceTask)(Path(path), docs)
