"""The throughput benchmark's engines are the given engine with one setting changed, nothing dropped."""

import dataclasses

import numpy as np
import pytest

from jaxloc.bench import throughput
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.masks import random_masks
from jaxloc.engine.peak import matmul_peak


def test_compared_engines_differ_from_the_flags_engine_only_where_named(tiny_model):
  engine = Engine(tiny_model, EngineConfig(memory_budget_gb=0.5, tokens_per_batch=300, activation_dtype="float32",
                                           share_prefix=False))
  previous = throughput.previous_engine(engine, generation_batch=8)
  assert previous.config == dataclasses.replace(engine.config, pack=False, residual_cache_gb=0, generation_batch=8)
  unshared = throughput.variant(engine, share_prefix=True)
  assert unshared.config == dataclasses.replace(engine.config, share_prefix=True)
  assert previous.mesh is engine.mesh and previous.model is engine.model


def test_a_base_model_generates_from_plain_humaneval_prompts(tokenizer):
  """The generation workload prompts through the chat template when the tokenizer has one; a base model's tokenizer
  (Gemma 3 270M's GGUF has none) gets HumanEval's plain completion prompts: the function's signature and docstring."""
  import copy

  chat, chat_format = throughput.humaneval_prompts(tokenizer, 3)
  plain = copy.deepcopy(tokenizer)
  plain.chat_template = None
  base, base_format = throughput.humaneval_prompts(plain, 3)
  assert (chat_format, base_format) == ("chat template", "plain completion")
  assert len(base) == 3 and all(p.lstrip().startswith(("def ", "from ", "import ")) for p in base), base
  assert all(b in c for b, c in zip(base, chat))  # the same problems, each inside its chat rendering


@pytest.mark.heavy  # ~20 s: three generators compile and run
def test_the_gsm8k_workload_times_each_generator_on_the_same_texts(tiny_model):
  """The GSM8K workload on the tiny model: the engine's generator and the previous one emit the same texts, every
  implementation gets seconds per mask, tokens/s and a roofline fraction, and the table prints."""
  from jaxloc.bench import gsm8k_generation

  engine = Engine(tiny_model, EngineConfig(memory_budget_gb=0.5, activation_dtype="float32"))
  docs, source = gsm8k_generation.load_docs(3)
  requests = gsm8k_generation.gsm8k_requests(docs, 6)
  assert [r.stop for r in requests] == [gsm8k_generation.gsm8k.STOP] * 3 and requests[0].max_new_tokens == 6
  keep = random_masks(tiny_model.config, 2, 5)
  try:
    torch_model = gsm8k_generation.torch_model_from_config(tiny_model.config)
  except ImportError:
    torch_model = None
  bandwidth = gsm8k_generation.memory_bandwidth(8 * 2**20, repeats=3)
  peak = max(matmul_peak(((256, 256, 256),), repeats=3).values())
  result = gsm8k_generation.run(engine, requests, keep, peak_gflops=peak, bandwidth_gbs=bandwidth["best"],
                                torch_model=torch_model, questions=source, rounds=2)
  names = ("jaxloc", "previous_generator") + (("transformers_generate",) if torch_model is not None else ())
  for name in names:
    r = result[name]
    assert r["masks"] == 2 and 0 < r["tokens"] <= 2 * 3 * 6, (name, r)
    assert r["seconds_per_mask"] > 0 and r["tokens_per_second"] > 0 and r["roofline_fraction"] > 0
    assert len(r["seconds_per_round"]) == 2 and r["seconds"] == np.median(r["seconds_per_round"])
    assert r["same_texts_every_round"], name
  for name in names[1:]:
    ratios = result[f"speedup_vs_{name}_per_round"]
    assert len(ratios) == 2 and result[f"speedup_vs_{name}"] == np.median(ratios)
  assert result["previous_generator"]["texts_equal_jaxloc"] == {"equal": 6, "compared": 6}
  assert result["previous_generator"]["tokens"] == result["jaxloc"]["tokens"]
  assert result["speedup_vs_previous_generator"] > 0
  assert torch_model is None or result["speedup_vs_transformers_generate"] > 0
  floor = result["roofline"]
  assert result["shared_prefix_tokens"] > 600 and floor["floor_seconds"] == max(floor["compute_seconds"],
                                                                               floor["memory_seconds"]) > 0
  assert 0 < result["rows_per_mask_slot"] <= 3 and result["rows_per_call"] <= 6
  assert result["layers_held"] is True  # a small job at the default budget: holding them costs it no rows
  table = "\n".join(throughput.format_workloads({"gsm8k": result}))
  assert "previous_generator" in table and "projection, 400 masks x 100 documents" in table
  assert "layers laid out once, held by the job" in table
  assert "2 timed rounds" in table and "jaxloc's speed-up per round: previous_generator" in table
  assert "DIFFERED" not in table


def test_the_gsm8k_workload_runs_the_engine_alone_without_the_previous_generator(tiny_model):
  from jaxloc.bench import gsm8k_generation

  engine = Engine(tiny_model, EngineConfig(memory_budget_gb=0.5, activation_dtype="float32"))
  docs, source = gsm8k_generation.load_docs(2)
  result = gsm8k_generation.run(engine, gsm8k_generation.gsm8k_requests(docs, 4), random_masks(tiny_model.config, 2, 5),
                                peak_gflops=10.0, bandwidth_gbs=10.0, previous_masks=None, questions=source, rounds=1)
  assert "previous_generator" not in result and "speedup_vs_previous_generator" not in result
  assert result["jaxloc"]["seconds_per_mask"] > 0
  lines = gsm8k_generation.format_lines(result)
  assert [line.split()[0] for line in lines[2:3]] == ["jaxloc"] and "previous" not in "\n".join(lines)
  assert lines[-1].startswith("projection, 400 masks x 100 documents: jaxloc ")


