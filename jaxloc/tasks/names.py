"""How a task is named in tables, plots and output directories."""

from __future__ import annotations

import os


def task_label(name: str) -> str:
  """A registered task's name, or for a task given by a file (a custom .jsonl, an lm-eval task YAML) the file's
  stem (not a truncated path), after its `lm_eval:` prefix if it has one."""
  if not name.endswith((".jsonl", ".yaml", ".yml")):
    return name
  prefix = "lm_eval:" if name.startswith("lm_eval:") else ""
  return prefix + os.path.splitext(os.path.basename(name))[0]
