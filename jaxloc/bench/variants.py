"""A benchmark variant: a registered method (`jaxloc.localize.methods`) with a few of its settings changed
(`LocalizeSettings.make`, whose defaults are `experiments.localize`'s), and how it runs on a problem at a budget of
model evaluations (`run_variant`), driven by the runner's own loop (`methods.drive`) with a problem's cached
measurements in place of the engine. The efficiency benchmark (`bench.sweep`) sweeps variants over budgets and seeds.

Axes: `masks` M, `layers` L, `heads` H, N = L * H heads flattened row-major (flat = layer * H + head).

Variant names are tokens joined with '-' (`parse_variant`):
  <method>           a registered method name (`jaxloc.localize.methods.names()`);
  accuracy|logprob|acc|acc_norm|exact_match   --metric;   nonpositive   --nonpositive;
  r<rate>            --ablation_rate;   s<fraction>   --screen_fraction;
  <flag>=<value>     any of the method's own flags (e.g. mask_steps=30; one value, no '-');
  n<count>           --num_masks fixed at count (the budget only decides whether the variant fits);
  upto<fraction>     the benchmark's own limit: the largest budget the variant runs at.
At a budget of B evaluations a method gets --num_masks = B, less what it needs before measuring (its `needs`):
the gradient pass, in evaluations, for a method that needs the mask gradient; its training, in evaluations by
measured time, for a method that trains on the relaxed objective (it trains once per seed, the budget buys its
confirmations). It runs only if its plan fits the budget, and only where the problem provides what it needs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from typing import Any

import numpy as np

from jaxloc.bench.problems import Problem
from jaxloc.config import parse_value
from jaxloc.errors import UserError
from jaxloc.localize import methods
from jaxloc.localize.methods import Measured, Ranking
from jaxloc.localize.methods.base import ATTRIBUTION, GRADIENT, OBJECTIVE, drive
from jaxloc.localize.settings import LocalizeSettings

log = logging.getLogger(__name__)

METRIC_TOKENS = ("accuracy", "logprob", "acc", "acc_norm", "exact_match")


# Short tokens for flags many variants set (the method must take the flag).
SHORT_TOKENS = {"r": "ablation_rate", "s": "screen_fraction"}


@dataclasses.dataclass(frozen=True)
class Variant:
  """A registered method with a few settings changed (see the module docstring for the name tokens)."""

  name: str
  method: str
  overrides: tuple[tuple[str, Any], ...] = ()
  max_budget: float = math.inf

  def settings(self, base: LocalizeSettings, num_masks: int, seed: int) -> LocalizeSettings:
    """`base`'s settings with this variant's method (its own settings at their defaults unless `base` runs the
    same method) and overrides, at `num_masks` (unless fixed) and `seed`."""
    return base.replace(method=self.method, seed=seed, **{"num_masks": num_masks, **dict(self.overrides)})


def parse_variant(name: str) -> Variant:
  """`<method>-logprob-r0.05-nonpositive` -> Variant; UserError naming a bad token."""
  method_name, *tokens = name.strip().split("-")
  if method_name not in methods.names():
    raise UserError(f"unknown method {name!r}: it must start with one of {', '.join(methods.names())}")
  method = methods.get(method_name)
  if "heads" not in method.units:
    raise UserError(f"method {name!r} localizes {', '.join(method.units)}; the benchmark ranks heads")
  own = method.flag_fields()
  overrides: dict[str, Any] = {}
  max_budget = math.inf
  for token in tokens:
    number = re.fullmatch(r"(r|s|upto)(\d*\.?\d+)", token)
    count = re.fullmatch(r"n(\d+)", token)
    flag, equals, text = token.partition("=")
    if token in METRIC_TOKENS:
      overrides["metric"] = token
    elif token == "nonpositive":
      overrides["nonpositive"] = True
    elif count and int(count.group(1)) >= 1:
      overrides["num_masks"] = int(count.group(1))
    elif number:
      value = float(number.group(2))
      if not 0 < value <= 1 or (number.group(1) != "upto" and value >= 1):
        raise UserError(f"method {name!r}: {token!r} must be a fraction in (0, 1)")
      if number.group(1) == "upto":
        max_budget = value
      else:
        overrides[SHORT_TOKENS[number.group(1)]] = value
    elif equals and flag in own:
      overrides[flag] = parse_value(flag, own[flag], text)
    else:
      raise UserError(f"method {name!r}: unknown token {token!r}; tokens are {', '.join(METRIC_TOKENS)}, "
                      "nonpositive, r<ablation rate>, s<screen fraction>, n<fixed --num_masks>, upto<largest budget "
                      f"fraction>, and <flag>=<value> for {method_name}'s flags ({', '.join(own) or 'none'})")
  missing = [k for k in overrides if k in ("nonpositive", *SHORT_TOKENS.values()) and k not in own]
  if missing:
    raise UserError(f"method {name!r}: {method_name} takes no --{missing[0]}; its flags: {', '.join(own) or 'none'}")
  return Variant(name.strip(), method_name, tuple(sorted(overrides.items())), max_budget)


def budget_masks(fraction: float, num_total: int) -> int:
  return max(2, int(round(fraction * num_total)))


@dataclasses.dataclass
class MethodRun:
  ranking: np.ndarray  # int [N], most important first
  evaluations: float  # masks measured, plus the gradient pass in evaluations
  info: dict[str, Any] = dataclasses.field(default_factory=dict)
  # What the runner's selection needs: the settings run, the plan (it estimates the general tasks from the same
  # masks), the target's measurements and the ranking.
  settings: LocalizeSettings | None = None
  plan: methods.Plan | None = None
  measured: Measured | None = None
  ranked: Ranking | None = None


def context(problem: Problem, memory: dict | None = None) -> methods.Context:
  """What a plan may ask of `problem` (its gradient, its objective); `memory` keeps what plans remember."""
  gradient = (lambda: problem.gradient) if problem.gradient is not None else None
  ctx = methods.Context(problem.num_layers, problem.num_heads, np.zeros(problem.num_total, bool), gradient,
                        problem.objective)
  if memory is not None:
    ctx._memory = memory  # noqa: SLF001 - shared across budgets: a trained mask is trained once per seed
  return ctx


def provides(problem: Problem, needs: frozenset[str]) -> bool:
  """Whether `problem` gives a method what it needs before measuring, with its cost in evaluations: the gradient
  (timed), the relaxed objective with a timed mask evaluation to convert training time. No problem attributes."""
  available = set()
  if problem.gradient is not None:
    available.add(GRADIENT)
  if problem.objective is not None and problem.mask_seconds is not None:
    available.add(OBJECTIVE)
  return set(needs) & {GRADIENT, OBJECTIVE, ATTRIBUTION} <= available


def measure_plan(plan: methods.Plan, problem: Problem, metric: str) -> Measured:
  """What `plan` measures on `problem`, driven as the runner drives it."""
  measured = Measured(np.zeros((0, problem.num_layers, problem.num_heads), bool),
                      {m: np.zeros((0,)) for m in problem.metric_names}, problem.baseline, metric)
  return drive(plan, measured, lambda masks: measured.extend(masks, problem.measure(masks)))


def run_settings(settings: LocalizeSettings, problem: Problem, memory: dict | None = None
                 ) -> tuple[Measured, Ranking]:
  """Runs the registered method of `settings` on `problem`: its measurements and ranking."""
  measured, ranking, _ = _run_plan(settings, problem, memory)
  return measured, ranking


def _run_plan(settings: LocalizeSettings, problem: Problem, memory: dict | None
              ) -> tuple[Measured, Ranking, methods.Plan]:
  plan = settings.method_object.plan(settings, context(problem, memory))
  measured = measure_plan(plan, problem, settings.metric or problem.headline_metric)
  return measured, plan.rank(measured), plan


def run_variant(variant: Variant, problem: Problem, base: LocalizeSettings, budget: int, seed: int
                ) -> MethodRun | None:
  """The variant at a budget of `budget` evaluations; None when the budget or the problem cannot run it."""
  method = methods.get(variant.method)
  if not provides(problem, method.needs):
    return None
  cost = float(problem.gradient_cost) if GRADIENT in method.needs else 0.0
  memory = problem.memory.setdefault((variant.name, seed), {})
  if OBJECTIVE in method.needs:
    if "training_seconds" not in memory:  # train once per seed (the plan trains; its gates are remembered)
      before = problem.objective.seconds
      method.plan(variant.settings(base, 1, seed), context(problem, memory))
      memory["training_seconds"] = problem.objective.seconds - before
    cost += float(memory["training_seconds"]) / problem.mask_seconds
  settings = variant.settings(base, int(math.floor(budget - cost)), seed)
  try:
    settings.check()
  except UserError:
    return None
  try:
    measured, ranking, plan = _run_plan(settings, problem, memory)
  except UserError as e:  # e.g. every mask of a small design at the accuracy floor: nothing to rank
    log.warning("%s at %d evaluations, seed %d: %s", variant.name, budget, seed, e)
    return None
  if len(measured) + cost > budget + 1e-9:
    return None
  info = {k: v for k, v in ranking.facts.items() if np.ndim(v) == 0 and not isinstance(v, dict)}
  return MethodRun(ranking.order, len(measured) + cost, info, settings, plan, measured, ranking)


def default_variants(synthetic: bool = False) -> list[str]:
  """Every registered method's declared variants (`Method.efficiency_variants`, in registration order): the paper's
  two designs, the beyond-paper settings and methods, and the baseline; a method that trains a mask declares none
  (its training alone can cost more than N evaluations, so it runs only when named, with a budget above 1).
  "{cap}" is the largest budget of a costly variant: 25% of N on a model (each costs 5 seeds x its masks in model
  evaluations; the targets are at 10% and 25%), 50% in simulation. Simulation leaves out the methods that need a
  model to differentiate."""
  cap = "0.5" if synthetic else "0.25"
  return [name + (f"-{tokens.format(cap=cap)}" if tokens else "")
          for name in methods.names() for tokens in methods.get(name).efficiency_variants
          if not (synthetic and needs_model(name))]


def needs_model(method: str) -> bool:
  """Whether the method needs something only a model gives (a gradient, an objective, an attribution)."""
  return bool(set(methods.get(method).needs) & {GRADIENT, OBJECTIVE, ATTRIBUTION})
