"""Activation patching over every head in one compiled call against a PyTorch hook loop (one forward per head), on
IOI-style prompt pairs; and many masks scored in one call against one call per mask, by default and with exact=True.

    python -m experiments.benchmark_patching --output_json=benchmark_patching.json

Writes the JSON and prints the figures: times (best of --repeats warm runs), their ratio and the parity of the
patched logits. Run it on a quiet machine: every figure is from this one run. The benchmark's own flags are
`jaxloc.bench.patching.PatchingConfig`; --model and --dtype are `jaxloc.cli`'s.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxloc import cli, files
from jaxloc.api.model import load
from jaxloc.bench import patching
from jaxloc.config import setting
from jaxloc.models.torch_reference import load_hf_model


@dataclasses.dataclass
class BenchmarkPatchingConfig(patching.PatchingConfig):
  output_json: str = setting("benchmark_patching.json", "Where to write the figures.")


def main(config: BenchmarkPatchingConfig) -> dict:
  flags = cli.settings_from_flags(cli.ModelFlags)
  model = load(flags.model, dtype=flags.dtype, cache_dir=None if flags.cache_dir == "none" else flags.cache_dir)
  torch_model = load_hf_model(flags.model, np.dtype(model.loaded.dtype).name) if config.torch_baseline else None
  report = {"patching": patching.patching(model, config, torch_model)}
  print(patching.format_patching(report["patching"]), flush=True)  # before the second part, which takes longer
  report["many_masks"] = patching.many_masks(model, config)
  print(patching.format_many_masks(report["many_masks"]))
  files.write_json(config.output_json, report)
  return report


def console() -> None:
  cli.console(BenchmarkPatchingConfig, main, model_flags=True)
