"""The GSM8K generation workload: the real 5-shot prompts of `jaxloc.tasks.gsm8k` under random head masks, greedy to
the task's stop strings or the token cap, timed with the engine's generator, the previous generator
(`jaxloc.bench.previous_generation`, on the same engine and budgets) and batched `transformers.generate`, against a
roofline of the work itself. After the warm-ups, timed rounds run each implementation once, the order reversed every
other round (`run`'s `rounds`): a speed-up is the median of the rounds' own ratios, so a machine whose speed drifts
over the minutes a slow baseline takes slows both sides of each ratio alike.

Questions: the test split from `--data_dir` (`<data_dir>/gsm8k/test.jsonl`) when one is given, else the questions
jaxloc ships (the five few-shot training questions and the dataset spec's example), cycled to the count. Every
prompt is `GSM8KTask().requests(docs)`'s (the shared 5-shot prefix, then the question), with its stop strings and a
cap of `MAX_NEW_TOKENS` (256) unless told otherwise.

Roofline (`roofline`), per mask, from the model's shapes and the tokens the engine emitted. D documents, M masks,
P shared-prefix tokens, s_r row r's own suffix, n the mean tokens a row emitted, m = n - 1 the decode steps a row
takes (its first token comes from its prefill), a decode call holding `rows_per_call` rows (`rows_per_slot` of them
one mask's), W the weight bytes a step reads (every parameter but an untied embedding), kv the key/value bytes of one
token over all layers:
  FLOPs: `flops_per_token(with_lm_head=False)` at every prefix token (once per mask), suffix token and fed-back new
    token (D·m), the LM head at every emitted token (D·n), and attention (4·L·H·Dh per query-key pair: the prefix
    causally, each suffix over the prefix and itself, each fed token over everything before it; a sliding-window
    layer's query over its window only);
  bytes: the weights once per decode step of a full call (D·m / rows_per_call steps per mask: the call's rows share
    them), the mask's prefix keys/values once per step its rows decode (shared by them: D·m / rows_per_slot; a
    sliding-window layer's at most its window) plus once written, and every row's own cache (suffix and tokens so
    far) at each of its m steps.
The floor is max(FLOPs / matmul peak, bytes / memory bandwidth), both measured in the same run (`memory_bandwidth`);
the reported fraction is floor / measured, every implementation held to the floor of the same work. Using the mean
row length makes the cache and attention terms lower bounds (their quadratic parts grow with the spread), and the
weights read by prefill calls are left out: it stays a floor.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.bench import deviceless
from jaxloc.bench.previous_generation import PreviousGenerator
from jaxloc.bench.torch_baselines import ablated_heads
from jaxloc.engine import batching, stops as stop_strings
from jaxloc.engine.engine import Engine
from jaxloc.engine.generator import shared_prefix_length
from jaxloc.engine.masks import random_masks
from jaxloc.engine.requests import GenerationRequest
from jaxloc.models import checkpoints
from jaxloc.models.config import NO_WINDOW, ModelConfig, config_to_hf
from jaxloc.models.torch_reference import ablated_heads as hooked
from jaxloc.tasks import gsm8k

log = logging.getLogger(__name__)

PROJECTED_MASKS, PROJECTED_DOCS = 400, 100  # the paper-scale GSM8K localization the projection is for
H100 = deviceless.TARGETS["h100"]["description"]
# Nominal memory bandwidths (GB/s) of the GPUs the kit is lent, by how their `device_kind` starts.
NOMINAL_BANDWIDTH_GBS = {H100: deviceless.TARGETS["h100"]["memory_bandwidth"] / 1e9, "NVIDIA H200": 4800.0}


def shipped_questions() -> list[str]:
  """The GSM8K questions jaxloc ships: the five few-shot training questions and the dataset spec's example."""
  return [q for q, _ in gsm8k.FEW_SHOT] + [gsm8k.SPEC.example["question"]]


