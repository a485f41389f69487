"""Offline-first loading of benchmark datasets, and the seeded identification subset.

Where a dataset comes from, first match wins:
1. a local JSONL file `<data_dir>/<dataset>/<split>.jsonl`, where `data_dir` is the `--data_dir`
   flag or else the `JAXLOC_DATA` environment variable. The files and their line formats:

   - gsm8k: `<data_dir>/gsm8k/test.jsonl`, `{"question": str, "answer": str ending "#### <n>"}`
   - mbpp: `<data_dir>/mbpp/test.jsonl`,
     `{"task_id": int, "text": str, "code": str, "test_list": [3 assert strings]}`
   - hellaswag: `<data_dir>/hellaswag/validation.jsonl`,
     `{"activity_label": str, "ctx_a": str, "ctx_b": str, "endings": [4 str], "label": "0".."3"}`
   - boolq: `<data_dir>/boolq/validation.jsonl`,
     `{"passage": str, "question": str, "label": 0 (no) or 1 (yes)}`
   - arc_challenge: `<data_dir>/arc_challenge/test.jsonl`,
     `{"question": str, "choices": {"text": [str], "label": [str]}, "answerKey": str}`
   - mmlu: `<data_dir>/mmlu/test.jsonl`,
     `{"question": str, "subject": str, "choices": [4 str], "answer": 0..3}`
   - wmdp_bio, wmdp_chem, wmdp_cyber: `<data_dir>/wmdp_bio/test.jsonl` (and so on),
     `{"question": str, "choices": [4 str], "answer": 0..3}`

   These are the Hugging Face datasets' own fields, so `ds.to_json(path, lines=True)` on a machine
   with network writes a valid file.
2. `datasets.load_dataset` when the `datasets` package is importable and either the network or the
   local Hugging Face cache has the data. HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are respected;
   without them we probe the hub endpoint (once per process, a few seconds at most) and, when it
   is unreachable, read the cache only, so a machine without network fails fast instead of
   hanging on retries.
3. Otherwise a UserError naming the dataset, the exact file to create and its line format.

Docs are plain dicts. `sample_docs` draws the identification subset: a seeded permutation's first
`num_samples` indices, kept in dataset order (so a smaller sample is a subset of a larger one with
the same seed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import socket
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from jaxloc.errors import UserError

log = logging.getLogger(__name__)

DATA_DIR_ENV = "JAXLOC_DATA"
_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
_NETWORK_PROBE_TIMEOUT_S = 3.0
# Rows read from a local file carry "path:line" under this key, for error messages.
WHERE_KEY = "_jaxloc_where"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """One split of one benchmark: where jaxloc finds it locally and on the Hugging Face hub.

  `fields` are the keys every row must have; `example` is a line shown in the offline-miss error.
  """

  name: str
  split: str
  hf_path: str
  hf_config: str | None
  hf_split: str
  fields: tuple[str, ...]
  example: dict[str, Any]

  def local_path(self, data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / self.name / f"{self.split}.jsonl"


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
  """`data_dir` if given, else $JAXLOC_DATA, else None."""
  chosen = data_dir if data_dir not in (None, "") else os.environ.get(DATA_DIR_ENV) or None
  return None if chosen is None else Path(chosen).expanduser()


def read_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
  """(1-based line number, parsed value) for every non-blank line; UserError on bad JSON."""
  path = Path(path)
  try:
    lines = path.read_text(encoding="utf-8").splitlines()
  except FileNotFoundError:
    raise UserError(f"file not found: {path}") from None
  except (OSError, UnicodeDecodeError) as error:
    raise UserError(f"cannot read {path}: {error}") from None
  for line_number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    try:
      yield line_number, json.loads(line)
    except json.JSONDecodeError as error:
      raise UserError(f"{path}:{line_number}: not valid JSON ({error.msg} at column "
                      f"{error.colno})") from None
    except RecursionError:  # the parser recurses once per level: `[` * 100000 is no task line
      raise UserError(f"{path}:{line_number}: not valid JSON for a task line (nested too deeply to "
                      "read)") from None


def _read_local(spec: DatasetSpec, path: Path) -> list[dict[str, Any]]:
  rows = []
  for line_number, row in read_jsonl(path):
    if not isinstance(row, dict):
      raise UserError(f"{path}:{line_number}: expected a JSON object like "
                      f"{json.dumps(spec.example, ensure_ascii=False)}, got {type(row).__name__}")
    missing = [field for field in spec.fields if field not in row]
    if missing:
      raise UserError(f"{path}:{line_number}: missing field(s) {missing}; each line of the "
                      f"{spec.name} file needs {list(spec.fields)}, e.g. "
                      f"{json.dumps(spec.example, ensure_ascii=False)}")
    rows.append({**row, WHERE_KEY: f"{path}:{line_number}"})
  if not rows:
    raise UserError(f"{path} holds no rows; expected one JSON object per line, e.g. "
                    f"{json.dumps(spec.example, ensure_ascii=False)}")
  return rows


def row_location(row: dict[str, Any], dataset: str, index: int) -> str:
  """"path:line" for a row from a local file, else "<dataset> row <index + 1>"."""
  return row.get(WHERE_KEY) or f"{dataset} row {index + 1}"


def _env_true(name: str) -> bool:
  return os.environ.get(name, "").strip().upper() in _TRUE_VALUES


@functools.cache
def hub_reachable() -> bool:
  """Whether the Hugging Face endpoint accepts a TCP connection within a few seconds.

  DNS lookups can block far longer than a socket timeout, so the probe runs in a daemon thread
  that we stop waiting for.
  """
  endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
  parsed = urllib.parse.urlparse(endpoint)
  host = parsed.hostname or "huggingface.co"
  port = parsed.port or (80 if parsed.scheme == "http" else 443)
  reachable = []

  def probe():
    try:
      with socket.create_connection((host, port), timeout=_NETWORK_PROBE_TIMEOUT_S):
        reachable.append(True)
    except OSError:
      pass

  thread = threading.Thread(target=probe, daemon=True)
  thread.start()
  thread.join(_NETWORK_PROBE_TIMEOUT_S + 0.5)
  return bool(reachable)


@contextlib.contextmanager
def _hf_offline_mode():
  """Make `datasets` read its cache only, without network retries.

  Both libraries read these module constants at call time; the environment variables alone are
  read once at import, which may already have happened.
  """
  import datasets.config
  import huggingface_hub.constants

  saved = (datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE)
  datasets.config.HF_HUB_OFFLINE = True
  huggingface_hub.constants.HF_HUB_OFFLINE = True
  try:
    yield
  finally:
    datasets.config.HF_HUB_OFFLINE, huggingface_hub.constants.HF_HUB_OFFLINE = saved


@contextlib.contextmanager
def hub_access() -> Iterator[bool]:
  """Within the block, `datasets` reads the local Hugging Face cache only when HF_DATASETS_OFFLINE or
  HF_HUB_OFFLINE is set or the hub is unreachable (`hub_reachable`), so a machine without network fails fast
  instead of retrying; yields whether it is offline. Needs `datasets`."""
  offline = _env_true("HF_DATASETS_OFFLINE") or _env_true("HF_HUB_OFFLINE") or not hub_reachable()
  with _hf_offline_mode() if offline else contextlib.nullcontext():
    yield offline


def _load_from_hub(spec: DatasetSpec) -> tuple[list[dict[str, Any]] | None, str]:
  """Rows from `datasets.load_dataset`, or (None, why not)."""
  try:
    import datasets
  except ImportError:
    return None, "the `datasets` package is not installed"
  offline = False
  try:
    with hub_access() as offline:
      dataset = datasets.load_dataset(spec.hf_path, spec.hf_config, split=spec.hf_split)
  except Exception as error:  # datasets raises many types for "not there"
    where = "the local Hugging Face cache (offline)" if offline else "the Hugging Face hub"
    return None, f"{where} does not have it ({type(error).__name__}: {str(error)[:200]})"
  return [dict(row) for row in dataset], ""


def load_rows(spec: DatasetSpec, data_dir: str | os.PathLike | None = None
              ) -> list[dict[str, Any]]:
  """All rows of the split, from the local JSONL, else the hub/cache; UserError on a miss."""
  resolved = resolve_data_dir(data_dir)
  if resolved is not None and spec.local_path(resolved).exists():
    return _read_local(spec, spec.local_path(resolved))
  rows, why_not = _load_from_hub(spec)
  if rows is not None:
    return rows
  hf_name = spec.hf_path + (f" (config {spec.hf_config!r})" if spec.hf_config else "")
  if resolved is None:
    where = (f"<data_dir>/{spec.name}/{spec.split}.jsonl and pass --data_dir=<data_dir> (or set "
             f"{DATA_DIR_ENV}=<data_dir>)")
  else:
    where = f"{spec.local_path(resolved)} (no such file)"
  raise UserError(
      f"dataset {spec.name!r} (split {spec.split!r}) is not available offline: {why_not}. "
      f"Put it at {where}, one JSON object per line with fields {list(spec.fields)}, e.g. "
      f"{json.dumps(spec.example, ensure_ascii=False)}. On a machine with network, "
      f"datasets.load_dataset({spec.hf_path!r}, {spec.hf_config!r}, split={spec.hf_split!r})"
      f".to_json(path, lines=True) writes it; or make the Hugging Face cache hold {hf_name}.")


def check_num_samples(num_samples: int | None) -> None:
  if num_samples is not None and (isinstance(num_samples, bool) or not isinstance(num_samples, int)
                                  or num_samples < 1):
    raise UserError(f"num_samples must be a positive integer or None (all), got {num_samples!r}")


def sample_docs(docs: Sequence[dict[str, Any]], num_samples: int | None, seed: int = 0
                ) -> list[dict[str, Any]]:
  """A seeded subset of `num_samples` docs in dataset order; all docs when None or too many."""
  check_num_samples(num_samples)
  if num_samples is None or num_samples >= len(docs):
    if num_samples is not None and num_samples > len(docs):
      log.warning("num_samples=%d but only %d docs exist; using all of them", num_samples,
                  len(docs))
    return list(docs)
  chosen = np.random.default_rng(seed).permutation(len(docs))[:num_samples]
  return [docs[index] for index in np.sort(chosen)]
