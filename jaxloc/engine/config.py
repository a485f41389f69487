"""The engine's settings: one frozen dataclass, whose fields are also the command-line flags (`jaxloc.cli`).

    engine = Engine(model, EngineConfig(tokens_per_batch=256))
    plain = Engine(model, dataclasses.replace(engine.config, pack=False, residual_cache_gb=0))

A field left None (or "auto") takes its default for the machine and the model when an engine is built
(`planner.resolve`); `engine.config` holds the resolved values, so a variant made from it with
`dataclasses.replace` keeps the original's budgets. The mesh is not settings but the devices: it is given apart.
"""

from __future__ import annotations

import dataclasses

from jaxloc.config import setting

# jax.default_matmul_precision's names for the two precisions a float32 run may ask of its matmuls.
FLOAT32_MATMULS = ("highest", "tensorfloat32")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """How an engine cuts and runs its work (each field is a `jaxloc.config.setting`: its flag's help and bounds)."""

  memory_budget_gb: float | None = setting(None, "Activation memory per compiled call (default: 60% of free device "
                                           "memory on accelerators, min(8, RAM/4) GiB on CPU).", type=float,
                                           lower=0.01)
  tokens_per_batch: int | None = setting(None, "Token rows per compiled scoring call (default 2048 on CPU, 65536 on "
                                         "accelerators).", type=int, lower=1)
  generation_batch: int | None = setting(None, "Rows decoded at once by a generation job, over all its mask slots "
                                         "(default from the memory budget).", type=int, lower=1)
  share_prefix: bool = setting(True, "Compute the few-shot prefix shared by all requests once per mask.")
  pack: bool = setting(True, "Pack several short requests into one row (each sees only itself and the shared "
                       "prefix); --nopack gives one request per row.")
  residual_cache_gb: float | None = setting(None, "Room, within --memory_budget_gb, for the unablated model's residual "
                                            "streams, so that masks start at the first layer they ablate and a "
                                            "generation mask prefills the shared prefix from there (default a quarter "
                                            "of the budget; 0 turns it off). Request sets that do not fit start at "
                                            "layer 0, with a warning.", type=float, lower=0)
  activation_dtype: str = setting("auto", "Activation dtype (residual stream and matmul inputs); auto = --dtype. "
                                  "float32 with --dtype=bfloat16 keeps bfloat16 weights in memory and computes in "
                                  "float32.", choices=("auto", "float32", "bfloat16"))
  float32_matmuls: str = setting("highest", "Precision of float32 matmuls and convolutions on every backend: highest "
                                 "is true float32 (default: parity with transformers to ~1e-6 on every device; JAX's "
                                 "own default on GPUs is TF32, 3e-4 off); tensorfloat32 allows TF32 on GPUs that have "
                                 "it (faster, ~1e-3 relative). bfloat16 activations are unaffected.",
                                 choices=FLOAT32_MATMULS)
  compilation_cache: str = setting("", "JAX's persistent compilation cache, so that a rerun or a resumed run compiles "
                                   "nothing new: a directory; empty = compilation/ in the jaxloc cache ($JAXLOC_CACHE "
                                   "or ~/.cache/jaxloc); 'none' turns it off. It is one setting for the whole "
                                   "process.")

  def activations_for(self, model_dtype: str) -> str:
    """The activation dtype's name for a model in `model_dtype` (a name): "auto" is the model's (the one place that
    rule is decided; the model's own "auto" is `models.loading.resolve_dtype`)."""
    return model_dtype if self.activation_dtype == "auto" else self.activation_dtype
