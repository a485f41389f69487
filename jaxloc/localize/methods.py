"""Which masks each localization method measures, and how it ranks heads from the measurements.

Axes: `masks` M, `layers` L, `heads` H; N = L * H heads flattened row-major (flat = layer * H + head).
Designs are bool (True = ablated); scores are the task metric under each mask (higher = better).

A method is a `MaskSource`: given what is measured so far it returns the next masks to measure
(None when done). `gradient_confirm` screens every head by the mask gradient (one backward pass,
computed by the runner) and measures only its top candidates, each ablated alone; it is the method
that reached greedy's top heads with the fewest evaluations in `experiments.benchmark_efficiency`
(docs/efficiency/). `two_stage` screens by compressed sensing (a stratified design and the Lasso) and
confirms the Lasso's top candidates the same way; it needs no gradient, so it also serves generation
tasks, and it beat plain compressed sensing at equal evaluations in that benchmark. Every method is
resumable the same way: re-run it on the saved measurements and it continues where they end.
Iterative greedy decides each round from the previous rounds' scores, so its masks are recomputed
from the saved scores, never stored separately.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, Sequence

import numpy as np

from jaxloc.errors import UserError
from jaxloc.localize import designs

METHODS = ("cs_stratified", "cs_bernoulli", "greedy", "one_shot_greedy", "gradient_confirm", "two_stage")


class MaskSource(Protocol):
  def next_masks(self, measured: np.ndarray, scores: np.ndarray, tie_breaks: Sequence[np.ndarray] = ()
                 ) -> np.ndarray | None:
    """The masks to measure next, or None when done. `scores` [M] are the metric under the `measured`
    masks; `tie_breaks` ([M] each, e.g. log-probability) break its exact ties, in order."""
    ...

  def expected_total(self) -> int: ...


def _check_prefix(measured: np.ndarray, planned: np.ndarray) -> None:
  n = len(measured)
  if n > len(planned) or not np.array_equal(measured, planned[:n]):
    raise UserError("the saved measurements do not match the masks this method would measure "
                    "(the run's settings changed); choose another --output_dir to start over")


@dataclasses.dataclass
class FixedDesign:
  """Measures a precomputed design (compressed sensing, one-shot greedy)."""

  design: np.ndarray  # bool [M, L, H]

  def next_masks(self, measured, scores, tie_breaks=()):
    del scores, tie_breaks
    _check_prefix(measured, self.design)
    rest = self.design[len(measured):]
    return rest if len(rest) else None

  def expected_total(self) -> int:
    return len(self.design)


def lexicographic_ranking(primary: np.ndarray, *tie_breaks: np.ndarray) -> np.ndarray:
  """Indices sorted by `primary` ascending (most negative score change first), ties by the next keys.

  0/1 accuracy over ~100 documents ties often (several heads each cost 0.17); the summed log-probability
  almost never does, so it is the natural tie-break of an accuracy ranking.
  """
  keys = [np.asarray(k, np.float64) for k in reversed(tie_breaks)] + [np.asarray(primary, np.float64)]
  return np.lexsort(keys)


def confirm_ranking(candidates: Sequence[int], changes: Sequence[np.ndarray], fallback: Sequence[int]) -> np.ndarray:
  """Confirmed heads ranked by their measured changes (`changes[0]` [C], ties by the rest), then every
  other head in `fallback` order (a ranking of all heads)."""
  candidates = np.asarray(candidates, np.int64)
  first = candidates[lexicographic_ranking(*changes)] if len(candidates) else candidates
  chosen = set(first.tolist())
  return np.concatenate([first, [int(h) for h in fallback if int(h) not in chosen]]).astype(np.int64)


def single_head_masks(heads: Sequence[int], num_layers: int, num_heads: int) -> np.ndarray:
  """bool [len(heads), L, H]: mask i ablates heads[i] alone."""
  design = np.zeros((len(heads), num_layers * num_heads), bool)
  design[np.arange(len(heads)), np.asarray(heads, np.int64)] = True
  return design.reshape(-1, num_layers, num_heads)


@dataclasses.dataclass
class GradientConfirm(FixedDesign):
  """Single-head masks of the `candidates`: the heads whose first-order ablation effect (the mask
  gradient) is most negative, most negative first."""

  candidates: np.ndarray = None  # int [C]
  gradient_change: np.ndarray = None  # float [N]: -d score / d keep, the first-order change of ablating


def gradient_confirm_source(gradient_change: np.ndarray, num_layers: int, num_heads: int, num_confirm: int,
                            excluded: np.ndarray) -> GradientConfirm:
  """Confirms the `num_confirm` heads (excluded heads never) with the most negative first-order change."""
  gradient_change = np.asarray(gradient_change, np.float64).reshape(-1)
  order = [int(h) for h in lexicographic_ranking(gradient_change) if not excluded[h]]
  candidates = np.asarray(order[:num_confirm], np.int64)
  return GradientConfirm(single_head_masks(candidates, num_layers, num_heads), candidates, gradient_change)


@dataclasses.dataclass
class TwoStage:
  """Screen: a stratified design of `screen` masks, ranked by `rank_screen(masks, scores)` -> (ranking [N],
  solver facts), the runner's Lasso. Confirm: the `num_confirm` best-ranked heads that are not excluded,
  each ablated alone."""

  screen: np.ndarray  # bool [S, L, H]
  num_confirm: int
  excluded: np.ndarray  # bool [N]
  rank_screen: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, dict]]
  screen_ranking: np.ndarray | None = None  # int [N], set once the screen is measured
  candidates: np.ndarray | None = None  # int [C]
  screen_facts: dict = dataclasses.field(default_factory=dict)  # the screen solve's facts

  def _confirm_masks(self, measured: np.ndarray, scores: np.ndarray) -> np.ndarray:
    if self.candidates is None:
      screen = len(self.screen)
      ranking, self.screen_facts = self.rank_screen(measured[:screen], scores[:screen])
      self.screen_ranking = np.asarray(ranking, np.int64)
      self.candidates = np.asarray([h for h in self.screen_ranking if not self.excluded[h]][:self.num_confirm],
                                   np.int64)
    _, num_layers, num_heads = self.screen.shape
    return single_head_masks(self.candidates, num_layers, num_heads)

  def next_masks(self, measured, scores, tie_breaks=()):
    del tie_breaks  # the screen's Lasso fits the metric itself
    screen = len(self.screen)
    if len(measured) < screen:
      _check_prefix(measured, self.screen)
      return self.screen[len(measured):]
    _check_prefix(measured[:screen], self.screen)
    confirm = self._confirm_masks(measured, scores)
    _check_prefix(measured[screen:], confirm)
    rest = confirm[len(measured) - screen:]
    return rest if len(rest) else None

  def expected_total(self) -> int:
    return len(self.screen) + self.num_confirm


def screen_size(num_masks: int, screen_fraction: float) -> int:
  """Masks of two_stage's screen out of a budget of num_masks (the rest confirm single heads)."""
  return min(max(2, int(round(screen_fraction * num_masks))), num_masks - 1)


