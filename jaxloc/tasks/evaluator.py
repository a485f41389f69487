"""The evaluator: a task evaluated under a stack of head or neuron masks, the only place tasks meet the engine.

Axes: `masks`, `layers`, `units` (keep-masks [masks, layers, units], 1 = keep, 0 = ablate); the unit is
"heads" (units = attention heads) or "neurons" (units = MLP intermediate units); `fill` is what an
ablated unit outputs instead (None: zeros; mean ablation: per-unit means from `mean_ablation_values`).

`Evaluator` is the one way to evaluate a task under masks (localization, validation, `experiments.evaluate`, the
benchmarks, the lm-eval comparison): `Evaluator.outputs` is the single place where a scored task goes to
`engine.score_batches` and a generation task to `engine.generate`. The engine is otherwise used through
`engine.tokenizer`, `engine.score` (unablated log-probabilities), `engine.mask_objective(...)`,
`engine.neuron_attribution(...)` and `engine.ablation_means(requests)`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from jaxloc.engine.requests import GenerationRequest, ScoreOutputs, ScoringRequest
from jaxloc.errors import UserError
from jaxloc.units import check_unit, units_per_layer
from jaxloc.tasks.base import Doc, Task
from jaxloc.tasks.registry import get_task

# Generation has no engine-side mask batches to report; this many masks go per generate call.
GENERATION_MASKS_PER_BATCH = 16


def engine_masks(unit: str, keep, fill) -> dict[str, Any]:
  """The engine's keyword arguments for keep-masks over `unit` with their fill values."""
  return {"head_masks": keep, "head_fill": fill} if unit == "heads" else {"neuron_masks": keep, "neuron_fill": fill}


def _metrics(task: Task, docs: Sequence[Doc], outputs, num_masks: int, per_doc: bool) -> dict[str, np.ndarray]:
  """The task's metrics for `num_masks` masks: name -> float [masks, docs] if `per_doc` (`doc_metrics`),
  else [masks] (`compute_metrics`, which adds the task's aggregate-only metrics)."""
  metrics = task.doc_metrics(docs, outputs) if per_doc else task.compute_metrics(docs, outputs)
  expected = (num_masks, len(docs)) if per_doc else (num_masks,)
  for name, values in metrics.items():
    if np.shape(values) != expected:
      raise ValueError(f"task {task.name!r} metric {name!r} has shape {np.shape(values)}; expected {list(expected)}")
  return metrics


def reference_requests(requests: Sequence[ScoringRequest | GenerationRequest]
                       ) -> list[ScoringRequest]:
  """The requests' texts as scoring requests, for head means over the task's own tokens.

  A generation prompt has no continuation; its last character becomes one, so every token is
  still the prompt's own text (split at one character boundary).
  """
  scoring = []
  for request in requests:
    if isinstance(request, GenerationRequest):
      scoring.append(ScoringRequest(request.context[:-1], request.context[-1:],
                                    request.add_special_tokens))
    else:
      scoring.append(request)
  return list(dict.fromkeys(scoring))  # a multiple-choice context counts once per distinct choice


def mean_ablation_values(engine, task: Task, docs: Sequence[Doc], *, unit: str = "heads"):
  """The fill for mean ablation: each head's mean output [layers, heads, head_dim] (or each neuron's mean value
  [layers, mlp]) over the tokens of this task's requests on `docs`, with nothing ablated."""
  heads, neurons = engine.ablation_means(reference_requests(task.requests(docs, engine.tokenizer)))
  return heads if unit == "heads" else neurons


def load_task(name: str, options: dict[str, Any] | None = None, *, num_samples: int | None, seed: int,
              data_dir: str | None) -> tuple[Task, list[Doc]]:
  """A registered or custom task and its seeded document subset; needs no model, so a bad task name, a
  missing dataset file or a malformed line is reported before any model loads."""
  task = get_task(name, **(options or {}))
  return task, task.load_docs(num_samples=num_samples, seed=seed, data_dir=data_dir)


