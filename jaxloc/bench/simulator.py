"""A simulated task score under head ablation, for fast sweeps and tests (no model).

Axes:
  masks:  one simulated evaluation per row.
  heads:  flattened `layers * heads` (heads_total); a design is bool [masks, heads] (or
          [masks, layers, heads], flattened row-major), True = ablated.

The response has a latent score eta(m) for an ablation mask m in {0,1}^N,

    eta(m) = eta_0 + sum_j beta_j m_j + sum_{i<j planted} gamma_ij m_i m_j,

with a few *planted* heads with large negative beta (the task heads), small dense *background*
effects on every other head, and optional pairwise *interactions* gamma between planted heads
(positive: redundant heads, negative: heads that only matter together). The task's probability of
success is p(m) = link(eta(m)):
  link="linear":   p = clip(eta, 0, 1): additive until saturation (accuracy cannot go below 0);
  link="logistic": p = sigmoid(eta): a smooth saturation at both ends.
Planted effects are specified as the drop in expected accuracy when the head alone is ablated, and
background effects in accuracy units, whatever the link.

Two metrics:
  metric="accuracy": the mean of `num_samples` Bernoulli(p) outcomes, i.e. Binomial(n, p) / n, the
    sampling noise of accuracy over a 100-sample task (num_samples=None gives p without noise);
  metric="logprob":  log(max(p, min_prob)) plus Gaussian noise of sd `noise_scale` (a continuous,
    log-probability-like metric with less noise per evaluation).

Everything is fixed by `seed` at construction; `evaluate` draws its noise from the rng it is given.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxloc.errors import UserError

LINKS = ("linear", "logistic")
METRICS = ("accuracy", "logprob")


def _logit(p):
  return np.log(p) - np.log1p(-p)


def _sigmoid(x):
  return 0.5 * (1.0 + np.tanh(0.5 * x))


@dataclasses.dataclass
class SyntheticResponse:
  """A seeded synthetic response over `num_heads` heads (heads_total).

  num_planted:       how many task heads get a large negative effect.
  planted_drop:      (low, high): each planted head's single-ablation accuracy drop ~ U(low, high).
  background_scale:  sd of the dense background effects on the other heads (accuracy units).
  interaction_scale: sd of the pairwise interactions between planted heads (latent units).
  baseline:          accuracy with no head ablated, in (0, 1).
  link, metric, num_samples, noise_scale, min_prob: see the module docstring.
  """
  num_heads: int
  num_planted: int = 5
  planted_drop: tuple[float, float] = (0.15, 0.35)
  background_scale: float = 0.003
  interaction_scale: float = 0.0
  baseline_accuracy: float = 0.8
  link: str = "linear"
  metric: str = "accuracy"
  num_samples: int | None = 100
  noise_scale: float = 0.05
  min_prob: float = 1e-4
  seed: int = 0

  def __post_init__(self):
    if isinstance(self.num_heads, bool) or not isinstance(self.num_heads, (int, np.integer)) \
        or self.num_heads < 1:
      raise UserError(f"num_heads must be a positive integer, got {self.num_heads!r}")
    if not 0 <= self.num_planted <= self.num_heads:
      raise UserError(
          f"num_planted must be in 0..{self.num_heads} (num_heads), got {self.num_planted!r}")
    low, high = self.planted_drop
    if not 0 <= low <= high < self.baseline_accuracy:
      raise UserError(
          f"planted_drop must satisfy 0 <= low <= high < baseline_accuracy "
          f"({self.baseline_accuracy}), got {self.planted_drop!r}")
    if not 0 < self.baseline_accuracy < 1:
      raise UserError(f"baseline_accuracy must be in (0, 1), got {self.baseline_accuracy!r}")
    if self.link not in LINKS:
      raise UserError(f"unknown link {self.link!r}; valid links are {', '.join(LINKS)}")
    if self.metric not in METRICS:
      raise UserError(f"unknown metric {self.metric!r}; valid metrics are {', '.join(METRICS)}")
    if self.num_samples is not None and (not isinstance(self.num_samples, (int, np.integer))
                                         or self.num_samples < 1):
      raise UserError(f"num_samples must be a positive integer or None, got {self.num_samples!r}")
    if self.noise_scale < 0 or self.background_scale < 0 or self.interaction_scale < 0:
      raise UserError("noise_scale, background_scale and interaction_scale must be >= 0")

    rng = np.random.default_rng(self.seed)
    n = int(self.num_heads)
    b = self.baseline_accuracy
    drops = rng.uniform(low, high, size=self.num_planted)
    planted = rng.choice(n, size=self.num_planted, replace=False)
    background = rng.normal(0.0, self.background_scale, size=n)
    background[planted] = 0.0
    if self.link == "linear":
      self._eta0 = b
      beta = background
      beta[planted] = -drops
    else:
      self._eta0 = _logit(b)
      beta = background / (b * (1.0 - b))  # first-order conversion of accuracy units to logits
      beta[planted] = _logit(b - drops) - _logit(b)
    self._beta = beta
    order = np.argsort(-drops, kind="stable")
    self._planted = planted[order]
    pairs = [(i, j) for a, i in enumerate(self._planted) for j in self._planted[a + 1:]]
    self._pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    self._gamma = rng.normal(0.0, self.interaction_scale, size=len(pairs))
    self._true_effects = self.expected(np.eye(n, dtype=bool)) - self.baseline

  # ----------------------------------------------------------------------------------------------

  @property
  def planted(self) -> np.ndarray:
    """int [num_planted]: the planted heads, largest single-ablation drop first."""
    return self._planted.copy()

  @property
  def baseline(self) -> float:
    """Expected score with no head ablated (accuracy, or log-probability for metric='logprob')."""
    return float(self.expected(np.zeros((1, self.num_heads), dtype=bool))[0])

  @property
  def true_effects(self) -> np.ndarray:
    """float [heads]: expected score change when that head alone is ablated (negative = hurts)."""
    return self._true_effects.copy()

  def true_top_k(self, k: int) -> np.ndarray:
    """int [k]: the k heads whose single ablation lowers the expected score most, most first."""
    if not 1 <= k <= self.num_heads:
      raise UserError(f"k must be in 1..{self.num_heads}, got {k!r}")
    return np.argsort(self._true_effects, kind="stable")[:k]

  def _masks(self, masks) -> np.ndarray:
    masks = np.asarray(masks)
    if masks.ndim < 2 or int(np.prod(masks.shape[1:])) != self.num_heads:
      raise UserError(
          f"masks must be [masks, {self.num_heads}] (or [masks, layers, heads] with "
          f"{self.num_heads} heads in all), got shape {masks.shape}")
    return masks.reshape(masks.shape[0], -1).astype(np.float64)

  def probability(self, masks) -> np.ndarray:
    """float [masks]: the task's success probability p(m) under each mask."""
    m = self._masks(masks)
    eta = self._eta0 + m @ self._beta
    if len(self._pairs):
      eta = eta + (m[:, self._pairs[:, 0]] * m[:, self._pairs[:, 1]]) @ self._gamma
    if self.link == "linear":
      return np.clip(eta, 0.0, 1.0)
    return _sigmoid(eta)

  def expected(self, masks) -> np.ndarray:
    """float [masks]: the noiseless score (accuracy p, or log(max(p, min_prob)))."""
    p = self.probability(masks)
    if self.metric == "accuracy":
      return p
    return np.log(np.maximum(p, self.min_prob))

  def evaluate(self, masks, rng: np.random.Generator | int) -> np.ndarray:
    """float [masks]: one noisy measurement per mask (binomial or Gaussian noise)."""
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    if self.metric == "accuracy":
      p = self.probability(masks)
      if self.num_samples is None:
        return p
      return rng.binomial(self.num_samples, p) / self.num_samples
    mean = self.expected(masks)
    return mean + rng.normal(0.0, self.noise_scale, size=mean.shape)
