"""Task test fixtures: JSONL writers (the tokenizer and the offline setup are the root conftest's)."""

import json

import pytest


@pytest.fixture
def write_jsonl(tmp_path):
  """write_jsonl(relative_path, rows) -> path: rows (dicts, or raw strings for bad lines)."""

  def write(relative_path, rows):
    path = tmp_path / relative_path
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

  return write
