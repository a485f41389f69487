"""Export the edited model: a Hugging Face checkpoint with a run's heads (or neurons) ablated in its weights.

    python -m experiments.export --run_dir=docs/default_run --output=/tmp/smollm2_edited
    python -m experiments.export --model=smollm2-135m --heads=L8H1,L20H5 --output=/tmp/smollm2_edited
    python -m experiments.export --model=smollm2-135m --neurons=L3N117,L20N5 --output=/tmp/smollm2_neurons

The directory holds config.json, generation_config.json, model.safetensors and the tokenizer's files: load it with
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` (or vLLM) and the chosen heads' `o_proj` input columns (the
neurons' `down_proj` columns) are zero, so it computes what jaxloc computes under the run's mask. A mean-ablation run's
fill values (each unit's mean output over the run's own documents) go into the projection's bias where the family can
hold one (`jaxloc.models.export`). GGUF models are quantized: their dequantized weights are written in --dtype.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from jaxloc import cli
from jaxloc.api import read_run
from jaxloc.config import setting
from jaxloc.engine.engine import Engine
from jaxloc.errors import UserError
from jaxloc.units import parse_units, singular, units_per_layer
from jaxloc.models import packaged
from jaxloc.models.export import check_bias_holds, fold_ablation, write_hf_checkpoint
from jaxloc.models.loading import load_model
from jaxloc.tasks.evaluator import load_task, mean_ablation_values

# What parse_units checks before the model (and so its size) is known: the names' form only.
_ANY_SIZE = 1 << 30


@dataclasses.dataclass
class ExportConfig:
  output: str = setting(None, "Directory to write the checkpoint to (must be empty or new, unless --overwrite).",
                        type=str, required=True)
  run_dir: str = setting(None, "A finished localization run: export its model with its selected units ablated "
                         "(--which) the way it ablated them.", type=str)
  which: str = setting("top_k", "With --run_dir: the run's list to ablate, its selected top-k units or the universal "
                       "ones it flagged.", choices=("top_k", "universal"))
  model: str = setting(None, "Without --run_dir: the model to edit (an alias, .gguf file, HF directory or hub id; "
                       f"default {packaged.SMOLLM2.alias}). With --run_dir it must be the run's model if given.",
                       type=str)
  heads: list = setting([], "Without --run_dir: heads to ablate, e.g. L8H1,L20H5.")
  neurons: list = setting([], "Without --run_dir: MLP neurons to ablate, e.g. L3N117,L20N5 (their down_proj columns "
                          "are zeroed).")
  ablation: str = setting(None, "zero, or mean (the units' mean outputs over the run's documents become an o_proj / "
                          "down_proj bias; needs --run_dir); default: the run's ablation, zero without a run.",
                          type=str, choices=("zero", "mean"))
  dtype: str = setting("float32", "dtype of the written weights (GGUF weights are dequantized to it).",
                       choices=("float32", "bfloat16"))
  overwrite: bool = setting(False, "Write into --output even when it already holds files (same-named files are "
                            "replaced).")


@dataclasses.dataclass
class Edit:
  """What to export, settled before the model loads: the model, the unit names and how they are ablated."""

  model: str
  unit: str
  names: list[str]
  ablation: str
  run: Any = None  # the run (jaxloc.api.Run) whose documents mean ablation averages over


def _edit(config: ExportConfig) -> Edit:
  """The edit the flags ask for; every mistake a user can make in them is reported here, before any model loads."""
  if config.run_dir is None:
    if config.heads and config.neurons:
      raise UserError("give --heads or --neurons, not both")
    if not (config.heads or config.neurons):
      raise UserError("nothing to ablate: give --run_dir, or --heads / --neurons")
    if config.ablation == "mean":
      raise UserError("--ablation=mean needs the documents the means are taken over: give --run_dir")
    unit = "neurons" if config.neurons else "heads"
    names = list(config.neurons or config.heads)
    parse_units(names, _ANY_SIZE, _ANY_SIZE, unit)
    return Edit(config.model or packaged.SMOLLM2.alias, unit, names, config.ablation or "zero")
  if config.heads or config.neurons:
    raise UserError("--run_dir gives the units to ablate: drop --heads / --neurons (or --run_dir)")
  if not os.path.isdir(config.run_dir):
    raise UserError(f"--run_dir={config.run_dir} is not a directory")
  run = read_run(config.run_dir)
  key = "top_k" if config.which == "top_k" else f"universal_{run.unit}"
  if key not in run.info:
    raise UserError(f"{config.run_dir} has no {key!r} list for --which={config.which}: its {run.unit}.json predates "
                    "it or the run flagged none; use --which=top_k")
  names = list(run.info[key])
  if not names:
    raise UserError(f"{config.run_dir}'s {key!r} list is empty: nothing to ablate")
  model = run.info["model"]
  if config.model is not None and config.model != model:
    raise UserError(f"--model={config.model}, but {config.run_dir} localized {model}: drop --model")
  return Edit(model, run.unit, names, config.ablation or run.info.get("flags", {}).get("ablation", "zero"), run)


def _check_output(config: ExportConfig) -> None:
  if os.path.isfile(config.output):
    raise UserError(f"--output={config.output} is a file; give a directory")
  if os.path.isdir(config.output) and os.listdir(config.output) and not config.overwrite:
    raise UserError(f"--output={config.output} is not empty; give a new directory or --overwrite")


def _run_documents(edit: Edit):
  """(task, documents) the run's own mean ablation averaged over: its target task's identification documents (loaded
  before the model, so a missing dataset is reported first)."""
  flags = edit.run.info.get("flags", {})
  return load_task(flags.get("task", edit.run.info["task"]), flags.get("task_options") or {},
                   num_samples=flags.get("num_samples"), seed=flags.get("seed", 0), data_dir=flags.get("data_dir"))


def main(config: ExportConfig) -> str:
  import jax.numpy as jnp

  edit = _edit(config)
  _check_output(config)
  documents = _run_documents(edit) if edit.ablation == "mean" else None
  model = load_model(edit.model, dtype=getattr(jnp, config.dtype))
  c = model.config
  units = parse_units(edit.names, c.num_layers, units_per_layer(c, edit.unit), edit.unit)
  if os.path.isfile(model.source):  # a GGUF file (HF checkpoints are directories)
    logging.warning("%s is a GGUF file (%s), quantized: the export holds its dequantized weights in %s", edit.model,
                    model.source, config.dtype)
  fill = None
  if edit.ablation == "mean":
    check_bias_holds(c, edit.unit)
    print(f"mean ablation: measuring each {singular(edit.unit)}'s mean output over the run's documents")
    fill = mean_ablation_values(Engine(model), *documents, unit=edit.unit)
  if edit.unit == "heads":
    edited, params = fold_ablation(c, model.params, heads=units, head_fill=fill)
  else:
    edited, params = fold_ablation(c, model.params, neurons=units, neuron_fill=fill)
  metadata = {"jaxloc_model": edit.model, f"jaxloc_{edit.unit}": ",".join(edit.names),
              "jaxloc_ablation": edit.ablation}
  if config.run_dir:
    metadata["jaxloc_run"] = os.path.abspath(config.run_dir)
  written = write_hf_checkpoint(config.output, edited, params, model.tokenizer, metadata)
  what = "o_proj input columns" if edit.unit == "heads" else "down_proj input columns"
  bias = (" and their mean outputs folded into the " + ("o_proj" if edit.unit == "heads" else "down_proj") + " bias"
          if fill is not None else "")
  print(f"{edit.model}: {len(units)} {edit.unit} ({','.join(edit.names)}) ablated: {what} zeroed{bias}")
  print(f"wrote {config.output}: {', '.join(written)}")
  return config.output


def console() -> None:
  cli.console(ExportConfig, main)