def load_docs(num_docs: int, data_dir: str | None = None) -> tuple[list[dict[str, Any]], str]:
  """(docs, where their questions came from): `data_dir`'s GSM8K test split when given (UserError when absent),
  else `shipped_questions()` cycled to `num_docs`."""
  if data_dir:
    docs = gsm8k.GSM8KTask().load_docs(num_samples=num_docs, data_dir=data_dir)
    return docs, f"gsm8k test split from {data_dir} ({len(docs)} questions)"
  pool = shipped_questions()
  docs = [{"id": f"shipped-{i}", "question": pool[i % len(pool)], "answer": ""} for i in range(num_docs)]
  return docs, (f"the {len(pool)} questions jaxloc ships (gsm8k.FEW_SHOT's and SPEC's example), cycled to "
                f"{num_docs}")


def gsm8k_requests(docs: Sequence[dict[str, Any]], max_new_tokens: int = gsm8k.MAX_NEW_TOKENS
                   ) -> list[GenerationRequest]:
  """The task's own requests (5-shot prefix + question, its stop strings), capped at `max_new_tokens`."""
  return [dataclasses.replace(r, max_new_tokens=max_new_tokens) for r in gsm8k.GSM8KTask().requests(docs)]


def memory_bandwidth(nbytes: int | None = None, repeats: int = 7) -> dict[str, float]:
  """Median GB/s of jitted reads of a float32 array of `nbytes` (default 256 MiB on a CPU, 2 GiB elsewhere): a sum,
  and a matrix-vector product (a decode step's access pattern); `best` is the larger."""
  nbytes = nbytes or (256 if jax.default_backend() == "cpu" else 2048) * 2**20
  rows = 4096
  x = jnp.ones((rows, nbytes // 4 // rows), jnp.float32)
  v = jnp.ones((x.shape[1],), jnp.float32)
  result = {}
  for name, f in (("sum", jax.jit(jnp.sum)), ("matvec", jax.jit(lambda a: a @ v))):
    f(x).block_until_ready()
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      f(x).block_until_ready()
      times.append(time.perf_counter() - start)
    result[name] = x.nbytes / float(np.median(times)) / 1e9
  result["best"] = max(result.values())
  return result


def weight_bytes(config: ModelConfig, params) -> int:
  """Bytes a decode step reads of the parameters: all of them but an untied embedding (only its rows are read)."""
  flat = checkpoints.flatten(params)
  total = sum(int(x.nbytes) for x in flat.values())
  return total - (0 if config.tie_word_embeddings else int(flat["embed/embedding"].nbytes))


def _visible_keys(before: float, queries: float, window: int) -> float:
  """Query-key pairs of `queries` consecutive queries after `before` positions, each seeing itself and what came
  before it within `window` (sum over i = 1..queries of min(before + i, window)), in closed form, so a mean count of
  new tokens that is not whole counts as the arithmetic series does."""
  pairs = queries * before + queries * (queries + 1) / 2
  past = before + queries - window  # the last query's keys beyond its window
  if past <= 0:
    return pairs
  over = min(queries, past)  # queries that see a full window
  return pairs - over * (2 * past - over + 1) / 2


def roofline(config: ModelConfig, *, masks: int, suffixes: Sequence[int], prefix: int, emitted: int,
             rows_per_call: int, rows_per_slot: int, weights: int, kv_dtype_bytes: int, peak_gflops: float,
             bandwidth_gbs: float) -> dict[str, float]:
  """FLOPs, bytes and floor seconds per mask of `masks` masks over prompts of `prefix` shared and `suffixes` own
  tokens emitting `emitted` tokens in all (the module docstring's model)."""
  c = config
  docs = len(suffixes)
  own = float(np.sum(suffixes))
  # A row's first new token comes from its suffix's prefill; each later one is a decode step feeding the token
  # before it: m = n - 1 steps per row, the one at step t attending to (and reading) prefix + suffix + t positions.
  fed = max(emitted / masks / docs - 1, 0.0)
  kv = 2 * c.num_layers * c.num_kv_heads * c.head_dim * kv_dtype_bytes
  attention, prefix_read = 0.0, 0.0  # prefix_read: the prefix's keys/values bytes a decode step reads
  for window, layers in collections.Counter(c.layer_windows() or (NO_WINDOW,) * c.num_layers).items():
    prefix_read += kv * layers / c.num_layers * min(prefix, window)
    pairs = (_visible_keys(0, prefix, window) + sum(_visible_keys(prefix, s, window) for s in suffixes)
             + sum(_visible_keys(prefix + s, fed, window) for s in suffixes))
    attention += 4 * layers * c.num_heads * c.head_dim * pairs  # q·k and p·v of each query-key pair
  flops = (c.flops_per_token(with_lm_head=False) * (prefix + own + docs * fed)
           + 2 * c.hidden_size * c.vocab_size * emitted / masks + attention)
  steps = docs * fed / rows_per_call  # this mask's share of a full call's decode steps
  cache = kv * (fed * own + docs * fed * (fed + 1) / 2)
  prefix_bytes = prefix_read * docs * fed / rows_per_slot + kv * prefix
  total_bytes = steps * weights + prefix_bytes + cache
  compute_s, memory_s = flops / peak_gflops / 1e9, total_bytes / bandwidth_gbs / 1e9
  return {"flops": flops, "attention_flops": attention, "bytes": total_bytes, "weight_bytes": steps * weights,
          "prefix_kv_bytes": prefix_bytes, "row_cache_bytes": cache, "decode_steps": steps,
          "compute_seconds": compute_s, "memory_seconds": memory_s, "floor_seconds": max(compute_s, memory_s),
          "bound": "compute" if compute_s >= memory_s else "memory"}


def torch_model_from_config(config: ModelConfig, dtype: str | None = None):
  """transformers' PyTorch model of `config` with its own random initialization (random presets have no PyTorch
  twin: the same shapes and work, not the same weights), on the GPU when torch sees one (bfloat16 there, float32 on a
  CPU unless `dtype` says)."""
  import torch
  from transformers import AutoConfig, AutoModelForCausalLM

  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch_dtype = getattr(torch, dtype or ("bfloat16" if device == "cuda" else "float32"))
  torch.manual_seed(0)
  with torch.device(device):
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config_to_hf(config)), dtype=torch_dtype)
  return model.eval()


