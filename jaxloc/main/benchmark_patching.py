"""Activation patching of every head at every position of a 20-token IOI pair, the residual stream by layer and
position, attribution patching and a filtered cache, against TransformerLens and nnsight (the `peers` extra; run in
an environment that has them); every head patched in one compiled call against a PyTorch hook loop; and many masks
scored in one call against one call per mask, by default and with exact=True.

    python -m experiments.benchmark_patching --output_json=benchmark_patching.json
    python -m experiments.benchmark_patching --parts=sweep   # the peers' comparison only

Writes the JSON and prints the figures: times (best of --repeats warm runs), their ratio and the parity of the
patched logits. Run it on a quiet machine: every figure is from this one run. The benchmark's own flags are
`jaxloc.bench.patching.PatchingConfig`; --model and --dtype are `jaxloc.cli`'s.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from jaxloc import cli, files
from jaxloc.api.model import load
from jaxloc.bench import patching
from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.models.torch_reference import load_hf_model


@dataclasses.dataclass
class BenchmarkPatchingConfig(patching.PatchingConfig, patching.SweepConfig):
  output_json: str = setting("benchmark_patching.json", "Where to write the figures.")
  parts: str = setting("sweep,patching,many_masks", "Which parts to run, comma-separated: sweep (against "
                       "TransformerLens and nnsight), patching (every head against a hook loop), many_masks.")


def main(config: BenchmarkPatchingConfig) -> dict:
  flags = cli.settings_from_flags(cli.ModelFlags)
  model = load(flags.model, dtype=flags.dtype, cache_dir=None if flags.cache_dir == "none" else flags.cache_dir)
  torch_model = load_hf_model(flags.model, np.dtype(model.loaded.dtype).name) if config.torch_baseline else None
  parts = [p.strip() for p in config.parts.split(",") if p.strip()]
  unknown = sorted(set(parts) - {"sweep", "patching", "many_masks"})
  if unknown or not parts:
    raise UserError(f"--parts={config.parts!r}: valid parts are sweep, patching, many_masks")
  report: dict = {"load": os.getloadavg()[0]}
  if "sweep" in parts:
    report["sweep"] = patching.sweep(model, config, torch_model)
    print(patching.format_sweep(report["sweep"]), flush=True)
  if "patching" in parts:
    report["patching"] = patching.patching(model, config, torch_model)
    print(patching.format_patching(report["patching"]), flush=True)  # before the next part, which takes longer
  if "many_masks" in parts:
    report["many_masks"] = patching.many_masks(model, config)
    print(patching.format_many_masks(report["many_masks"]))
  report["load_after"] = os.getloadavg()[0]
  print(f"load average (1 min) at the start {report['load']:.2f}, at the end {report['load_after']:.2f}")
  files.write_json(config.output_json, report)
  return report


def console() -> None:
  cli.console(BenchmarkPatchingConfig, main, model_flags=True)