def test_minutes_on_another_gpu_are_projected_to_an_h100_by_nominal_bandwidth():
  from jaxloc.bench import gsm8k_generation

  on_h200 = gsm8k_generation.h100_minutes(10.0, "NVIDIA H200")
  assert on_h200["h100_minutes"] == pytest.approx(10.0 * 4800 / 3352.32)  # an H100 reads memory 1.43x slower
  assert "14.3 minutes" in on_h200["h100_projection"]
  assert gsm8k_generation.h100_minutes(7.0, gsm8k_generation.H100)["h100_minutes"] == 7.0
  unknown = gsm8k_generation.h100_minutes(7.0, "cpu")
  assert unknown["h100_minutes"] is None and "no nominal bandwidth for 'cpu'" in unknown["h100_projection"]


def test_gsm8k_rounds_reverse_their_order_and_take_medians():
  """The rounds time every implementation once each, the order reversed every other round (a linear drift of the
  machine cancels over a pair), and the speed-ups are the median of each round's own ratio."""
  from jaxloc.bench import gsm8k_generation

  calls, seconds = [], {"jaxloc": [1.0, 2.0, 1.5], "previous_generator": [3.0, 5.0, 6.0], "other": [9.0, 9.0, 9.0]}
  texts = {"jaxloc": [["a"], ["a"], ["a"]], "previous_generator": [["a"], ["a"], ["a"]], "other": [["a"], ["b"], ["a"]]}

  def timer(name):
    def timed():
      calls.append(name)
      index = sum(c == name for c in calls) - 1
      return {"masks": 2, "seconds": seconds[name][index], "texts": texts[name][index]}
    return timed

  per_round = gsm8k_generation._rounds({name: timer(name) for name in seconds}, 3)
  assert calls == ["jaxloc", "previous_generator", "other", "other", "previous_generator", "jaxloc",
                   "jaxloc", "previous_generator", "other"]
  assert gsm8k_generation._speedups(per_round, "previous_generator") == pytest.approx([3.0, 2.5, 4.0])
  merged = gsm8k_generation._merged([r["previous_generator"] for r in per_round])
  assert merged["seconds"] == 5.0 and merged["seconds_per_round"] == [3.0, 5.0, 6.0]
  assert merged["same_texts_every_round"]
  assert not gsm8k_generation._merged([r["other"] for r in per_round])["same_texts_every_round"]


def test_the_roofline_counts_the_query_key_pairs_each_layer_attends():
  """Attention FLOPs of the roofline: every query over itself and what came before, a sliding-window layer's over its
  window only; counted pair by pair here."""
  from jaxloc.bench import gsm8k_generation
  from jaxloc.models.config import FULL, SLIDING, ModelConfig

  fields = dict(model_type="gemma3_text", vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=3,
                num_heads=2, num_kv_heads=1, head_dim=4, rms_norm_eps=1e-6, rope_theta=1e4, sliding_window=9,
                layer_types=(SLIDING, FULL, SLIDING))
  prefix, suffixes, fed = 7, (2, 5), 6  # two documents of one mask, each emitting fed + 1 tokens

  def pairs(window):  # every query's keys: the prefix's, then each document's suffix and fed tokens
    positions = list(range(prefix)) + [p for s in suffixes for p in range(prefix, prefix + s + fed)]
    return sum(min(p + 1, window) for p in positions)

  def attention(config):
    return gsm8k_generation.roofline(config, masks=1, suffixes=suffixes, prefix=prefix, emitted=2 * (fed + 1),
                                     rows_per_call=2, rows_per_slot=2, weights=1, kv_dtype_bytes=4, peak_gflops=1.0,
                                     bandwidth_gbs=1.0)["attention_flops"]

  per_pair = 4 * 2 * 4  # q·k and p·v, heads x head_dim, one layer
  assert attention(ModelConfig(**fields)) == per_pair * (2 * pairs(9) + pairs(10**9))
  assert attention(ModelConfig(**dict(fields, layer_types=(), sliding_window=None))) == per_pair * 3 * pairs(10**9)


def test_gsm8k_questions_come_from_the_data_dir_else_from_what_jaxloc_ships(tmp_path):
  import json

  from jaxloc.bench import gsm8k_generation

  shipped, source = gsm8k_generation.load_docs(8)
  pool = gsm8k_generation.shipped_questions()
  assert [d["question"] for d in shipped] == (pool + pool)[:8] and "ships" in source
  (tmp_path / "gsm8k").mkdir()
  rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(5)]
  (tmp_path / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  docs, source = gsm8k_generation.load_docs(3, str(tmp_path))
  assert len(docs) == 3 and all(d["question"].startswith("What is") for d in docs) and str(tmp_path) in source


def test_transformers_tokens_are_counted_to_the_first_stop_string_or_eos(tokenizer):
  from jaxloc.bench import gsm8k_generation

  answer = tokenizer(" 3 + 4 = 7\n#### 7\n\n", add_special_tokens=False)["input_ids"]
  after = tokenizer("Question: how many", add_special_tokens=False)["input_ids"]
  stops, eos = gsm8k_generation.gsm8k.STOP, {tokenizer.eos_token_id}
  n = gsm8k_generation._emitted(answer + after, tokenizer, stops, eos)
  assert "Question:" in tokenizer.decode((answer + after)[:n]) and "Question:" not in tokenizer.decode(
      (answer + after)[:n - 1])
  assert gsm8k_generation._emitted(answer + [tokenizer.eos_token_id] + after, tokenizer, stops, eos) == len(answer) + 1
  assert gsm8k_generation._emitted(answer, tokenizer, stops, eos) == len(answer)
