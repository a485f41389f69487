"""`learned_mask`: search for the heads whose ablation breaks the target task and spares the general tasks by
optimizing a relaxed mask (hard-concrete gates with an L0 penalty: Louizos et al. 2018, as Voita et al. 2019
pruned heads), then confirm the learned candidates by real ablation.

Each configuration c (a restart × an L0 strength from --mask_l0, all trained together along the masks axis)
has a gate per head with logit log_alpha[c, n]. A training step samples every gate,

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log_alpha) / BETA),  a = clip(s (ZETA - GAMMA) + GAMMA, 0, 1),

ablates each head by its gate (keep = 1 - a; a is exactly 0 or 1 with positive probability), and takes an Adam
step (cosine-decayed learning rate) on

    loss_c = T_c + w * mean_g (1 - G_{g,c}) + l0_c * sum_n P(a_{c,n} > 0),

where T and G_g are the target's and general task g's *retained probability* on a minibatch of documents: the
mean over documents of exp(min(logprob - unablated logprob, 0)), in [0, 1] (`Evaluator.retained_probability`),
w = --mask_general_weight and P(a > 0) = sigmoid(log_alpha - BETA log(-GAMMA / ZETA)) the expected L0.
The gradient passes straight through the gates' clip (`sample_ablation`).
Documents and gate noise are fixed by (--seed, step), so a run killed mid-training resumes from its checkpoint
(`learned_mask_state.npz`, every CHECKPOINT_EVERY steps) to the same gates.

Screen: heads ordered by their ablation probability averaged over configurations (a head every restart and
strength ablates comes first), ties by the mean log_alpha. Confirmation and ranking as for the gradient's screen:
the --num_masks best screened heads are ablated one at a time; ranked by the measured change (base's rule), the
others follow in screen order (`base.confirmation_plan`, shared with it). Cost: the training's
forward+backward passes, reported in seconds and converted to mask evaluations by the run; the per-step losses
stay in the checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import types
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from jaxloc import files
from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.units import head_name
from jaxloc.localize.methods.base import (OBJECTIVE, SCORED_GENERAL_TASKS, SCORED_TARGET, Context, FixedDesignPlan,
                                          Method, confirmation_plan, rank_by)

log = logging.getLogger(__name__)

# Hard-concrete constants (Louizos et al. 2018): temperature and the stretch interval (GAMMA, ZETA).
BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1
# Initial gate logit: each head ablated (a > 0) with probability sigmoid(INIT - BETA log(-GAMMA/ZETA)) ≈ 0.08 per
# sample, about the compressed-sensing design's rate, so the first steps see informative partial ablations.
INIT_LOG_ALPHA = -4.0
INIT_SPREAD = 0.5  # sd of the restarts' initial logits around INIT_LOG_ALPHA
CHECKPOINT_EVERY = 5
STATE_FILE = "learned_mask_state.npz"


@dataclasses.dataclass
class LearnedMaskSettings:
  """The gate training (flags --mask_steps, --mask_l0, ...); every field changes the gates, so the measurements."""

  # Not the derived "learned_mask_": the names these flags had before prefixes were derived, kept for flagfiles.
  flag_prefix: ClassVar[str] = "mask_"

  steps: int = setting(60, "Adam steps of the gate training.", lower=1, measured=True)
  restarts: int = setting(2, "Restarts (different initial gates and noise) per L0 strength.", lower=1, measured=True)
  l0: list = setting([0.005, 0.02], "L0 penalty strengths (cost of each expected ablated head against the target's "
                     "retained probability in [0, 1]); every restart x strength is one configuration, all trained "
                     "together.", element=float, lower=0.0, measured=True)
  general_weight: float = setting(1.0, "Weight of the general tasks' lost probability in the loss.", lower=0.0,
                                  measured=True)
  learning_rate: float = setting(1.0, "Adam's initial learning rate on the gate logits (cosine-decayed to 0).",
                                 lower=1e-9, measured=True)
  batch_docs: int = setting(16, "Documents per task in each training step.", lower=1, measured=True)


def ablation_probability(log_alpha):
  """P(a > 0): the expected L0 contribution of each gate."""
  return jax.nn.sigmoid(log_alpha - BETA * jnp.log(-GAMMA / ZETA))


def sample_ablation(log_alpha, key):
  """Gate values a in [0, 1] (1 = fully ablated), one hard-concrete draw per gate.

  The gradient passes straight through the clip (it is that of the stretched value s (ZETA - GAMMA) + GAMMA):
  a clipped gate, most of them at any step, still learns from the objective's gradient in its mask value, the
  mask gradient at the sampled ablation. Through the clip itself it would learn only in the rare draws that
  ablate it, and Adam, which scales every gradient to about the learning rate, would let the constant L0 term
  close each gate before those draws show what it does.
  """
  u = jax.random.uniform(key, log_alpha.shape, minval=1e-6, maxval=1 - 1e-6)
  stretched = jax.nn.sigmoid((jnp.log(u) - jnp.log1p(-u) + log_alpha) / BETA) * (ZETA - GAMMA) + GAMMA
  return stretched + jax.lax.stop_gradient(jnp.clip(stretched, 0.0, 1.0) - stretched)


def deterministic_ablation(log_alpha):
  """The gates without noise (what training converges to): exactly 0 or 1 once |log_alpha| ≳ 2.4."""
  return jnp.clip(jax.nn.sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def configurations(options: LearnedMaskSettings) -> tuple[np.ndarray, np.ndarray]:
  """(restart index int [C], L0 strength float [C]) of every configuration."""
  restarts = np.repeat(np.arange(options.restarts), len(options.l0))
  return restarts, np.tile(np.asarray(options.l0, np.float64), options.restarts)


def minibatch(num_docs: int, size: int, seed: int, step: int, task: int) -> np.ndarray:
  """The documents of task `task` at `step` (a fixed function of the seed: a resumed run draws the same)."""
  rng = np.random.default_rng([seed, step, task])
  return np.sort(rng.choice(num_docs, min(size, num_docs), replace=False))


def train(settings, context: Context, progress: bool = True) -> dict[str, np.ndarray]:
  """Trains every configuration's gates (resuming from the run directory's checkpoint); returns the final
  log_alpha [C, N], the per-step losses [steps, C] and the training seconds."""
  objective = context.objective
  if objective is None:
    raise ValueError("this run provides no relaxed objective to train a mask on")
  options = settings.method_settings
  restarts, l0 = configurations(options)
  num_configs, n = len(l0), context.num_total
  active = jnp.asarray(~context.excluded, jnp.float32)
  schedule = optax.cosine_decay_schedule(options.learning_rate, options.steps)
  optimizer = optax.adam(schedule)
  init_rng = np.random.default_rng(settings.seed)
  spread = init_rng.normal(0.0, INIT_SPREAD, (options.restarts, n))
  log_alpha = jnp.asarray(INIT_LOG_ALPHA + spread[restarts], jnp.float32)
  state = optimizer.init(log_alpha)
  losses = np.zeros((options.steps, num_configs))
  start_step, seconds = 0, 0.0
  path = os.path.join(context.directory, STATE_FILE) if context.directory else None
  saved = files.read_arrays(path) if path else None
  if saved is not None:
    leaves, treedef = jax.tree_util.tree_flatten((log_alpha, state))
    if int(saved["num_leaves"]) != len(leaves) or saved["log_alpha"].shape != log_alpha.shape:
      raise UserError(f"{path} was written by other learned-mask settings; choose another --output_dir")
    log_alpha, state = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(saved[f"leaf{i}"])
                                                              for i in range(len(leaves))])
    start_step, seconds = int(saved["step"]), float(saved["seconds"])
    losses[:start_step] = saved["losses"][:start_step]
    log.info("learned_mask: resuming training at step %d of %d", start_step, options.steps)

  def checkpoint(step: int) -> None:
    if path:
      leaves = jax.tree_util.tree_leaves((log_alpha, state))
      files.save_arrays(path, {"step": np.asarray(step), "seconds": np.asarray(seconds), "losses": losses,
                               "log_alpha": np.asarray(log_alpha), "num_leaves": np.asarray(len(leaves)),
                               **{f"leaf{i}": np.asarray(leaf) for i, leaf in enumerate(leaves)}})

  l0_weights = jnp.asarray(l0, jnp.float32)[:, None]

  @jax.jit
  def sample(la, key):
    return sample_ablation(la, key) * active  # excluded heads are never ablated

  @jax.jit
  def update(la, state, key, d_ablated):
    """One Adam step from the objective's gradient in the sampled gates plus the L0 penalty's."""
    _, pullback = jax.vjp(lambda x: sample(x, key), la)
    penalty = jax.grad(lambda x: jnp.sum(l0_weights * ablation_probability(x) * active))(la)
    updates, state = optimizer.update(pullback(d_ablated)[0] + penalty, state, la)
    la = optax.apply_updates(la, updates)
    return la, state, jnp.sum(ablation_probability(la) * active, axis=1)

  key = jax.random.PRNGKey(settings.seed)
  bar = tqdm(total=options.steps, initial=start_step, desc="training gates", unit="step", disable=not progress,
             dynamic_ncols=True)
  try:
    for step in range(start_step, options.steps):
      t = time.perf_counter()
      step_key = jax.random.fold_in(key, step)
      keep = 1.0 - np.asarray(sample(log_alpha, step_key), np.float32)
      docs = [minibatch(size, options.batch_docs, settings.seed, step, t_) for t_, size in
              enumerate(objective.num_docs)]
      values, grads = objective(keep.reshape(num_configs, context.num_layers, context.num_heads), docs)
      d_keep = grads[0]  # [T, C], [T, C, L, H]: d retained / d keep
      general_lost = np.zeros(num_configs)
      if len(values) > 1:
        general_lost = options.general_weight * (1.0 - values[1:]).mean(axis=0)
        d_keep = d_keep - options.general_weight * grads[1:].mean(axis=0)
      # keep = 1 - a, so d loss / d a = -d loss / d keep.
      log_alpha, state, expected = update(log_alpha, state, step_key,
                                          jnp.asarray(-d_keep.reshape(num_configs, n), jnp.float32))
      expected = np.asarray(expected)
      losses[step] = values[0] + general_lost + l0 * expected
      seconds += time.perf_counter() - t
      bar.update(1)
      bar.set_postfix(target=f"{values[0].mean():.3f}", heads=f"{expected.mean():.1f}")
      if (step + 1) % CHECKPOINT_EVERY == 0 or step + 1 == options.steps:
        checkpoint(step + 1)
  finally:
    bar.close()
  return {"log_alpha": np.asarray(log_alpha), "losses": losses, "seconds": np.asarray(seconds)}


def screen_order(log_alpha: np.ndarray, excluded: np.ndarray) -> np.ndarray:
  """int [N]: heads by mean ablation probability over configurations (highest first), ties by mean log_alpha;
  excluded heads last."""
  probability = np.asarray(ablation_probability(jnp.asarray(log_alpha)), np.float64).mean(axis=0)
  return rank_by(excluded, -probability, -np.asarray(log_alpha, np.float64).mean(axis=0))


@dataclasses.dataclass(frozen=True)
class LearnedMask(Method):
  name: str = "learned_mask"
  listing_order = 70
  units = ("heads",)
  needs = frozenset({OBJECTIVE, SCORED_TARGET, SCORED_GENERAL_TASKS})
  settings_class = LearnedMaskSettings
  run_settings = types.MappingProxyType({"num_masks": "heads confirmed by ablation, most often gated first"})
  example_options = types.MappingProxyType({"num_masks": 5, "mask_steps": 40})

  def check(self, settings) -> None:
    l0 = settings.method_settings.l0
    if not l0:
      raise UserError("--mask_l0 must name at least one L0 penalty strength")

  def plan(self, settings, context: Context) -> FixedDesignPlan:
    options = settings.method_settings
    log_alpha = context.remember("learned_log_alpha", lambda: train(settings, context)["log_alpha"])
    ablation = np.asarray(deterministic_ablation(jnp.asarray(log_alpha)))
    facts = {"screen": "hard-concrete gates trained on the target's and general tasks' retained probability",
             "configurations": int(len(log_alpha)), "steps": options.steps,
             "hard_gate_fraction": float(np.mean((ablation == 0) | (ablation == 1))),
             "learned_sets": {f"restart {r} l0 {v:g}": [head_name(*divmod(int(h), context.num_heads))
                                                           for h in np.flatnonzero(row > 0.5)]
                              for r, v, row in zip(*configurations(options), ablation)}}
    return confirmation_plan(screen_order(log_alpha, context.excluded), settings.num_masks, context, facts)


METHODS = (LearnedMask(),)
