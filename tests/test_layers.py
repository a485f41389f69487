"""The packages import one way: models ← engine ← tasks, sandbox ← lasso ← localize ← studies, bench ← report ←
main. A module may import its own package and the packages below it, never one above."""

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxloc")

# Lower number = lower floor. Modules at the package root (errors, files, heads, cli, api, evaluate) sit where their
# imports put them.
FLOOR = {"errors": 0, "files": 0, "heads": 0, "models": 1, "engine": 2, "sandbox": 3, "tasks": 3, "lasso": 3,
         "localize": 4, "evaluate": 4, "studies": 5, "bench": 5, "report": 6, "api": 7, "cli": 7, "main": 8}


def _imports(path):
  tree = ast.parse(open(path, encoding="utf-8").read())
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxloc"):
      parts = node.module.split(".")
      yield parts[1] if len(parts) > 1 else node.names[0].name
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.startswith("jaxloc."):
          yield alias.name.split(".")[1]


def test_no_import_runs_back_up_the_layers():
  upward = []
  for directory, _, names in os.walk(ROOT):
    for name in names:
      if not name.endswith(".py"):
        continue
      path = os.path.join(directory, name)
      relative = os.path.relpath(path, ROOT).split(os.sep)
      package = relative[0][:-3] if len(relative) == 1 else relative[0]
      if package == "__init__":
        continue  # the package's lazy public face
      assert package in FLOOR, f"{package} has no floor in this test; add it"
      upward += [f"{os.path.relpath(path, ROOT)} imports jaxloc.{target}" for target in _imports(path)
                 if target in FLOOR and FLOOR[target] > FLOOR[package]]
  assert not upward, "imports that run back up:\n" + "\n".join(upward)
