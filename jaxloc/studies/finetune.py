"""CNL's enhancement experiment: fine-tune only the parameters of chosen MLP neurons on a task, then measure the task
(and the general tasks) on held-out documents; the same number of random neurons is the control.

A neuron (layer l, index j) owns column j of `gate_proj` and `up_proj` ([D] each, plus their bias entries when the
model has MLP biases) and row j of `down_proj` ([D]): 3 × hidden parameters. Training is Adam (optax) on the
target's teacher-forced log-probability of its scored requests (`Evaluator.scored_requests`), full batch; every
other parameter gets a zero gradient, which Adam turns into an exact zero update.

Axes: `layers` L, `embed` D, `mlp` F (neurons per layer).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from jaxloc.engine import attribution, mesh as mesh_lib
from jaxloc.errors import UserError
from jaxloc.models.decoder import Ablation

_COLUMN = {"gate_kernel": 2, "up_kernel": 2, "down_kernel": 1, "gate_bias": 1, "up_bias": 1}  # the axis a neuron indexes


def neuron_parameter_mask(params, neurons: Sequence[tuple[int, int]]):
  """A params-shaped pytree of float32 0/1: 1 on the parameters the neurons own (module docstring), 0 elsewhere."""
  if not neurons:
    raise UserError("no neurons to fine-tune")
  layers = np.array([layer for layer, _ in neurons])
  index = np.array([j for _, j in neurons])
  mlp = {}
  for name, leaf in params["layers"]["mlp"].items():
    mask = np.zeros(leaf.shape, np.float32)
    axis = _COLUMN[name]
    if axis == 2:
      mask[layers, :, index] = 1
    else:
      mask[layers, index] = 1
    mlp[name] = jnp.asarray(mask)
  zeros = jax.tree_util.tree_map(lambda leaf: jnp.zeros(leaf.shape, jnp.float32), params)
  zeros["layers"]["mlp"] = mlp
  return zeros


@dataclasses.dataclass
class Training:
  params: Any
  losses: list[float]  # negative mean log-probability before each step, then after the last
  seconds: float
  trained_parameters: int


def _loss(module, config, params, ablation, prefix, rows, weights, dtype):
  value = attribution.mask_objective(module, config, params, ablation, prefix, rows, weights,
                                     jnp.zeros_like(weights), dtype)
  return -value.sum()


def finetune(engine, requests, neurons: Sequence[tuple[int, int]], *, steps: int, learning_rate: float,
             progress: bool = False) -> Training:
  """Adam on the neurons' parameters for `steps` full-batch steps of the requests' mean negative log-probability."""
  if steps < 1 or learning_rate <= 0:
    raise UserError(f"fine-tuning needs steps ≥ 1 and a positive learning rate, got {steps} and {learning_rate}")
  c = engine.model_config
  lay, _ = engine.prepare(requests)
  replicated = mesh_lib.replicated(engine.mesh)
  prefix = mesh_lib.put(lay.prefix, replicated) if len(lay.prefix) else None
  ablation = Ablation(head_mask=mesh_lib.put(np.ones((1, c.num_layers, c.num_heads), engine.dtype), replicated))
  chunks = []
  for chunk in lay.chunks:
    weights = np.where(chunk.index >= 0, 1.0 / len(requests), 0.0).astype(np.float32)
    chunks.append([jax.tree_util.tree_map(lambda a: mesh_lib.put(a, replicated), chunk.rows),
                   mesh_lib.put(weights, replicated)])
  mask = neuron_parameter_mask(engine.params, neurons)
  grad_fn = jax.jit(jax.value_and_grad(functools.partial(_loss, engine.model.module, c, dtype=engine.dtype)))
  optimizer = optax.adam(learning_rate)

  @jax.jit
  def update(params, state, grads):
    grads = jax.tree_util.tree_map(lambda g, m: g * m.astype(g.dtype), grads, mask)
    updates, state = optimizer.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  def loss_and_grads(params):
    total, grads = 0.0, None
    for arrays in chunks:
      value, g = grad_fn(params, ablation, prefix, *arrays)
      total += float(value)
      grads = g if grads is None else jax.tree_util.tree_map(jnp.add, grads, g)
    return total, grads

  params = engine.params
  state = optimizer.init(params)
  losses = []
  start = time.perf_counter()
  for _ in tqdm(range(steps), desc="fine-tuning", unit="step", disable=not progress):
    loss, grads = loss_and_grads(params)
    losses.append(loss)
    params, state = update(params, state, grads)
  losses.append(loss_and_grads(params)[0])
  trained = int(sum(float(m.sum()) for m in jax.tree_util.tree_leaves(mask)))
  return Training(params, losses, time.perf_counter() - start, trained)
