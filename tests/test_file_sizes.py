"""Every module of the package stays small enough to read and says what it is for: under 500 lines, and a module
docstring (the job it owns) in every module, package `__init__`s included. A file that grows past the limit is split by
responsibility, as `lasso/solver.py` (the public API) and `lasso/fista.py` (the iteration) were."""

import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 500  # a module must stay under this many lines
MODULES = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "jaxloc", "**", "*.py"), recursive=True))


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    return f.read()


def test_the_package_has_modules_to_check():
  assert "jaxloc/lasso/solver.py" in MODULES and len(MODULES) > 50


def test_every_module_is_under_500_lines():
  sizes = {path: len(_read(path).splitlines()) for path in MODULES}
  too_long = {path: n for path, n in sizes.items() if n >= MAX_LINES}
  assert not too_long, f"split these by responsibility (lines ≥ {MAX_LINES}): {too_long}"


def test_every_module_has_a_docstring():
  missing = [path for path in MODULES if not ast.get_docstring(ast.parse(_read(path)))]
  assert not missing, f"these modules need a docstring saying which job they own: {missing}"
