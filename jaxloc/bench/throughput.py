"""Throughput of mask evaluation: jaxloc against PyTorch run the paper's way and the best way we know.

All figures come from one process on one machine, so ratios are fair even on a shared host:
  (a) jaxloc: `Engine.score` over many random masks (compile time reported apart), with and without
      the shared few-shot prefix;
  (b) reference style: `transformers` PyTorch reloaded for every mask, batch 1, full logits, heads
      zeroed by a pre-hook on `o_proj` (how the paper's released code runs);
  (c) best-effort PyTorch: loaded once, batch 32, the same hook, LM head only at target positions;
  (d) the JAX matmul peak in the engine's activation dtype, measured before and after;
  plus greedy generation tokens/s, jaxloc against batched `transformers.generate`;
  (e) workloads, each timed with today's engine and with the previous engine path (no packing, every mask from layer
      0, no shared prefill; `previous_engine`; for generation, the generator before shared-prefix generation,
      `previous_generation.PreviousGenerator`) in this one run: `default` (the default localization's measurements,
      `plurals` under 300 stratified masks), `one_shot_greedy` (`plurals` under every single-head mask) and
      `generation` (HumanEval prompts under single-head masks, against `transformers.generate` too: through the
      chat template like `humaneval`, or, for a base model whose tokenizer has none, in the plain completion format
      of `humaneval_solutions`, the function's signature and docstring), and `gsm8k` (`jaxloc.bench.gsm8k_generation`:
      the task's 5-shot prompts under random 5-head masks to its stop strings, the engine's generator against the
      previous generator and `transformers.generate`, as seconds per mask, tokens/s and the fraction of a roofline;
      `--only_gsm8k` runs it alone).
Torch is imported only by the PyTorch parts; without it they are skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.bench import gsm8k_generation
from jaxloc.bench.torch_baselines import bench_torch_best, bench_torch_reference
from jaxloc.bench.previous_generation import PreviousGenerator
from jaxloc.config import setting
from jaxloc.engine.engine import Engine
from jaxloc.engine.masks import random_masks
from jaxloc.engine.peak import matmul_peak
from jaxloc.engine.requests import GenerationRequest, ScoringRequest
from jaxloc.localize import designs
from jaxloc.models.config import ModelConfig
from jaxloc.models.torch_reference import load_hf_model
from jaxloc.tasks import arithmetic, evaluator

log = logging.getLogger(__name__)


def few_shot_addition_requests(num_requests: int = 100, shots: int = 4, seed: int = 0) -> list[ScoringRequest]:
  """4-shot 2-digit addition in the GPT-3 arithmetic format: one fixed few-shot prefix, ~100 tokens each."""
  pool = arithmetic.generate_subtask("2da")
  rng = np.random.default_rng(seed)
  order = rng.permutation(len(pool))
  examples = [pool[i] for i in order[:shots]]
  prefix = "".join(f"{d['prompt']}{d['target']}\n\n" for d in examples)
  return [ScoringRequest(prefix + pool[i]["prompt"], pool[i]["target"]) for i in order[shots:shots + num_requests]]


def executed_flops(engine: Engine, requests: Sequence[ScoringRequest]) -> dict[str, float]:
  """FLOPs one mask evaluation executes, padding included: weights, attention scores, LM head."""
  layout, plan = engine.prepare(requests)
  c = engine.model_config
  per_token = c.flops_per_token(with_lm_head=False)
  prefix = len(layout.prefix)
  weights = per_token * layout.padded_tokens_per_mask
  attention = 0.0
  lm_head = 0.0
  for chunk in layout.chunks:
    rows, seq = chunk.rows.tokens.shape
    # q·k and p·v for every (query, key) pair the calls compute: context keys + the full causal square.
    attention += 4 * c.num_layers * c.num_heads * c.head_dim * rows * seq * (prefix + seq)
    lm_head += 2 * c.hidden_size * c.vocab_size * chunk.rows.target_ids.size
  attention += 4 * c.num_layers * c.num_heads * c.head_dim * prefix * prefix
  useful = c.flops_per_token(with_lm_head=False) * layout.tokens_per_mask
  return {"weights": weights, "attention": attention, "lm_head": lm_head,
          "total": weights + attention + lm_head, "useful_weights": useful,
          "masks_per_call": plan.masks_per_call, "requests_per_call": plan.requests_per_call}


def bench_jaxloc(engine: Engine, requests, masks: np.ndarray, label: str) -> dict[str, Any]:
  start = time.perf_counter()
  warm = engine.score(requests, masks[:engine.masks_per_call(requests)])
  compile_and_first = time.perf_counter() - start
  start = time.perf_counter()
  out = engine.score(requests, masks)
  seconds = time.perf_counter() - start
  del warm
  flops = executed_flops(engine, requests)
  layout = engine.prepare(requests)[0]
  return {"label": label, "masks": len(masks), "seconds": seconds, "seconds_per_mask": seconds / len(masks),
          "compile_and_first_batch_seconds": compile_and_first, "gflops_per_s": flops["total"] * len(masks)
          / seconds / 1e9, "flops_per_mask": flops, "tokens_per_mask": layout.tokens_per_mask,
          "shared_prefix_tokens": len(layout.prefix), "compiles": engine.compile_count,
          "logprob": out.logprob, "is_greedy": out.is_greedy}


def bench_generation(engine: Engine, torch_model, prompts: Sequence[str], max_new_tokens: int) -> dict[str, Any]:
  """Greedy tokens/s of jaxloc and of batched transformers.generate on the same prompts (one batch)."""
  tok = engine.tokenizer
  requests = [GenerationRequest(p, max_new_tokens=max_new_tokens) for p in prompts]
  mask = np.ones((1, engine.model_config.num_layers, engine.model_config.num_heads), np.float32)
  engine.generate(requests[:len(prompts)], mask)  # compile
  tokens_before = engine.stats.tokens
  start = time.perf_counter()
  engine.generate(requests, mask)
  jax_seconds = time.perf_counter() - start
  jax_tokens = engine.stats.tokens - tokens_before
  result = {"batch": len(prompts), "max_new_tokens": max_new_tokens, "jaxloc_tokens": jax_tokens,
            "jaxloc_seconds": jax_seconds, "jaxloc_tokens_per_s": jax_tokens / jax_seconds}
  if torch_model is not None:
    import torch

    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    enc = tok(list(prompts), return_tensors="pt", padding=True)
    start = time.perf_counter()
    with torch.no_grad():
      out = torch_model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    torch_seconds = time.perf_counter() - start
    new = out[:, enc["input_ids"].shape[1]:]
    eos = tok.eos_token_id
    torch_tokens = 0
    for row in new.tolist():
      torch_tokens += (row.index(eos) + 1) if eos in row else len(row)
    tok.padding_side = "right"
    result.update({"torch_tokens": torch_tokens, "torch_seconds": torch_seconds,
                   "torch_tokens_per_s": torch_tokens / torch_seconds})
    result["speedup"] = result["jaxloc_tokens_per_s"] / result["torch_tokens_per_s"]
  return result


def variant(engine: Engine, **changes) -> Engine:
  """An engine on the same model and mesh whose config is `engine`'s with `changes` (same budgets otherwise)."""
  return Engine(engine.model, dataclasses.replace(engine.config, **changes), mesh=engine.mesh)