def _emitted(ids: list[int], tokenizer, stops: Sequence[str], eos_ids: set[int]) -> int:
  """Tokens a row emitted, as the engine counts them: up to and including the EOS or the token that completes the
  first stop string (the shortest prefix whose text holds one; a binary search, holding is monotone)."""
  n = next((i + 1 for i, t in enumerate(ids) if t in eos_ids), len(ids))

  def holds(k: int) -> bool:
    text = tokenizer.decode(ids[:k], skip_special_tokens=True)
    return any(s in text for s in stops)

  if stops and holds(n):
    low, high = 1, n
    while low < high:
      mid = (low + high) // 2
      low, high = (low, mid) if holds(mid) else (mid + 1, high)
    n = low
  return n


def torch_generate(model, tokenizer, requests: Sequence[GenerationRequest], keep: np.ndarray,
                   eos_ids: Sequence[int]) -> dict[str, Any]:
  """Batched `transformers.generate` of every request under every mask (heads zeroed by the `o_proj` pre-hook), one
  left-padded batch of all requests per mask, greedy with `stop_strings` (a batch ends when every row has stopped),
  after an untimed warm-up; each row's tokens counted up to its first EOS or stop string (`_emitted`). Requests share
  stops and a cap."""
  import torch

  stops, cap = tuple(requests[0].stop), requests[0].max_new_tokens
  side = tokenizer.padding_side
  tokenizer.padding_side = "left"
  try:
    enc = tokenizer([r.context for r in requests], return_tensors="pt", padding=True,
                    add_special_tokens=requests[0].add_special_tokens).to(model.device)
  finally:
    tokenizer.padding_side = side
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
  options = dict(do_sample=False, pad_token_id=pad, eos_token_id=list(eos_ids), stop_strings=list(stops) or None,
                 tokenizer=tokenizer)
  with torch.no_grad():  # warm-up (transformers caches its stop-string tables over the vocabulary, torch its kernels)
    model.generate(**{k: v[:1] for k, v in enc.items()}, max_new_tokens=2, **options)
  texts, emitted, seconds = [], 0, 0.0
  for mask in keep:
    start = time.perf_counter()
    with torch.no_grad(), hooked(model, ablated_heads(mask)):
      out = model.generate(**enc, max_new_tokens=cap, **options)
    seconds += time.perf_counter() - start  # the counting below is not transformers' work
    rows = []
    for ids in out[:, enc["input_ids"].shape[1]:].tolist():
      n = _emitted(ids, tokenizer, stops, set(eos_ids))
      emitted += n
      rows.append(stop_strings.truncate_at_stop(tokenizer.decode(ids[:n], skip_special_tokens=True), stops))
    texts.append(rows)
  return {"masks": len(keep), "seconds": seconds, "tokens": emitted, "texts": texts,
          "counting": "transformers.generate with stop_strings; tokens up to the first EOS or stop string"}


