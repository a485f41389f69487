"""Everything a localization run depends on, and how a settings dataclass becomes flags.

A settings dataclass (`LocalizeSettings`, a method's own, a command's config) declares each field once with
`setting(default, help, ...)`: its default, help, bounds and choices. Its flags are its fields, named with the
class's `flag_prefix` (a ClassVar, "" when absent) before the field name; a field made with `nested(Other)` holds
another settings dataclass and contributes that class's flags under that class's own prefix. So a method whose
settings have prefix "mask_" and a field `steps` has the flag --mask_steps, and a method that reuses another's
settings dataclass reuses its flags.
`jaxloc.cli.define_flags` defines the flags, `build` makes the dataclass back from flag values by name.

`LocalizeSettings` holds the run-wide settings (model, task, method, budget, selection, validation, bootstrap) and
the method's own settings object (`method_settings`, an instance of `methods.get(method).settings_class`, built from
the flags or keywords by the registry). Its flags are the run-wide fields plus every registered method's
(`flag_fields`); `flags()` is the flat record of a run (heads.json `flags`): the run-wide settings and the method's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxloc.errors import UserError
from jaxloc.models.loading import SMOLLM2_ALIAS


def setting(default: Any, help: str | Callable[[], str], **metadata: Any) -> Any:  # noqa: A002 - absl's word
  """A settings field: default, help text, and optional `lower`/`upper` bounds, `choices`, `type`, for a list the
  `element` type its flag's values are converted to, and `measured=True` for a method setting that changes what
  the method measures (a resumed run must match it). Help and choices may be callables, resolved when the flags are
  defined (e.g. lists that come from the method registry)."""
  if isinstance(default, (list, dict)):
    return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help, **metadata})
  return dataclasses.field(default=default, metadata={"help": help, **metadata})


def nested(settings_class: type) -> Any:
  """A field holding another settings dataclass (at its defaults unless given): its flags are that class's."""
  return dataclasses.field(default_factory=settings_class, metadata={"nested": settings_class})


def resolve(value: Any) -> Any:
  """A help text or choices given as a callable, called."""
  return value() if callable(value) else value


def default_of(field: dataclasses.Field) -> Any:
  return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def flag_fields(settings_class: type) -> dict[str, dataclasses.Field]:
  """Every flag of a settings dataclass, by flag name, in field order. A class whose flags are more than its fields
  (`LocalizeSettings`: the registry's methods add theirs) says so with a `flag_fields` classmethod."""
  if hasattr(settings_class, "flag_fields"):
    return settings_class.flag_fields()
  return declared_flag_fields(settings_class)


def declared_flag_fields(settings_class: type) -> dict[str, dataclasses.Field]:
  """The flags of the class's own fields: prefix + name, a nested class's under its own prefix."""
  prefix = getattr(settings_class, "flag_prefix", "")
  out: dict[str, dataclasses.Field] = {}
  for field in dataclasses.fields(settings_class):
    inner = field.metadata.get("nested")
    if inner is not None:
      out.update(flag_fields(inner))
    elif field.metadata.get("flag", True):
      out[prefix + field.name] = field
  return out


def build(settings_class: type, values: Mapping[str, Any]) -> Any:
  """The settings dataclass from flag values by flag name: a flag not in `values` keeps its default, a name the class
  has no flag for is ignored. A class that decides more (`LocalizeSettings`) has a `from_flags` classmethod."""
  if hasattr(settings_class, "from_flags"):
    return settings_class.from_flags(values)
  return build_declared(settings_class, values)


def build_declared(settings_class: type, values: Mapping[str, Any]) -> Any:
  prefix = getattr(settings_class, "flag_prefix", "")
  kwargs = {}
  for field in dataclasses.fields(settings_class):
    inner = field.metadata.get("nested")
    if inner is not None:
      kwargs[field.name] = build(inner, values)
    elif field.metadata.get("flag", True) and prefix + field.name in values:
      kwargs[field.name] = values[prefix + field.name]
  return settings_class(**kwargs)


def flag_values(settings: Any, measured_only: bool = False) -> dict[str, Any]:
  """{flag name: value} of a settings object (nested ones included); `measured_only`: only the fields marked
  `measured`."""
  prefix = getattr(settings, "flag_prefix", "")
  out: dict[str, Any] = {}
  for field in dataclasses.fields(settings):
    value = getattr(settings, field.name)
    if field.metadata.get("nested") is not None:
      out.update(flag_values(value, measured_only))
    elif field.metadata.get("flag", True) and (field.metadata.get("measured") or not measured_only):
      out[prefix + field.name] = value
  return out


def check_fields(settings: Any) -> None:
  """UserError naming the flag for a value out of its field's bounds or choices, or a required one missing."""
  fields = declared_flag_fields(type(settings))
  values = flag_values(settings)
  for name, field in fields.items():
    value, meta = values[name], field.metadata
    lower, upper = meta.get("lower"), meta.get("upper")
    if value is None and meta.get("required"):
      raise UserError(f"--{name} is required")
    if lower is not None and value is not None and value < lower:
      raise UserError(f"--{name}={value} must be ≥ {lower:g}")
    if upper is not None and value is not None and value > upper:
      raise UserError(f"--{name}={value} must be ≤ {upper:g}")
    choices = resolve(meta.get("choices"))
    if choices is not None and value not in choices:
      raise UserError(f"--{name}={value} must be one of {', '.join(choices)}")


