"""--float32_matmuls: a float32 engine traces every jitted function under one matmul precision, "highest" unless told
otherwise, because JAX's default on GPUs is TF32 (3.3e-4 max logit difference against transformers on an H100
instead of ~1e-6). CPUs compute float32 matmuls in float32 whatever the setting, so these tests read the precision
off the lowered program (StableHLO's `precision = [HIGHEST, HIGHEST]` on each dot_general), not off the numbers."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from jaxloc.engine import compilation
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.requests import ScoringRequest
from jaxloc.errors import UserError


def _matmul(a, b):
  return a @ b


def _dots(text: str) -> list[str]:
  return [line for line in text.splitlines() if "dot_general" in line]


def test_jitted_traces_under_its_precision_and_compiles_each_apart():
  """"highest" lowers to HIGHEST, "tensorfloat32" to HIGH (what XLA runs as TF32 on GPUs), None to DEFAULT; the
  precision is part of jit's cache key, so the same function under two precisions is two executables."""
  x = jnp.ones((4, 4), jnp.float32)
  time = compilation.CompileTime()
  for precision, expected in (("highest", "[HIGHEST, HIGHEST]"), ("tensorfloat32", "[HIGH, HIGH]"),
                              (None, "[DEFAULT, DEFAULT]")):
    dots = _dots(compilation.Jitted(_matmul, time, matmul_precision=precision).lower(x, x).as_text())
    assert dots and all(f"precision = {expected}" in d for d in dots), (precision, dots)
  jitted = jax.jit(_matmul)
  for precision in ("highest", "tensorfloat32"):
    with jax.default_matmul_precision(precision):
      jitted(x, x)
  assert jitted._cache_size() == 2  # noqa: SLF001
  # A function of its own: jit's cache is per function, shared by its wrappers.
  ahead = compilation.Jitted(lambda a: a @ a, time, matmul_precision="highest")
  # The ahead-of-time compile traces under it too (XLA writes it operand_precision={highest,highest}).
  assert "operand_precision={highest,highest}" in ahead.executable(x).as_text()
  assert jnp.array_equal(ahead(x), x @ x)
  with jax.default_matmul_precision("highest"):  # what the call was traced under: its executable is found
    ahead._jitted(x)  # noqa: SLF001
  assert ahead._jitted._cache_size() == 1  # noqa: SLF001
  ahead._jitted(x)  # noqa: SLF001  (JAX's default: another executable)
  assert ahead._jitted._cache_size() == 2  # noqa: SLF001


def _residuals_program(engine: Engine) -> str:
  """The lowered text of the engine's unablated-streams kernel on a one-request layout."""
  lay, _ = engine.prepare([ScoringRequest("The capital of France is", " Paris")])
  return engine.scorer.jitted[2].lower(engine.params, None, lay.chunks[0].rows).as_text()


def test_a_float32_engine_computes_its_matmuls_at_the_precision_it_is_given(tiny_model):
  engine = Engine(tiny_model, EngineConfig(activation_dtype="float32", compilation_cache="none"))
  assert engine.config.float32_matmuls == "highest" and engine.shared.matmul_precision == "highest"
  dots = _dots(_residuals_program(engine))
  assert dots and all("precision = [HIGHEST, HIGHEST]" in d for d in dots), dots
  tf32 = Engine(tiny_model, dataclasses.replace(engine.config, float32_matmuls="tensorfloat32"), mesh=engine.mesh)
  dots = _dots(_residuals_program(tf32))
  assert dots and all("precision = [HIGH, HIGH]" in d for d in dots), dots
  bf16 = Engine(tiny_model, dataclasses.replace(engine.config, activation_dtype="bfloat16"), mesh=engine.mesh)
  assert bf16.shared.matmul_precision is None and "HIGH" not in _residuals_program(bf16)  # JAX's default kept


def test_an_unknown_precision_is_refused_by_the_flag_and_the_engine(tiny_model):
  from absl import flags

  from jaxloc import cli

  with pytest.raises(UserError, match="--float32_matmuls=tf32 must be one of highest, tensorfloat32"):
    Engine(tiny_model, EngineConfig(float32_matmuls="tf32"))
  values = flags.FlagValues()
  cli.define_flags(EngineConfig, flag_values=values)
  with pytest.raises(flags.IllegalFlagValueError, match="highest|tensorfloat32"):
    values["float32_matmuls"].parse("tf32")
  values["float32_matmuls"].parse("tensorfloat32")
  assert cli.settings_from_flags(EngineConfig, values).float32_matmuls == "tensorfloat32"