def _doc_key(doc: Doc) -> str:
  return json.dumps(doc, sort_keys=True, default=str)


def load_task_split(name: str, options: dict[str, Any] | None = None, *, num_samples: int, validation_samples: int,
                    seed: int, data_dir: str | None) -> tuple[Task, list[Doc], list[Doc]]:
  """(task, identification docs, held-out docs): the identification docs are `load_task`'s seeded subset;
  the held-out docs are `validation_samples` more from the same seeded draw, disjoint from them. A task with
  too few documents for both is a UserError naming the counts."""
  task, docs = load_task(name, options, num_samples=num_samples, seed=seed, data_dir=data_dir)
  if not validation_samples:
    return task, docs, []
  wanted = num_samples + validation_samples
  pool = task.load_docs(num_samples=wanted, seed=seed, data_dir=data_dir)
  if len(pool) < wanted:
    raise UserError(f"task {name} has {len(pool)} documents; identification ({num_samples}) and held-out "
                    f"validation ({validation_samples}) need {wanted} disjoint ones: lower --num_samples / "
                    "--general_samples or --validation_samples")
  used = collections.Counter(_doc_key(doc) for doc in docs)
  held_out = []
  for doc in pool:
    key = _doc_key(doc)
    if used[key]:
      used[key] -= 1
    else:
      held_out.append(doc)
  if len(held_out) != validation_samples or sum(used.values()):
    raise ValueError(f"task {name}: load_docs did not draw nested seeded subsets (data.sample_docs does)")
  return task, docs, held_out


def load_more_docs(task: Task, used: Sequence[Doc], count: int, *, seed: int, data_dir: str | None) -> list[Doc]:
  """Up to `count` more documents of `task`, disjoint from `used` (e.g. a run's identification and held-out
  documents): the rest of its split in a seeded order, so that a smaller count's documents begin a larger count's
  (documents scored for one cap are the same for another); fewer (all the rest) when it has no more."""
  if count <= 0:
    return []
  taken = collections.Counter(_doc_key(doc) for doc in used)
  rest = []
  for doc in task.load_docs(num_samples=None, seed=seed, data_dir=data_dir):
    key = _doc_key(doc)
    if taken[key]:
      taken[key] -= 1
    else:
      rest.append(doc)
  order = np.random.default_rng([seed, len(used)]).permutation(len(rest))[:count]
  return [rest[i] for i in order]