def parse_value(name: str, field: dataclasses.Field, text: str) -> Any:
  """A flag's value from text (a variant token of the efficiency benchmark), as its field's type; UserError naming
  the flag when the text is not one."""
  default = default_of(field)
  kind = field.metadata.get("type", type(default))
  try:
    if kind is bool:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
      return text.lower() in ("true", "1")
    if kind is list:
      element = field.metadata.get("element", str)
      return [element(v) for v in text.split(",")]
    return kind(text)
  except ValueError:
    raise UserError(f"--{name}={text} is not a valid {kind.__name__}") from None


def _method_help(text: str, field: str) -> Callable[[], str]:
  """Help for a run-wide setting that methods read: `text` and what it means for each method that reads it."""

  def help_text() -> str:
    from jaxloc.localize import methods

    meanings = [f"{name}: {meaning}" for name, meaning in methods.run_setting_meanings(field)]
    return text + (" Per method: " + "; ".join(meanings) + "." if meanings else "")

  return help_text


def _method_names() -> list[str]:
  from jaxloc.localize import methods

  return methods.names()


def _default_method() -> str:
  from jaxloc.localize import methods

  return methods.DEFAULT


def _unit_help() -> str:
  from jaxloc.localize import methods

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
  method: str = dataclasses.field(default_factory=_default_method, metadata={
      "help": "Localization method (one of jaxloc.localize.methods.names()).", "choices": _method_names})
  unit: str = setting("heads", _unit_help, choices=("heads", "neurons"))
  task_options: dict = setting({}, "Task options as key=value.")
  num_masks: int = setting(300, _method_help("Evaluation budget of the method.", "num_masks"), lower=1)
  num_samples: int = setting(100, "Task documents used for identification (seeded subset).", lower=1)
  metric: str = setting(None, "Task metric to localize (default: the task's default metric).", type=str)
  top_k: int = setting(5, _method_help("Heads (neurons) reported and validated.", "top_k"), lower=1)
  exclude_heads: list = setting([], "Heads (with --unit=neurons: neurons) never ablated, e.g. L0H1,L1H3 (known "
                                "universal heads) or L3N117.")
  seed: int = setting(0, "Seed of the design, the CV folds and the document subset.")
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
                           "the target ranking as is. Universal heads are left out of both.", choices=("specific", "raw"))
  specific_max_general_drop: float = setting(0.1, "--selection=specific: the largest relative drop on "
                                             "any general task a selected head may have.", lower=0.0, upper=1.0)
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

  def __post_init__(self) -> None:
    from jaxloc.localize import methods

    if self.method_settings is None and self.method in methods.names():
      self.method_settings = methods.get(self.method).settings_class()

  @classmethod
  def flag_fields(cls) -> dict[str, dataclasses.Field]:
    """The run-wide flags, then every registered method's (`jaxloc.localize.methods.flag_fields`)."""
    from jaxloc.localize import methods

    return {**declared_flag_fields(cls), **methods.flag_fields()}

  @classmethod
  def from_flags(cls, values: Mapping[str, Any]) -> "LocalizeSettings":
    """From flag values by name (e.g. every parsed flag): the run-wide ones, and the flags of the method that
    `values["method"]` names; other names, other methods' flags included, are ignored."""
    from jaxloc.localize import methods

    run_wide = declared_flag_fields(cls)
    method = methods.get(values.get("method", default_of(run_wide["method"])))
    return cls(**{f.name: values[name] for name, f in run_wide.items() if name in values},
               method_settings=build(method.settings_class, values))

  @classmethod
  def make(cls, **values: Any) -> "LocalizeSettings":
    """From flag names as keywords (`jaxloc.run_localization`'s): the run-wide settings and the method's own (e.g.
    `mask_steps=30` for a method with prefix "mask_"). A name that is neither is a UserError listing the valid
    ones."""
    from jaxloc.localize import methods

    run_wide = declared_flag_fields(cls)
    method = methods.get(values.get("method", default_of(run_wide["method"])))
    own = set(flag_fields(method.settings_class))
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

  def run_wide_flags(self) -> dict[str, Any]:
    return {name: getattr(self, f.name) for name, f in declared_flag_fields(type(self)).items()}

  def flags(self) -> dict[str, Any]:
    """Every setting of the run by flag name: the run-wide ones and the method's (heads.json `flags`)."""
    return {**self.run_wide_flags(), **(flag_values(self.method_settings) if self.method_settings is not None
                                        else {})}

  def check(self) -> None:
    """The run-wide settings' bounds, the method's settings' bounds, then the method's own checks."""
    from jaxloc.localize import methods

    check_fields(self)
    method = methods.get(self.method)
    if not isinstance(self.method_settings, method.settings_class):
      raise TypeError(f"method_settings is a {type(self.method_settings).__name__}, not {method.name}'s "
                      f"{method.settings_class.__name__} (change the method with LocalizeSettings.replace)")
    check_fields(self.method_settings)
    if self.unit not in method.units:
      raise UserError(f"--method={self.method} localizes {' or '.join(method.units)}, not {self.unit}; with "
                      f"--unit={self.unit} use " + ", ".join(methods.names_for(self.unit)))
    method.check(self)

  def shared_measurement_settings(self) -> dict[str, Any]:
    """The settings that make any method's measurements what they are (a method adds its own)."""
    return {k: getattr(self, k) for k in ("model", "task", "task_options", "method", "unit", "num_samples", "seed",
                                          "exclude_heads", "ablation", "data_dir")}
