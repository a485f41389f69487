"""Gradients of a metric of the last tokens' logits with respect to any site, in one forward and one backward pass
(`Model.gradients`).

The gradient with respect to a site is the gradient with respect to a zero added to it at every position (an `add`
edit, `sites.Edit`), so it flows through everything the site feeds, as a hook's gradient in TransformerLens does.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.api.forward import Batch
from jaxloc.api.interventions import site_shape
from jaxloc.errors import UserError
from jaxloc.models import sites as sites_lib
from jaxloc.models.decoder import Ablation, lm_logits
from jaxloc.models.loading import LoadedModel
from jaxloc.models.sites import Edit


def _metric_and_grads(module: Any, config: Any, params: Any, ids: jax.Array, last: jax.Array, ablation: Ablation,
                      probes: tuple[jax.Array, ...], *, sites: tuple[str, ...], metric: Callable[[Any], Any],
                      dtype: Any) -> tuple[jax.Array, tuple[jax.Array, ...]]:
  """metric(last-token logits [P, V]) of one row and its gradients in zero adds [1, L, P, S, U, Dv] at `sites`."""

  def value(adds: tuple[jax.Array, ...]) -> jax.Array:
    edits = ablation.edits + tuple(Edit(site, add=a) for site, a in zip(sites, adds))
    tokens = ids[None]
    positions = jnp.arange(ids.shape[1])[None, None]
    out = module.apply({"params": params}, tokens, positions, ablation=dataclasses.replace(ablation, edits=edits),
                       dtype=dtype)
    hidden = jnp.take_along_axis(out.hidden, last[None, :, None, None], axis=2)[:, :, 0]  # [1, P, D]
    return metric(lm_logits(config, params, hidden)[0])

  return jax.value_and_grad(value)(probes)


class Gradients:
  """The compiled metric-and-gradients pass of one model (a shape and a metric compile once)."""

  def __init__(self, model: LoadedModel):
    self.model = model
    self._fn = jax.jit(functools.partial(_metric_and_grads, model.module, model.config),
                       static_argnames=("sites", "metric", "dtype"))

  def run(self, batch: Batch, heads: np.ndarray | None, neurons: np.ndarray | None, metric: Callable[[Any], Any],
          sites: Sequence[str]) -> tuple[float, dict[str, np.ndarray]]:
    """(metric, {site: gradient [L, P, S, U, Dv] as the site's axes lay it: [L, P, S, H, Dh], [L, P, S, D], ...}) of
    one row (the unablated model, or one head/neuron keep-mask [L, H] / [L, F])."""
    c = self.model.config
    bad = [s for s in sites if s not in sites_lib.EDITABLE]
    if bad or not sites:
      raise UserError(f"gradients are taken at editable sites ({', '.join(sites_lib.EDITABLE)}), not {bad or 'none'}")
    dtype = self.model.dtype
    seq = batch.ids.shape[1]
    probes = tuple(jnp.zeros((1, c.num_layers, len(batch.lengths), seq) + site_shape(c, s), jnp.float32)
                   for s in sites)
    ablation = Ablation(None if heads is None else jnp.asarray(heads, dtype)[None],
                        None, None if neurons is None else jnp.asarray(neurons, dtype)[None])
    if heads is None and neurons is None:
      ablation = Ablation(head_mask=jnp.ones((1, c.num_layers, c.num_heads), dtype))
    try:
      hash(metric)
    except TypeError:
      raise UserError("the metric must be hashable (a function, or a frozen dataclass such as LogitDiff)") from None
    value, grads = self._fn(self.model.params, jnp.asarray(batch.ids), jnp.asarray(batch.last), ablation, probes,
                            sites=tuple(sites), metric=metric, dtype=dtype)
    out = {}
    for site, grad in zip(sites, grads):
      g = np.asarray(grad)[0, :, :, :batch.width]  # [L, P, S, U, Dv]
      units = sites_lib.SITES[site].units
      out[site] = g[..., 0, :] if units is None else (g[..., 0] if units == "neurons" else g)
    return float(value), out
