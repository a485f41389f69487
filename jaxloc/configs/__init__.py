"""The flagfiles of the README's and the paper's runs and their example task files, shipped inside the package so that
an installed jaxloc runs them from any directory by name:

    jaxloc-localize --flagfile=smollm2_default          # this package's smollm2_default.flags
    python -m experiments.localize --flagfile=experiments/configs/smollm2_default.flags   # in a clone, the same file

In a clone, `experiments/configs` and `experiments/data` are links to this directory and to `data/` in it.
"""

from __future__ import annotations

import atexit
import os
import re
import tempfile

from jaxloc.errors import UserError

DIRECTORY = os.path.dirname(os.path.abspath(__file__))
SUFFIX = ".flags"
# How a flagfile names the packaged task files in a clone; outside one they are read from this directory.
CLONE_PATHS = {"experiments/configs/": DIRECTORY + os.sep,
               "experiments/data/": os.path.join(DIRECTORY, "data") + os.sep}


def names() -> list[str]:
  """The packaged flagfiles, by name."""
  return sorted(f[:-len(SUFFIX)] for f in os.listdir(DIRECTORY) if f.endswith(SUFFIX))


def flagfile(name: str) -> str:
  """The path of a packaged flagfile named `name` (with or without ".flags"): a UserError naming the packaged ones
  when there is none."""
  stem = name[:-len(SUFFIX)] if name.endswith(SUFFIX) else name
  path = os.path.join(DIRECTORY, stem + SUFFIX)
  if os.sep in stem or "/" in stem or not os.path.isfile(path):
    raise UserError(f"--flagfile={name}: no such file, and no packaged flagfile of that name; packaged: "
                    + ", ".join(names()))
  return path


def _outside_a_clone(path: str) -> str:
  """`path`, or a copy of it whose clone-relative task paths (`experiments/data/...`) point into this package, when
  those paths do not exist from the current directory."""
  with open(path) as f:
    lines = f.read().splitlines(keepends=True)
  flags = "".join(line for line in lines if line.startswith("--"))  # not the comments' example commands
  missing = [p for p in CLONE_PATHS if p in flags and not os.path.isdir(p)]
  if not missing:
    return path
  for prefix in missing:
    lines = [re.sub(rf"(?<=[=:,]){re.escape(prefix)}", CLONE_PATHS[prefix].replace("\\", "\\\\"), line)
             if line.startswith("--") else line for line in lines]
  text = "".join(lines)
  handle, copy = tempfile.mkstemp(prefix=os.path.basename(path)[:-len(SUFFIX)] + "-", suffix=SUFFIX)
  with os.fdopen(handle, "w") as f:
    f.write(text)
  atexit.register(os.remove, copy)
  return copy


def resolve_flagfiles(argv: list[str]) -> list[str]:
  """Command-line arguments with every `--flagfile=NAME` or `--flagfile NAME` whose NAME is not a file
  (`--flagfile=smollm2_default`) replaced by the packaged flagfile of that name (as `--flagfile=PATH`); what follows
  a bare `--` is left alone."""
  resolved = []
  position = 0
  while position < len(argv):
    arg = argv[position]
    position += 1
    if arg == "--":
      resolved += argv[position - 1:]
      break
    value = None
    if arg.startswith("--flagfile="):
      value = arg.split("=", 1)[1]
    elif arg == "--flagfile" and position < len(argv):
      value = argv[position]
      position += 1
      arg = f"--flagfile={value}"
    if value is not None and not os.path.exists(value):
      arg = "--flagfile=" + _outside_a_clone(flagfile(value))
    resolved.append(arg)
  return resolved
