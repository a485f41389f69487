"""`jaxloc.cli`: a flag given more than once with different values is one warning line naming each value, where it
was given and the one the run uses (absl takes the last, which these tests check too); the same value given again
(a flagfile's value repeated on the command line) says nothing; Ctrl-C's line names the command as it was run.
Importing `cli` (and a command that loads no model) does not start JAX."""

import os
import subprocess
import sys

import pytest
from absl import flags

from jaxloc import cli


@pytest.fixture()
def flag_values():
  values = flags.FlagValues()
  flags.DEFINE_integer("num_masks", 300, "", flag_values=values)
  flags.DEFINE_bool("validate", True, "", flag_values=values)
  flags.DEFINE_list("general_tasks", ["counting"], "", flag_values=values)
  flags.DEFINE_float("rate", 0.1, "", flag_values=values)
  flags.DEFINE_multi_string("tag", [], "", flag_values=values)
  return values


def _warnings(flag_values, *args):
  argv = ["localize", *args]
  flag_values(argv)
  return cli.repeated_flags(argv, flag_values)


def test_a_flag_given_twice_with_different_values_is_one_warning_naming_both(flag_values):
  assert _warnings(flag_values, "--num_masks=4", "--num_masks", "6") == [
      "--num_masks is given 2 times with different values: --num_masks=4 (on the command line), --num_masks=6 (on the "
      "command line); the run uses the last, --num_masks=6"]
  assert flag_values.num_masks == 6


def test_a_flagfile_value_overridden_names_the_flagfile(flag_values, tmp_path):
  flagfile = tmp_path / "run.flags"
  flagfile.write_text("# a config\n--num_masks=300\n--validate\n--general_tasks=counting,plurals\n")
  warnings = _warnings(flag_values, f"--flagfile={flagfile}", "--num_masks=50", "--novalidate",
                       "--general_tasks=counting,plurals")
  assert warnings == [
      f"--num_masks is given 2 times with different values: --num_masks=300 (in {flagfile}), --num_masks=50 (on the "
      "command line); the run uses the last, --num_masks=50",
      f"--validate is given 2 times with different values: --validate (in {flagfile}), --novalidate (on the command "
      "line); the run uses the last, --novalidate"]
  assert (flag_values.num_masks, flag_values.validate) == (50, False)


def test_the_same_value_again_says_nothing(flag_values, tmp_path):
  flagfile = tmp_path / "run.flags"
  flagfile.write_text("--num_masks=300\n--rate=0.5\n")
  assert _warnings(flag_values, f"--flagfile={flagfile}", "--num_masks=300", "--rate=.50", "--validate",
                   "--validate=true", "--tag=a", "--tag=b", "--general_tasks=a,b", "--general_tasks=a,b") == []


def test_the_command_is_named_as_it_was_run(monkeypatch):
  class Main:
    __spec__ = type("Spec", (), {"name": "experiments.localize"})()

  monkeypatch.setitem(sys.modules, "__main__", Main)
  assert cli.command() == "python -m experiments.localize"
  Main.__spec__ = None
  monkeypatch.setattr(sys, "argv", ["/venv/bin/jaxloc-localize", "--task=plurals"])
  assert cli.command() == "jaxloc-localize"


def test_importing_cli_and_a_command_that_loads_no_model_does_not_import_jax():
  code = "import jaxloc.main.benchmark_sandbox, jaxloc.cli, sys; assert 'jax' not in sys.modules, 'jax imported'"
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr


def test_an_unknown_fault_point_ends_the_command_in_one_line_before_it_runs():
  code = "from jaxloc import cli; cli.run(lambda argv: print('ran'))"
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JAXLOC_FAULT="garbage"), stdin=subprocess.DEVNULL)
  assert result.returncode == cli.EXIT_USER_ERROR and "ran" not in result.stdout and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
      "error: JAXLOC_FAULT=garbage: 'garbage' is not <point>@<n>[=<action>]: the points are write:<file name>, "
      "between_tasks, validation; n counts from 1; the actions are kill, enospc")
