"""Find the attention heads (or, with --unit=neurons, the MLP neurons) that carry a capability.

    python -m experiments.localize --flagfile=experiments/configs/smollm2_default.flags
    python -m experiments.localize --flagfile=experiments/configs/smollm2_plurals_cnl.flags  # neurons, CNL
    jaxloc-localize --flagfile=smollm2_learned_mask  # installed: a packaged flagfile by name (jaxloc.configs)

Writes measurements.npz (the target's; each general task's under the same masks in general/<task>/),
heads.json (neurons.json), coefficients.npy, heatmap.png (neurons_per_layer.png), ablation.json (held-out
validation), ablation_curve.png, specificity_curve.png and report.html to --output_dir. Re-running the same command
resumes an interrupted run without re-measuring any saved mask. The flags are the run-wide settings
(`jaxloc.localize.settings.LocalizeSettings`), every registered method's own (`jaxloc.localize.methods`; e.g.
--lasso_alpha; a flag of a method other than --method's is not read), --progress, and the model/engine flags.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
from absl import flags

from jaxloc import cli, files
from jaxloc.api.runs import execute
from jaxloc.config import nested, setting
from jaxloc.engine.config import EngineConfig
from jaxloc.localize import methods
from jaxloc.localize.preflight import saved_masks, scoring_settings
from jaxloc.localize.localization import Localization
from jaxloc.localize.settings import LocalizeSettings
from jaxloc.main import engine_flags
from jaxloc.models.loading import resolve_dtype
from jaxloc.report.summary import summary_table


@dataclasses.dataclass
class LocalizeConfig:
  settings: LocalizeSettings = nested(LocalizeSettings)  # its flags: run-wide and every registered method's
  progress: bool = setting(True, "Show a progress bar.")


def main(config: LocalizeConfig) -> None:
  settings = config.settings
  # Every user error that needs no model weights is reported before they load (the preflight stage): the settings
  # and the tasks, names and counts checked against the model's config, the output directory (held from here on), a
  # resume's settings. The engine then runs the other stages.
  localization = Localization.preflight(settings)
  with files.hold_run_directory(settings.output_dir):
    localization.check_resume(_flag_scoring_settings())
    engine = engine_flags.engine_from_flags()
    run = execute(localization, engine, progress=config.progress)
  print(summary_table(run.info, run.ablation))
  print(f"outputs in {settings.output_dir}")


def _flag_scoring_settings() -> dict[str, Any]:
  """`preflight.scoring_settings` of the engine that `engine_flags.engine_from_flags` builds, from the flags alone."""
  model_flags, engine_config = cli.settings_from_flags(cli.ModelFlags), cli.settings_from_flags(EngineConfig)
  dtype = np.dtype(resolve_dtype(model_flags.dtype)).name
  return scoring_settings(dtype, engine_config.activations_for(dtype), engine_config.share_prefix,
                          engine_config.float32_matmuls)


def define_flags() -> None:
  """The config's flags (--model is the model flags', which `engine_from_flags` loads), then the model flags."""
  cli.define_flags(LocalizeConfig, skip=("model",))
  cli.define_model_flags()


def config_from_flags() -> LocalizeConfig:
  """The parsed flags as a config; a flag given for another method than --method's is reported as not read."""
  config = cli.settings_from_flags(LocalizeConfig)
  method = config.settings.method
  unread = [name for name in methods.flag_fields() if flags.FLAGS[name].present and method not in methods.owners(name)]
  if unread:
    logging.warning("--method=%s does not read %s (settings of other methods)", method,
                    ", ".join(f"--{name}" for name in unread))
  return config


def interrupted() -> str:
  """What a Ctrl-C'd run says: the masks it saved, and how to resume."""
  return (f"{saved_masks(flags.FLAGS.output_dir)}; to resume, rerun {cli.command()} with the same flags (no saved "
          "mask is measured again)")


def console() -> None:
  define_flags()
  run_command()


def run_command() -> None:
  """The command on sys.argv, its flags defined (`define_flags`): one line and exit status 2 for a user error, 130
  for Ctrl-C (`cli.run`)."""
  cli.run(lambda argv: main(config_from_flags()), saved=interrupted)
