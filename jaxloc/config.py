"""Settings dataclasses and their flags: the one config framework every config uses (the engine's `EngineConfig`,
the CLI's `ModelFlags` and `DistributedFlags`, `LocalizeSettings` and every method's settings, each command's config).

A settings dataclass declares each field once with `setting(default, help, ...)`: its default, help, bounds and
choices. Its flags are its fields, named with the class's `flag_prefix` (a ClassVar, "" when absent) before the field
name; a field made with `nested(Other)` holds another settings dataclass and contributes that class's flags under
that class's own prefix. So settings with prefix "mask_" and a field `steps` have the flag --mask_steps.

`define_flags` defines a class's flags (absl: flagfiles work as usual), `settings_from_flags` builds the dataclass
back from the parsed flags, `build` from flag values by name. A class whose flags are more than its fields (the run
settings add every method's) says so with a `flag_fields` classmethod, and one that decides more when built with a
`from_flags` classmethod.

One rule checks every value, whichever way it comes (`problem`): the flag parser runs it on every flag it parses
that holds a number (a validator `define_flags` registers), `check_fields` on a settings object built in code. A
number must be finite (NaN and ±inf pass no bound: a comparison with NaN is always false), within its field's
`lower`/`upper` bounds; a field may allow inf with `infinite=True`, and a text field that holds a number or a word
(`words=("cv",)`) is held to the same rule when it is not one of its words.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from absl import flags

from jaxloc.errors import UserError


# A seed's bounds (`setting(0, help, **SEED)`): it seeds numpy's generators, which refuse a negative one, and
# jax.random.PRNGKey, which keeps 32 bits (without x64, seeds 2**32 apart would give the same key).
SEED = {"lower": 0, "upper": 2**32 - 1}


def setting(default: Any, help: str | Callable[[], str], **metadata: Any) -> Any:  # noqa: A002 - absl's word
  """A settings field: default, help text, and optional `lower`/`upper` bounds, `choices`, `type`, for a list the
  `element` type its flag's values are converted to, `infinite=True` for a number that may be inf, `words` for a
  text field that holds a number or one of these words, `required=True`, and `measured=True` for a method setting
  that changes what the method measures (a resumed run must match it). Help and choices may be callables, resolved
  when the flags are defined (e.g. lists that come from the method registry)."""
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


def kind_of(field: dataclasses.Field) -> type:
  """The type of a field's flag: its `type`, else its default's."""
  return field.metadata.get("type", type(default_of(field)))


def flag_fields(settings_class: type) -> dict[str, dataclasses.Field]:
  """Every flag of a settings dataclass, by flag name, in field order. A class whose flags are more than its fields
  (`LocalizeSettings`: the registry's methods add theirs) says so with a `flag_fields` classmethod."""
  if hasattr(settings_class, "flag_fields"):
    return settings_class.flag_fields()
  return declared_flag_fields(settings_class)


def declared_flag_fields(settings_class: type, prefix: str | None = None) -> dict[str, dataclasses.Field]:
  """The flags of the class's own fields: prefix (`prefix`, else the class's `flag_prefix`) + name, a nested
  class's under its own prefix."""
  prefix = getattr(settings_class, "flag_prefix", "") if prefix is None else prefix
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


def build_declared(settings_class: type, values: Mapping[str, Any], prefix: str | None = None) -> Any:
  prefix = getattr(settings_class, "flag_prefix", "") if prefix is None else prefix
  kwargs = {}
  for field in dataclasses.fields(settings_class):
    inner = field.metadata.get("nested")
    if inner is not None:
      kwargs[field.name] = build(inner, values)
    elif field.metadata.get("flag", True) and prefix + field.name in values:
      kwargs[field.name] = values[prefix + field.name]
  return settings_class(**kwargs)


def flag_values(settings: Any, measured_only: bool = False, prefix: str | None = None) -> dict[str, Any]:
  """{flag name: value} of a settings object (nested ones included); `measured_only`: only the fields marked
  `measured`."""
  prefix = getattr(settings, "flag_prefix", "") if prefix is None else prefix
  out: dict[str, Any] = {}
  for field in dataclasses.fields(settings):
    value = getattr(settings, field.name)
    if field.metadata.get("nested") is not None:
      out.update(flag_values(value, measured_only))
    elif field.metadata.get("flag", True) and (field.metadata.get("measured") or not measured_only):
      out[prefix + field.name] = value
  return out


def holds_numbers(field: dataclasses.Field) -> bool:
  """Whether the number rule applies to the field's flag: a float, a list of floats, a number-or-word text."""
  kind = kind_of(field)
  return kind is float or (kind is list and field.metadata.get("element") is float) or "words" in field.metadata


def _number(bound: float) -> str:
  """A bound as a message shows it (an integer's every digit: 4294967295, not 4.29497e+09)."""
  return f"{bound:g}" if isinstance(bound, float) else str(bound)


def _valid_range(meta: Mapping[str, Any]) -> str:
  lower, upper = meta.get("lower"), meta.get("upper")
  words = "".join(f"'{w}' or " for w in meta.get("words", ()))
  number = "a number" if meta.get("infinite") else "a finite number"
  if lower is not None and upper is not None:
    return f"{words}{number} in [{_number(lower)}, {_number(upper)}]"
  if lower is not None:
    return f"{words}{number} ≥ {_number(lower)}"
  if upper is not None:
    return f"{words}{number} ≤ {_number(upper)}"
  return words + number


def problem(field: dataclasses.Field, value: Any) -> str | None:
  """What is wrong with `value` for `field` (the words after "--flag=value"), or None: the one rule for every
  setting. A number: finite unless `infinite`, within `lower`/`upper`; a number-or-word text: one of its `words` or
  such a number; a list of numbers: each; a list: no empty entry (`--general_tasks=counting,,`); a value with
  `choices`: one of them; a `required` one: given."""
  meta = field.metadata
  if value is None:
    return "is required" if meta.get("required") else None
  if isinstance(value, (list, tuple)) and any(isinstance(v, str) and not v.strip() for v in value):
    return "has an empty entry: give the entries separated by single commas, none of them empty"
  if isinstance(value, (list, tuple)) and holds_numbers(field):
    element = dataclasses.field(metadata={k: v for k, v in meta.items() if k != "element"})
    bad = [(v, wrong) for v in value if (wrong := problem(element, v))]
    return f"has a bad element, {bad[0][0]}: it {bad[0][1]}" if bad else None
  if isinstance(value, str) and "words" in meta:
    if value in meta["words"]:
      return None
    try:
      value = float(value)
    except ValueError:
      return f"must be {_valid_range(meta)}"
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    if math.isnan(value) or (math.isinf(value) and not meta.get("infinite")):
      return f"is not a finite number: give {_valid_range(meta)}"
    lower, upper = meta.get("lower"), meta.get("upper")
    if lower is not None and value < lower:
      return f"must be ≥ {_number(lower)}"
    if upper is not None and value > upper:
      return f"must be ≤ {_number(upper)}"
  choices = resolve(meta.get("choices"))
  if choices is not None and value not in choices:
    return f"must be one of {', '.join(choices)}"
  return None


def check_fields(settings: Any, prefix: str | None = None) -> None:
  """UserError naming the flag for a value `problem` finds wrong (out of bounds, not finite, not a choice, a required
  one missing); `prefix` as `declared_flag_fields`'s."""
  fields = declared_flag_fields(type(settings), prefix)
  values = flag_values(settings, prefix=prefix)
  for name, field in fields.items():
    wrong = problem(field, values[name])
    if wrong == "is required":
      raise UserError(f"--{name} is required")
    if wrong:
      shown = ",".join(map(str, values[name])) if isinstance(values[name], (list, tuple)) else values[name]
      raise UserError(f"--{name}={shown} {wrong}")


def parse_value(name: str, field: dataclasses.Field, text: str) -> Any:
  """A flag's value from text (a variant token of the efficiency benchmark), as its field's type; UserError naming
  the flag when the text is not one or breaks the field's rule (`problem`)."""
  kind = kind_of(field)
  try:
    if kind is bool:
      if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(text)
      value: Any = text.lower() in ("true", "1")
    elif kind is list:
      element = field.metadata.get("element", str)
      value = [element(v) for v in text.split(",")]
    else:
      value = kind(text)
  except ValueError:
    raise UserError(f"--{name}={text} is not a valid {kind.__name__}") from None
  wrong = problem(field, value)
  if wrong:
    raise UserError(f"--{name}={text} {wrong}")
  return value


def define_flags(settings_class, skip: tuple[str, ...] = (), flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """One flag per flag of a settings dataclass (`flag_fields`: its `setting` fields, under its prefix, nested
  settings included; `LocalizeSettings` adds every registered method's): default, help, bounds and choices come
  from the field, so the flag and the settings never disagree. A flag that holds a number gets the number rule
  (`problem`) as a validator: the parser refuses NaN, inf, or a value out of bounds before the command starts."""
  for name, field in flag_fields(settings_class).items():
    if name in skip:
      continue
    meta = field.metadata
    default = default_of(field)
    help_text = resolve(meta.get("help", ""))
    kind = kind_of(field)
    options = resolve(meta.get("choices"))
    bounds = {k: meta[b] for k, b in (("lower_bound", "lower"), ("upper_bound", "upper")) if b in meta}
    where = {"flag_values": flag_values}
    if options:
      flags.DEFINE_enum(name, default, list(options), help_text, **where)
    elif kind is bool:
      flags.DEFINE_bool(name, default, help_text, **where)
    elif kind is int:
      flags.DEFINE_integer(name, default, help_text, **bounds, **where)
    elif kind is float:  # absl's bounds let NaN through: the number rule's validator (below) refuses it
      flags.DEFINE_float(name, default, help_text, **bounds, **where)
    elif kind in (list, dict):
      shown = (None if default is None else [f"{k}={v}" for k, v in default.items()] if kind is dict
               else [str(v) for v in default])
      flags.DEFINE_list(name, shown, help_text, **where)
    else:
      flags.DEFINE_string(name, default, help_text, **where)
    if holds_numbers(field):
      flags.register_validator(name, _number_validator(name, field), flag_values=flag_values)
    if meta.get("required"):
      flags.mark_flag_as_required(name, flag_values=flag_values)


def _number_validator(name: str, field: dataclasses.Field) -> Callable[[Any], bool]:
  def valid(value: Any) -> bool:
    if kind_of(field) is list and value is not None:
      try:
        value = [field.metadata["element"](v) for v in value]
      except ValueError:
        raise flags.ValidationError(f"{','.join(value)} must be a list of numbers") from None
    wrong = problem(field, value)
    if wrong and wrong != "is required":  # absl says which required flag is missing
      shown = ",".join(map(str, value)) if isinstance(value, list) else value
      raise flags.ValidationError(f"{shown} {wrong}")
    return True

  return valid


def settings_from_flags(settings_class, flag_values: flags.FlagValues = flags.FLAGS) -> Any:
  """The settings dataclass built from the parsed flags that `define_flags` defined (`build`: a `LocalizeSettings`
  takes the flags of the method `--method` names)."""
  values = {}
  for name, field in flag_fields(settings_class).items():
    if name not in flag_values:
      continue
    value = flag_values[name].value
    kind = kind_of(field)
    if kind is dict:
      value = parse_options(value)
    elif kind is list:
      value = _elements(name, value, field.metadata.get("element"))
    values[name] = value
  return build(settings_class, values)


def _elements(name: str, values, element) -> list:
  """A list flag's values converted to the field's `element` type (strings when it names none)."""
  if element is None:
    return list(values)
  try:
    return [element(v) for v in values]
  except ValueError:
    raise UserError(f"--{name}={','.join(values)} must be a list of {element.__name__}s") from None


def parse_options(values: list[str] | None) -> dict[str, str]:
  """'key=value' strings (a list flag) -> dict."""
  options = {}
  for item in values or []:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise UserError(f"bad option {item!r}: expected key=value")
    options[key.strip()] = value.strip()
  return options
