"""Shapes and sizes: bucketing so a run compiles a handful of times, and batch sizes from a memory budget.

Axes: `masks` (head masks in one call, Mb), `requests` (requests in one call, Rb), `seq` (S),
`targets` (T, continuation tokens scored per request).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os

import jax

from jaxloc.errors import UserError
from jaxloc.models.config import ModelConfig

log = logging.getLogger(__name__)

GIB = 1024**3


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


def default_memory_budget() -> int:
  """Bytes the engine may use for activations in one call.

  Accelerators: 60% of what the first device reports free (the rest holds parameters, the XLA
  workspace and fragmentation). CPU: a quarter of physical memory, at most 8 GiB.
  """
  device = jax.local_devices()[0]
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    if limit:
      return accelerator_budget(limit, stats.get("bytes_in_use", 0))
    return 8 * GIB
  try:
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError):
    physical = 16 * GIB
  return int(min(8 * GIB, physical / 4))


def accelerator_budget(limit: int, in_use: int) -> int:
  """60% of what an accelerator has free once the parameters are placed."""
  return int(0.6 * (limit - in_use))


def default_tokens_per_batch() -> int:
  """Token rows per compiled call. Large enough to saturate the matmul units, small enough to stay in cache
  on CPUs; accelerators want far more rows."""
  return 2048 if jax.devices()[0].platform == "cpu" else 65536


def activation_bytes(config: ModelConfig, masks: int, requests: int, seq: int, context: int, targets: int,
                     dtype_bytes: int) -> int:
  """Peak bytes beyond the parameters of one scoring step (the prefix call, then the scoring call).

  Layers are scanned, so one layer is live at a time, in one of two phases whose buffers XLA reuses for each
  other, each with the scan's slice of that layer's weights: attention (per token row, part of the residual and
  q/k/v before and after rotation; three float32 copies of the attention scores) or the MLP (a residual and two
  intermediate-size rows; with many rows, 2.5 residuals and three intermediate rows outlast the weight slice).
  After the layers, the logits phase holds the float32 logits of the scored positions and the final hidden rows.
  The prefix keys/values (counted 1.5 times: the scan stacks them) stay live through both calls. The coefficients
  follow XLA's own buffer assignment (`compiled.memory_analysis()`), checked by `experiments.benchmark_memory`
  over the planned calls and corner shapes of six presets: never under it, at most ~25% over.
  """
  c = config
  kv_dims = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
  weights = (3 * c.hidden_size * c.intermediate_size + c.hidden_size * kv_dims
             + c.num_heads * c.head_dim * c.hidden_size) * dtype_bytes
  prefix_kv = 3 * c.num_layers * masks * context * c.num_kv_heads * c.head_dim * dtype_bytes  # 1.5 x (k and v)

  def layer(rows: int, score_elements: int) -> int:
    attention = weights + rows * (7 * c.hidden_size // 10 + 2 * kv_dims) * dtype_bytes + 3 * score_elements * 4
    mlp = max(weights + rows * (c.hidden_size + 2 * c.intermediate_size) * dtype_bytes,
              rows * (5 * c.hidden_size // 2 + 3 * c.intermediate_size) * dtype_bytes)
    return max(attention, mlp)

  rows = masks * requests * seq
  logits = masks * requests * targets * c.vocab_size * 4 + rows * c.hidden_size * dtype_bytes
  scoring = prefix_kv + max(layer(rows, rows * c.num_heads * (seq + context)), logits)
  prefix = prefix_kv + layer(masks * context, masks * c.num_heads * context * context) if context else 0
  return max(scoring, prefix)


@dataclasses.dataclass(frozen=True)
class ScoringBatches:
  """How a scoring job is cut into compiled calls."""

  masks_per_call: int
  requests_per_call: int
  estimated_bytes: int


def plan_scoring(config: ModelConfig, *, num_masks: int, num_requests: int, mean_seq: float, max_seq: int,
                 context: int, max_targets: int, dtype_bytes: int, tokens_per_batch: int, memory_budget: int,
                 data_parallel: int = 1) -> ScoringBatches:
  """Masks and requests per call: fill `tokens_per_batch` rows, then shrink until within the memory budget.

  Whole request sets go into one call when they fit (the shared prefix is then computed once per mask
  per call); the masks axis absorbs the remaining rows. Masks per call is a multiple of the data-parallel
  size when there are enough masks to shard over it.
  """
  mean_seq = max(mean_seq, 1.0)
  requests = min(num_requests, max(1, int(tokens_per_batch // mean_seq)))
  masks = max(1, int(tokens_per_batch // (requests * mean_seq)))
  # A small ladder of shapes: fewer masks than a full call round up to a power of two, so the baseline (1),
  # validation curves (k + 1) and single-head checks reuse a handful of compiled shapes whatever k is.
  masks = min(masks, bucket_pow2(num_masks))
  if num_masks >= data_parallel:
    masks = max(data_parallel, masks // data_parallel * data_parallel)
  targets = bucket_pow2(max_targets)

  def cost(m, r):
    return activation_bytes(config, m, r, max_seq, context, targets, dtype_bytes)

  while cost(masks, requests) > memory_budget:
    if masks > data_parallel and masks > 1:
      masks = max(data_parallel if num_masks >= data_parallel else 1, masks // 2)
    elif requests > 1:
      requests = max(1, requests // 2)
    else:
      raise UserError(f"one request of {max_seq} tokens (context {context}) needs "
                      f"{cost(masks, requests) / GIB:.2f} GiB, over the memory budget of "
                      f"{memory_budget / GIB:.2f} GiB; raise --memory_budget_gb or shorten the prompts")
  return ScoringBatches(masks, requests, cost(masks, requests))
