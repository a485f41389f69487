"""Shapes: sizes round up to a short ladder, so that a run compiles a handful of times (the memory side of cutting
work into calls is `planner.py`)."""

from __future__ import annotations

import math


def bucket(n: int, minimum: int = 8) -> int:
  """Rounds n up to a size from a short ladder: multiples of 8 to 64, then 4 steps per doubling.

  Any run then compiles at most ~4 shapes per doubling of sequence length.
  """
  n = max(n, 1)
  if n <= minimum:
    return minimum
  if n <= 64:
    return -(-n // 8) * 8
  step = 2 ** (int(math.log2(n - 1)) - 2)
  return -(-n // step) * step


def bucket_pow2(n: int) -> int:
  return 1 << max(0, (max(n, 1) - 1).bit_length())
