"""Readouts of a cache through the model's own unembedding (`Model.logit_lens`, `Model.direct_logit_attribution`).

Logit lens: a residual stream (any layer's `resid_pre`/`resid_mid`/`resid_post`) through the final norm and the
unembedding, as if the model stopped there. Direct logit attribution: each component's share of a token's logit,
the component (`embed`, each head's `head_out`, each layer's `attn_out` and `mlp_out`) times the final norm's scale
at that position, frozen at the value the full residual stream gives it (TransformerLens' `apply_ln_to_stack`), times
the token's unembedding column. The components' shares add up to the logit: the residual stream leaving the last
layer is their sum. Axes: rows M, `layers` L, `prompts` P, `tokens` S, `heads` H, `embed` D, `vocab` V, targets T.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc import checks
from jaxloc.api.cache import Cache
from jaxloc.errors import UserError
from jaxloc.models.decoder import lm_logits
from jaxloc.models.layers import norm
from jaxloc.models.loading import LoadedModel


@functools.partial(jax.jit, static_argnums=(0,))
def _lens(config: Any, params: Any, stream: jax.Array) -> jax.Array:
  normed: jax.Array = norm(config, jnp.float32).apply({"params": params["final_norm"]}, stream)  # type: ignore[assignment]
  return lm_logits(config, params, normed)


def logit_lens(model: LoadedModel, cache: Cache, site: str = "resid_post", columns: Sequence[int] | None = None
               ) -> np.ndarray:
  """Logits [M, L, P, S, V] (or [..., T] for `columns`) of `site`'s residual stream at every layer the cache holds,
  through the final norm and unembedding; NaN past a shorter prompt's end. `resid_post` of the last layer gives
  the model's own logits."""
  if site not in ("resid_pre", "resid_mid", "resid_post"):
    raise UserError(f"the logit lens reads a residual stream (resid_pre, resid_mid, resid_post), not {site!r}")
  if columns is not None:
    columns = checks.check_columns(columns, model.config.vocab_size)
  stream = np.nan_to_num(cache[site])  # [M, L, P, S, D]
  logits = np.asarray(_lens(model.config, model.params, jnp.asarray(stream, jnp.float32)))
  if columns is not None:
    logits = logits[..., list(columns)]
  return np.where(np.isnan(cache[site][..., :1]), np.nan, logits)


def frozen_scale(model: LoadedModel, final_stream: np.ndarray) -> np.ndarray:
  """The final norm's factor [..., 1] at each position of the residual stream leaving the last layer
  (1 / rms(x)), the linear map direct logit attribution freezes."""
  x = final_stream.astype(np.float64)
  return 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + model.config.rms_norm_eps)


def direct_logit_attribution(model: LoadedModel, cache: Cache, tokens: Sequence[int], position: int = -1
                             ) -> dict[str, np.ndarray]:
  """Each component's share of the logit of `tokens` (one per prompt) at each prompt's `position` (negative: from its
  end) under the cache's rows: {"embed": [M, P], "heads": [M, L, P, H], "attn": [M, L, P], "mlp": [M, L, P],
  "total": [M, P] (their sum: embed + attn + mlp), "logit": [M, P] (the model's logit, for comparison)}.

  The cache must hold embed, head_out, attn_out, mlp_out and resid_post (`names=["embed", "head_out", "attn_out",
  "mlp_out", "resid_post"]`). Per-head shares need a family whose attention output enters the residual unnormed
  (not Gemma's post-norms); soft-capped final logits (Gemma 2) have no additive shares."""
  c = model.config
  if c.final_softcap is not None:
    raise UserError("direct logit attribution needs logits linear in the residual stream; this family soft-caps them")
  missing = [s for s in ("embed", "attn_out", "mlp_out", "resid_post") if s not in cache]
  if missing:
    raise UserError(f"direct logit attribution reads {', '.join(missing)} too: run_with_cache(..., names=[...])")
  tokens = checks.token_id_list(tokens, c.vocab_size, "tokens")
  every = tuple(range(c.num_layers))
  partial = [s for s in ("attn_out", "mlp_out", "head_out") if s in cache and cache.layers[s] != every]
  if partial:
    raise UserError(f"direct logit attribution adds up every layer: the cache holds {', '.join(partial)} at some "
                    f"layers only")
  if len(tokens) != len(cache.lengths):
    raise UserError(f"one token per prompt: {len(tokens)} tokens for {len(cache.lengths)} prompts")
  index = [int(position) + int(n) if position < 0 else int(position) for n in cache.lengths]
  for p, (i, n) in enumerate(zip(index, cache.lengths)):
    if not 0 <= i < n:
      raise UserError(f"position {position} is outside prompt {p}, which has {n} tokens")
  prompts = np.arange(len(tokens))

  def at(value: np.ndarray, prompt_axis: int) -> np.ndarray:  # [..., P, S, ...] -> [..., P, ...] at each position
    moved = np.moveaxis(value, (prompt_axis, prompt_axis + 1), (0, 1))
    return np.moveaxis(moved[prompts, index], 0, prompt_axis)

  final = at(cache["resid_post"][:, -1], 1)  # [M, P, D]
  if cache.layers["resid_post"][-1] != c.num_layers - 1:
    raise UserError("direct logit attribution reads the last layer's resid_post")
  scale = frozen_scale(model, final)  # [M, P, 1]
  weight = np.asarray(model.params["final_norm"]["scale"], np.float64)
  if c.norm_unit_offset:
    weight = 1.0 + weight
  unembed = np.asarray(model.params["embed"]["embedding"] if c.tie_word_embeddings else model.params["lm_head"].T,
                       np.float64)[tokens]  # [P, D]
  direction = scale * weight * unembed  # [M, P, D]
  out = {"embed": (at(cache["embed"], 1) * direction).sum(-1)}
  attn = at(cache["attn_out"], 2)  # [M, L, P, D]
  mlp = at(cache["mlp_out"], 2)
  out["attn"] = (attn * direction[:, None]).sum(-1)
  out["mlp"] = (mlp * direction[:, None]).sum(-1)
  if "head_out" in cache:
    if c.post_norm:
      raise UserError("per-head shares need attention outputs that enter the residual unnormed; this family "
                      "normalizes them after attention (Gemma)")
    heads = at(cache["head_out"], 2)  # [M, L, P, H, D]
    out["heads"] = (heads * direction[:, None, :, None]).sum(-1)
  out["total"] = out["embed"] + out["attn"].sum(1) + out["mlp"].sum(1)
  logits = at(cache["logits"], 1) if "logits" in cache else None
  if logits is not None:
    out["logit"] = logits[:, prompts, tokens]
  return {k: v.astype(np.float32) for k, v in out.items()}