def _engine_timer(generate, engine: Engine, requests, keep: np.ndarray) -> Callable[[], dict[str, Any]]:
  """A timed call of `generate`, after a warm-up made here on the very inputs (every compile and one full run); each
  timed call returns its seconds, tokens and texts, and the warm-up's seconds."""
  start = time.perf_counter()
  generate(requests, keep)
  first = time.perf_counter() - start

  def timed() -> dict[str, Any]:
    tokens = engine.stats.tokens
    start = time.perf_counter()
    texts = generate(requests, keep)
    return {"masks": len(keep), "seconds": time.perf_counter() - start, "tokens": engine.stats.tokens - tokens,
            "texts": texts, "compile_and_first_seconds": first}

  return timed


def _rounds(timers: dict[str, Callable[[], dict[str, Any]]], rounds: int) -> list[dict[str, dict[str, Any]]]:
  """Each implementation timed once per round, the order reversed every other round (A B C, C B A, ...): on a
  machine whose speed drifts, a round's implementations ran close together, and a linear drift cancels over a pair."""
  names = list(timers)
  out = []
  for index in range(rounds):
    order = names if index % 2 == 0 else names[::-1]
    timed = {name: timers[name]() for name in order}
    out.append({name: timed[name] for name in names})
    log.info("gsm8k round %d of %d: %s", index + 1, rounds,
             ", ".join(f"{name} {timed[name]['seconds']:.1f}s" for name in order))
  return out


