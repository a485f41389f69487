"""Driving a method's plan in tests, the way the runner does, with metric functions of the flat masks."""

import dataclasses

import numpy as np

from jaxloc.localize import methods
from jaxloc.localize.methods import Context, Measured
from jaxloc.localize.settings import LocalizeSettings


def settings(method: str, **overrides) -> LocalizeSettings:
  return LocalizeSettings.make(**{"task": "synthetic", "output_dir": "unused", "method": method, **overrides})


def context(num_layers, num_heads, excluded=(), gradient=None, directory=None, objective=None,
            attribution=None) -> Context:
  mask = np.zeros(num_layers * num_heads, bool)
  mask[list(excluded)] = True
  return Context(num_layers, num_heads, mask, (lambda: np.asarray(gradient)) if gradient is not None else None,
                 objective, directory, (lambda steps: np.asarray(attribution)) if attribution is not None else None)


@dataclasses.dataclass
class PlantedObjective:
  """A relaxed objective with a known answer: task t loses effects[t, n] nats of log-probability per unit of
  head n's ablation, so its retained probability is exp(-sum_n effects[t, n] (1 - keep_n)) (the same on every
  document). Counts its calls; `fail_at` raises on that call (a run killed mid-training)."""

  effects: np.ndarray  # float [T, N], ≥ 0
  calls: int = 0
  fail_at: int | None = None

  @property
  def num_docs(self) -> list[int]:
    return [4] * len(self.effects)

  def __call__(self, keep, docs):
    self.calls += 1
    if self.fail_at is not None and self.calls == self.fail_at:
      raise KeyboardInterrupt("killed")
    assert len(docs) == len(self.effects)
    flat = np.asarray(keep, np.float64).reshape(len(keep), -1)
    retained = np.exp(-(1.0 - flat) @ self.effects.T).T  # [T, C]
    grads = retained[:, :, None] * self.effects[:, None, :]
    return retained, grads.reshape((len(self.effects),) + np.shape(keep))


def measure(masks: np.ndarray, metric_fns: dict) -> dict[str, np.ndarray]:
  flat = masks.reshape(len(masks), -1)
  return {name: np.asarray(fn(flat), np.float64) for name, fn in metric_fns.items()}


def drive(plan, metric_fns: dict, num_layers: int, num_heads: int, metric: str = "accuracy",
          measured: Measured | None = None, stop_after: int | None = None) -> Measured:
  """Measures what `plan` asks for until it is done (or `stop_after` masks are measured), with the runner's loop."""
  baselines = {k: float(v[0]) for k, v in measure(np.zeros((1, num_layers, num_heads), bool), metric_fns).items()}
  if measured is None:
    measured = Measured(np.zeros((0, num_layers, num_heads), bool), {k: np.zeros(0) for k in metric_fns},
                        baselines, metric)
  measured = Measured(measured.masks, dict(measured.metrics), measured.baselines, measured.metric)  # theirs intact
  return methods.drive(plan, measured, lambda masks: measured.extend(masks, measure(masks, metric_fns)),
                       limit=stop_after)


def run(name: str, metric_fns: dict, num_layers: int, num_heads: int, ctx: Context | None = None, **overrides):
  """(plan, measurements, ranking) of a registered method run to the end."""
  s = settings(name, **overrides)
  s.check()
  plan = methods.get(name).plan(s, ctx or context(num_layers, num_heads))
  measured = drive(plan, metric_fns, num_layers, num_heads, metric=s.metric or "accuracy")
  return plan, measured, plan.rank(measured)

