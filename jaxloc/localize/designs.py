"""Measurement designs: which heads each model evaluation ablates.

Axes:
  masks:  one row per model evaluation (the paper's measurement matrix A has one row per mask).
  layers, heads: a query head is (layer, head); `heads_total = layers * heads`, flattened row-major
    so that flat index = layer * num_heads + head (the order of `[masks, layers, heads]`.reshape).

A design is bool `[masks, layers, heads]` or, flattened, `[masks, heads_total]`; True = ablated
(the paper's 1). The model's multiplicative head mask is the opposite (1 = keep), so the engine
receives `~design`.

Designs are built on the flattened head axis with a numpy Generator from a seed, so the same
arguments always give the same design. Excluded heads (e.g. universal heads whose ablation breaks
every task) are never ablated; ablation rates and balance are over the remaining heads only.

  bernoulli_design:   each active head ablated independently with probability `ablation_rate`.
  stratified_design:  every mask ablates exactly `round(ablation_rate * N)` heads and every active
                      head is ablated the same number of times +-1 over the design.
  single_head_design: one mask per active head, ablating that head alone (one-shot greedy).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxloc.errors import UserError
from jaxloc.units import parse_unit

DESIGN_KINDS = ("bernoulli", "stratified", "single_head")

SeedLike = int | np.random.Generator
ExcludeLike = Sequence[int] | Sequence[str] | Sequence[tuple[int, int]] | np.ndarray | None


# ------------------------------------------------------------------------------------------------
# Layout.


def unflatten_design(masks: np.ndarray, num_layers: int, num_heads: int) -> np.ndarray:
  """bool [masks, heads_total] -> bool [masks, layers, heads]."""
  masks = np.asarray(masks)
  if masks.ndim != 2 or masks.shape[1] != num_layers * num_heads:
    raise UserError(
        f"expected a design of shape [masks, {num_layers * num_heads}] for {num_layers} layers x "
        f"{num_heads} heads, got shape {masks.shape}")
  return masks.reshape(masks.shape[0], num_layers, num_heads)


def excluded_heads(exclude: ExcludeLike, num_heads_total: int,
                   num_heads: int | None = None, unit: str = "heads") -> np.ndarray:
  """Normalizes an exclusion spec to bool [heads_total] (True = never ablated); the units are heads, or with
  `unit="neurons"` MLP neurons (names like 'L3N117').

  `exclude` may be None, a bool array of shape [heads_total] or [layers, heads], flat int indices,
  (layer, head) pairs, or names like 'L15H13' (pairs and names need `num_heads`, the heads per
  layer).
  """
  out = np.zeros(num_heads_total, dtype=bool)
  if exclude is None:
    return out
  if isinstance(exclude, np.ndarray) and exclude.dtype == bool:
    if exclude.size != num_heads_total:
      raise UserError(
          f"exclusion mask has {exclude.size} entries, expected one per head ({num_heads_total})")
    return exclude.reshape(-1).copy()
  items = list(exclude)
  if num_heads is None:
    num_heads = num_heads_total
  num_layers = num_heads_total // num_heads
  for item in items:
    if isinstance(item, str):
      layer, head = parse_unit(item, num_layers, num_heads, unit)
      index = layer * num_heads + head
    elif isinstance(item, (tuple, list)) and len(item) == 2:
      layer, head = int(item[0]), int(item[1])
      if not (0 <= layer < num_layers and 0 <= head < num_heads):
        raise UserError(
            f"excluded head {tuple(item)} is out of range: layers 0..{num_layers - 1}, heads "
            f"0..{num_heads - 1}")
      index = layer * num_heads + head
    elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
      index = int(item)
      if not 0 <= index < num_heads_total:
        raise UserError(
            f"excluded head index {index} is out of range 0..{num_heads_total - 1}")
    else:
      raise UserError(
          f"cannot read excluded head {item!r}: give a flat index, a (layer, head) pair or a name "
          "like 'L15H13'")
    out[index] = True
  return out


# ------------------------------------------------------------------------------------------------
# Validation.


def _rng(seed: SeedLike) -> np.random.Generator:
  if isinstance(seed, np.random.Generator):
    return seed
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise UserError(f"seed must be a non-negative integer, got {seed!r}")
  return np.random.default_rng(int(seed))


def _check_count(name: str, value, minimum: int = 1) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise UserError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def _active_heads(num_heads_total: int, exclude: ExcludeLike,
                  num_heads: int | None) -> np.ndarray:
  num_heads_total = _check_count("number of heads", num_heads_total)
  excluded = excluded_heads(exclude, num_heads_total, num_heads)
  active = np.flatnonzero(~excluded)
  if active.size == 0:
    raise UserError(f"all {num_heads_total} heads are excluded; nothing is left to ablate")
  return active


def check_rate(ablation_rate, num_active: int) -> float:
  """The rate as a float; a UserError unless it is in (0, 1) and ablates at least one of `num_active` heads per mask
  on average (checked before the model loads too: `preflight.check_layout`)."""
  try:
    rate = float(ablation_rate)
  except (TypeError, ValueError):
    raise UserError(f"ablation_rate must be a number in (0, 1), got {ablation_rate!r}") from None
  if not 0.0 < rate < 1.0:
    raise UserError(f"ablation_rate must be in (0, 1), got {ablation_rate!r}")
  if rate * num_active < 1.0:
    raise UserError(
        f"ablation_rate={rate} ablates fewer than one head per mask on average among "
        f"{num_active} heads; use ablation_rate >= {1.0 / num_active:.4g}")
  return rate


# ------------------------------------------------------------------------------------------------
# Designs on the flattened head axis: bool [masks, heads_total].


def bernoulli_design(num_masks: int, num_heads_total: int, ablation_rate: float, seed: SeedLike,
                     exclude: ExcludeLike = None, *, num_heads: int | None = None) -> np.ndarray:
  """bool [masks, heads_total]: each active head ablated independently with prob. `ablation_rate`.

  Excluded heads are never ablated. A mask may ablate no head at all (probability
  (1 - rate)^N); it is kept, as a Bernoulli design would.
  """
  num_masks = _check_count("num_masks", num_masks)
  active = _active_heads(num_heads_total, exclude, num_heads)
  rate = check_rate(ablation_rate, active.size)
  rng = _rng(seed)
  design = np.zeros((num_masks, num_heads_total), dtype=bool)
  design[:, active] = rng.random((num_masks, active.size)) < rate
  return design


def stratified_design(num_masks: int, num_heads_total: int, ablation_rate: float, seed: SeedLike,
                      exclude: ExcludeLike = None, *, num_heads: int | None = None) -> np.ndarray:
  """bool [masks, heads_total]: each mask ablates exactly k = round(rate * N) of the N active heads,
  and each active head is ablated floor(M k / N) or ceil(M k / N) times.

  Construction: a stream of concatenated random permutations of the active heads is cut into
  consecutive chunks of k. Every permutation holds each head once, so counts over the stream differ
  by at most one. A chunk that straddles two permutations could hold a head twice; before using
  permutation p+1 its first positions are swapped with later positions so that none of them repeats
  a head from the tail of permutation p in the same chunk. Such a swap always exists because k < N,
  and it keeps p+1 a permutation, so both guarantees hold exactly (no rejection sampling).
  """
  num_masks = _check_count("num_masks", num_masks)
  active = _active_heads(num_heads_total, exclude, num_heads)
  n = active.size
  rate = check_rate(ablation_rate, n)
  k = int(round(rate * n))
  if k >= n:
    raise UserError(
        f"ablation_rate={rate} ablates all {n} active heads in every mask (round(rate * N) = {k}); "
        f"use ablation_rate < {(n - 0.5) / n:.4g}")
  rng = _rng(seed)
  total = num_masks * k
  stream = np.empty(total + n, dtype=np.int64)  # one spare permutation of room
  filled = 0
  while filled < total:
    perm = rng.permutation(n)
    offset = filled % k  # positions already taken in the chunk this permutation starts inside
    if offset:
      tail = set(stream[filled - offset:filled].tolist())
      head_len = k - offset
      # Positions of the straddling chunk that repeat a head from the tail.
      clashes = [i for i in range(head_len) if perm[i] in tail]
      if clashes:
        # Replacements from later in the permutation that are not in the tail.
        candidates = np.array([j for j in range(head_len, n) if perm[j] not in tail])
        chosen = rng.choice(candidates, size=len(clashes), replace=False)
        for i, j in zip(clashes, chosen):
          perm[i], perm[j] = perm[j], perm[i]
    stream[filled:filled + n] = perm
    filled += n
  chunks = stream[:total].reshape(num_masks, k)
  design = np.zeros((num_masks, num_heads_total), dtype=bool)
  rows = np.repeat(np.arange(num_masks), k)
  design[rows, active[chunks.reshape(-1)]] = True
  return design


def single_head_design(num_heads_total: int, exclude: ExcludeLike = None, *,
                       num_heads: int | None = None) -> np.ndarray:
  """bool [active heads, heads_total]: identity rows, one per non-excluded head (flat order)."""
  active = _active_heads(num_heads_total, exclude, num_heads)
  design = np.zeros((active.size, num_heads_total), dtype=bool)
  design[np.arange(active.size), active] = True
  return design


# ------------------------------------------------------------------------------------------------
# The layered face used by the engine and the CLI: bool [masks, layers, heads].


def make_design(kind: str, num_layers: int, num_heads: int, *, num_masks: int | None = None,
                ablation_rate: float | None = None, seed: SeedLike = 0,
                exclude: ExcludeLike = None) -> np.ndarray:
  """bool [masks, layers, heads] for `kind` in DESIGN_KINDS (True = ablated).

  `exclude`: heads never ablated, as names 'L15H13', (layer, head) pairs, flat indices or a bool
  [layers, heads] array. `num_masks` and `ablation_rate` are ignored for 'single_head'.
  """
  num_layers = _check_count("num_layers", num_layers)
  num_heads = _check_count("num_heads", num_heads)
  total = num_layers * num_heads
  if kind == "single_head":
    flat = single_head_design(total, exclude, num_heads=num_heads)
  elif kind in ("bernoulli", "stratified"):
    if num_masks is None or ablation_rate is None:
      raise UserError(f"the {kind!r} design needs num_masks and ablation_rate")
    build = bernoulli_design if kind == "bernoulli" else stratified_design
    flat = build(num_masks, total, ablation_rate, seed, exclude, num_heads=num_heads)
  else:
    raise UserError(f"unknown design {kind!r}; valid designs are {', '.join(DESIGN_KINDS)}")
  return unflatten_design(flat, num_layers, num_heads)
