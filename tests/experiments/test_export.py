"""`experiments.export`: the checkpoint it writes from explicit heads and from a run (a mean-ablation run's fill in
the o_proj bias), and one-line errors before the model loads."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.main.export import ExportConfig, main
from jaxloc.models.decoder import Ablation, lm_logits
from jaxloc.models.export import read_metadata
from tests.experiments.conftest import run_cli
from tests.models.parity import keep_mask, logits, torch_logits

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = "The capital of France is Paris, and the capital of Italy is"


def _hf_logits(directory, ids) -> np.ndarray:
  model = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                            attn_implementation="eager")
  with torch.no_grad():
    return model(torch.tensor([ids])).logits[0].numpy()


def _tiny(tiny_model_dir):
  from jaxloc.models.loading import load_model

  return load_model(tiny_model_dir, dtype=jnp.float32, cache_dir=None)


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_cli_exports_explicit_heads(tiny_model_dir, tmp_path):
  out = tmp_path / "edited"
  proc = run_cli("experiments.export", f"--model={tiny_model_dir}", "--heads=L0H1,L2H3", f"--output={out}")
  assert proc.returncode == 0, proc.stderr
  assert "2 heads (L0H1,L2H3) ablated" in proc.stdout
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
  model = _tiny(tiny_model_dir)
  ids = model.tokenizer(PROMPT)["input_ids"]
  heads = [(0, 1), (2, 3)]
  ours = logits(model, ids, head_mask=keep_mask(model.config, heads))
  exported = _hf_logits(out, ids)
  # The source checkpoint under the o_proj hook is the same torch computation: equal to float32 rounding. jaxloc's
  # own parity with transformers on this model (weights scaled up 8x, logits near 15) is 1e-3.
  original = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                               attn_implementation="eager")
  assert np.abs(exported - torch_logits(original, ids, heads)).max() < 1e-5
  assert np.abs(exported - ours).max() < 1e-3
  assert np.abs(ours - logits(model, ids)).max() > 1e-2
  assert read_metadata(str(out))["jaxloc_heads"] == "L0H1,L2H3"


def _run_dir(tmp_path, tiny_model_dir, task, ablation):
  """A finished run's heads.json, as much of it as the export reads."""
  run = tmp_path / "run"
  run.mkdir()
  info = {"model": tiny_model_dir, "task": task, "unit": "heads", "top_k": ["L1H2", "L0H3"],
          "universal_heads": ["L2H0"], "heads": [],
          "flags": {"task": task, "task_options": {}, "num_samples": 6, "seed": 0, "data_dir": None,
                    "ablation": ablation}}
  (run / "heads.json").write_text(json.dumps(info))
  return str(run)


def test_mean_ablation_run_folds_its_means_into_the_o_proj_bias(tiny_model_dir, capitals_jsonl, tmp_path):
  from jaxloc.engine.engine import Engine
  from jaxloc.tasks.evaluator import load_task, mean_ablation_values

  run_dir = _run_dir(tmp_path, tiny_model_dir, capitals_jsonl, "mean")
  out = tmp_path / "edited"
  main(ExportConfig(output=str(out), run_dir=run_dir))
  model = _tiny(tiny_model_dir)
  task, docs = load_task(capitals_jsonl, {}, num_samples=6, seed=0, data_dir=None)
  fill = mean_ablation_values(Engine(model), task, docs)
  ids = model.tokenizer(PROMPT)["input_ids"]
  mask = keep_mask(model.config, [(1, 2), (0, 3)])
  tokens, positions = jnp.asarray(ids)[None, None], jnp.arange(len(ids))[None, None]
  hidden = model.module.apply({"params": model.params}, tokens, positions,
                              ablation=Ablation(head_mask=mask, head_fill=jnp.asarray(fill))).hidden
  ours = np.asarray(lm_logits(model.config, model.params, hidden))[0, 0]
  exported = _hf_logits(out, ids)
  assert np.abs(exported - ours).max() < 1e-3  # jaxloc's parity on this model (see above)
  assert np.abs(exported - logits(model, ids, head_mask=mask)).max() > 1e-2  # not the zero ablation
  assert read_metadata(str(out))["jaxloc_ablation"] == "mean"


def test_which_universal_exports_the_runs_universal_heads(tiny_model_dir, capitals_jsonl, tmp_path):
  out = tmp_path / "edited"
  main(ExportConfig(output=str(out), run_dir=_run_dir(tmp_path, tiny_model_dir, capitals_jsonl, "zero"),
                    which="universal"))
  assert read_metadata(str(out))["jaxloc_heads"] == "L2H0"


@pytest.mark.parametrize("fields, message", [
    (dict(heads=["L0X1"]), "bad head name 'L0X1'"),
    (dict(), "nothing to ablate"),
    (dict(heads=["L0H1"], neurons=["L0N1"]), "not both"),
    (dict(heads=["L0H1"], ablation="mean"), "give --run_dir"),
    (dict(run_dir="/no/such/run"), "is not a directory"),
])
def test_bad_flags_fail_before_the_model_loads(tmp_path, fields, message):
  with pytest.raises(UserError, match=message):
    main(ExportConfig(output=str(tmp_path / "out"), model="/no/such/model", **fields))


def test_a_non_empty_output_needs_overwrite(tiny_model_dir, tmp_path):
  (tmp_path / "keep.txt").write_text("x")
  with pytest.raises(UserError, match="not empty"):
    main(ExportConfig(output=str(tmp_path), model=tiny_model_dir, heads=["L0H1"]))
  with pytest.raises(UserError, match="out of range"):
    main(ExportConfig(output=str(tmp_path), model=tiny_model_dir, heads=["L9H0"], overwrite=True))


def test_a_run_and_another_model_conflict(tiny_model_dir, capitals_jsonl, tmp_path):
  with pytest.raises(UserError, match="drop --model"):
    main(ExportConfig(output=str(tmp_path / "out"), model="smollm2-135m",
                      run_dir=_run_dir(tmp_path, tiny_model_dir, capitals_jsonl, "zero")))
