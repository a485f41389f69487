"""`experiments.evaluate`: the JSON contract, parity with transformers, and one-line errors."""

import json

import numpy as np
import pytest

from jaxloc.fixed_ablation import evaluate_heads, evaluate_masks, load_documents
from jaxloc.localize.validate import drop_interval
from jaxloc.tasks.evaluator import load_task, load_task_split
from jaxloc.units import keep_mask, parse_heads
from tests.experiments.conftest import run_cli

HEADS = ["L3H1", "L12H5", "L20H0"]


def test_custom_jsonl_with_heads_matches_transformers(smollm2, smollm2_engine, smollm2_torch, capitals_jsonl):
  import torch
  from jaxloc.models.torch_reference import ablated_heads

  result = evaluate_heads(smollm2_engine, capitals_jsonl, heads=HEADS)
  tok = smollm2.tokenizer
  correct, logprobs = [], []
  with open(capitals_jsonl) as f:
    rows = [json.loads(line) for line in f]
  with torch.no_grad(), ablated_heads(smollm2_torch, parse_heads(HEADS, 30, 9)):
    for row in rows:
      ctx = tok(row["prompt"])["input_ids"]
      cont = tok(row["target"], add_special_tokens=False)["input_ids"]
      logits = smollm2_torch(torch.tensor([ctx + cont])).logits[0, len(ctx) - 1:-1]
      lp = torch.log_softmax(logits, -1)[torch.arange(len(cont)), torch.tensor(cont)].sum()
      logprobs.append(float(lp))
      correct.append(bool((logits.argmax(-1) == torch.tensor(cont)).all()))
  assert result["metrics"]["accuracy"] == pytest.approx(np.mean(correct), abs=1e-9)
  assert abs(result["metrics"]["logprob"] - np.mean(logprobs)) < 1e-3
  assert result["heads"] == HEADS and result["num_samples"] == len(rows) and result["ablation"] == "zero"


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_cli_writes_the_contract_json(tiny_model_dir, capitals_jsonl, tmp_path):
  out = tmp_path / "result.json"
  proc = run_cli("experiments.evaluate", f"--model={tiny_model_dir}", f"--task={capitals_jsonl}",
                 "--heads=L0H1,L2H3", "--ablation=mean", "--num_samples=5", f"--output_json={out}",
                 "--cache_dir=none")
  assert proc.returncode == 0, proc.stderr[-2000:]
  result = json.loads(out.read_text())
  assert set(result) == {"model", "task", "heads", "ablation", "num_samples", "metrics"}
  assert result["heads"] == ["L0H1", "L2H3"] and result["ablation"] == "mean" and result["num_samples"] == 5
  assert set(result["metrics"]) == {"accuracy", "logprob"}
  assert "logprob:" in proc.stdout


def test_curve_evaluates_every_prefix_of_the_ranking_in_one_batch(smollm2_engine, capitals_jsonl):
  result = evaluate_heads(smollm2_engine, capitals_jsonl, heads=HEADS, curve=True)
  assert [row["heads"] for row in result["curve"]] == [[], HEADS[:1], HEADS[:2], HEADS]
  assert result["metrics"] == result["curve"][-1]["metrics"] and result["heads"] == HEADS
  for row in result["curve"]:  # each row equals evaluating that prefix alone
    alone = evaluate_heads(smollm2_engine, capitals_jsonl, heads=row["heads"])["metrics"]
    assert alone == pytest.approx(row["metrics"], abs=1e-4)
  assert "curve" not in evaluate_heads(smollm2_engine, capitals_jsonl, heads=HEADS)


def test_a_curve_gives_each_prefix_its_drop_with_the_validation_interval(smollm2_engine, capitals_jsonl):
  result = evaluate_heads(smollm2_engine, capitals_jsonl, heads=HEADS, curve=True)
  masks = np.stack([keep_mask(parse_heads(row["heads"], 30, 9), 30, 9) for row in result["curve"]])
  per_doc = evaluate_masks(smollm2_engine, capitals_jsonl, masks, per_doc=True)
  for name in ("accuracy", "logprob"):
    values = np.array([row["metrics"][name] for row in result["curve"]])
    drops = np.array([row["relative_drop"][name] for row in result["curve"]])
    np.testing.assert_allclose(drops, (values[0] - values) / abs(values[0]), atol=1e-12)
    intervals = np.array([row["relative_drop_interval"][name] for row in result["curve"]])
    np.testing.assert_allclose(intervals, drop_interval(per_doc[name]), atol=1e-4)
  assert result["curve"][0]["relative_drop"] == {"accuracy": 0, "logprob": 0}
  assert result["curve"][-1]["relative_drop"]["logprob"] != 0


def test_skip_samples_are_a_localization_runs_held_out_documents():
  task, identification, held_out = load_task_split("plurals", num_samples=30, validation_samples=20, seed=2,
                                                   data_dir=None)
  _, skipped = load_documents("plurals", num_samples=20, seed=2, skip_samples=30)
  assert skipped == held_out and len(skipped) == 20
  assert identification == load_task("plurals", num_samples=30, seed=2, data_dir=None)[1]
  assert not {json.dumps(d, sort_keys=True) for d in skipped} & {json.dumps(d, sort_keys=True) for d in identification}
  unskipped = load_documents("plurals", num_samples=20, seed=2)[1]
  assert unskipped == load_task("plurals", num_samples=20, seed=2, data_dir=None)[1]


@pytest.mark.parametrize("args, message", [
    (["--task=no_such_task"], "unknown task 'no_such_task'"),
    (["--task=/no/such/file.jsonl"], "/no/such/file.jsonl"),
    (["--task=counting", "--model=/no/such/model.gguf"], "GGUF file not found"),
    (["--task=counting", "--heads=L99H0"], "out of range"),
    (["--task=counting", "--num_samples=0"], "num_samples"),
    (["--task=counting", "--ablation=half"], "ablation"),
    (["--task=counting", "--curve"], "--curve evaluates the prefixes of a ranking"),
    (["--task=counting", "--skip_samples=10"], "give how many with --num_samples"),
    (["--task=counting", "--skip_samples=-1"], "skip_samples"),
    (["--task=counting", "--skip_samples=100000", "--num_samples=5"], "need 100005 disjoint ones"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, tiny_model_dir):
  if not any(a.startswith("--model=") for a in args):
    args = args + [f"--model={tiny_model_dir}", "--cache_dir=none"]
  proc = run_cli("experiments.evaluate", *args)
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  assert message in proc.stderr and "Traceback" not in proc.stderr


def test_malformed_jsonl_names_file_and_line(tiny_model_dir, tmp_path):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "a", "target": " b"}\n{"prompt": "c", "target": \n')
  proc = run_cli("experiments.evaluate", f"--model={tiny_model_dir}", f"--task={bad}", "--cache_dir=none")
  assert proc.returncode == 2 and f"{bad}:2" in proc.stderr and "Traceback" not in proc.stderr
