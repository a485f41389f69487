"""How the efficiency benchmark judges a method: by the heads a run of it would report (`runner_selection`: the
run's own solve and confirm stages over the benchmark's cached problems), ablated together on held-out
documents of the target and of every general task (`held_out_drops`). On a model, the confirmation decides as a
run's does: each drop with its interval from the cached per-document values, more documents of a general task
(its reserve) where the interval straddles the bound or the task's power asks (`Judging.in_sample`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxloc.bench.problems import Problem
from jaxloc.bench.variants import MethodRun
from jaxloc.localize import confirm, localization, validate
from jaxloc.localize.methods import Measured


@dataclasses.dataclass
class Judging:
  """Where each method's heads are judged as a run would judge them: the target on held-out documents, and every
  general task on its identification documents (scored under each method's masks, as a run scores them) and on
  held-out documents."""

  held_out: Problem
  general: list[tuple[str, Problem, Problem]]  # (task, identification documents, held-out documents)
  # The target's and every general task's identification documents, with more documents of each general task (its
  # reserve), where the confirmation decides (a run's `validate.TaskMeasures`); None: the caches' means, point
  # decisions (simulation).
  in_sample: validate.TaskMeasures | None = None

  @property
  def names(self) -> list[str]:
    return [name for name, _, _ in self.general]


class ProblemScorer:
  """`validate.Measures` over problems: each task's metric under keep-masks, from its mask cache (a head checked
  alone for one method is free for every other)."""

  def __init__(self, names: Sequence[str], problems: Sequence[Problem], metrics: Sequence[str]):
    self.names, self.problems, self.metrics = list(names), list(problems), list(metrics)
    self.num_layers, self.units_per_layer = problems[0].num_layers, problems[0].num_heads

  def means(self, keep: np.ndarray) -> list[np.ndarray]:
    ablated = np.asarray(keep) < 0.5
    return [np.asarray(p.measure(ablated)[m], np.float64) for p, m in zip(self.problems, self.metrics)]


def measured_on(problem: Problem, masks: np.ndarray, metric: str | None = None) -> Measured:
  """`problem` scored under `masks` (bool [M, L, H]), every metric (per document too where the problem keeps them),
  `metric` localized (default its headline metric)."""
  masks = np.asarray(masks, bool)
  metrics = problem.measure(masks) if len(masks) else {m: np.zeros((0,)) for m in problem.metric_names}
  docs = baselines = None
  if problem.per_doc is not None:
    docs = problem.per_doc(masks) if len(masks) else None
    baselines = {m: v[0] for m, v in problem.per_doc(problem.joint_mask([])).items()}
    if docs is None:
      docs = {m: np.zeros((0, len(v))) for m, v in baselines.items()}
  return Measured(masks, {m: np.asarray(v, np.float64) for m, v in metrics.items()}, problem.baseline,
                  metric or problem.headline_metric, docs, baselines)


def runner_selection(run: MethodRun, problem: Problem, judging: Judging) -> confirm.Found:
  """The heads a run of this method would report, from the run's own solve and confirm stages
  (`localize.localization.estimate`, `localize.localization.conclude`): the general tasks scored under the method's
  masks on their identification documents and estimated by its plan, universal heads confirmed on the held-out
  documents, the selection confirmed on the identification documents."""
  names = [problem.name, *judging.names]
  target = measured_on(problem, run.measured.masks, run.measured.metric)
  general = [measured_on(identification, run.measured.masks) for _, identification, _ in judging.general]
  metrics = [run.measured.metric, *(p.headline_metric for _, p, _ in judging.general)]
  confirming = ProblemScorer(names, [judging.held_out, *(p for _, _, p in judging.general)], metrics)
  identification = judging.in_sample
  if identification is None:
    identification = ProblemScorer(names, [problem, *(p for _, p, _ in judging.general)], metrics)
  elif identification.metrics != metrics:
    raise ValueError(f"the confirmation's documents are scored in {identification.metrics}, this run in {metrics}")
  excluded = np.zeros(problem.num_total, bool)
  measured = [target, *general]
  solution = localization.estimate(run.plan, measured, excluded, ranking=run.ranked)
  return localization.conclude(run.settings, solution, measured, excluded, confirming, identification)


def held_out_drops(task: float, general: dict[str, float]) -> dict[str, Any]:
  """A top-k's held-out relative drop on the task, on each general task, and the largest of those."""
  out: dict[str, Any] = {"held_out_relative_drop": float(task)}
  if general:
    out["general_relative_drop"] = {name: float(d) for name, d in general.items()}
    finite = [d for d in out["general_relative_drop"].values() if np.isfinite(d)]
    out["max_general_relative_drop"] = max(finite) if finite else float("nan")
  return out