@dataclasses.dataclass
class Evaluator:
  """A task on its documents, with its mean-ablation fill, run under masks by one engine: the one way
  localization, validation, `experiments.evaluate` and the benchmarks evaluate a task.

  Masks given to `run`/`batches` are keep-masks (1 keep, 0 ablate), float [masks, layers, units] over `unit`
  ("heads" or "neurons").

  `exact`: a scored task's masks are scored bit for bit the same whichever masks share their call
  (`Engine.score_batches(exact=True)`: every call at the layout's size), as a run's resumable measurements must be.
  """

  engine: Any
  name: str
  task: Task
  docs: list[Doc]
  fill: np.ndarray | None = None
  unit: str = "heads"
  held_out: bool = False  # documents held out: scored in a few calls only (validation, single-head checks)
  exact: bool = False
  _unablated: np.ndarray | None = dataclasses.field(default=None, repr=False, compare=False)

  @classmethod
  def build(cls, engine, name: str, task: Task, docs: Sequence[Doc], ablation: str = "zero", unit: str = "heads",
            exact: bool = False) -> "Evaluator":
    fill = mean_ablation_values(engine, task, docs, unit=unit) if ablation == "mean" else None
    return cls(engine, name, task, list(docs), fill, unit, exact=exact)

  def on(self, docs: Sequence[Doc]) -> "Evaluator":
    """The same task, fill and unit on held-out documents, which the engine scores in a few calls and may lay
    out in a larger shape compiled for the identification documents (`Layouts.prepare(few_calls=True)`)."""
    return Evaluator(self.engine, self.name, self.task, list(docs), self.fill, self.unit, held_out=True,
                     exact=self.exact)

  def lay_out(self, pin: bool = False) -> None:
    """Lays out a scored task's requests now (`Engine.prepare`; a layout may take a shape laid out before, so the
    order in which request sets are first laid out decides their shapes, and so their scores' rounding); `pin`: the
    layout is kept for the engine's life. A run lays out every set it resumes measuring first, in one order."""
    if self.task.output_type == "loglikelihood":
      self.engine.prepare(self.requests(), few_calls=self.held_out, pin=pin)

  @property
  def units_per_layer(self) -> int:
    return units_per_layer(self.engine.model_config, self.unit)

  def _all_kept(self) -> np.ndarray:
    return np.ones((1, self.engine.model_config.num_layers, self.units_per_layer), np.float32)

  def requests(self, docs: Sequence[Doc] | None = None) -> list[ScoringRequest | GenerationRequest]:
    """The task's requests on its documents (or on `docs`), tokenized by the engine's tokenizer."""
    return self.task.requests(self.docs if docs is None else docs, self.engine.tokenizer)

  def outputs(self, keep, *, progress: Callable[[int], None] | None = None
              ) -> Iterator[tuple[slice, ScoreOutputs | list[list[str]]]]:
    """(mask slice, the engine's outputs under those keep-masks) as batches finish: `ScoreOutputs` from
    `engine.score_batches` for a scored task (the engine's own mask batches), generated texts [masks][docs] from
    `engine.generate` for a generation task, `GENERATION_MASKS_PER_BATCH` masks at a time. The one place a task
    meets the engine. `progress` counts masks (scoring) or (mask, request) sequences (generation)."""
    check_unit(self.unit)
    if np.ndim(keep) != 3:
      raise ValueError(f"masks must be [masks, layers, {self.unit}], got shape {np.shape(keep)}")
    requests = self.requests()
    if self.task.output_type == "loglikelihood":
      for where, scores in self.engine.score_batches(requests, **engine_masks(self.unit, keep, self.fill),
                                                     few_calls=self.held_out, exact=self.exact):
        if progress:
          progress(where.stop - where.start)
        yield where, scores
    elif self.task.output_type == "generate":
      for begin in range(0, len(keep), GENERATION_MASKS_PER_BATCH):
        where = slice(begin, min(begin + GENERATION_MASKS_PER_BATCH, len(keep)))
        yield where, self.engine.generate(requests, progress=progress,
                                          **engine_masks(self.unit, np.asarray(keep)[where], self.fill))
    else:
      raise ValueError(f"task {self.task.name!r} has unknown output_type {self.task.output_type!r}")

  def joined_outputs(self, keep) -> ScoreOutputs | list[list[str]]:
    """The engine's outputs under every keep-mask in one piece (`outputs`' batches joined)."""
    parts = [outputs for _, outputs in self.outputs(keep)]
    if isinstance(parts[0], ScoreOutputs):
      return ScoreOutputs(np.concatenate([p.logprob for p in parts]), np.concatenate([p.is_greedy for p in parts]),
                          parts[0].num_tokens)
    return [texts for part in parts for texts in part]

  def batches(self, keep, *, per_doc: bool = False, progress: Callable[[int], None] | None = None
              ) -> Iterator[tuple[slice, dict[str, np.ndarray]]]:
    """(mask slice, the task's metrics under those masks) as batches finish (`outputs`); callers checkpoint
    between batches. Metrics: name -> float [masks] ([masks, docs] if `per_doc`)."""
    for where, outputs in self.outputs(keep, progress=progress):
      yield where, _metrics(self.task, self.docs, outputs, where.stop - where.start, per_doc)

  def run(self, keep, *, progress: bool = False, per_doc: bool = False) -> dict[str, np.ndarray]:
    """The task's metrics under every keep-mask: name -> float [masks] ([masks, docs] if `per_doc`). `progress`
    shows a bar over masks (scoring) or (mask, request) sequences (generation)."""
    generating = self.task.output_type == "generate"
    total = len(keep) * (len(self.docs) if generating else 1)
    with tqdm(total=total, desc=self.name, unit="seq" if generating else "mask", disable=not progress) as bar:
      parts = [metrics for _, metrics in self.batches(keep, per_doc=per_doc, progress=bar.update)]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

  def scored_requests(self, docs: Sequence[int] | None = None) -> list[ScoringRequest]:
    """One request per document (all, or those indexed by `docs`) whose log-probability is the task's
    differentiable score (`Task.scored_request_index`): the target of a prompt/target task, the gold choice of a
    multiple-choice task (the choices compete; their sum does not)."""
    if self.task.output_type != "loglikelihood":
      raise UserError(f"a differentiable score needs a scored (loglikelihood) task; {self.name} is a generation "
                      "task")
    chosen = self.docs if docs is None else [self.docs[int(i)] for i in docs]
    requests = self.requests(chosen)
    return [requests[int(i)] for i in self.task.scored_request_index(chosen)]

  def first_order_change(self) -> np.ndarray:
    """[N] first-order score change of ablating each unit: -d(mean log-probability of the scored requests)/
    d(keep mask) at the unablated model, one backward pass."""
    _, grad = self.engine.mask_objective(self.scored_requests(), **engine_masks(self.unit, self._all_kept(),
                                                                                self.fill))
    return -grad[0].reshape(-1)

  def attribution(self, steps: int, progress: bool = False) -> np.ndarray:
    """float [docs, N]: each document's integrated-gradients attribution of every neuron for its scored request
    (`engine.neuron_attribution`; CNL's per-sample scores)."""
    if self.unit != "neurons":
      raise UserError("integrated-gradients attribution is over neurons (--unit=neurons)")
    requests = self.scored_requests()
    with tqdm(total=len(requests), desc=f"{self.name} attribution", unit="doc", disable=not progress) as bar:
      scores = self.engine.neuron_attribution(requests, steps, self.fill, progress=bar.update)
    return scores.reshape(len(requests), -1)

  def unablated_logprob(self) -> np.ndarray:
    """float [docs]: each scored request's log-probability under the unablated model (computed once)."""
    if self._unablated is None:
      out = self.engine.score(self.scored_requests(), **engine_masks(self.unit, self._all_kept(), self.fill))
      self._unablated = np.asarray(out.logprob[0], np.float64)
    return self._unablated

  def retained_probability(self, keep, docs: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over `docs` (indices) of the probability each scored request keeps under each soft keep-mask,
    relative to the unablated model and capped at 1 (exp(min(logprob - unablated, 0))), float [masks], and its
    gradient in the mask [masks, layers, heads]: the bounded, differentiable score a learned mask trains on."""
    docs = np.asarray(docs, np.int64)
    return self.engine.mask_objective(self.scored_requests(docs), weights=np.full(len(docs), 1.0 / len(docs)),
                                      offsets=self.unablated_logprob()[docs], retained=True,
                                      **engine_masks(self.unit, keep, self.fill))


@dataclasses.dataclass
class RetainedProbability:
  """Several evaluators' `retained_probability` as one relaxed objective (`localize.methods.RelaxedObjective`:
  the target first, then the general tasks), timing itself."""

  evaluators: list[Evaluator]
  seconds: float = 0.0

  @property
  def num_docs(self) -> list[int]:
    return [len(e.docs) for e in self.evaluators]

  def __call__(self, keep, docs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    start = time.perf_counter()
    out = [e.retained_probability(keep, d) for e, d in zip(self.evaluators, docs)]
    self.seconds += time.perf_counter() - start
    return np.stack([v for v, _ in out]), np.stack([g for _, g in out])
