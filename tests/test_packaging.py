"""The package installs anywhere: its license, citation, changelog and version agree; the flagfiles ship inside it
and resolve by name; and (heavy) a wheel built from the sources, installed into a fresh virtual environment outside
the checkout, runs the API and the main job's flagfile from there."""

import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

import jaxloc
from jaxloc import configs
from jaxloc.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(name: str) -> str:
  with open(os.path.join(ROOT, name)) as f:
    return f.read()


def test_license_citation_changelog_and_version_agree():
  project = tomllib.loads(_read("pyproject.toml"))
  assert project["project"]["license"]["text"] == "Apache-2.0"
  assert "Apache License" in _read("LICENSE") and "Version 2.0, January 2004" in _read("LICENSE")
  assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "jaxloc.__version__"}
  assert re.fullmatch(r"\d+\.\d+\.\d+", jaxloc.__version__)
  assert re.search(rf"^version: {re.escape(jaxloc.__version__)}$", _read("CITATION.cff"), re.M)
  assert re.search(rf"^## {re.escape(jaxloc.__version__)} ", _read("CHANGELOG.md"), re.M)
  assert "Capabilities Can be Localized rather than Individual Knowledge" in _read("CITATION.cff")
  assert os.path.isfile(os.path.join(ROOT, "jaxloc", "py.typed"))


def test_the_flagfiles_ship_in_the_package_and_resolve_by_name(tmp_path, monkeypatch):
  assert os.path.realpath(os.path.join(ROOT, "experiments", "configs")) == configs.DIRECTORY
  assert os.path.realpath(os.path.join(ROOT, "experiments", "data")) == os.path.join(configs.DIRECTORY, "data")
  assert "smollm2_default" in configs.names()
  monkeypatch.chdir(tmp_path)  # outside the clone
  [_, flagfile] = configs.resolve_flagfiles(["prog", "--flagfile=smollm2_default"])
  assert flagfile == "--flagfile=" + os.path.join(configs.DIRECTORY, "smollm2_default.flags")
  # A packaged task file named by its clone path is read from the package outside a clone.
  [_, flagfile] = configs.resolve_flagfiles(["prog", "--flagfile=smollm2_capitals_two_stage.flags"])
  text = open(flagfile.split("=", 1)[1]).read()
  assert f"--task={os.path.join(configs.DIRECTORY, 'data', 'capitals.jsonl')}\n" in text
  assert configs.resolve_flagfiles(["prog", "--flagfile=" + flagfile.split("=", 1)[1]])[1] == flagfile  # a file
  with pytest.raises(UserError, match="--flagfile=smollm_default: no such file.*packaged: .*smollm2_default"):
    configs.resolve_flagfiles(["prog", "--flagfile=smollm_default"])
  # `--flagfile NAME`, two arguments, as absl takes it too; what follows `--` is no flag.
  packaged = "--flagfile=" + os.path.join(configs.DIRECTORY, "smollm2_default.flags")
  assert configs.resolve_flagfiles(["prog", "--flagfile", "smollm2_default", "--seed=1"]) == [
      "prog", packaged, "--seed=1"]
  assert configs.resolve_flagfiles(["prog", "--", "--flagfile", "x"]) == ["prog", "--", "--flagfile", "x"]


@pytest.mark.heavy  # builds a wheel and a virtual environment, loads SmolLM2: ~40 s on a quiet 2-core machine
def test_a_wheel_installed_outside_the_checkout_runs_the_api_and_the_main_jobs_flagfile(tmp_path):
  source = tmp_path / "source"  # a copy, so that the build leaves nothing in the checkout
  for name in ("pyproject.toml", "README.md", "LICENSE"):
    shutil.copy(os.path.join(ROOT, name), source / name if source.exists() else _mkdir(source) / name)
  shutil.copytree(os.path.join(ROOT, "jaxloc"), source / "jaxloc", ignore=shutil.ignore_patterns("__pycache__"))
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                  str(tmp_path / "dist"), str(source)], check=True, cwd=tmp_path)
  [wheel] = os.listdir(tmp_path / "dist")
  assert wheel == f"jaxloc-{jaxloc.__version__}-py3-none-any.whl"
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
  python = str(venv / "bin" / "python")
  subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(tmp_path / "dist" / wheel)],
                 check=True)
  elsewhere = _mkdir(tmp_path / "elsewhere")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  api = ("import os, jaxloc, numpy as np\n"
         "from jaxloc import configs\n"
         "print(jaxloc.__file__)\n"
         "print(configs.flagfile('smollm2_default'))\n"
         "engine = jaxloc.Engine(jaxloc.load_model('smollm2-135m'))\n"
         "result = jaxloc.evaluate_heads(engine, 'plurals', heads=['L8H1'], num_samples=8, curve=True)\n"
         "print([row['metrics']['accuracy'] for row in result['curve']])\n")
  done = subprocess.run([python, "-c", api], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  lines = done.stdout.splitlines()
  site = str(venv / "lib")
  assert lines[0].startswith(site) and lines[1].startswith(site), lines  # the wheel's, not the checkout's
  assert len(eval(lines[2])) == 2  # noqa: S307 - our own printed list
  # The console script takes the main job's flagfile by name from here (--helpfull: parsing, no run).
  script = str(venv / "bin" / "jaxloc-localize")
  done = subprocess.run([script, "--flagfile=smollm2_default", "--helpfull"], cwd=elsewhere, env=env,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode in (0, 1) and "--num_masks" in done.stdout and "error" not in done.stderr, done.stderr


def _mkdir(path):
  path.mkdir(parents=True, exist_ok=True)
  return path
