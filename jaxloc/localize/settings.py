"""Everything a localization run depends on: `LocalizeSettings`, the run-wide settings (model, task, method, budget,
selection, validation, bootstrap) and the method's own settings object.
`selector` is the selection rule (`jaxloc.localize.selection`) that `selection` names.

Its fields are `jaxloc.config.setting`s, so they are flags (`jaxloc.config.define_flags`) and keywords. It also holds
the method: `method` is its name (what heads.json and run.json record), `method_object` the registered method
(`jaxloc.localize.methods`) resolved once when the settings are made, and `method_settings` an instance of that
method's `settings_class`, built from the flags or keywords. Its flags are the run-wide fields plus every registered
method's (`flag_fields`); `flags()` is the flat record of a run (heads.json `flags`): the run-wide settings and the
method's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxloc.config import SEED, build_declared, check_fields, declared_flag_fields, flag_values, setting
from jaxloc.errors import UserError
from jaxloc.localize import methods, selection
from jaxloc.localize.methods.base import Method
from jaxloc.models.loading import SMOLLM2_ALIAS


def _method_help(text: str, field: str) -> Callable[[], str]:
  """Help for a run-wide setting that methods read: `text` and what it means for each method that reads it."""

  def help_text() -> str:
    meanings = [f"{name}: {meaning}" for name, meaning in methods.run_setting_meanings(field)]
    return text + (" Per method: " + "; ".join(meanings) + "." if meanings else "")

  return help_text


def _unit_help() -> str:
  return ("What to localize: attention heads, or MLP neurons (the input of down_proj; methods "
          f"{', '.join(methods.names_for('neurons'))}). Names: L15H13 / L3N117.")


@dataclasses.dataclass
class LocalizeSettings:
  """The run-wide flags of `experiments.localize` (run `python -m experiments.localize --helpfull`) and the
  method's own settings (`method_settings`; its flags are the method's, see `jaxloc.localize.methods`).

  Build one from flag names, the method's included, with `LocalizeSettings.make(task=..., method=...,
  mask_steps=...)`; the constructor takes the run-wide fields and, optionally, the method's settings object (its
  defaults when left out).
  """

  model: str = setting(SMOLLM2_ALIAS, "Model: alias, .gguf file, local HF directory or HF hub id.")
  task: str = setting(None, "Registered task name, a custom .jsonl file, or an lm-evaluation-harness task as "
                      "lm_eval:<task name or task .yaml>.", type=str, required=True)
  output_dir: str = setting(None, "Where outputs go (and where a resumed run finds them).", type=str, required=True)
  method: str = setting(methods.DEFAULT, "Localization method (one of jaxloc.localize.methods.names()).",
                        choices=methods.names)
  unit: str = setting("heads", _unit_help, choices=("heads", "neurons"))
  task_options: dict = setting({}, "Task options as key=value.")
  num_masks: int = setting(300, _method_help("Evaluation budget of the method.", "num_masks"), lower=1)
  num_samples: int = setting(100, "Task documents used for identification (seeded subset).", lower=1)
  metric: str = setting(None, "Task metric to localize (default: the task's default metric).", type=str)
  top_k: int = setting(5, _method_help("Heads (neurons) reported and validated.", "top_k"), lower=1)
  exclude_heads: list = setting([], "Heads (with --unit=neurons: neurons) never ablated, e.g. L0H1,L1H3 (known "
                                "universal heads) or L3N117.")
  seed: int = setting(0, "Seed of the design, the CV folds and the document subset.", **SEED)
  data_dir: str = setting(None, "Directory of offline dataset files (default $JAXLOC_DATA).", type=str)
  ablation: str = setting("zero", "Zero ablation or mean ablation.", choices=("zero", "mean"))
  validate: bool = setting(True, "Ablate the selected heads on held-out documents of the task and the general tasks.")
  general_tasks: list = setting(["counting", "plurals", "induction", "arithmetic_1d_4shot"],
                                "Tasks scored under every design mask beside the target (each head gets an "
                                "estimated effect on each), used to select specific heads, find universal heads "
                                "and check specificity. The target is left out of this list.")
  general_samples: int = setting(100, "Identification documents per general task.", lower=1)
  validation_samples: int = setting(100, "Held-out documents per task (target and general) for validation, "
                                    "disjoint from the identification documents.", lower=1)
  selection: str = setting("specific", "specific: the target's best heads whose relative drop on every general task "
                           "is at most --specific_max_general_drop, each confirmed by ablating it alone on every "
                           "task's identification documents, the top-k also together (extra masks, counted); raw: "
                           "the target ranking as is. Universal heads are left out of both.",
                           choices=selection.NAMES)
  specific_max_general_drop: float = setting(0.1, "--selection=specific: the largest relative drop on "
                                             "any general task a selected head may have.", lower=0.0, upper=1.0)
  specific_rule: str = setting("interval", "--selection=specific: how a confirmation decision reads each general "
                               "drop's interval (paired bootstrap over documents, at --specific_confidence). interval: "
                               "above the threshold vetoes, at or below passes, straddling gets more documents of that "
                               "task (up to --general_max_samples), where the point estimate decides; upper_bound: the "
                               "same, but still straddling at the cap vetoes; point: the point estimate decides, no "
                               "documents added (jaxloc/localize/decisions.py).", choices=("interval", "upper_bound",
                                                                                           "point"))
  specific_confidence: float = setting(0.95, "--selection=specific: the level of each confirmation drop's interval "
                                       "(central, paired bootstrap over documents).", lower=0.5, upper=0.999)
  general_max_samples: int = setting(800, "At most this many documents per general task in one confirmation decision: "
                                     "its identification documents (--general_samples), then more of the task's, "
                                     "disjoint from the held-out ones, where its power or a straddling interval asks. "
                                     "At least --general_samples.", lower=1)
  veto_alpha: float = setting(0.05, "Power of a general task to veto, printed at the start: the one-sided binomial "
                              "test's level.", lower=1e-6, upper=0.5)
  veto_power: float = setting(0.8, "Power of a general task to veto: a task whose documents (up to "
                              "--general_max_samples) cannot detect a --specific_max_general_drop drop with this "
                              "probability is unable to veto.", lower=0.5, upper=0.999)
  universal_threshold: float = setting(0.3, "A head is universal when ablating it alone drops at least "
                                       "--universal_min_tasks tasks (target included) by at least this (relative), "
                                       "estimated from the design and confirmed on held-out documents.",
                                       lower=1e-6, upper=1.0)
  universal_min_tasks: int = setting(2, "Tasks a universal head must break (see --universal_threshold).", lower=1)
  universal_candidates: int = setting(10, "At most this many heads the estimates flag as universal are confirmed "
                                      "by ablating them alone (best-ranked on the target first).", lower=0)
  curve_k: int = setting(10, "Heads in the specificity curve (the target drop and the largest general drop for "
                         "the top 1..curve_k selected heads ablated together, held out; the curve extends to "
                         "--top_k, on a geometric ladder past 12), and the selected heads also ablated alone.",
                         lower=1)
  bootstrap: int = setting(200, "Bootstrap resamples (of documents, and of masks for random designs) that give each "
                           "head a selection frequency and an interval on its value; no model evaluations. 0: off.",
                           lower=0)
  # The method's own settings (an instance of its `settings_class`); None: its defaults. Not a flag itself: its
  # fields are the method's flags.
  method_settings: Any = dataclasses.field(default=None, metadata={"flag": False})
  # The registered method `method` names, resolved once here (call sites use it; `method` is what runs record).
  method_object: Method = dataclasses.field(init=False, repr=False, compare=False, metadata={"flag": False})

  def __post_init__(self) -> None:
    self.method_object = methods.get(self.method)
    _check_composable(self.method_object)
    if self.method_settings is None:
      self.method_settings = self.method_object.settings_class()

  @classmethod
  def flag_fields(cls) -> dict[str, dataclasses.Field]:
    """The run-wide flags, then every registered method's (`jaxloc.localize.methods.flag_fields`)."""
    for name in methods.names():
      _check_composable(methods.get(name))
    return {**declared_flag_fields(cls), **methods.flag_fields()}

  @classmethod
  def from_flags(cls, values: Mapping[str, Any]) -> "LocalizeSettings":
    """From flag values by name (e.g. every parsed flag): the run-wide ones, and the flags of the method that
    `values["method"]` names; other names, other methods' flags included, are ignored."""
    run_wide = declared_flag_fields(cls)
    method = methods.get(values.get("method", methods.DEFAULT))
    return cls(**{f.name: values[name] for name, f in run_wide.items() if name in values},
               method_settings=build_declared(method.settings_class, values, method.flag_prefix))

  @classmethod
  def make(cls, **values: Any) -> "LocalizeSettings":
    """From flag names as keywords (`jaxloc.run_localization`'s): the run-wide settings and the method's own (e.g.
    `mask_steps=30` for a method with prefix "mask_"). A name that is neither is a UserError listing the valid
    ones."""
    run_wide = declared_flag_fields(cls)
    method = methods.get(values.get("method", methods.DEFAULT))
    own = set(method.flag_fields())
    unknown = sorted(set(values) - set(run_wide) - own)
    if unknown:
      others = {name: methods.owners(name) for name in unknown if methods.owners(name)}
      why = "".join(f"; {name} is a setting of {', '.join(owners)}" for name, owners in others.items())
      raise UserError(f"unknown setting(s) {unknown} for --method={method.name}{why}; its settings: "
                      f"{', '.join(sorted(own)) or 'none'}; run-wide: {', '.join(sorted(run_wide))}")
    return cls.from_flags(values)

  def replace(self, **changes: Any) -> "LocalizeSettings":
    """A copy with `changes` by flag name (`make`'s); with another method, that method's settings start from its
    defaults."""
    kept = self.flags() if changes.get("method", self.method) == self.method else self.run_wide_flags()
    return type(self).make(**{**kept, **changes})

  @property
  def selector(self) -> selection.Selection:
    """The selection rule that --selection and --specific_max_general_drop name (`jaxloc.localize.selection`)."""
    return selection.of(self.selection, self.specific_max_general_drop)

  def run_wide_flags(self) -> dict[str, Any]:
    return {name: getattr(self, f.name) for name, f in declared_flag_fields(type(self)).items()}

  def flags(self) -> dict[str, Any]:
    """Every setting of the run by flag name: the run-wide ones and the method's (heads.json `flags`)."""
    return {**self.run_wide_flags(), **flag_values(self.method_settings, prefix=self.method_object.flag_prefix)}

  def check(self) -> None:
    """The run-wide settings' rule (`jaxloc.config.problem`), the method's settings' rule, then the method's own
    checks."""
    check_fields(self)
    if self.general_max_samples < self.general_samples:
      raise UserError(f"--general_max_samples={self.general_max_samples} is below --general_samples="
                      f"{self.general_samples}: a confirmation decision uses at least the identification documents; "
                      f"raise it to {self.general_samples} or more")
    method = self.method_object
    if not isinstance(self.method_settings, method.settings_class):
      raise TypeError(f"method_settings is a {type(self.method_settings).__name__}, not {method.name}'s "
                      f"{method.settings_class.__name__} (change the method with LocalizeSettings.replace)")
    check_fields(self.method_settings, method.flag_prefix)
    if self.unit not in method.units:
      raise UserError(f"--method={self.method} localizes {' or '.join(method.units)}, not {self.unit}; with "
                      f"--unit={self.unit} use " + ", ".join(methods.names_for(self.unit)))
    method.check(self)

  def shared_measurement_settings(self) -> dict[str, Any]:
    """The settings that make any method's measurements what they are (a method adds its own)."""
    return {k: getattr(self, k) for k in ("model", "task", "task_options", "method", "unit", "num_samples", "seed",
                                          "exclude_heads", "ablation", "data_dir")}


def _check_composable(method: Method) -> None:
  """ValueError when a registered method cannot be part of the run settings: a flag of its own under a run-wide
  setting's name, or a run-wide setting it reads that is none."""
  run_wide = declared_flag_fields(LocalizeSettings)
  problems = [f"flag --{name} is taken by the run-wide settings" for name in method.flag_fields() if name in run_wide]
  problems += [f"run setting {name!r} is no LocalizeSettings field" for name in method.run_settings
               if name not in run_wide]
  if problems:
    raise ValueError(f"method {method.name!r} cannot be run: " + "; ".join(problems))
