"""What a command prints by default: jaxloc's own messages as plain lines ("WARNING: ..." for a warning), and nothing
of the libraries' INFO logging (JAX probing for a TPU on a CPU machine, "Unable to initialize backend 'tpu'", its
compilation cache). `--verbosity=N` (absl's flag) keeps absl's full format and every logger's INFO lines."""

from __future__ import annotations

import logging

from absl import flags
from absl import logging as absl_logging

# Libraries whose INFO lines are theirs, not the run's (their warnings still show).
QUIET = ("jax", "jaxlib", "absl", "orbax", "etils", "datasets", "transformers", "urllib3", "filelock")


class PlainFormatter(logging.Formatter):
  def format(self, record: logging.LogRecord) -> str:
    message = record.getMessage()
    if record.exc_info:
      message += "\n" + self.formatException(record.exc_info)
    # "WARNING: ...", not "warning:": a command's one-line failure is the only line that starts with "error:".
    return message if record.levelno < logging.WARNING else f"{record.levelname}: {message}"


def plain_logging(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Plain lines and quiet libraries, unless the command line sets --verbosity (called once flags are parsed)."""
  if "verbosity" in flag_values and flag_values["verbosity"].present:
    return
  for name in QUIET:
    logging.getLogger(name).setLevel(logging.WARNING)
  absl_logging.get_absl_handler().setFormatter(PlainFormatter())
