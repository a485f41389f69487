"""Compiling for a GPU that is not here (`jaxloc.bench.deviceless`): the target's description, the errors a user meets
before JAX starts, and, with XLA's CUDA plugin in `.deviceless/` (CI installs it there: `.ci/run`), the decode step
compiled by XLA:GPU for an H100: its products with a row's cache blocks stay apart, where XLA:GPU's dot merger
concatenated the blocks (a copy of every layer's keys in every step)."""

import json
import os
import subprocess
import sys

import pytest

from jaxloc.bench import deviceless
from jaxloc.errors import UserError
from jaxloc.models import layers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN_DIR = os.path.join(ROOT, ".deviceless")

# Compiles a tiny decode step for an H100 and prints, as JSON, the concatenations that join a layer's cache blocks
# (the whole cache along its positions), and XLA:GPU's memory analysis.
DECODE_SCRIPT = """
import json, math
import jax.numpy as jnp
from jaxloc.bench import decode_cost, deviceless
from jaxloc.engine import generation_kernels
from jaxloc.models import layers
from jaxloc.models.config import ModelConfig

config = ModelConfig("llama", 512, 64, 128, 2, 4, 2, 16, 1e-5, rope_theta=10000.0)
slots, rows, cache = 2, 4, 192
widths = generation_kernels.cache_blocks(cache)
with deviceless.compiling_for("h100"):
  compiled = decode_cost.compile_step(config, jnp.bfloat16, slots, rows, 16, cache, 128, len(widths),
                                      held_layers=True)
  platform, output_major = deviceless.platform(), layers.kernels_output_major()
text = compiled.as_text()
computations, _ = decode_cost.parse_hlo(text)
cache_elements = slots * rows * config.num_kv_heads * config.head_dim * cache
merged = []
for computation in computations.values():
  for instr in computation.values():
    if instr.opcode == "concatenate":
      dims = [int(d) for d in instr.type.split("[")[1].split("]")[0].split(",")]
      axis = int(instr.attributes.split("dimensions={")[1].split("}")[0])
      if math.prod(dims) == cache_elements and dims[axis] == cache:  # every block of a layer's key cache, joined
        merged.append(instr.name)
analysis = compiled.memory_analysis()
print(json.dumps({"blocks": len(widths), "merged": merged, "temp": analysis.temp_size_in_bytes,
                  "platform": platform, "output_major": output_major}))
"""


def test_the_target_config_describes_the_device():
  text = deviceless.target_config("h100")
  assert 'device_description_str: "NVIDIA H100 80GB HBM3"' in text
  assert "major: 9\n    minor: 0" in text and "core_count: 132" in text and "memory_bandwidth: 3352320000000" in text
  assert text.count("{") == text.count("}")


def test_an_unknown_target_or_a_missing_plugin_is_a_user_error(monkeypatch):
  with pytest.raises(UserError, match="unknown compile target 'a100'; valid: h100"):
    deviceless.check("a100")
  monkeypatch.setattr(deviceless.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(UserError, match="pip install --no-deps jax-cuda12-plugin=="):
    deviceless.check("h100")


def test_the_kernel_layout_follows_the_platform_compiled_for():
  with layers.kernel_layout_for("gpu"):
    assert layers.kernels_output_major()
    with layers.kernel_layout_for("cpu"):
      assert layers.kernels_output_major() == (not layers._cpu_has_avx512())
  assert deviceless.platform() != "gpu" and deviceless.place((None,)) == (None,)  # no target: as given


def test_the_benchmark_names_a_bad_target_before_jax_starts():
  out = subprocess.run([sys.executable, "-m", "experiments.benchmark_memory", "--target=a100"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and "unknown compile target 'a100'" in out.stderr and "Traceback" not in out.stderr


def _plugin_env() -> dict:
  if not os.path.isdir(os.path.join(PLUGIN_DIR, "jax_plugins", "xla_cuda12")):
    if os.environ.get("CI"):
      pytest.fail(f"XLA's CUDA plugin is not in {PLUGIN_DIR} (.ci/run installs it there)")
    pytest.skip(f"XLA's CUDA plugin is not in {PLUGIN_DIR}: {deviceless.install_command()} --target=.deviceless")
  return dict(os.environ, PYTHONPATH=os.pathsep.join([PLUGIN_DIR, ROOT]), JAX_PLATFORMS="cpu")


@pytest.mark.heavy
def test_an_h100_decode_step_reads_each_cache_block_where_it_lies():
  out = subprocess.run([sys.executable, "-c", DECODE_SCRIPT], cwd=ROOT, env=_plugin_env(), capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["platform"] == "gpu" and result["output_major"]  # compiled as a GPU lays its kernels out
  assert result["blocks"] == 3 and result["merged"] == []
  assert result["temp"] > 0
