"""One name per idea: no two modules of the library are named by forms of one word (scorer/scoring,
evaluate/evaluation: which one holds what?), and a module name used in several packages is allowed only where listed,
with the reason. Commands (`jaxloc/main`) are named after the command they run, so they are left out. (That every
module says in its docstring which job it owns is `test_file_sizes`'.)"""

import collections
import os
import re

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxloc")

# The same module name in several packages, each for the same idea in its own package.
SAME_NAME = {
    "config": "each package's settings (the config layer, the engine's, a model's)",
    "base": "each registry's base class (tasks, methods)",
    "masks": "the masks the engine takes, checked (engine) and the masks a user builds (the prompt-level API)",
    "heads_vs_neurons": "a study and its report page",
    "patching": "patching experiments in the prompt-level API, and their benchmark",
}


def _modules():
  for directory, _, names in os.walk(ROOT):
    for name in sorted(names):
      if name.endswith(".py"):
        yield os.path.join(directory, name)


def _root(stem: str) -> str:
  return re.sub(r"(ion|ing|or|er|e|s)$", "", stem)


def test_no_two_modules_are_named_by_forms_of_one_word():
  by_root = collections.defaultdict(set)
  by_stem = collections.defaultdict(list)
  for path in _modules():
    relative = os.path.relpath(path, ROOT)
    stem = os.path.basename(path)[:-3]
    if stem == "__init__" or relative.startswith("main" + os.sep):
      continue
    by_root[_root(stem)].add(stem)
    by_stem[stem].append(relative)
  forms = {root: sorted(stems) for root, stems in by_root.items() if len(stems) > 1}
  assert not forms, f"modules named by forms of one word: {forms}"
  repeated = {stem: paths for stem, paths in by_stem.items() if len(paths) > 1 and stem not in SAME_NAME}
  assert not repeated, f"one module name in several packages: {repeated}"


def test_the_forms_rule_catches_what_it_is_for():
  assert _root("scorer") == _root("scoring") and _root("generator") == _root("generation")
  assert _root("evaluate") == _root("evaluation") and _root("scoring_kernels") != _root("scorer")