@dataclasses.dataclass
class IterativeGreedy:
  """k rounds; round r ablates each remaining head on top of the r heads chosen so far and keeps
  the one whose ablation scores lowest."""

  num_layers: int
  num_heads: int
  rounds: int
  excluded: np.ndarray  # bool [N]

  def _round_masks(self, chosen: list[int]) -> tuple[np.ndarray, np.ndarray]:
    n = self.num_layers * self.num_heads
    candidates = np.array([h for h in range(n) if not self.excluded[h] and h not in chosen], np.int64)
    masks = np.zeros((len(candidates), n), bool)
    masks[:, chosen] = True
    masks[np.arange(len(candidates)), candidates] = True
    return masks.reshape(-1, self.num_layers, self.num_heads), candidates

  def replay(self, measured: np.ndarray, scores: np.ndarray, tie_breaks: Sequence[np.ndarray] = ()):
    """(chosen heads, per-round (candidates, scores), masks still to measure or None). A round keeps the
    head with the lowest score; exact ties (frequent once 0/1 accuracy reaches its floor) go to the lowest
    `tie_breaks` value, in order."""
    chosen: list[int] = []
    rounds = []
    offset = 0
    for _ in range(self.rounds):
      masks, candidates = self._round_masks(chosen)
      if len(candidates) == 0:
        break
      have = len(measured) - offset
      if have < len(masks):
        _check_prefix(measured[offset:], masks)
        return chosen, rounds, masks[max(have, 0):]
      _check_prefix(measured[offset:offset + len(masks)], masks)
      where = slice(offset, offset + len(masks))
      round_scores = scores[where]
      chosen.append(int(candidates[lexicographic_ranking(round_scores, *(t[where] for t in tie_breaks))[0]]))
      rounds.append((candidates, round_scores))
      offset += len(masks)
    return chosen, rounds, None

  def next_masks(self, measured, scores, tie_breaks=()):
    return self.replay(measured, scores, tie_breaks)[2]

  def expected_total(self) -> int:
    active = int((~self.excluded).sum())
    return sum(max(active - r, 0) for r in range(self.rounds))


