"""The config layer's one rule for numbers (`jaxloc.config.problem`), walked over every number setting of every
command: the flag parser refuses NaN and inf (where inf is not meaningful) before a command starts, and a settings
object made in code is refused the same way by `check_fields`."""

import dataclasses
import importlib
import math
import pkgutil

import pytest
from absl import flags

import jaxloc.main
from jaxloc import cli, config
from jaxloc.errors import UserError
from jaxloc.localize.settings import LocalizeSettings


def command_settings(monkeypatch) -> dict[str, list[tuple[type, tuple[str, ...]]]]:
  """{command: the settings classes whose flags it defines (with the flags it skips)}, recorded by running each
  `jaxloc.main` command's `console` up to the point where it would parse."""
  defined: list[tuple[type, tuple[str, ...]]] = []
  monkeypatch.setattr(cli, "define_flags", lambda settings_class, skip=(), **_: defined.append((settings_class, skip)))
  monkeypatch.setattr(cli, "run", lambda main, **_: None)
  commands = {}
  for module_info in pkgutil.iter_modules(jaxloc.main.__path__):
    module = importlib.import_module(f"jaxloc.main.{module_info.name}")
    if not hasattr(module, "console"):
      continue  # engine_flags: the model-loading commands' engine, no command of its own
    defined.clear()
    module.console()
    commands[module_info.name] = list(defined)
  return commands


def number_flags(commands) -> list[tuple[str, str, type, dataclasses.Field]]:
  """(command, flag, settings class, field) for every flag that holds numbers (`config.holds_numbers`)."""
  out = []
  for command, classes in commands.items():
    for settings_class, skip in classes:
      for name, field in config.flag_fields(settings_class).items():
        if name not in skip and config.holds_numbers(field):
          out.append((command, name, settings_class, field))
  return out


def test_every_command_is_walked_and_its_number_settings_found(monkeypatch):
  commands = command_settings(monkeypatch)
  assert len(commands) >= 15 and all(commands.values()), {c: v for c, v in commands.items() if not v}
  found = {(command, name) for command, name, _, _ in number_flags(commands)}
  assert {("localize", "specific_max_general_drop"), ("localize", "universal_threshold"),
          ("localize", "memory_budget_gb"), ("localize", "lasso_alpha"), ("localize", "ablation_rate"),
          ("localize", "mask_l0"), ("evaluate", "memory_budget_gb")} <= found


def test_the_parser_refuses_nan_and_inf_in_every_number_setting_of_every_command(monkeypatch):
  walked = 0
  for command, name, settings_class, field in number_flags(command_settings(monkeypatch)):
    flag_values = flags.FlagValues()
    config.define_flags(settings_class, flag_values=flag_values)
    flag_values.mark_as_parsed()
    bad = ["nan", "inf", "-inf"] if not field.metadata.get("infinite") else ["nan"]
    for text in bad:
      value = [text] if config.kind_of(field) is list else text if "words" in field.metadata else float(text)
      # NaN passes absl's bounds, so the number rule must say it; inf may meet a bound of absl's first.
      with pytest.raises(flags.IllegalFlagValueError, match="is not a finite number" if text == "nan" else ""):
        setattr(flag_values, name, value)  # absl runs a flag's validators on assignment as on parsing
      walked += 1
  assert walked > 40


def test_settings_made_in_code_are_held_to_the_same_rule(monkeypatch):
  checked = 0
  for command, name, settings_class, field in number_flags(command_settings(monkeypatch)):
    if field not in dataclasses.fields(settings_class) or hasattr(settings_class, "from_flags"):
      continue  # a nested class's or a method's flag: checked below, through the class that holds it
    value = [math.nan] if config.kind_of(field) is list else "nan" if "words" in field.metadata else math.nan
    required = {n: "x" for n, f in config.flag_fields(settings_class).items() if f.metadata.get("required")}
    settings = dataclasses.replace(config.build(settings_class, required), **{field.name: value})
    with pytest.raises(UserError, match=f"--{name}=nan .*not a finite number"):
      config.check_fields(settings)
    checked += 1
  assert checked >= 5
  for flag in ("specific_max_general_drop", "universal_threshold", "lasso_alpha", "ablation_rate", "screen_fraction",
               "mask_learning_rate", "cnl_threshold"):
    method = {"screen_fraction": "two_stage", "mask_learning_rate": "learned_mask", "cnl_threshold": "cnl"}.get(
        flag, "cs_stratified")
    extra = {"unit": "neurons"} if method == "cnl" else {}
    value = "nan" if flag == "lasso_alpha" else math.nan
    settings = LocalizeSettings.make(task="counting", output_dir="x", method=method, **extra, **{flag: value})
    with pytest.raises(UserError, match=f"--{flag}=nan is not a finite number"):
      settings.check()


def test_the_rule_keeps_good_values_and_names_what_is_valid():
  field = config.setting(0.1, "", lower=0.0, upper=1.0)
  assert config.problem(field, 0.5) is None and config.problem(field, 1.5) == "must be ≤ 1"
  assert config.problem(field, math.inf) == "is not a finite number: give a finite number in [0, 1]"
  assert config.problem(config.setting(1.0, "", infinite=True), math.inf) is None
  alpha = config.setting("cv", "", words=("cv",), lower=0.0)
  assert config.problem(alpha, "cv") is None and config.problem(alpha, "0.5") is None
  assert config.problem(alpha, "-1") == "must be ≥ 0"
  assert config.problem(alpha, "x") == "must be 'cv' or a finite number ≥ 0"
  assert config.problem(config.setting([0.1], "", element=float, lower=0.0), [0.1, math.nan]).startswith(
      "has a bad element, nan: it is not a finite number")


def test_a_list_flag_with_an_empty_entry_is_refused_naming_the_flag():
  values = flags.FlagValues()
  flags.DEFINE_list("general_tasks", [], "", flag_values=values)
  values(["localize", "--general_tasks=counting,,"])
  assert values.general_tasks == ["counting", "", ""]  # what absl makes of it: two empty task names
  settings = LocalizeSettings.make(task="plurals", output_dir="x", general_tasks=values.general_tasks)
  with pytest.raises(UserError, match=r"^--general_tasks=counting,, has an empty entry: give the entries separated "
                                      "by single commas, none of them empty$"):
    settings.check()
  LocalizeSettings.make(task="plurals", output_dir="x", general_tasks=["counting"]).check()
