"""Imports point one way, checked on packages and on modules.

Packages: models ← engine ← tasks, sandbox ← lasso ← localize ← studies, bench ← report ← main (`config`,
`errors`, `files`, `heads` on the floor below them all). A module may import its own package and the packages below
it, never one above. Modules: no module imports one that (directly or through others) imports it back. Every import
counts, including one inside a function, so a function-local import cannot hide a cycle or an upward import; and a
function-local import of a jaxloc module is refused outright: a module imports what it needs at its top. Only the
optional or heavy third-party packages in `LAZY` may be imported inside a function."""

import ast
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxloc")

# Lower number = lower floor. Modules at the package root (config, errors, files, units, logs, masks, cli,
# fixed_ablation)
# sit where their imports put them; `configs` is the packaged flagfiles.
FLOOR = {"config": 0, "configs": 0, "errors": 0, "files": 0, "units": 0, "checks": 0, "logs": 0, "models": 1, "engine": 2,
         "sandbox": 3, "tasks": 3, "lasso": 3, "localize": 4, "fixed_ablation": 4, "masks": 4, "studies": 5, "bench": 5,
         "report": 6, "api": 7, "cli": 7, "main": 8}

# Third-party packages a function may import where it needs them, and why (each is optional, or too heavy to load
# in every process that imports the module).
LAZY = {
    "torch": "optional: the PyTorch references and baselines only",
    "transformers": "optional: the PyTorch references, HF checkpoint import/export",
    "lm_eval": "optional: lm-evaluation-harness tasks",
    "matplotlib": "optional: plots",
    "sklearn": "optional: --check_sklearn's cross-check",
    "gguf": "optional: .gguf files",
    "orbax": "heavy: the converted-parameter cache",
    "datasets": "optional: HF datasets",
    "huggingface_hub": "optional: hub downloads",
    "pronouncing": "optional: the rhyming task's dictionary",
    "filelock": "optional: JAX's bounded compilation cache",
    "jax": "heavy: `files` and the sandbox stay importable without starting JAX",
    "jaxlib": "heavy: as jax",
    "transformer_lens": "optional: the peers' side of the patching benchmark (the peers extra)",
    "nnsight": "optional: as transformer_lens",
    "pandas": "optional: TransformerLens' patching utilities take a DataFrame of cells",
}


def _modules():
  """{module name: path} of every module of the package."""
  out = {}
  for directory, _, names in os.walk(ROOT):
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        dotted = "jaxloc." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        out[dotted.removesuffix(".__init__")] = path
  return out


def _imports(path, module, modules):
  """(imported name, inside a function?) for every import of the file; a jaxloc import as the module it names
  (`from jaxloc.x import y`: jaxloc.x.y when that is a module, else jaxloc.x)."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  local = {id(node) for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
           for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))}
  package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
      for alias in node.names:
        yield (f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base), id(node) in local
    elif isinstance(node, ast.Import):
      for alias in node.names:
        yield alias.name, id(node) in local


def _graph():
  """{module: the jaxloc modules it imports}, and the function-local imports as 'module: name' lines."""
  modules = _modules()
  graph, local = {}, []
  for module, path in modules.items():
    graph[module] = set()
    for name, inside in _imports(path, module, modules):
      target = name
      while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
      if target.startswith("jaxloc") and target != "jaxloc" and target != module:
        graph[module].add(target)
      if inside:
        local.append(f"{os.path.relpath(path, os.path.dirname(ROOT))}: {name}")
  return graph, local


def _floor_package(module):
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else None


def test_no_import_runs_back_up_the_layers():
  graph, _ = _graph()
  upward = []
  for module, targets in graph.items():
    package = _floor_package(module)
    if package is None:
      continue  # jaxloc/__init__.py: the package's lazy public face
    assert package in FLOOR and {_floor_package(t) for t in targets} <= set(FLOOR), (
        f"{module} or a module it imports has no floor in this test; add it")
    upward += [f"{module} imports {target}" for target in sorted(targets)
               if FLOOR[_floor_package(target)] > FLOOR[package]]
  assert not upward, "imports that run back up:\n" + "\n".join(upward)


def _cycles(graph):
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while not component or component[-1] != v:
        component.append(stack.pop())
        on_stack.discard(component[-1])
      if len(component) > 1:
        found.append(sorted(component))

  limit = sys.getrecursionlimit()
  sys.setrecursionlimit(max(limit, 10 * len(graph)))
  try:
    for v in sorted(graph):
      if v not in index:
        visit(v)
  finally:
    sys.setrecursionlimit(limit)
  return found


def test_no_module_imports_itself_back():
  graph, _ = _graph()
  graph = {m: {t for t in targets if t != "jaxloc"} for m, targets in graph.items() if m != "jaxloc"}
  cycles = _cycles(graph)
  assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
      " <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle_through_a_function_local_import():
  assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert _cycles({"a": {"b"}, "b": set()}) == []


def test_function_local_imports_are_optional_packages_only():
  _, local = _graph()
  stdlib = set(sys.stdlib_module_names)  # cannot cycle with the package, and cost nothing to import
  refused = [line for line in local if (top := line.split(": ")[1].split(".")[0]) not in LAZY and top not in stdlib]
  assert not refused, ("function-local imports (import at the module's top; a lazily imported optional package "
                       "goes in LAZY with why):\n" + "\n".join(refused))