def previous_engine(engine: Engine, **changes) -> Engine:
  """The engine as it was before packing, layer skipping and shared prefill: one request per row, every mask from
  layer 0, every generation row with its own prefill (same model, mesh and budgets)."""
  return variant(engine, pack=False, residual_cache_gb=0, **changes)


def real_flops(config: ModelConfig, layer_tokens: int, targets: int) -> float:
  """Weight and LM-head FLOPs of real tokens only: every token through the layers it needed, the LM head at every
  scored target (padding, and the layers a mask could skip but a batch did not, are not counted as useful)."""
  return (config.flops_per_token(with_lm_head=False) / config.num_layers * layer_tokens
          + 2 * config.hidden_size * config.vocab_size * targets)


def _scoring_workload(engines: dict[str, Engine], requests, keep: np.ndarray, peak: float) -> dict[str, Any]:
  """Seconds per mask of each engine on the same masks (after a warm-up call of one batch), the real-token
  fraction of the matmul peak, and the largest score difference between the engines."""
  result: dict[str, Any] = {"masks": len(keep), "requests": len(requests)}
  scores = {}
  for name, engine in engines.items():
    warm_start = time.perf_counter()
    engine.score(requests, keep[:engine.masks_per_call(requests)])
    warm = time.perf_counter() - warm_start
    before = dataclasses.replace(engine.stats)
    start = time.perf_counter()
    scores[name] = engine.score(requests, keep).logprob
    seconds = time.perf_counter() - start
    flops = real_flops(engine.model_config, engine.stats.layer_tokens - before.layer_tokens,
                       engine.stats.targets - before.targets)
    result[name] = {"seconds": seconds, "seconds_per_mask": seconds / len(keep),
                    "compile_and_first_batch_seconds": warm,
                    "real_tokens_per_mask": (engine.stats.tokens - before.tokens) / len(keep),
                    "padded_tokens_per_mask": (engine.stats.padded_tokens - before.padded_tokens) / len(keep),
                    "peak_fraction_real_tokens": flops / seconds / 1e9 / peak}
  now, old = result["jaxloc"], result["previous_engine"]
  result["seconds_per_mask"] = now["seconds_per_mask"]
  result["peak_fraction_real_tokens"] = now["peak_fraction_real_tokens"]
  result["speedup_vs_previous_engine"] = old["seconds_per_mask"] / now["seconds_per_mask"]
  result["max_abs_logprob_diff_vs_previous_engine"] = float(np.abs(scores["jaxloc"] - scores["previous_engine"]).max())
  return result


