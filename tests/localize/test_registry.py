"""A method is one file: registering one object is all a new method needs (its flags and keywords, the runner, the
efficiency benchmark, help and error messages), and no registered method is named outside its own file and the
registry."""

import dataclasses
import glob
import inspect
import os
import re
import types
from typing import ClassVar

import numpy as np
import pytest
from absl import flags

from jaxloc import cli
from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.localize import methods
from jaxloc.localize.methods.base import Method, confirmation_plan
from jaxloc.localize.localization import load_tasks
from jaxloc.localize.settings import LocalizeSettings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class RandomSettings:
  flag_prefix: ClassVar[str] = "random_"

  salt: int = setting(0, "Mixed with --seed into the random order.", lower=0, measured=True)


@dataclasses.dataclass(frozen=True)
class RandomRanking(Method):
  """A baseline defined here only: a seeded random order of the heads, its first --num_masks ablated alone."""

  name: str = "random_ranking"
  units = ("heads", "neurons")
  settings_class = RandomSettings
  run_settings = types.MappingProxyType({"num_masks": "heads of a random order ablated alone"})
  efficiency_variants = ("", "random_salt=7")

  def plan(self, settings, context):
    order = np.random.default_rng([settings.seed, settings.method_settings.salt]).permutation(context.num_total)
    return confirmation_plan(order, settings.num_masks, context, {"screen": "a seeded random order"})


@pytest.fixture()
def random_ranking():
  methods.register(RandomRanking())
  try:
    yield
  finally:
    methods.unregister("random_ranking")


def test_its_settings_are_flags_and_keywords_checked_by_their_field(random_ranking, tmp_path):
  from jaxloc.main.localize import LocalizeConfig

  flag_values = flags.FlagValues()
  cli.define_flags(LocalizeConfig, skip=("model",), flag_values=flag_values)
  flag_values(["localize", "--task=counting", f"--output_dir={tmp_path}", "--method=random_ranking",
               "--random_salt=3", "--lasso_alpha=0.5"])  # another method's flag is parsed, not read
  config = cli.settings_from_flags(LocalizeConfig, flag_values)
  assert config.settings.method_settings == RandomSettings(salt=3) and config.progress
  assert config.settings.flags()["random_salt"] == 3 and "lasso_alpha" not in config.settings.flags()
  assert flag_values["random_salt"].help == "random_ranking: Mixed with --seed into the random order."
  assert "random_ranking: heads of a random order ablated alone" in flag_values["num_masks"].help
  assert "random_ranking" in flag_values["method"].parser.enum_values and "random_ranking" in flag_values["unit"].help

  keywords = LocalizeSettings.make(task="counting", output_dir=str(tmp_path), method="random_ranking", random_salt=3)
  assert keywords == config.settings
  assert methods.get("random_ranking").measurement_settings(keywords) == {"num_masks": 300, "random_salt": 3}
  with pytest.raises(UserError, match="--random_salt=-1 must be ≥ 0"):
    keywords.replace(random_salt=-1).check()
  with pytest.raises(UserError, match="random_salt is a setting of random_ranking"):
    LocalizeSettings.make(task="counting", output_dir=str(tmp_path), random_salt=3)


def test_error_messages_and_the_benchmark_list_it_from_the_registry(random_ranking, tmp_path):
  from jaxloc.bench import sweep

  # It needs nothing from the run: it is one of the methods offered for a generation task.
  settings = LocalizeSettings.make(task="swearing", output_dir=str(tmp_path), method="gradient_confirm",
                                   num_samples=10, validation_samples=10)
  with pytest.raises(UserError, match="needs a scored .*use .*random_ranking"):
    load_tasks(settings)
  assert {"random_ranking", "random_ranking-random_salt=7"} <= set(sweep.default_variants(synthetic=True))


