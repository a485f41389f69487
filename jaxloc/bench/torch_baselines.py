"""The PyTorch baselines of `benchmark_throughput`'s scoring figures, on the same requests and masks as jaxloc:

  bench_torch_reference  the paper's way: `transformers` reloaded for every mask, batch 1, full logits, heads zeroed
                         by a pre-hook on `o_proj` (`models.torch_reference.ablated_heads`);
  bench_torch_best       loaded once, batch 32, right padding, the LM head and log-softmax only at target positions.

Torch is imported inside each: jaxloc never needs it to run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from jaxloc.models.torch_reference import ablated_heads as hooked, load_hf_model


def ablated_heads(mask: np.ndarray) -> list[tuple[int, int]]:
  """The (layer, head) pairs a keep-mask [L, H] zeroes."""
  return [(int(l), int(h)) for l, h in zip(*np.nonzero(mask == 0))]


def _torch_tokens(tokenizer, requests):
  rows = []
  for r in requests:
    ctx = tokenizer(r.context)["input_ids"]
    cont = tokenizer(r.continuation, add_special_tokens=False)["input_ids"]
    rows.append((ctx, cont))
  return rows


def bench_torch_reference(model_spec: str, tokenizer, requests, masks: np.ndarray) -> dict[str, Any]:
  """The paper's way: reload per mask, batch 1, full logits."""
  import torch

  rows = _torch_tokens(tokenizer, requests)
  logprob = np.zeros((len(masks), len(rows)), np.float32)
  reload_seconds = []
  start = time.perf_counter()
  for m, mask in enumerate(masks):
    t0 = time.perf_counter()
    model = load_hf_model(model_spec)
    reload_seconds.append(time.perf_counter() - t0)
    with torch.no_grad(), hooked(model, ablated_heads(mask)):
      for i, (ctx, cont) in enumerate(rows):
        logits = model(torch.tensor([ctx + cont])).logits[0, len(ctx) - 1:-1].float()
        logprob[m, i] = float(torch.log_softmax(logits, -1)[torch.arange(len(cont)), torch.tensor(cont)].sum())
    del model
  seconds = time.perf_counter() - start
  return {"label": "torch reference (reload per mask, batch 1)", "masks": len(masks), "seconds": seconds,
          "seconds_per_mask": seconds / len(masks), "reload_seconds_per_mask": float(np.mean(reload_seconds)),
          "logprob": logprob}


def bench_torch_best(model, tokenizer, requests, masks: np.ndarray, batch_size: int = 32) -> dict[str, Any]:
  """Loaded once, batch 32, right padding, LM head and log-softmax only at target positions."""
  import torch

  rows = _torch_tokens(tokenizer, requests)
  pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
  logprob = np.zeros((len(masks), len(rows)), np.float32)
  start = time.perf_counter()
  for m, mask in enumerate(masks):
    with torch.no_grad(), hooked(model, ablated_heads(mask)):
      for begin in range(0, len(rows), batch_size):
        batch = rows[begin:begin + batch_size]
        width = max(len(c) + len(t) for c, t in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (ctx, cont) in enumerate(batch):
          ids[i, :len(ctx) + len(cont)] = torch.tensor(ctx + cont)
          attn[i, :len(ctx) + len(cont)] = 1
        hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state
        for i, (ctx, cont) in enumerate(batch):
          positions = torch.arange(len(ctx) - 1, len(ctx) + len(cont) - 1)
          logits = model.lm_head(hidden[i, positions]).float()
          logprob[m, begin + i] = float(
              torch.log_softmax(logits, -1)[torch.arange(len(cont)), torch.tensor(cont)].sum())
  seconds = time.perf_counter() - start
  return {"label": f"torch best effort (loaded once, batch {batch_size}, LM head at targets)",
          "masks": len(masks), "seconds": seconds, "seconds_per_mask": seconds / len(masks), "logprob": logprob}
