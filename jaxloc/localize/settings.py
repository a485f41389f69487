"""Everything a localization run depends on: one definition of each setting, its default and its help.

`experiments.localize` turns every field into a flag (`jaxloc.cli.define_flags`), the benchmark builds
the same object with a few fields changed, and each method reads the fields it uses. A field's
`metadata` holds its help and bounds; `check` validates the settings shared by all methods (each
method checks its own, `methods.get(name).check`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxloc.errors import UserError
from jaxloc.models.loading import SMOLLM2_ALIAS


def setting(default: Any, help: str, **metadata: Any) -> Any:  # noqa: A002 - absl's word for it
  """A settings field: default, help text, and optional `lower`/`upper` bounds, `choices`, `type`, and for a
  list the `element` type its flag's values are converted to."""
  if isinstance(default, (list, dict)):
    return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help, **metadata})
  return dataclasses.field(default=default, metadata={"help": help, **metadata})


@dataclasses.dataclass
class LocalizeSettings:
  """The flags of `experiments.localize` (run `python -m experiments.localize --helpfull`)."""

  model: str = setting(SMOLLM2_ALIAS, "Model: alias, .gguf file, local HF directory or HF hub id.")
  task: str = setting(None, "Registered task name, a custom .jsonl file, or an lm-evaluation-harness task as "
                      "lm_eval:<task name or task .yaml>.", type=str, required=True)
  output_dir: str = setting(None, "Where outputs go (and where a resumed run finds them).", type=str, required=True)
  method: str = setting("cs_stratified", "Localization method (one of jaxloc.localize.methods.names()).",
                        choices="methods")
  unit: str = setting("heads", "What to localize: attention heads, or MLP neurons (the input of down_proj; methods "
                      "cnl, gradient_confirm, one_shot_greedy). Names: L15H13 / L3N117.", choices=("heads", "neurons"))
  cnl_steps: int = setting(20, "cnl: integrated-gradients steps along the 0 -> activation path.", lower=1)
  cnl_threshold: float = setting(0.2, "cnl: a document selects the neurons whose attribution is above this fraction "
                                 "of its largest attribution.", lower=1e-6, upper=1.0)
  cnl_commonality: float = setting(0.4, "cnl: commonality neurons are those selected by at least this fraction of "
                                   "the documents.", lower=1e-6, upper=1.0)
  task_options: dict = setting({}, "Task options as key=value.")
  num_masks: int = setting(300, "Evaluation budget of the method: design masks for compressed sensing and "
                           "two_stage (screen plus confirmations); heads confirmed for gradient_confirm and "
                           "learned_mask; heads "
                           "ablated alone for one_shot_greedy (a seeded random subset when fewer than all).",
                           lower=1)
  ablation_rate: float = setting(0.1, "Fraction of heads each compressed-sensing mask ablates.", lower=1e-6,
                                 upper=1 - 1e-6)
  screen_fraction: float = setting(0.5, "two_stage: fraction of --num_masks spent on the compressed-sensing "
                                   "screen; the rest ablate the screen's top heads one at a time.", lower=1e-6,
                                   upper=1 - 1e-6)
  mask_steps: int = setting(60, "learned_mask: Adam steps of the gate training.", lower=1)
  mask_restarts: int = setting(2, "learned_mask: restarts (different initial gates and noise) per L0 strength.",
                               lower=1)
  mask_l0: list = setting([0.005, 0.02], "learned_mask: L0 penalty strengths (cost of each expected ablated head "
                          "against the target's retained probability in [0, 1]); every restart x strength is one "
                          "configuration, all trained together.", element=float)
  mask_general_weight: float = setting(1.0, "learned_mask: weight of the general tasks' lost probability in the "
                                       "loss.", lower=0.0)
  mask_learning_rate: float = setting(1.0, "learned_mask: Adam's initial learning rate on the gate logits "
                                      "(cosine-decayed to 0).", lower=1e-9)
  mask_batch_docs: int = setting(16, "learned_mask: documents per task in each training step.", lower=1)
  num_samples: int = setting(100, "Task documents used for identification (seeded subset).", lower=1)
  metric: str = setting(None, "Task metric to localize (default: the task's default metric).", type=str)
  lasso_alpha: str = setting("cv", "Lasso alpha: a number, or 'cv' for K-fold cross-validation.")
  standardize: bool = setting(True, "Standardize the scores before the Lasso (as the paper's code does).")
  nonpositive: bool = setting(False, "Constrain Lasso coefficients to ≤ 0 (ablation can only hurt).")
  solver_dtype: str = setting("float64", "Precision of the Lasso solve.", choices=("float64", "float32"))
  check_sklearn: bool = setting(False, "Also solve with scikit-learn and record the largest difference.")
  top_k: int = setting(5, "Heads (neurons) reported and validated (and rounds of iterative greedy).", lower=1)
  exclude_heads: list = setting([], "Heads (with --unit=neurons: neurons) never ablated, e.g. L0H1,L1H3 (known "
                                "universal heads) or L3N117.")
  seed: int = setting(0, "Seed of the design, the CV folds and the document subset.")
  data_dir: str = setting(None, "Directory of offline dataset files (default $JAXLOC_DATA).", type=str)
  ablation: str = setting("zero", "Zero ablation or mean ablation.", choices=("zero", "mean"))
  validate: bool = setting(True, "Ablate the selected heads on held-out documents of the task and the general tasks.")
  general_tasks: list = setting(["counting", "plurals", "induction", "arithmetic_1d_4shot"],
                                "Tasks scored under every design mask beside the target (each head gets an "
                                "estimated effect on each), used to select specific heads, find universal heads "
                                "and check specificity. The target is left out of this list.")
  general_samples: int = setting(100, "Identification documents per general task.", lower=1)
  validation_samples: int = setting(100, "Held-out documents per task (target and general) for validation, "
                                    "disjoint from the identification documents.", lower=1)
  selection: str = setting("specific", "specific: the top-k among heads whose estimated relative drop on every "
                           "general task is at most --specific_max_general_drop; raw: the target ranking as is. "
                           "Universal heads are left out of both.", choices=("specific", "raw"))
  specific_max_general_drop: float = setting(0.1, "--selection=specific: the largest estimated relative drop on "
                                             "any general task a selected head may have.", lower=0.0, upper=1.0)
  universal_threshold: float = setting(0.3, "A head is universal when ablating it alone drops at least "
                                       "--universal_min_tasks tasks (target included) by at least this (relative), "
                                       "estimated from the design and confirmed on held-out documents.",
                                       lower=1e-6, upper=1.0)
  universal_min_tasks: int = setting(2, "Tasks a universal head must break (see --universal_threshold).", lower=1)
  universal_candidates: int = setting(10, "At most this many heads the estimates flag as universal are confirmed "
                                      "by ablating them alone (best-ranked on the target first).", lower=0)
  curve_k: int = setting(10, "Heads in the specificity curve (the target drop and the largest general drop for "
                         "the top 1..curve_k selected heads ablated together, held out; the curve extends to "
                         "--top_k, on a geometric ladder past 12), and the selected heads also ablated alone.",
                         lower=1)
  bootstrap: int = setting(200, "Bootstrap resamples (of documents, and of masks for random designs) that give each "
                           "head a selection frequency and an interval on its value; no model evaluations. 0: off.",
                           lower=0)

  def check(self) -> None:
    """The checks every method shares (bounds are also enforced by the flags)."""
    from jaxloc.localize import methods

    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      lower, upper = field.metadata.get("lower"), field.metadata.get("upper")
      if value is None and field.metadata.get("required"):
        raise UserError(f"--{field.name} is required")
      if lower is not None and value is not None and value < lower:
        raise UserError(f"--{field.name}={value} must be ≥ {lower:g}")
      if upper is not None and value is not None and value > upper:
        raise UserError(f"--{field.name}={value} must be ≤ {upper:g}")
      choices = field.metadata.get("choices")
      if isinstance(choices, tuple) and value not in choices:
        raise UserError(f"--{field.name}={value} must be one of {', '.join(choices)}")
    if self.lasso_alpha != "cv":
      try:
        alpha = float(self.lasso_alpha)
      except ValueError:
        raise UserError(f"--lasso_alpha={self.lasso_alpha!r} must be 'cv' or a number ≥ 0") from None
      if alpha < 0:
        raise UserError(f"--lasso_alpha={self.lasso_alpha} must be ≥ 0")
    method = methods.get(self.method)
    if self.unit not in method.units:
      raise UserError(f"--method={self.method} localizes {' or '.join(method.units)}, not {self.unit}; with "
                      f"--unit={self.unit} use " + ", ".join(methods.names_for(self.unit)))
    method.check(self)

  def shared_measurement_settings(self) -> dict[str, Any]:
    """The settings that make any method's measurements what they are (a method adds its own)."""
    return {k: getattr(self, k) for k in ("model", "task", "task_options", "method", "unit", "num_samples", "seed",
                                          "exclude_heads", "ablation", "data_dir")}