def make_source(method: str, num_layers: int, num_heads: int, *, num_masks: int, ablation_rate: float, seed: int,
                exclude: list[str], rounds: int, gradient_change: np.ndarray | None = None,
                screen_fraction: float = 0.5,
                rank_screen: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, dict]] | None = None
                ) -> MaskSource:
  if method not in METHODS:
    raise UserError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")
  if method == "two_stage":
    if rank_screen is None:
      raise ValueError("two_stage needs the screen's ranking function (the runner's Lasso)")
    if num_masks < 3:
      raise UserError(f"--num_masks={num_masks} must be ≥ 3 for two_stage (a screen of ≥ 2 masks and ≥ 1 "
                      "confirmation)")
    screen = designs.make_design("stratified", num_layers, num_heads, num_masks=screen_size(num_masks, screen_fraction),
                                 ablation_rate=ablation_rate, seed=seed, exclude=exclude)
    excluded = designs.excluded_heads(exclude, num_layers * num_heads, num_heads=num_heads)
    return TwoStage(screen, num_masks - len(screen), excluded, rank_screen)
  if method == "gradient_confirm":
    if gradient_change is None:
      raise ValueError("gradient_confirm needs the mask gradient (the runner computes it)")
    excluded = designs.excluded_heads(exclude, num_layers * num_heads, num_heads=num_heads)
    return gradient_confirm_source(gradient_change, num_layers, num_heads, num_masks, excluded)
  if method.startswith("cs_"):
    kind = "stratified" if method == "cs_stratified" else "bernoulli"
    return FixedDesign(designs.make_design(kind, num_layers, num_heads, num_masks=num_masks,
                                           ablation_rate=ablation_rate, seed=seed, exclude=exclude))
  if method == "one_shot_greedy":
    return FixedDesign(designs.make_design("single_head", num_layers, num_heads, exclude=exclude))
  excluded = np.zeros(num_layers * num_heads, bool)
  if exclude:
    excluded[designs.excluded_heads(exclude, num_layers * num_heads, num_heads=num_heads)] = True
  if rounds < 1:
    raise UserError(f"iterative greedy needs --top_k ≥ 1 rounds, got {rounds}")
  return IterativeGreedy(num_layers, num_heads, rounds, excluded)


def greedy_result(source: MaskSource, method: str, measured: np.ndarray, scores: np.ndarray,
                  baseline: float, tie_breaks: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray]:
  """(ranking [N] flat head indices, most important first; per-head score change [N]) for greedy methods.

  One-shot: the change is score(head alone ablated) - baseline, ranked most negative first; exact ties
  are broken by `tie_breaks` (the same masks' changes in other metrics, e.g. log-probability).
  gradient_confirm: the confirmed heads ranked the same way, then the others in gradient order (their
  change is reported as 0: not measured). two_stage: the same for its confirmed heads (the masks after
  the screen), the others in the screen's Lasso order.
  Iterative: chosen heads first in the order chosen, each with its marginal change when chosen; the
  others follow, ranked by their marginal change in the last round.
  """
  n = measured.shape[1] * measured.shape[2]
  flat = measured.reshape(len(measured), n)
  change = np.zeros(n)
  if method == "one_shot_greedy":
    heads = flat.argmax(axis=1)
    change[heads] = scores - baseline
    spread = []
    for values in tie_breaks:
      spread.append(np.zeros(n))
      spread[-1][heads] = values
    # Unmeasured (excluded) heads keep change 0 and sort among the zeros.
    return lexicographic_ranking(change, *spread), change
  if method == "gradient_confirm":
    heads = flat.argmax(axis=1)
    change[heads] = scores - baseline
    ranking = confirm_ranking(heads, [scores - baseline, *tie_breaks], lexicographic_ranking(source.gradient_change))
    return ranking, change
  if method == "two_stage":
    screen = len(source.screen)
    source.next_masks(measured, scores)  # sets the screen's ranking and the candidates
    heads = flat[screen:].argmax(axis=1)
    change[heads] = scores[screen:] - baseline
    ranking = confirm_ranking(heads, [scores[screen:] - baseline, *(t[screen:] for t in tie_breaks)],
                              source.screen_ranking)
    return ranking, change
  chosen, rounds, _ = source.replay(measured, scores, tie_breaks)
  level = baseline
  for round_index, (candidates, round_scores) in enumerate(rounds):
    marginal = round_scores - level
    for head, value in zip(candidates, marginal):
      if head not in chosen[:round_index]:
        change[head] = value
    level = float(np.min(round_scores))
  rest = [h for h in np.argsort(change, kind="stable") if h not in chosen]
  return np.array(chosen + rest, np.int64), change
