"""Shapes: sizes round up to short ladders, so that a run compiles a handful of times (which compiled shape a request
set takes is `layouts.py`; the memory side of cutting work into calls is `planner.py`)."""

from __future__ import annotations

import math


def _steps_per_doubling(n: int, steps: int) -> int:
  """n rounded up to one of `steps` evenly spaced sizes between the powers of two around it."""
  step = max(1, 2 ** (int(math.log2(n - 1)) - int(math.log2(steps))))
  return -(-n // step) * step


def bucket(n: int, minimum: int = 8) -> int:
  """Rounds n up to a size from a short ladder: multiples of 8 to 64, then 4 steps per doubling.

  Any run then compiles at most ~4 shapes per doubling of sequence length.
  """
  n = max(n, 1)
  if n <= minimum:
    return minimum
  if n <= 64:
    return -(-n // 8) * 8
  return _steps_per_doubling(n, 4)


def bucket_count(n: int) -> int:
  """Rounds a count of rows up to a short ladder: exact to 8, then 4 steps per doubling (10, 12, 14, 16, 20, ...):
  at most 25% padding, and request sets of nearly the same size (a task's identification and held-out documents)
  land on the same size."""
  n = max(n, 1)
  return n if n <= 8 else _steps_per_doubling(n, 4)


def bucket_coarse(n: int) -> int:
  """Rounds a prompt width up to a coarser ladder than `bucket`: multiples of 16 to 64, then 2 steps per doubling
  (96, 128, 192, 256, ...). Generation compiles one loop per width, and prompts of one task spread over many of
  `bucket`'s sizes."""
  n = max(n, 1)
  if n <= 64:
    return max(16, -(-n // 16) * 16)
  return _steps_per_doubling(n, 2)


def bucket_pow2(n: int) -> int:
  return 1 << max(0, (max(n, 1) - 1).bit_length())


def floor_pow2(n: int) -> int:
  """The largest power of two at most n (1 for n < 2)."""
  return 1 << max(0, max(n, 1).bit_length() - 1)
