"""What a benchmarked method sees: a `Problem` answers "these masks' metrics" for a real model and task
(through the engine and a persistent `MaskCache`) or for a simulated response (`SyntheticResponse`).

Axes: `masks` M, `layers` L, `heads` H, N = L * H heads flattened row-major (flat = layer * H + head).
Masks are bool (True = ablated).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
from typing import Any, Callable

import numpy as np

from jaxloc.bench.mask_cache import MaskCache
from jaxloc.errors import UserError
from jaxloc.bench.simulator import SyntheticResponse
from jaxloc.tasks.evaluator import Evaluator, RetainedProbability


@dataclasses.dataclass
class Problem:
  """What a method sees of a (model, task) or a simulation.

  measure:        bool [M, L, H] -> {metric: float [M]} (through a MaskCache).
  baseline:       {metric: score with nothing ablated}.
  metric_names:   every metric measure() reports; headline_metric first.
  gradient:       float [N] first-order score change of ablating each head (-d score / d keep), or None.
  gradient_cost:  the gradient pass in mask evaluations (measured), or None.
  mask_seconds:   seconds per mask evaluation (measured with the gradient), which converts a method's training
                  time to evaluations; None when not measured.
  objective:      the task's relaxed objective (`RetainedProbability`, timing itself) for methods that train a
                  mask, or None (generation tasks, simulation).
  evaluator:      the task on its documents (real problems; None in simulation).
  per_doc:        bool [M, L, H] -> {metric: float [M, docs]} (real problems: the cache keeps every document's value,
                  which a confirmation's intervals resample), or None (simulation: means only).
  memory:         what a method's plan remembers (`Context.remember`), per (variant, seed): a method that trains
                  does so once per seed, whatever the budget.
  """

  name: str
  num_layers: int
  num_heads: int
  measure: Callable[[np.ndarray], dict[str, np.ndarray]]
  baseline: dict[str, float]
  metric_names: list[str]
  gradient: np.ndarray | None = None
  gradient_cost: float | None = None
  mask_seconds: float | None = None
  objective: RetainedProbability | None = None
  evaluator: Evaluator | None = None
  per_doc: Callable[[np.ndarray], dict[str, np.ndarray]] | None = None
  memory: dict = dataclasses.field(default_factory=dict)

  @property
  def num_total(self) -> int:
    return self.num_layers * self.num_heads

  @property
  def headline_metric(self) -> str:
    return self.metric_names[0]

  def joint_mask(self, heads) -> np.ndarray:
    """bool [1, L, H] ablating `heads` together."""
    mask = np.zeros(self.num_total, bool)
    mask[np.asarray(heads, np.int64)] = True
    return mask.reshape(1, self.num_layers, self.num_heads)


def cache_directory(output_dir: str, model: str, task: str, num_samples, sample_seed: int, part: str) -> str:
  def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)

  return os.path.join(output_dir, "cache", f"{slug(os.path.basename(os.path.normpath(model)))}-{slug(task)}"
                      f"-n{num_samples}-s{sample_seed}-{part}")


def real_problem(evaluator: Evaluator, model_name: str, *, output_dir: str, num_samples, sample_seed: int,
                 part: str, headline_metric: str) -> tuple[Problem, MaskCache]:
  """The evaluator's task on its documents, every mask's metrics cached under output_dir/cache."""
  c = evaluator.engine.model_config
  task, docs, task_name = evaluator.task, evaluator.docs, evaluator.name
  if headline_metric not in task.metric_names:
    raise UserError(f"--headline_metric={headline_metric} is not a metric of {task_name}; it has "
                    f"{', '.join(task.metric_names)}")
  doc_ids = hashlib.sha256(repr([d.get("id", i) for i, d in enumerate(docs)]).encode()).hexdigest()[:16]
  settings = {"model": model_name, "task": task_name, "task_options": {}, "num_samples": num_samples,
              "sample_seed": sample_seed, "docs": part, "ablation": "zero", "doc_ids": doc_ids}
  cache = MaskCache(cache_directory(output_dir, model_name, task_name, num_samples, sample_seed, part), settings,
                    lambda masks: evaluator.batches((~np.asarray(masks, bool)).astype(np.float32), per_doc=True),
                    c.num_layers, c.num_heads, task.default_metric, docs=len(docs))
  base = cache.measure(np.zeros((1, c.num_layers, c.num_heads), bool))
  metric_names = [headline_metric] + [m for m in task.metric_names if m != headline_metric]
  objective = RetainedProbability([evaluator]) if task.output_type == "loglikelihood" else None
  problem = Problem(f"{task_name} ({part})", c.num_layers, c.num_heads, cache.measure,
                    {m: float(v[0]) for m, v in base.items()}, metric_names, objective=objective, evaluator=evaluator,
                    per_doc=cache.per_doc)
  return problem, cache


def measure_gradient(problem: Problem, repeats: int = 2) -> dict[str, Any]:
  """The mask gradient (`Evaluator.first_order_change`, what a method that needs the gradient uses) and its cost against
  mask evaluations timed in the same process: a warm gradient pass vs a warm full batch of masks."""
  evaluator = problem.evaluator
  if evaluator.task.output_type != "loglikelihood":
    return {"available": False, "reason": "generation task: no teacher-forced log-probability to differentiate"}
  evaluator.first_order_change()  # compile
  seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    change = evaluator.first_order_change()
    seconds.append(time.perf_counter() - start)
  engine, c = evaluator.engine, evaluator.engine.model_config
  per_call = engine.masks_per_call(evaluator.task.requests(evaluator.docs, engine.tokenizer))
  keep = np.ones((per_call, c.num_layers, c.num_heads), np.float32)
  keep[:, 0, 0] = 0  # any masks: the cost does not depend on which heads are ablated
  evaluator.run(keep)  # compile this batch shape (usually already done)
  mask_seconds = []
  for _ in range(repeats):
    start = time.perf_counter()
    evaluator.run(keep)
    mask_seconds.append((time.perf_counter() - start) / per_call)
  gradient_seconds, per_mask = float(np.median(seconds)), float(np.median(mask_seconds))
  problem.gradient = change
  problem.gradient_cost = gradient_seconds / per_mask
  problem.mask_seconds = per_mask
  return {"available": True, "gradient_seconds": gradient_seconds, "mask_evaluation_seconds": per_mask,
          "masks_per_call": per_call, "forward_equivalents": problem.gradient_cost,
          "timing_evaluations": per_call * (repeats + 1)}


def synthetic_evaluator(responses: dict[str, SyntheticResponse], noise_seed: int):
  """An evaluator whose noise is a fixed function of the mask (a deterministic model on fixed
  documents), so repeated masks give the same score, as on a real model."""

  def evaluate(masks: np.ndarray):
    flat = np.asarray(masks, bool).reshape(len(masks), -1)
    out = {}
    for name, response in responses.items():
      values = np.empty(len(flat))
      for i, row in enumerate(flat):
        digest = hashlib.blake2b(np.packbits(row).tobytes(), digest_size=8).digest()
        rng = np.random.default_rng([noise_seed, *np.frombuffer(digest, np.uint32).tolist(), len(name)])
        values[i] = response.evaluate(row[None], rng)[0]
      out[name] = values
    yield slice(0, len(flat)), out

  return evaluate


def synthetic_problem(num_layers: int, num_heads: int, seed: int, *, num_planted: int = 10,
                      interaction_scale: float = 0.5, headline_metric: str = "accuracy",
                      num_samples: int = 100) -> tuple[Problem, MaskCache, SyntheticResponse]:
  """A simulated task over num_layers × num_heads heads: `num_planted` sparse effects (single-ablation
  drops U(0.05, 0.4) from 0.8), dense background effects, pairwise interactions between planted heads,
  logistic saturation, and the binomial noise of a `num_samples`-document accuracy; its `logprob` metric
  is log p plus Gaussian noise (sd 0.05) from the same p."""
  n = num_layers * num_heads
  common = dict(num_planted=num_planted, planted_drop=(0.05, 0.4), interaction_scale=interaction_scale,
                link="logistic", num_samples=num_samples, seed=seed)
  responses = {"accuracy": SyntheticResponse(n, metric="accuracy", **common),
               "logprob": SyntheticResponse(n, metric="logprob", **common)}
  cache = MaskCache(None, {}, synthetic_evaluator(responses, noise_seed=10_000 + seed), num_layers, num_heads,
                    "accuracy")
  base = cache.measure(np.zeros((1, num_layers, num_heads), bool))
  names = [headline_metric] + [m for m in responses if m != headline_metric]
  problem = Problem(f"synthetic N={n} seed={seed}", num_layers, num_heads, cache.measure,
                    {m: float(v[0]) for m, v in base.items()}, names)
  return problem, cache, responses["accuracy"]
