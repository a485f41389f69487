"""The patching benchmark runs the shipped `Model.patch` and the PyTorch hook loop on the same IOI pairs, and they
agree (`jaxloc.bench.patching`)."""

import numpy as np
import pytest

import jaxloc
from jaxloc.bench import patching

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.mark.heavy  # the tiny model compiled for four shapes, and a PyTorch forward per head
def test_patching_benchmark_agrees_with_the_hook_loop(tiny_model_dir, tokenizer):
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
  model = jaxloc.from_hf(torch_model, tokenizer=tokenizer)
  config = patching.PatchingConfig(pairs=2, repeats=1, score_masks=3)
  clean, corrupted, answers = patching.ioi_pairs(model, 2)
  assert len({len(ids) for ids in model.tokens(clean + corrupted)}) == 1
  assert all(clean[i] != corrupted[i] for i in range(2)) and answers[0][0] != answers[0][1]
  report = {"patching": patching.patching(model, config, torch_model), "many_masks": patching.many_masks(model, config)}
  p = report["patching"]
  assert p["heads"] == model.config.num_layers * model.config.num_heads and p["pairs"] == 2
  assert p["parity_max_abs_logit"] < 1e-3 and p["parity_max_abs_logit_difference"] < 1e-3
  assert np.isfinite(p["speedup"]) and p["clean_logit_difference"] != p["corrupted_logit_difference"]
  assert report["many_masks"]["max_abs_score_difference"] < 1e-3
  assert report["many_masks"]["exact_scores_identical"] and report["many_masks"]["exact_masks"] == 3
  assert "PyTorch hook loop" in patching.format_report(report)


@pytest.mark.heavy  # every head at every position of a 20-token pair on the tiny model, twice, and the residual stream
def test_sweep_patches_every_head_at_every_position_and_skips_only_cells_that_patch_nothing(tiny_model_dir, tokenizer):
  torch_model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
  model = jaxloc.from_hf(torch_model, tokenizer=tokenizer)
  report = patching.sweep(model, patching.SweepConfig())  # no peers: jaxloc's side only
  j = report["jaxloc"]
  c = model.config
  assert j["head_position_patches"] == c.num_layers * report["tokens"] * c.num_heads
  assert j["resid_pre_patches"] == c.num_layers * report["tokens"]
  assert j["skip_vs_every_cell_max_abs"] < 1e-4  # skipping unchanged cells changes no result
  assert -1 <= j["atp_vs_exact_correlation"] <= 1 and j["cache_entries"] == 2
  assert j["clean_metric"] != j["corrupted_metric"] and "peers" not in report
  assert "every head x position" in patching.format_sweep(report)


def test_performance_page_states_the_committed_sweep():
  """docs/performance.md's sweep table says what docs/speed/benchmark_patching_sweep.json holds."""
  import json
  import os

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, "docs", "speed", "benchmark_patching_sweep.json"), encoding="utf-8") as f:
    sweep = json.load(f)["sweep"]
  with open(os.path.join(root, "docs", "performance.md"), encoding="utf-8") as f:
    page = f.read()
  j, p = sweep["jaxloc"], sweep["peers"]
  for figure in (f"{j['seconds_per_patch'] * 1e3:.2f} ms", f"{j['head_position_seconds']:.1f} s",
                 f"**{p['speedup_vs_transformer_lens']:.0f}x**", f"**{p['speedup_vs_nnsight']:.0f}x**",
                 f"{p['transformer_lens']['seconds_per_patch']:.3f} s", f"{p['nnsight']['seconds_per_patch']:.3f} s"):
    assert figure in page, figure
