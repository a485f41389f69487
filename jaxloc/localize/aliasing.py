"""What a random design can tell apart: how often each head is ablated, which heads are aliased (their columns of
the design are identical or nearly collinear, so no regression on these measurements can say which of them
matters), and how well conditioned the design is for the Lasso.

Axes: `masks` M (rows), `heads` N (flattened `layers * units`, True = ablated); excluded heads are never ablated
and left out of every figure.

At the compressed-sensing paper's own settings (100 stratified masks at a 2% rate over 270 heads) each head is
ablated in one or two masks and dozens of heads share their column with another head: the Lasso then splits the
weight of a group evenly (jaxloc's FISTA) or hands it to one member (scikit-learn's coordinate descent), and only a
measurement of each head alone can break the tie.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

# Below this many ablations per head, a head's coefficient rests on a handful of masks.
MIN_ABLATIONS = 5
# Columns whose centered correlation is at least this are reported as nearly collinear.
COLLINEAR = 0.9
# Pairwise correlations are computed up to this many active heads (a [N, N] matrix).
MAX_PAIRWISE = 4096


@dataclasses.dataclass
class DesignDiagnostics:
  num_masks: int
  num_active: int
  ablations_min: int
  ablations_median: float
  ablations_max: int
  never_ablated: list[int]  # active heads no mask ablates
  identical_groups: list[list[int]]  # heads with identical columns (ablated at least once), 2+ per group
  collinear_pairs: list[tuple[int, int, float]]  # (head, head, correlation) >= COLLINEAR, not identical
  mutual_coherence: float | None  # largest |correlation| between two distinct active columns
  # Of the centered, column-normalized design: its rank (a stratified design ablates the same number of heads per
  # mask, so its centered columns sum to zero and the rank is at most N - 1; never more than M - 1) and its smallest
  # nonzero singular value (how weakly the worst-determined direction is measured).
  smallest_singular_value: float | None
  rank: int

  @property
  def aliased(self) -> list[list[int]]:
    """Groups that no regression can split: identical columns, and heads never ablated (all-zero columns)."""
    return self.identical_groups + ([self.never_ablated] if len(self.never_ablated) > 1 else [])

  def group_of(self, head: int) -> list[int]:
    """The identical group `head` belongs to ([head] when none)."""
    for group in self.identical_groups:
      if head in group:
        return group
    return [head]

  def warning(self, rate_flag: str = "--ablation_rate") -> str | None:
    """A one-line warning when the design cannot tell heads apart, naming what to change."""
    problems = []
    if self.ablations_min < MIN_ABLATIONS:
      problems.append(f"each head is ablated in {self.ablations_min}–{self.ablations_max} of {self.num_masks} masks "
                      f"(fewer than {MIN_ABLATIONS} for some)")
    if self.identical_groups:
      heads = sum(len(g) for g in self.identical_groups)
      problems.append(f"{len(self.identical_groups)} groups ({heads} heads) are always ablated together")
    if self.never_ablated:
      problems.append(f"{len(self.never_ablated)} heads are never ablated")
    if not problems:
      return None
    needed = int(np.ceil(MIN_ABLATIONS * self.num_masks / max(self.ablations_median, 1e-9)))
    return ("the design cannot tell every head apart: " + "; ".join(problems) + f". Raise --num_masks (about "
            f"{needed} at this rate gives each head {MIN_ABLATIONS} ablations) or {rate_flag}; aliased candidates are "
            "measured alone before they are selected")

  def facts(self, name: Callable[[int], str]) -> dict[str, Any]:
    """The diagnostics for heads.json, heads by name."""
    return {
        "num_masks": self.num_masks, "active": self.num_active,
        "ablations_per_head": {"min": self.ablations_min, "median": self.ablations_median,
                               "max": self.ablations_max},
        "never_ablated": [name(h) for h in self.never_ablated],
        "identical_groups": [[name(h) for h in group] for group in self.identical_groups],
        "collinear_pairs": [[name(a), name(b), round(c, 4)] for a, b, c in self.collinear_pairs],
        "mutual_coherence": self.mutual_coherence, "smallest_singular_value": self.smallest_singular_value,
        "rank": self.rank, "collinear_threshold": COLLINEAR, "min_ablations": MIN_ABLATIONS,
        "warning": self.warning(),
    }


def diagnose(ablated: np.ndarray, excluded: np.ndarray | None = None) -> DesignDiagnostics:
  """The diagnostics of a design: bool [M, N] (or [M, L, H]), True = ablated; `excluded` bool [N]."""
  X = np.asarray(ablated, bool).reshape(len(ablated), -1)
  num_masks, n = X.shape
  excluded = np.zeros(n, bool) if excluded is None else np.asarray(excluded, bool).reshape(-1)
  active = np.flatnonzero(~excluded)
  counts = X[:, active].sum(axis=0)
  never = active[counts == 0].tolist()
  seen = active[counts > 0]

  columns: dict[bytes, list[int]] = {}
  packed = np.packbits(X[:, seen], axis=0)
  for i, head in enumerate(seen):
    columns.setdefault(packed[:, i].tobytes(), []).append(int(head))
  identical = sorted((g for g in columns.values() if len(g) > 1), key=lambda g: g[0])

  coherence = singular = None
  collinear: list[tuple[int, int, float]] = []
  rank = 0
  varying = seen[counts[counts > 0] < num_masks]  # a head ablated in every mask has no variance either
  if len(varying) and num_masks > 1:
    Z = X[:, varying].astype(np.float64)
    Z -= Z.mean(axis=0)
    Z /= np.linalg.norm(Z, axis=0)
    values = np.linalg.svd(Z, compute_uv=False)
    rank = int((values > values[0] * 1e-10).sum())
    singular = float(values[rank - 1])
    if 1 < len(varying) <= MAX_PAIRWISE:
      corr = np.abs(Z.T @ Z)
      np.fill_diagonal(corr, 0.0)
      coherence = float(corr.max())
      same = {h: g[0] for g in identical for h in g}
      for i, j in zip(*np.nonzero(np.triu(corr >= COLLINEAR, k=1))):
        a, b = int(varying[i]), int(varying[j])
        if a not in same or same[a] != same.get(b):  # identical pairs are reported as groups
          collinear.append((a, b, float(corr[i, j])))
  return DesignDiagnostics(num_masks, len(active), int(counts.min()) if len(counts) else 0,
                           float(np.median(counts)) if len(counts) else 0.0, int(counts.max()) if len(counts) else 0,
                           never, identical, collinear, coherence, singular, rank)


def of_measurements(masks: np.ndarray, excluded: np.ndarray) -> DesignDiagnostics | None:
  """The diagnostics of a run's random design: the measured masks (bool [M, L, U]) that ablate two or more units (a
  method's single-unit measurements are no design); None when there are none."""
  masks = np.asarray(masks, bool)
  rows = masks.reshape(len(masks), int(np.prod(masks.shape[1:]))).sum(axis=1) > 1  # -1 cannot size zero masks
  return diagnose(masks[rows], excluded) if rows.any() else None