def _merged(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """One implementation over the rounds: the median seconds, each round's seconds, the last round's texts, and
  whether every round emitted the same texts."""
  out = dict(runs[-1])
  out.update(seconds=float(np.median([r["seconds"] for r in runs])), seconds_per_round=[r["seconds"] for r in runs],
             same_texts_every_round=all(r["texts"] == runs[-1]["texts"] for r in runs))
  return out


def _speedups(per_round: Sequence[dict[str, dict[str, Any]]], name: str) -> list[float]:
  """jaxloc's speed-up over `name` per mask, in each round (the two timed in the same round)."""
  return [(r[name]["seconds"] / r[name]["masks"]) / (r["jaxloc"]["seconds"] / r["jaxloc"]["masks"])
          for r in per_round]


def _figures(run: dict[str, Any], docs: int, floor: float) -> dict[str, Any]:
  per_mask = run["seconds"] / run["masks"]
  out = {k: v for k, v in run.items() if k != "texts"}
  out.update({"seconds_per_mask": per_mask, "tokens_per_second": run["tokens"] / run["seconds"],
              "tokens_per_mask": run["tokens"] / run["masks"], "roofline_fraction": floor / per_mask,
              "projected_minutes": PROJECTED_MASKS * per_mask * PROJECTED_DOCS / docs / 60})
  return out


def h100_minutes(minutes: float, device_kind: str) -> dict[str, Any]:
  """`minutes` measured on a device of `device_kind`, projected to an 80 GB H100 SXM by the two nominal memory
  bandwidths (`NOMINAL_BANDWIDTH_GBS`): decode, most of the work, is bound by memory; prefill is bound by compute, at
  the same dense bfloat16 peak on an H100 and an H200, so that scaling it too makes the figure from an H200 an upper
  bound. None where this device's nominal bandwidth is unknown (a CPU, or an H100 other than the 80 GB SXM:
  PCIe and NVL cards have other bandwidths)."""
  here = next((gbs for kind, gbs in NOMINAL_BANDWIDTH_GBS.items() if device_kind.startswith(kind)), None)
  if here is None:
    return {"h100_minutes": None, "h100_projection": f"not projected to an H100: no nominal bandwidth for "
                                                     f"{device_kind!r}"}
  scaled = minutes * here / NOMINAL_BANDWIDTH_GBS[H100]
  return {"h100_minutes": scaled, "nominal_bandwidth_gbs": here,
          "h100_projection": f"on an H100: {scaled:.1f} minutes ({minutes:.1f} here x {here:.0f} / "
                             f"{NOMINAL_BANDWIDTH_GBS[H100]:.0f} GB/s nominal)"}


def _equal(texts: Sequence[Sequence[str]], reference: Sequence[Sequence[str]]) -> dict[str, int]:
  pairs = [(a, b) for row, ref in zip(texts, reference) for a, b in zip(row, ref)]
  return {"equal": sum(a == b for a, b in pairs), "compared": len(pairs)}


def _job_layout(engine: Engine, known: set, masks: int, docs: int, prefix: int, suffixes: Sequence[int],
                max_new: int) -> tuple[int, int, bool | None, str]:
  """(rows per decode call, rows per mask slot, whether the job held its laid-out layers, where from): the layout the
  generator settled on for this job (the one its `_layouts` gained), else the planner's first guess for the same
  shapes (whether the layers were held is then unknown: XLA's check may have let them go)."""
  new = [layout for key, layout in engine.generator._layouts.items() if key not in known]
  if new:
    layout, source = new[-1], "the generator's layout"
  else:
    layout = engine.shared.planner.generation_slots(
        masks=masks, docs=docs, prefix=batching.bucket(prefix) if prefix else 0,
        suffix=batching.bucket(max(suffixes)), new=batching.bucket_pow2(max_new))
    source = "the planner's estimate (the layout was cached before this run)"
  per_slot = min(layout.rows, docs)
  held = layout.held_layers if new else None
  return min(layout.slots, masks) * per_slot, per_slot, held, source


def run(engine: Engine, requests: Sequence[GenerationRequest], keep: np.ndarray, *, peak_gflops: float,
        bandwidth_gbs: float, previous_masks: int | None = 0, torch_model=None, torch_masks: int = 0,
        torch_result: dict[str, Any] | None = None, questions: str = "", rounds: int) -> dict[str, Any]:
  """The workload: `requests` (one stop set and cap) under every keep-mask of `keep` [M, L, H] with the engine's
  generator, the previous generator on the first `previous_masks` masks (0: all; None: not run) and
  `transformers.generate` on the first `torch_masks` (0: all) with `torch_model`, or `torch_result`
  (`torch_generate`'s, run by the caller beforehand: the kit runs it before JAX holds the GPU; `"same_weights":
  False` in it when the PyTorch model's weights are not the engine's, whose texts are then not compared);
  `questions` says where the questions came from.
  After each engine generator's warm-up, `rounds` (at least 1) timed rounds run every implementation but a
  `torch_result` once (`_rounds`): seconds are the rounds' median, a speed-up the median of the rounds' own ratios.
  Returns JSON-able figures (texts dropped)."""
  if rounds < 1:
    raise ValueError(f"rounds must be at least 1, not {rounds}")
  c, tok = engine.model_config, engine.tokenizer
  docs, masks = len(requests), len(keep)
  ids = tok([r.context for r in requests], add_special_tokens=requests[0].add_special_tokens)["input_ids"]
  prefix = shared_prefix_length(ids) if engine.config.share_prefix else 0
  suffixes = [len(i) - prefix for i in ids]
  known = set(engine.generator._layouts)
  timers: dict[str, Callable[[], dict[str, Any]]] = {}
  timers["jaxloc"] = _engine_timer(engine.generate, engine, requests, keep)
  rows_per_call, rows_per_slot, held, layout_source = _job_layout(engine, known, masks, docs, prefix, suffixes,
                                                                  requests[0].max_new_tokens)
  if previous_masks is not None:
    previous = keep[:previous_masks or masks]
    timers["previous_generator"] = _engine_timer(PreviousGenerator(engine.shared).generate, engine, requests,
                                                 previous)
  if torch_result is None and torch_model is not None:
    eos = sorted({*c.eos_token_ids, *([tok.eos_token_id] if tok.eos_token_id is not None else [])})
    timers["transformers_generate"] = lambda: torch_generate(torch_model, tok, requests, keep[:torch_masks or masks],
                                                             eos)
  per_round = _rounds(timers, rounds)
  runs = {name: _merged([r[name] for r in per_round]) for name in timers}
  if torch_result is not None:
    runs["transformers_generate"] = torch_result
  floor = roofline(c, masks=masks, suffixes=suffixes, prefix=prefix, emitted=runs["jaxloc"]["tokens"],
                   rows_per_call=rows_per_call, rows_per_slot=rows_per_slot,
                   weights=weight_bytes(c, engine.params), kv_dtype_bytes=jnp.dtype(engine.dtype).itemsize,
                   peak_gflops=peak_gflops, bandwidth_gbs=bandwidth_gbs)
  result: dict[str, Any] = {
      "documents": docs, "questions": questions, "masks": masks, "ablated_heads_per_mask": int((keep[0] == 0).sum()),
      "max_new_tokens": requests[0].max_new_tokens, "stop": list(requests[0].stop), "shared_prefix_tokens": prefix,
      "suffix_tokens_mean": float(np.mean(suffixes)), "rows_per_call": rows_per_call,
      "rows_per_mask_slot": rows_per_slot, "layers_held": held, "layout_source": layout_source,
      "matmul_peak_gflops": peak_gflops,
      "memory_bandwidth_gbs": bandwidth_gbs, "roofline": floor, "rounds": rounds}
  for name, figures in runs.items():
    result[name] = _figures(figures, docs, floor["floor_seconds"])
  now = result["jaxloc"]
  if "previous_generator" in runs:
    result["previous_generator"]["texts_equal_jaxloc"] = _equal(runs["previous_generator"]["texts"],
                                                                runs["jaxloc"]["texts"])
  # Each speed-up is the median of the rounds' own ratios; a result run beforehand (the kit's) has no round.
  for name in ("previous_generator", "transformers_generate"):
    if name in timers:
      ratios = _speedups(per_round, name)
      result[f"speedup_vs_{name}"] = float(np.median(ratios))
      result[f"speedup_vs_{name}_per_round"] = ratios
    elif name in result:
      result[f"speedup_vs_{name}"] = result[name]["seconds_per_mask"] / now["seconds_per_mask"]
  if "transformers_generate" in result and runs["transformers_generate"].get("same_weights", True):
    # (texts of another model's weights say nothing about jaxloc's)
    result["transformers_generate"]["texts_equal_jaxloc"] = _equal(runs["transformers_generate"]["texts"],
                                                                   runs["jaxloc"]["texts"])
  return result


def workload(engine: Engine, cfg, torch_model, peak_gflops: float) -> dict[str, Any]:
  """`run` as `experiments.benchmark_throughput` configures it (`ThroughputConfig`'s `gsm8k_*` and `data_dir`):
  random 5-head masks, the memory bandwidth measured here."""
  docs, source = load_docs(cfg.gsm8k_docs, cfg.data_dir or None)
  keep = random_masks(engine.model_config, cfg.gsm8k_masks, min(5, engine.model_config.num_head_total))
  bandwidth = memory_bandwidth()
  result = run(engine, gsm8k_requests(docs, cfg.gsm8k_new_tokens), keep, peak_gflops=peak_gflops,
               bandwidth_gbs=bandwidth["best"], previous_masks=cfg.gsm8k_previous_masks, torch_model=torch_model,
               torch_masks=cfg.gsm8k_torch_masks, questions=source, rounds=cfg.gsm8k_rounds)
  result["memory_bandwidth"] = bandwidth
  log.info("gsm8k workload: %s", {k: v for k, v in result.items() if not isinstance(v, dict)})
  return result


def _held_words(held: bool | None) -> str:
  """How the job's decode calls got their laid-out layers (nothing where unknown: a layout from before this run or a run
  recorded before `layers_held`)."""
  if held is None:
    return ""
  return "; layers laid out once, held by the job" if held else "; layers laid out by every decode call"


def format_lines(w: dict[str, Any]) -> list[str]:
  """The workload as a table: one line per implementation, then the shapes and the roofline."""
  lines = [f"gsm8k: {w['documents']} questions x {w['masks']} masks of {w['ablated_heads_per_mask']} random heads, "
           f"greedy to {'/'.join(w['stop'])} or {w['max_new_tokens']} tokens; questions: {w['questions']}",
           f"{'':22s} {'masks':>5s} {'s/mask':>9s} {'tokens':>7s} {'tok/s':>8s} {'roofline':>9s} "
           f"{'jaxloc speed-up':>15s} {'texts = jaxloc':>14s} {'compile+first':>13s}"]
  for name in ("jaxloc", "previous_generator", "transformers_generate"):
    if name not in w:
      continue
    r = w[name]
    speedup = 1.0 if name == "jaxloc" else w[f"speedup_vs_{name}"]
    equal = r.get("texts_equal_jaxloc")
    equal = f"{equal['equal']}/{equal['compared']}" if equal else "-"
    first = f"{r['compile_and_first_seconds']:.1f}s" if "compile_and_first_seconds" in r else "-"
    lines.append(f"{name:22s} {r['masks']:5d} {r['seconds_per_mask']:9.2f} {r['tokens']:7d} "
                 f"{r['tokens_per_second']:8.1f} {100 * r['roofline_fraction']:8.1f}% {speedup:14.2f}x "
                 f"{equal:>14s} {first:>13s}")
  per_round = {name: w[f"speedup_vs_{name}_per_round"] for name in ("previous_generator", "transformers_generate")
               if f"speedup_vs_{name}_per_round" in w}
  if w.get("rounds", 1) > 1:
    lines.append(f"{w['rounds']} timed rounds, each running jaxloc, {' and '.join(per_round)} once, the order "
                 "reversed every other round; jaxloc's speed-up per round: "
                 + "; ".join(f"{name} " + ", ".join(f"{x:.2f}x" for x in ratios) for name, ratios in per_round.items())
                 + " (the table: their median)")
  changed = [name for name in ("jaxloc", "previous_generator", "transformers_generate")
             if w.get(name, {}).get("same_texts_every_round") is False]
  if changed:
    lines.append(f"TEXTS DIFFERED BETWEEN ROUNDS: {', '.join(changed)} (texts and tokens above are the last round's)")
  f = w["roofline"]
  lines.append(f"roofline per mask: {f['flops'] / 1e9:.0f} GFLOP at {w['matmul_peak_gflops']:.0f} GFLOP/s = "
               f"{f['compute_seconds']:.2f}s, {f['bytes'] / 1e9:.2f} GB (weights {f['weight_bytes'] / 1e9:.2f}, "
               f"prefix K/V {f['prefix_kv_bytes'] / 1e9:.2f}, row caches {f['row_cache_bytes'] / 1e9:.2f}) at "
               f"{w['memory_bandwidth_gbs']:.1f} GB/s = {f['memory_seconds']:.2f}s: floor {f['floor_seconds']:.2f}s "
               f"({f['bound']}-bound); {w['shared_prefix_tokens']}-token shared prefix, suffixes "
               f"{w['suffix_tokens_mean']:.0f} tokens on average, {w['rows_per_call']} rows per decode call "
               f"({w['rows_per_mask_slot']} per mask slot{_held_words(w.get('layers_held'))})")
  named = {"jaxloc": "jaxloc", "previous_generator": "previous generator",
           "transformers_generate": "transformers.generate"}
  lines.append(f"projection, {PROJECTED_MASKS} masks x {PROJECTED_DOCS} documents: "
               + ", ".join(f"{words} {w[name]['projected_minutes']:.0f} min" for name, words in named.items()
                           if name in w))
  return lines