def test_the_efficiency_sweep_drives_it_on_a_synthetic_problem(random_ranking):
  from jaxloc.bench import sweep

  cfg = sweep.EfficiencyConfig(output_dir="unused", methods=["random_ranking", "random_ranking-random_salt=7"],
                               budgets=[0.25, 1.0], seeds=[0], synthetic_sizes=[(4, 8)], synthetic_planted=3)
  (task,) = sweep.run(cfg, synthetic=True)["tasks"]
  runs = {(r["method"], r["budget_fraction"]): r for r in task["records"]}
  assert {(m, f): runs[m, f]["evaluations"] for m, f in runs} == {
      ("random_ranking", 0.25): 8, ("random_ranking", 1.0): 32, ("random_ranking-random_salt=7", 0.25): 8,
      ("random_ranking-random_salt=7", 1.0): 32}
  # Every head measured alone is the ground truth's ranking, whatever the order; the salt changes which 8 come first.
  assert runs["random_ranking", 1.0]["recall"]["accuracy"] == 1.0
  assert runs["random_ranking", 0.25]["top_k"] != runs["random_ranking-random_salt=7", 0.25]["top_k"]


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_the_runner_runs_it_end_to_end_and_resumes_only_with_its_settings(random_ranking, tiny_model, tmp_path):
  import jaxloc

  engine = jaxloc.Engine(tiny_model)
  options = dict(method="random_ranking", random_salt=3, num_masks=5, num_samples=6, validation_samples=4,
                 metric="logprob", top_k=2, general_tasks=["plurals"], general_samples=6, curve_k=3, bootstrap=10,
                 progress=False)
  run = jaxloc.run_localization(engine, "counting", str(tmp_path), **options)
  assert run.info["method"] == "random_ranking" and run.info["flags"]["random_salt"] == 3
  order = np.random.default_rng([0, 3]).permutation(run.coefficients.size)
  measured = run.masks.reshape(len(run.masks), -1)
  assert [int(np.flatnonzero(m)[0]) for m in measured[:5]] == order[:5].tolist()  # its plan, measured
  assert run.info["num_evaluations"] >= 5 and run.ablation["held_out"]["num_docs"] == 4
  again = jaxloc.run_localization(engine, "counting", str(tmp_path), **options)
  assert again.info["timing"]["measured_this_run"] == 0
  with pytest.raises(UserError, match="--random_salt: saved 3, now 4"):
    jaxloc.run_localization(engine, "counting", str(tmp_path), **dict(options, random_salt=4))


def test_registration_refuses_taken_flags_and_names(random_ranking):
  # Declared prefixes (a derived one, the method's name, would keep them apart).
  @dataclasses.dataclass
  class Clashing:
    flag_prefix: ClassVar[str] = ""
    lasso_alpha: str = setting("cv", "Another field under a taken flag name.")

  @dataclasses.dataclass
  class RunWide:
    flag_prefix: ClassVar[str] = ""
    seed: int = setting(1, "A run-wide setting's name.")

  clash = dataclasses.replace(RandomRanking(), name="clash")
  object.__setattr__(clash, "settings_class", Clashing)
  with pytest.raises(ValueError, match="flag --lasso_alpha is taken"):
    methods.register(clash)
  # A run-wide setting's name: the run settings, which compose every method's flags with theirs, refuse it.
  object.__setattr__(clash, "settings_class", RunWide)
  methods.register(clash)
  try:
    for compose in (LocalizeSettings.flag_fields, lambda: LocalizeSettings.make(task="counting", output_dir="x",
                                                                                method="clash")):
      with pytest.raises(ValueError, match="flag --seed is taken by the run-wide settings"):
        compose()
  finally:
    methods.unregister("clash")
  with pytest.raises(ValueError, match="registered already"):
    methods.register(RandomRanking())
  assert "clash" not in methods.names()


def _named(name: str, line: str) -> bool:
  """Whether `line` names method `name` as code names it: a string or backticked name (alone, or a benchmark variant
  `name-...`), `method=name`; a name with an underscore anywhere as a word (prose included)."""
  n = re.escape(name)
  patterns = [rf"([\"'`]){n}\1", rf"[\"'`]{n}-[\w{{]", rf"method\s*=\s*[\"']?{n}(?![\w])"]
  if "_" in name:
    patterns.append(rf"(?<![\w]){n}(?![\w])")
  return any(re.search(p, line) for p in patterns)


# A label that is not a reference to the method: the throughput benchmark times a workload of every single-head mask
# under this name, a key of its committed output (docs/speed/benchmark_throughput.json); it runs no method.
NOT_A_REFERENCE = {("one_shot_greedy", os.path.join("jaxloc", "bench", "throughput.py"))}


def test_no_method_is_named_outside_its_own_file_and_the_registry():
  registry = os.path.relpath(inspect.getfile(methods), ROOT)
  found = []
  for name in methods.names():
    own = os.path.relpath(inspect.getfile(type(methods.get(name))), ROOT)
    for path in sorted(glob.glob(os.path.join(ROOT, "jaxloc", "**", "*.py"), recursive=True)):
      relative = os.path.relpath(path, ROOT)
      if relative in (own, registry) or (name, relative) in NOT_A_REFERENCE:
        continue
      with open(path, encoding="utf-8") as f:
        found += [f"{relative}:{i}: {name}" for i, line in enumerate(f, 1) if _named(name, line)]
  assert not found, "methods named outside their own file and the registry:\n" + "\n".join(found)


def test_the_check_finds_a_name_where_code_names_it():
  assert _named("greedy", 'drive(method="greedy")') and _named("greedy", "`greedy`: k rounds")
  assert _named("cs_bernoulli", 'f"cs_bernoulli-upto{limit}"') and _named("two_stage", "a two_stage screen")
  assert not _named("greedy", "greedy decoding") and not _named("greedy", "f\"greedy's top-{k}\"")
