"""Runs a docs page written as a notebook session: its ```python blocks in order, in one namespace, each followed by
a ```text block holding what it printed. `python -m tests.api.notebook docs/api.md` runs the page and writes the
printed output into it; `tests/api/test_notebook.py` runs it and checks the page still says what the code prints.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys

BLOCK = re.compile(r"```python\n(.*?)```\n(?:\n```text\n.*?```\n)?", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def run(text: str) -> list[str]:
  """What each ```python block of a page prints, run in order in one namespace."""
  namespace: dict = {"__name__": "__notebook__"}
  outputs = []
  for code in BLOCK.findall(text):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      exec(compile(code, "<notebook>", "exec"), namespace)  # noqa: S102 - the page's own code
    outputs.append(printed.getvalue())
  return outputs


def recorded(text: str) -> list[str]:
  """The ```text block after each ```python block ("" where there is none)."""
  found = re.findall(r"```python\n.*?```\n(?:\n```text\n(.*?)```\n)?", text, flags=re.S)
  return list(found)


def with_outputs(text: str, outputs: list[str]) -> str:
  """The page with each ```python block followed by its printed output (none where it printed nothing)."""
  it = iter(outputs)

  def block(match: re.Match) -> str:
    out = next(it)
    return f"```python\n{match.group(1)}```\n" + (f"\n```text\n{out}```\n" if out else "")

  return BLOCK.sub(block, text)


def same(printed: str, page: str, tolerance: float = 0.02) -> bool:
  """Equal text, numbers within `tolerance` (absolute, or relative to the larger): a page recorded on one machine
  holds on another whose last float bits differ."""
  if NUMBER.sub("#", printed) != NUMBER.sub("#", page):
    return False
  for a, b in zip(NUMBER.findall(printed), NUMBER.findall(page)):
    x, y = float(a), float(b)
    if abs(x - y) > tolerance * max(1.0, abs(x), abs(y)):
      return False
  return True


if __name__ == "__main__":
  path = sys.argv[1]
  with open(path, encoding="utf-8") as f:
    page = f.read()
  written = with_outputs(page, run(page))  # run first: a failed or killed run leaves the page as it was
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    f.write(written)
  os.replace(path + ".tmp", path)
