"""The protocol every localization method follows, the measurements it sees, the loop that measures a plan, and
the ranking rule.

Axes: `masks` M, `layers` L, `heads` H; N = L * H heads flattened row-major (flat = layer * H + head).
Masks are bool (True = ablated); metrics are task scores under each mask (higher = better).

A `Method` (subclass it; list its instances in the module's `METHODS`) is one file in `jaxloc.localize.methods`,
found by the registry. It declares
  - its own settings dataclass (`settings_class`, fields made with `jaxloc.config.setting`): the registry turns
    them into flags and keywords under the prefix `flag_prefix` (the method's name and "_"), and a run holds them
    as `settings.method_settings`;
  - the run-wide settings it reads and what they mean for it (`run_settings`, e.g. --num_masks: "design masks"),
  - what it needs from the run (`needs`, empty by default: the mask gradient, the relaxed objective, the
    attribution, a scored target, scored general tasks) and the units it localizes (`units`);
  - example options (`example_options`): keywords of `LocalizeSettings.make` that run it on a small problem (3
    layers × 4 heads, three planted heads, a few dozen masks), which the method tests run every method with;
and for a run it
  - checks its settings (`check`, before any model loads),
  - names the settings its saved measurements depend on (`measurement_settings`; a resume must match): by default
    the run-wide settings it reads and its own fields marked `measured`,
  - makes a `Plan` (`plan(settings, context)`): what to measure next given what is measured
    (`next_masks`, None when done), and how to rank every head from the measurements (`rank`),
  - makes the plan a bootstrap re-estimates with (`bootstrap_plan`; by default the same plan).
The runner (`localize/localization.py`) and the efficiency benchmark (`bench/variants.py`) drive plans with the same
`drive` and never ask which method they hold. Every plan is resumable: given saved measurements it continues where they
end (its masks are a function of the settings and the measured scores).

Ranking rule (every method): heads are ordered by their value, most negative first (the Lasso
coefficient, or the measured score change when ablated alone). Exact ties, including the heads a Lasso
leaves at zero and heads a method never measured, are broken by measured evidence, in this order: the
same quantity in the task's other metrics, then the method's screen (for compressed sensing each head's
marginal effect in the design: mean score of the masks that ablate it minus the mean of those that
keep it, in each metric; for the confirmation methods the screen's ranking). Only heads with identical
evidence in every measured quantity (e.g. excluded heads, never ablated) stay in flat order.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from typing import Any, Callable, Mapping, Protocol

import numpy as np

from jaxloc import files
from jaxloc.config import declared_flag_fields, flag_values
from jaxloc.errors import UserError


@dataclasses.dataclass
class Measured:
  """Masks measured so far and every metric under each: the view a plan decides and ranks from."""

  masks: np.ndarray  # bool [M, L, H]
  metrics: dict[str, np.ndarray]  # name -> float [M]
  baselines: dict[str, float]  # name -> unablated score
  metric: str  # the metric localized
  # The same per document, when kept: name -> float [M, docs] and name -> float [docs] (bootstrap over docs).
  doc_metrics: dict[str, np.ndarray] | None = None
  doc_baselines: dict[str, np.ndarray] | None = None

  def __len__(self) -> int:
    return len(self.masks)

  @property
  def scores(self) -> np.ndarray:
    return self.metrics.get(self.metric, np.zeros((0,), np.float64))

  @property
  def metric_order(self) -> list[str]:
    """The localized metric, then the others (sorted): the order in which they break ties."""
    return [self.metric] + sorted(m for m in self.metrics if m != self.metric)

  def changes(self) -> list[np.ndarray]:
    """Score change from the baseline under each mask, one [M] array per metric in `metric_order`."""
    return [self.metrics[m] - self.baselines.get(m, 0.0) for m in self.metric_order]

  def extend(self, masks: np.ndarray, metrics: dict[str, np.ndarray]) -> None:
    """Adds masks [m, L, H] and their metrics, name -> float [m] (measurements kept in memory: benchmarks, tests;
    a run's `MeasurementStore` appends per document and saves)."""
    self.masks = np.concatenate([self.masks, np.asarray(masks, bool)])
    self.metrics = {k: np.concatenate([v, np.asarray(metrics[k], np.float64)]) for k, v in self.metrics.items()}

  def rows(self, where) -> "Measured":
    """The measurements of the masks selected by `where` (a slice or an index array)."""
    docs = None if self.doc_metrics is None else {k: v[where] for k, v in self.doc_metrics.items()}
    return Measured(self.masks[where], {k: v[where] for k, v in self.metrics.items()}, self.baselines, self.metric,
                    docs, self.doc_baselines)

  def resample_docs(self, docs: np.ndarray) -> "Measured":
    """The measurements as if the task's documents were `docs` (indices, repeats allowed): every metric and
    baseline re-averaged over them. Needs per-document metrics."""
    if self.doc_metrics is None or self.doc_baselines is None:
      raise ValueError("these measurements kept no per-document metrics")
    doc_metrics = {k: v[:, docs] for k, v in self.doc_metrics.items()}
    doc_baselines = {k: v[docs] for k, v in self.doc_baselines.items()}
    return Measured(self.masks, {k: v.mean(axis=1) for k, v in doc_metrics.items()},
                    {k: float(v.mean()) for k, v in doc_baselines.items()}, self.metric, doc_metrics, doc_baselines)

  @property
  def num_docs(self) -> int | None:
    return None if not self.doc_baselines else len(next(iter(self.doc_baselines.values())))

  def flat(self) -> np.ndarray:
    """bool [M, N]."""
    return self.masks.reshape(len(self.masks), -1)


@dataclasses.dataclass
class Ranking:
  order: np.ndarray  # int [N], most important head first
  values: np.ndarray  # float [N]: coefficient or measured change per head (0 where not measured)
  facts: dict[str, Any] = dataclasses.field(default_factory=dict)  # solver/method facts for heads.json; "value"
  # names what `values` holds (plots and tables label it so)
  known: np.ndarray | None = None  # bool [N]: heads whose value was measured or estimated (None: every head)


class Plan(Protocol):
  # True when the masks are i.i.d. draws of a random design, so that a bootstrap may resample them.
  exchangeable_rows: bool

  def next_masks(self, measured: Measured) -> np.ndarray | None:
    """bool [m, L, H] to measure next, or None when the method has what it needs."""

  def expected_total(self) -> int:
    """Masks the whole plan measures (for progress bars and cost accounting)."""

  def rank(self, measured: Measured) -> Ranking: ...

  def estimate(self, measured: Measured) -> Ranking:
    """Each head's score change estimated from this plan's masks, whatever task was scored under them (the
    target, a general task, a bootstrap resample), taking the masks as given: decides nothing new. For most
    plans this is `rank`; a plan whose masks depend on the target's scores (iterative greedy) estimates
    from the part of its design that does not."""


# What a method may need from the run (`Method.needs`); the runner and the benchmark provide or refuse by these.
GRADIENT = "gradient"  # the mask gradient (`Context.first_order_change`): one backward pass before measuring
OBJECTIVE = "objective"  # every task's relaxed objective (`Context.objective`), trained on before measuring
ATTRIBUTION = "attribution"  # integrated gradients over the target's documents (`Context.document_attribution`)
SCORED_TARGET = "scored target"  # a target scored by log-likelihood (it is differentiated), not generated
SCORED_GENERAL_TASKS = "scored general tasks"  # general tasks scored by log-likelihood too
NEEDS = (GRADIENT, OBJECTIVE, ATTRIBUTION, SCORED_TARGET, SCORED_GENERAL_TASKS)


@dataclasses.dataclass
class NoSettings:
  """The settings of a method that has none of its own (it reads run-wide settings only)."""


class Method:
  """The base of every method; see the module docstring. A subclass sets `name` and `units` and implements `plan`;
  the rest has defaults for a method that declares nothing more."""

  name: str
  units: tuple[str, ...]  # what it localizes: "heads", "neurons"
  settings_class: type = NoSettings
  needs: frozenset[str] = frozenset()  # from NEEDS
  # The run-wide settings (LocalizeSettings fields) it reads, each with what it means for this method (shown in
  # that flag's help); its saved measurements depend on them.
  run_settings: Mapping[str, str] = types.MappingProxyType({})
  # Its variants in the efficiency benchmark's default set (`bench.variants.parse_variant` tokens after the name, ""
  # for the method at its defaults; "{cap}" is the budget cap the benchmark gives costly variants).
  efficiency_variants: tuple[str, ...] = ()
  # Where it stands in the registry's listing (`names()`: help texts, error messages, the efficiency benchmark's
  # default variants), lowest first; a method that sets none comes after those that do, by name.
  listing_order: float = math.inf
  # Keywords of `LocalizeSettings.make` (run-wide settings and its own flags) for a small example problem: 3 layers
  # × 4 heads with three planted heads (tests/localize/test_methods.py runs every method on it).
  example_options: Mapping[str, Any] = types.MappingProxyType({})

  @property
  def flag_prefix(self) -> str:
    """What its settings' flags start with: the method's name and "_", unless its settings class declares a
    `flag_prefix` (the names some methods' flags had before the prefix was derived: kept, so flagfiles still
    work)."""
    return getattr(self.settings_class, "flag_prefix", f"{self.name}_")

  def flag_fields(self) -> dict[str, dataclasses.Field]:
    """Its own flags by name (`flag_prefix` + field; a nested settings class's under that class's prefix)."""
    return declared_flag_fields(self.settings_class, self.flag_prefix)

  def check(self, settings) -> None:
    """UserError naming the flag if this method cannot run with `settings` (bounds are checked already)."""
    del settings

  def measurement_settings(self, settings) -> dict[str, Any]:
    """The settings its saved measurements depend on, by flag name: the run-wide ones it reads, and its own fields
    marked `measured`."""
    return {**{k: getattr(settings, k) for k in self.run_settings},
            **flag_values(settings.method_settings, measured_only=True, prefix=self.flag_prefix)}

  def plan(self, settings, context: "Context") -> Plan:
    """The run's plan: `settings` is the LocalizeSettings (its `method_settings` an instance of `settings_class`),
    `context` what the run provides."""
    raise NotImplementedError

  def bootstrap_plan(self, settings, context: "Context", ranking: Ranking) -> Plan:
    """The plan a bootstrap re-estimates with, given the run's `ranking`: the run's own plan."""
    del ranking
    return self.plan(settings, context)


class RelaxedObjective(Protocol):
  """Every task's differentiable score under soft keep-masks, the target first, then the general tasks."""

  num_docs: list[int]  # documents per task

  def __call__(self, keep: np.ndarray, docs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """keep: float [C, L, H] in [0, 1]; docs: one index array per task. Returns each task's retained probability
    on those documents (mean of exp(min(logprob - unablated logprob, 0))), float [T, C], and its gradient in
    the keep-mask, float [T, C, L, H]."""


@dataclasses.dataclass
class Context:
  """What a plan may ask of the run: the head layout, the excluded heads, the mask gradient, the relaxed
  objective, and a place to keep intermediate results (e.g. a screen's coefficients) so that a resumed run
  decides the same way.

  num_heads: the units per layer: query heads, or MLP neurons in a `--unit=neurons` run (the methods see one
  layout, [layers, units], whatever the unit).
  gradient: () -> float [N], the first-order score change of ablating each head (-d score / d keep).
  objective: the tasks' relaxed objective (`RelaxedObjective`), for methods that train a mask.
  attribution: (steps) -> float [docs, N], each target document's integrated-gradients attribution of every unit
    along `steps` points of the 0 -> activation path.
  directory: where `remember` keeps arrays across runs (None: in memory, for benchmarks and tests).
  """

  num_layers: int
  num_heads: int
  excluded: np.ndarray  # bool [N]
  gradient: Callable[[], np.ndarray] | None = None
  objective: RelaxedObjective | None = None
  directory: str | None = None
  attribution: Callable[[int], np.ndarray] | None = None
  _memory: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

  @property
  def num_total(self) -> int:
    return self.num_layers * self.num_heads

  def active_heads(self) -> np.ndarray:
    return np.flatnonzero(~self.excluded)

  def first_order_change(self) -> np.ndarray:
    if self.gradient is None:
      raise ValueError("this run provides no mask gradient")
    return np.asarray(self.remember("gradient", self.gradient), np.float64).reshape(-1)

  def document_attribution(self, steps: int) -> np.ndarray:
    """float [docs, N] (`attribution` with `steps` integration points), computed once per run directory (a resume
    with other steps is refused by the method's measurement settings)."""
    if self.attribution is None:
      raise ValueError("this run provides no attribution")
    attribution = self.attribution
    return np.asarray(self.remember("attribution", lambda: attribution(steps)), np.float64)

  def remember(self, name: str, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """compute() once per run directory (saved as <name>.npy), or once per Context in memory."""
    if name in self._memory:
      return self._memory[name]
    path = os.path.join(self.directory, f"{name}.npy") if self.directory else None
    value = files.read_array(path) if path else None
    if value is None:
      value = np.asarray(compute())
      if path:
        files.save_array(path, value)
    self._memory[name] = value
    return value


def rank_by(*keys: np.ndarray) -> np.ndarray:
  """Indices sorted by keys[0] ascending (most negative first), exact ties by keys[1], and so on."""
  return np.lexsort([np.asarray(k, np.float64) for k in reversed(keys)])


def marginal_effects(flat_masks: np.ndarray, scores: np.ndarray) -> np.ndarray:
  """[N] mean score of the masks that ablate each head minus the mean of those that keep it (0 when a head
  is always or never ablated): the design's one-variable view of each head."""
  X = np.asarray(flat_masks, np.float64)
  y = np.asarray(scores, np.float64)
  ablated = X.sum(axis=0)
  kept = len(X) - ablated
  with np.errstate(invalid="ignore", divide="ignore"):
    effect = (y @ X) / ablated - (y @ (1 - X)) / kept
  return np.where((ablated > 0) & (kept > 0), effect, 0.0)


def single_head_masks(heads, num_layers: int, num_heads: int) -> np.ndarray:
  """bool [len(heads), L, H]: mask i ablates heads[i] alone."""
  heads = np.asarray(heads, np.int64)
  design = np.zeros((len(heads), num_layers * num_heads), bool)
  design[np.arange(len(heads)), heads] = True
  return design.reshape(-1, num_layers, num_heads)


def check_prefix(measured: np.ndarray, planned: np.ndarray) -> None:
  """The saved masks must be the start of what the plan measures."""
  n = len(measured)
  if n > len(planned) or not np.array_equal(measured, planned[:n]):
    raise UserError("the saved measurements do not match the masks this method would measure "
                    "(the run's settings changed); choose another --output_dir to start over")


def remaining(measured: Measured, planned: np.ndarray) -> np.ndarray | None:
  """The planned masks not measured yet (None when all are), after checking the saved prefix."""
  check_prefix(measured.masks, planned)
  rest = planned[len(measured):]
  return rest if len(rest) else None


def single_head_ranking(measured: Measured, screen_order: np.ndarray) -> Ranking:
  """Rank single-head measurements: each mask ablates one head. Measured heads first, by their change
  (ties by the other metrics' changes, then screen order); then the unmeasured heads in `screen_order`
  (a ranking of all heads). Values: measured changes, 0 where not measured."""
  n = measured.masks.shape[1] * measured.masks.shape[2]
  heads = measured.flat().argmax(axis=1) if len(measured) else np.zeros((0,), np.int64)
  position = np.empty(n, np.int64)
  position[np.asarray(screen_order, np.int64)] = np.arange(n)
  changes = measured.changes()
  first = heads[rank_by(*changes, position[heads])] if len(heads) else heads
  seen = set(first.tolist())
  order = np.concatenate([first, [h for h in screen_order if int(h) not in seen]]).astype(np.int64)
  values = np.zeros(n)
  values[heads] = changes[0]
  known = np.zeros(n, bool)
  known[heads] = True
  return Ranking(order, values, {"value": "score change when ablated alone", "measured_heads": int(len(heads)),
                                 "unmeasured_value": "0 (not measured)"}, known)


def drive(plan: Plan, measured: Measured, measure: Callable[[np.ndarray], Any], *, chunk: int | None = None,
          limit: int | None = None) -> Measured:
  """Measures what `plan` asks for until it is done: `measure(masks)` scores masks [m, L, H] and adds them to
  `measured`, which the plan reads to decide what comes next (the runner's stores, saved after every batch; a
  benchmark's or a test's in-memory `Measured`). `chunk`: at most this many masks per `measure` call (a run scores
  every task on one chunk before the next); `limit`: stop once this many masks are measured (a run cut short)."""
  while (todo := plan.next_masks(measured)) is not None:
    if limit is not None:
      todo = todo[:max(limit - len(measured), 0)]
      if not len(todo):
        break
    step = chunk or len(todo)
    for start in range(0, len(todo), step):
      measure(todo[start:start + step])
  return measured


@dataclasses.dataclass
class FixedDesignPlan:
  """Measures a design fixed in advance, then ranks with `ranker(measured)`."""

  design: np.ndarray  # bool [M, L, H]
  ranker: Callable[[Measured], Ranking]
  exchangeable_rows: bool = False

  def next_masks(self, measured: Measured) -> np.ndarray | None:
    return remaining(measured, self.design)

  def expected_total(self) -> int:
    return len(self.design)

  def rank(self, measured: Measured) -> Ranking:
    return self.ranker(measured)

  def estimate(self, measured: Measured) -> Ranking:
    return self.ranker(measured)


def single_head_plan(heads, screen: np.ndarray, context: Context, facts: dict[str, Any] | None = None
                     ) -> FixedDesignPlan:
  """Ablates `heads` one at a time, in that order; ranks by the measured changes, the other heads in `screen` order
  (a ranking of every head; `single_head_ranking`), with `facts` added. Every head in flat order is the efficiency
  benchmark's ground truth."""
  masks = single_head_masks(heads, context.num_layers, context.num_heads)

  def rank(measured: Measured) -> Ranking:
    ranking = single_head_ranking(measured, screen)
    ranking.facts.update(facts or {})
    return ranking

  return FixedDesignPlan(masks, rank)


def confirmation_plan(screen: np.ndarray, count: int, context: Context, facts: dict[str, Any]) -> FixedDesignPlan:
  """Ablates the `count` best heads of `screen` (a ranking of every head) one at a time, excluded heads skipped;
  ranks by the measured changes, the other heads in screen order, with `facts` added."""
  return single_head_plan([h for h in screen if not context.excluded[h]][:count], screen, context, facts)
