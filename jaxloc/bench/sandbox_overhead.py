"""What the code sandbox costs per program, by isolation mode, measured in one run.

Each mode runs the same `count` trivial programs through `sandbox.run_programs` with the default worker
count: the per-program seconds the harness reports (start, isolation setup, run, teardown) and the wall
time of the whole batch. Modes this machine cannot run are reported as unavailable.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from jaxloc import sandbox


def measure(modes: Sequence[str], count: int = 200, warmup: int = 8) -> list[dict[str, Any]]:
  rows = []
  sources = [f"assert {i} + 1 == {i + 1}" for i in range(count)]  # distinct: run_programs dedups sources
  for mode in modes:
    probe = sandbox.run_program("print('ok')", mode=mode)
    if not probe.passed:
      rows.append({"mode": mode, "available": False, "reason": probe.stderr.strip()[-200:]})
      continue
    sandbox.run_programs([f"x = {i}" for i in range(warmup)], mode=mode)
    start = time.perf_counter()
    results = sandbox.run_programs(sources, mode=mode)
    wall = time.perf_counter() - start
    seconds = np.array([r.seconds for r in results])
    rows.append({"mode": mode, "available": True, "programs": count, "passed": int(sum(r.passed for r in results)),
                 "workers": min(sandbox.default_workers(), count), "median_ms": float(np.median(seconds) * 1e3),
                 "p90_ms": float(np.percentile(seconds, 90) * 1e3), "wall_s": wall,
                 "programs_per_s": count / wall})
  return rows


def format_table(rows: list[dict[str, Any]]) -> str:
  counts = sorted({r["programs"] for r in rows if r["available"]})
  wall = f"wall s ({counts[0]} programs)" if len(counts) == 1 else "wall s"
  lines = [f"| mode | median ms / program | p90 ms | {wall} | programs / s |", "|---|---|---|---|---|"]
  for r in rows:
    if not r["available"]:
      lines.append(f"| {r['mode']} | unavailable: {r['reason']} | | | |")
    else:
      lines.append(f"| {r['mode']} | {r['median_ms']:.1f} | {r['p90_ms']:.1f} | {r['wall_s']:.2f} | "
                   f"{r['programs_per_s']:.1f} |")
  return "\n".join(lines)
