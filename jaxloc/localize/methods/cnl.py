"""`cnl`: Commonality Neuron Localization (Huang et al., ICLR 2025, "Capabilities Can be Localized rather than
Individual Knowledge"), an extension of knowledge neurons (Dai et al.) to a capability's documents.

Per document, every MLP neuron at the last context position gets its integrated-gradients attribution for the
probability of the document's target (`Evaluator.attribution`: value × mean gradient along --cnl_steps points of
the 0 -> value path; all layers' neurons at that position are scaled together, one batched path, where Dai et al.
scale one layer at a time). A document selects the neurons above --cnl_threshold × its largest attribution; the
commonality neurons are those selected by at least --cnl_commonality of the documents. Neurons are ranked by the
fraction of documents that select them (ties by the mean attribution relative to each document's largest); the
value is minus that fraction, so the most important neuron is the most negative, as every method ranks.

The overlap rate (CNL's stability check) splits the documents into two seeded disjoint halves and compares the
two commonality sets: |A ∩ B| / min(|A|, |B|), with the Jaccard index |A ∩ B| / |A ∪ B| beside it. CNL
measures no masks: ablation is validation's job (held out), and nothing is estimated for the general tasks.

Axes: `docs` D, N = layers × neurons flattened (flat = layer * F + index).
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import numpy as np

from jaxloc.config import setting
from jaxloc.errors import UserError
from jaxloc.localize.methods.base import ATTRIBUTION, SCORED_TARGET, Context, Measured, Method, Ranking, rank_by


@dataclasses.dataclass
class CommonalitySettings:
  """Its flags: --cnl_steps, --cnl_threshold, --cnl_commonality (the prefix is the method's name)."""

  steps: int = setting(20, "Integrated-gradients steps along the 0 -> activation path.", lower=1, measured=True)
  threshold: float = setting(0.2, "A document selects the neurons whose attribution is above this fraction of its "
                             "largest attribution.", lower=1e-6, upper=1.0)
  commonality: float = setting(0.4, "Commonality neurons are those selected by at least this fraction of the "
                               "documents.", lower=1e-6, upper=1.0)


def commonality(attribution: np.ndarray, threshold: float, commonality_rate: float
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """From attributions [docs, N]: (fraction of documents selecting each neuron [N], mean attribution relative to
  each document's largest [N], the commonality neurons, bool [N])."""
  scores = np.asarray(attribution, np.float64)
  peak = scores.max(axis=1, keepdims=True)
  safe = np.where(peak > 0, peak, 1.0)
  selected = (scores > threshold * peak) & (peak > 0)
  frequency = selected.mean(axis=0)
  return frequency, (scores / safe).mean(axis=0), frequency >= commonality_rate


def overlap(attribution: np.ndarray, threshold: float, commonality_rate: float, seed: int) -> dict[str, Any]:
  """The commonality sets of two seeded disjoint halves of the documents and how much they coincide."""
  docs = len(attribution)
  order = np.random.default_rng([seed, 23]).permutation(docs)
  halves = [order[:docs // 2], order[docs // 2:]]
  sets = [commonality(attribution[h], threshold, commonality_rate)[2] for h in halves]
  both, either = int((sets[0] & sets[1]).sum()), int((sets[0] | sets[1]).sum())
  sizes = [int(s.sum()) for s in sets]
  smaller = min(sizes)
  return {"half_docs": [len(h) for h in halves], "half_neurons": sizes, "shared_neurons": both,
          "overlap_rate": both / smaller if smaller else None, "jaccard": both / either if either else None}


@dataclasses.dataclass
class CommonalityPlan:
  settings: Any
  context: Context
  exchangeable_rows: bool = False

  def next_masks(self, measured: Measured) -> np.ndarray | None:
    if len(measured):
      raise UserError("this output directory holds measured masks, but cnl measures none (the run's settings "
                      "changed); choose another --output_dir to start over")
    return None

  def expected_total(self) -> int:
    return 0

  def rank(self, measured: Measured) -> Ranking:
    del measured  # cnl ranks from the attributions alone
    s, c = self.settings.method_settings, self.context
    attribution = c.document_attribution(s.steps)
    frequency, relative, located = commonality(attribution, s.threshold, s.commonality)
    order = rank_by(c.excluded, -frequency, -relative)
    facts = {"value": "minus the fraction of documents whose attribution selects the neuron",
             "integrated_gradient_steps": s.steps, "threshold": s.threshold,
             "commonality": s.commonality, "documents": int(len(attribution)),
             "located_neurons": int(located.sum()), "located_fraction_of_neurons": float(located.mean()),
             "neurons_per_document": float((attribution > s.threshold * attribution.max(1, keepdims=True)).sum(1)
                                           .mean()),
             **overlap(attribution, s.threshold, s.commonality, self.settings.seed)}
    return Ranking(order, -frequency, facts)

  def estimate(self, measured: Measured) -> Ranking:
    """Nothing for another task: cnl's attributions are the target's (the general tasks are measured in
    validation)."""
    n = self.context.num_total
    return Ranking(np.arange(n), np.zeros(n), {"value": "none: cnl estimates the target only"})


@dataclasses.dataclass(frozen=True)
class CommonalityNeurons(Method):
  name: str = "cnl"
  listing_order = 80
  units = ("neurons",)
  needs = frozenset({ATTRIBUTION, SCORED_TARGET})
  settings_class = CommonalitySettings
  example_options = types.MappingProxyType({"unit": "neurons"})

  def plan(self, settings, context: Context) -> CommonalityPlan:
    return CommonalityPlan(settings, context)


METHODS = (CommonalityNeurons(),)