def _torch_generate_masked(model, tokenizer, prompts: Sequence[str], keep: np.ndarray, max_new_tokens: int
                           ) -> tuple[float, int]:
  """Batched `transformers.generate` of every prompt under every mask (heads zeroed by the `o_proj` pre-hook), one
  batch of all prompts per mask, to EOS or the cap; (seconds, tokens emitted)."""
  requests = [GenerationRequest(p, max_new_tokens=max_new_tokens, add_special_tokens=False) for p in prompts]
  out = gsm8k_generation.torch_generate(model, tokenizer, requests, keep, [tokenizer.eos_token_id])
  return out["seconds"], out["tokens"]


def generation_workload(engines: dict[str, Engine], torch_model, prompts: Sequence[str], keep: np.ndarray,
                        max_new_tokens: int, peak: float) -> dict[str, Any]:
  """Greedy generation of every prompt under every mask, no stop strings (so every implementation does the same
  work): tokens/s of each engine (batch = the number of prompts) and of batched `transformers.generate`, and the
  model-FLOP floor: every row's prompt and new tokens through every layer and the LM head (weights only, no
  padding) at the matmul peak; shared prefill can beat it."""
  requests = [GenerationRequest(p, max_new_tokens=max_new_tokens, add_special_tokens=False) for p in prompts]
  c = next(iter(engines.values())).model_config
  tok = next(iter(engines.values())).tokenizer
  prompt_tokens = sum(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
  result: dict[str, Any] = {"prompts": len(prompts), "masks": len(keep), "batch": len(prompts),
                            "max_new_tokens": max_new_tokens, "prompt_tokens": prompt_tokens}
  for name, engine in engines.items():
    engine.generate(requests, keep[:1])  # compile
    before = engine.stats.tokens
    start = time.perf_counter()
    engine.generate(requests, keep)
    seconds = time.perf_counter() - start
    emitted = engine.stats.tokens - before
    result[name] = {"seconds": seconds, "tokens": emitted, "tokens_per_second": emitted / seconds}
  # Every row's prompt and new tokens through the whole model (the work without shared prefill), at the peak.
  flops = (len(keep) * prompt_tokens + result["jaxloc"]["tokens"]) * c.flops_per_token()
  result["floor_seconds"] = flops / peak / 1e9
  result["tokens_per_second"] = result["jaxloc"]["tokens_per_second"]
  result["peak_fraction_real_tokens"] = result["floor_seconds"] / result["jaxloc"]["seconds"]
  result["speedup_vs_previous_engine"] = result["tokens_per_second"] / result["previous_engine"]["tokens_per_second"]
  if torch_model is not None:
    seconds, emitted = _torch_generate_masked(torch_model, tok, prompts, keep, max_new_tokens)
    result["transformers_generate"] = {"seconds": seconds, "tokens": emitted, "tokens_per_second": emitted / seconds}
    result["speedup_vs_transformers_generate"] = result["tokens_per_second"] / (emitted / seconds)
  return result


def single_head_masks(config: ModelConfig, heads: Sequence[int] | None = None) -> np.ndarray:
  """Keep-masks [M, L, H], each ablating one head (all heads, or the flat indices `heads`), in head order."""
  heads = np.arange(config.num_head_total) if heads is None else np.asarray(heads)
  keep = np.ones((len(heads), config.num_head_total), np.float32)
  keep[np.arange(len(heads)), heads] = 0
  return keep.reshape(len(heads), config.num_layers, config.num_heads)


def humaneval_prompts(tokenizer, num_prompts: int) -> tuple[list[str], str]:
  """The generation workload's prompts and their format: HumanEval through the chat template (`humaneval`) when
  the tokenizer has one, else a base model's plain completion prompts (`humaneval_solutions`' contexts)."""
  chat = bool(getattr(tokenizer, "chat_template", None))
  task, docs = evaluator.load_task("humaneval" if chat else "humaneval_solutions", num_samples=num_prompts, seed=0,
                                    data_dir=None)
  return [r.context for r in task.requests(docs, tokenizer)], "chat template" if chat else "plain completion"


def run_workloads(engine: Engine, cfg: "ThroughputConfig", torch_model, peak: float) -> dict[str, Any]:
  """The four workloads of the module docstring, each with `seconds_per_mask` (or `tokens_per_second`) and its
  speed-up over the previous engine (or generator)."""
  c = engine.model_config
  prompts, prompt_format = humaneval_prompts(engine.tokenizer, cfg.workload_generation_prompts)
  engines = {"jaxloc": engine, "previous_engine": previous_engine(engine)}
  task, docs = evaluator.load_task("plurals", num_samples=cfg.workload_samples, seed=0, data_dir=None)
  requests = task.requests(docs, engine.tokenizer)
  design = designs.stratified_design(cfg.default_masks, c.num_head_total, 0.1, 0)
  keep = (~design).astype(np.float32).reshape(-1, c.num_layers, c.num_heads)
  workloads = {"default": _scoring_workload(engines, requests, keep, peak)}
  log.info("default workload: %s", {k: v for k, v in workloads["default"].items() if not isinstance(v, dict)})
  workloads["one_shot_greedy"] = _scoring_workload(engines, requests, single_head_masks(c), peak)
  log.info("one-shot greedy workload: %s",
           {k: v for k, v in workloads["one_shot_greedy"].items() if not isinstance(v, dict)})
  heads = np.linspace(0, c.num_head_total - 1, cfg.workload_generation_masks).round().astype(int)
  engines = {"jaxloc": variant(engine, generation_batch=len(prompts)),  # the previous path's generator: the old one
             "previous_engine": PreviousGenerator(previous_engine(engine, generation_batch=len(prompts)).shared)}
  workloads["generation"] = generation_workload(engines, torch_model, prompts, single_head_masks(c, heads),
                                                cfg.workload_generation_tokens, peak)
  workloads["generation"]["prompt_format"] = prompt_format
  log.info("generation workload: %s", {k: v for k, v in workloads["generation"].items() if not isinstance(v, dict)})
  workloads["gsm8k"] = gsm8k_generation.workload(engine, cfg, torch_model, peak)
  return workloads


@dataclasses.dataclass
class ThroughputConfig:
  """What the benchmark measures (the model and the engine are the model and engine flags, `jaxloc.cli`)."""

  num_requests: int = setting(100, "Requests of the 4-shot 2-digit addition task.", lower=1)
  shots: int = setting(4, "Solved examples in the addition task's shared prefix.", lower=0)
  jax_masks: int = setting(32, "Masks jaxloc evaluates (after a warm-up batch).", lower=1)
  reference_masks: int = setting(2, "Masks for the reload-per-mask PyTorch baseline.", lower=1)
  best_effort_masks: int = setting(3, "Masks for the best-effort PyTorch baseline.", lower=1)
  ablated_per_mask: int = setting(27, "Random heads ablated in each mask.", lower=0)
  torch_batch: int = setting(32, "Batch of the best-effort PyTorch baseline.", lower=1)
  generation_prompts: int = setting(16, "Prompts (batch size) in the generation benchmark.", lower=1)
  generation_tokens: int = setting(64, "New tokens per sequence in the generation benchmark.", lower=1)
  skip_torch: bool = setting(False, "Skip the PyTorch baselines (e.g. on accelerators without torch).")
  compare_unshared: bool = setting(True, "Also time jaxloc without prefix sharing.")
  workload_samples: int = setting(100, "plurals documents of the default and one-shot greedy workloads.", lower=1)
  default_masks: int = setting(300, "Stratified masks of the default workload (plurals).", lower=1)
  workload_generation_prompts: int = setting(8, "HumanEval prompts of the generation workload (its batch).", lower=1)
  workload_generation_masks: int = setting(16, "Single-head masks of the generation workload.", lower=1)
  workload_generation_tokens: int = setting(32, "New tokens per row in the generation workload.", lower=1)
  gsm8k_docs: int = setting(16, "GSM8K questions of the gsm8k workload.", lower=1)
  gsm8k_masks: int = setting(2, "Random 5-head masks of the gsm8k workload.", lower=1)
  gsm8k_new_tokens: int = setting(256, "Token cap of the gsm8k workload (the task's is 256).", lower=1)
  gsm8k_previous_masks: int = setting(0, "Masks the previous generator runs in the gsm8k workload (0: all).", lower=0)
  gsm8k_torch_masks: int = setting(0, "Masks transformers.generate runs in the gsm8k workload (0: all).", lower=0)
  gsm8k_rounds: int = setting(2, "Timed rounds of the gsm8k workload: each runs every implementation once, the order "
                                 "reversed every other round, and a speed-up is the median of the rounds' own "
                                 "ratios (a machine whose speed drifts then slows both sides of a ratio alike).",
                               lower=1)
  data_dir: str = setting("", "A data directory holding gsm8k/test.jsonl for the gsm8k workload's questions; empty: "
                              "the few questions jaxloc ships, cycled.")
  only_workloads: bool = setting(False, "Run only the workloads (default, one-shot greedy, generation, gsm8k).")
  only_gsm8k: bool = setting(False, "Run only the gsm8k workload.")


def run(engine: Engine, cfg: ThroughputConfig) -> dict[str, Any]:
  """Every measurement of the benchmark; returns a JSON-able dict (arrays dropped)."""
  model = engine.model.name
  requests = few_shot_addition_requests(cfg.num_requests, cfg.shots)
  masks = random_masks(engine.model_config, cfg.jax_masks, cfg.ablated_per_mask)
  tokens_total = sum(len(engine.tokenizer(r.context)["input_ids"]) +
                     len(engine.tokenizer(r.continuation, add_special_tokens=False)["input_ids"]) for r in requests)
  report: dict[str, Any] = {"model": model, "masks_per_second": None, "device": str(jax.devices()[0].device_kind),
                            "platform": jax.default_backend(), "num_devices": len(jax.devices()),
                            "requests": len(requests), "tokens_in_requests": tokens_total,
                            "ablated_heads_per_mask": cfg.ablated_per_mask, "config": dataclasses.asdict(cfg),
                            "engine": dataclasses.asdict(engine.config)}
  c = engine.model_config
  rows = 3200 if jax.default_backend() == "cpu" else 16384
  square = 2048 if jax.default_backend() == "cpu" else 8192
  # The square peak, and the model's own MLP and LM-head shapes, in the model's compute dtype.
  peak_shapes = ((square, square, square), (rows, c.hidden_size, c.intermediate_size),
                 (rows, c.hidden_size, c.vocab_size))
  lm_head_shape = f"{rows}x{c.hidden_size}x{c.vocab_size}"
  report["matmul_peak_before"] = matmul_peak(peak_shapes, engine.dtype)
  skip_torch = cfg.skip_torch or model.startswith("random:")  # random weights have no PyTorch twin
  if not skip_torch:
    try:
      import torch  # noqa: F401
    except ImportError:
      log.warning("torch not installed: PyTorch baselines skipped")
      skip_torch = True
  torch_model = None
  if not skip_torch:
    torch_model = load_hf_model(model)
  if cfg.only_gsm8k:
    peak = max(report["matmul_peak_before"].values())
    report["workloads"] = {"gsm8k": gsm8k_generation.workload(engine, cfg, torch_model, peak)}
    return report
  report["workloads"] = run_workloads(engine, cfg, torch_model, max(report["matmul_peak_before"].values()))
  if cfg.only_workloads:
    return report
  results = [bench_jaxloc(engine, requests, masks, "jaxloc (shared prefix)")]
  if cfg.compare_unshared:
    results.append(bench_jaxloc(variant(engine, share_prefix=False), requests, masks[:max(4, cfg.jax_masks // 4)],
                                "jaxloc (no prefix sharing)"))
  if torch_model is not None:
    results.append(bench_torch_best(torch_model, engine.tokenizer, requests, masks[:cfg.best_effort_masks],
                                    cfg.torch_batch))
    results.append(bench_torch_reference(model, engine.tokenizer, requests, masks[:cfg.reference_masks]))
  report["matmul_peak_after"] = matmul_peak(peak_shapes, engine.dtype)
  jax_result = results[0]
  report["masks_per_second"] = 1.0 / jax_result["seconds_per_mask"]
  report["tokens_per_second"] = jax_result["tokens_per_mask"] / jax_result["seconds_per_mask"]
  for r in results[1:]:
    n = r["masks"]
    diff = np.abs(r["logprob"] - jax_result["logprob"][:n]).max()
    r["max_abs_logprob_diff_vs_jaxloc"] = float(diff)
  for r in results:
    r["speedup_of_jaxloc"] = r["seconds_per_mask"] / jax_result["seconds_per_mask"]
  peak = max(max(report["matmul_peak_before"].values()), max(report["matmul_peak_after"].values()))
  report["matmul_peak_gflops"] = peak
  report["jaxloc_fraction_of_peak"] = jax_result["gflops_per_s"] / peak
  report["jaxloc_fraction_of_lm_head_shape_peak"] = jax_result["gflops_per_s"] / max(
      report["matmul_peak_before"][lm_head_shape], report["matmul_peak_after"][lm_head_shape])
  report["dtype"] = jnp.dtype(engine.model.dtype).name
  report["activation_dtype"] = jnp.dtype(engine.dtype).name
  report["results"] = [{k: v for k, v in r.items() if k not in ("logprob", "is_greedy")} for r in results]
  prompts = [r.context for r in few_shot_addition_requests(cfg.generation_prompts, 0, seed=1)]
  report["generation"] = bench_generation(engine, torch_model, prompts, cfg.generation_tokens)
  return report


def format_workloads(workloads: dict[str, Any]) -> list[str]:
  gsm8k = gsm8k_generation.format_lines(workloads["gsm8k"]) if "gsm8k" in workloads else []
  workloads = {name: w for name, w in workloads.items() if name != "gsm8k"}
  if not workloads:
    return gsm8k
  lines = [f"{'workload':16s} {'jaxloc':>14s} {'previous engine':>16s} {'speed-up':>9s} {'real-token peak':>16s}"]
  for name, w in workloads.items():
    if name == "generation":
      now, old = f"{w['tokens_per_second']:.1f} tok/s", f"{w['previous_engine']['tokens_per_second']:.1f} tok/s"
    else:
      now, old = f"{w['seconds_per_mask']:.3f} s/mask", f"{w['previous_engine']['seconds_per_mask']:.3f} s/mask"
    lines.append(f"{name:16s} {now:>14s} {old:>16s} {w['speedup_vs_previous_engine']:8.2f}x "
                 f"{100 * w['peak_fraction_real_tokens']:15.0f}%")
  g = workloads["generation"]
  line = (f"generation: {g['prompts']} HumanEval prompts ({g.get('prompt_format', 'chat template')}, "
          f"{g['prompt_tokens']} tokens) x {g['masks']} single-head "
          f"masks, batch {g['batch']}, {g['max_new_tokens']} new tokens; jaxloc {g['jaxloc']['seconds']:.1f}s, "
          f"model-FLOP floor {g['floor_seconds']:.1f}s")
  if "transformers_generate" in g:
    line += (f", transformers.generate {g['transformers_generate']['tokens_per_second']:.1f} tok/s "
             f"({g['speedup_vs_transformers_generate']:.2f}x)")
  lines.append(line)
  for name in ("default", "one_shot_greedy"):
    w = workloads[name]
    lines.append(f"{name}: {w['masks']} masks x {w['requests']} requests, real tokens per mask "
                 f"{w['jaxloc']['real_tokens_per_mask']:.0f}, computed (padded) {w['jaxloc']['padded_tokens_per_mask']:.0f}"
                 f" vs previous {w['previous_engine']['padded_tokens_per_mask']:.0f}; max |Δlogprob| vs previous "
                 f"{w['max_abs_logprob_diff_vs_previous_engine']:.1e}")
  return lines + gsm8k


def format_table(report: dict[str, Any]) -> str:
  if "results" not in report:
    peaks = ", ".join(f"{k}: {v:.0f}" for k, v in report["matmul_peak_before"].items())
    return "\n".join(format_workloads(report["workloads"]) + [
        f"model {report['model']} on {report['device']} ({report['platform']}); matmul peak GFLOP/s [{peaks}]"])
  lines = format_workloads(report["workloads"]) + [f"model {report['model']} on {report['device']} ({report['platform']}, {report['num_devices']} "
           f"device(s)); {report['requests']} requests, {report['tokens_in_requests']} tokens, "
           f"{report['ablated_heads_per_mask']} heads ablated per mask",
           f"dtype {report['dtype']}: {report['masks_per_second']:.2f} masks/s, "
           f"{report['tokens_per_second']:.0f} tokens/s",
           f"{'mode':58s} {'masks':>5s} {'s/mask':>8s} {'jaxloc speed-up':>15s} {'max|Δlogprob|':>13s}"]
  for r in report["results"]:
    diff = r.get("max_abs_logprob_diff_vs_jaxloc")
    lines.append(f"{r['label']:58s} {r['masks']:5d} {r['seconds_per_mask']:8.3f} {r['speedup_of_jaxloc']:14.1f}x "
                 f"{'' if diff is None else f'{diff:13.2e}'}")
  j = report["results"][0]
  lines.append(f"jaxloc executes {j['flops_per_mask']['total'] / 1e9:.1f} GFLOP per mask "
               f"({j['tokens_per_mask']} tokens, {j['shared_prefix_tokens']}-token shared prefix) at "
               f"{j['gflops_per_s']:.0f} GFLOP/s = {100 * report['jaxloc_fraction_of_peak']:.0f}% of the best "
               f"{report['activation_dtype']} matmul peak ({report['matmul_peak_gflops']:.0f} GFLOP/s), "
               f"{100 * report['jaxloc_fraction_of_lm_head_shape_peak']:.0f}% of the LM-head-shape peak; "
               f"compile + first batch {j['compile_and_first_batch_seconds']:.1f}s, {j['compiles']} compiles")
  peaks = ", ".join(f"{k}: {v:.0f}" for k, v in report["matmul_peak_before"].items())
  lines.append(f"matmul peak GFLOP/s before [{peaks}]; after [" +
               ", ".join(f"{k}: {v:.0f}" for k, v in report["matmul_peak_after"].items()) + "]")
  g = report["generation"]
  line = (f"generation, batch {g['batch']}, {g['max_new_tokens']} new tokens: jaxloc "
          f"{g['jaxloc_tokens_per_s']:.1f} tokens/s")
  if "torch_tokens_per_s" in g:
    line += f", transformers.generate {g['torch_tokens_per_s']:.1f} tokens/s ({g['speedup']:.1f}x)"
  lines.append(line)
  return "\n".join(lines)
