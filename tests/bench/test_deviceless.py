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

# Compiles a tiny decode step for an H100 and prints, as JSON, the concatenations that join the rows' cache blocks
# (more positions than a block holds, of every row's keys or values), and XLA:GPU's memory analysis.
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
per_position = slots * rows * config.num_kv_heads * config.head_dim  # a layer's keys (or values) at one position
merged = []
for computation in computations.values():
  for instr in computation.values():
    if instr.opcode == "concatenate":
      dims = [int(d) for d in instr.type.split("[")[1].split("]")[0].split(",")]
      axis = int(instr.attributes.split("dimensions={")[1].split("}")[0])
      if math.prod(dims) == per_position * dims[axis] and dims[axis] > max(widths):  # rows' caches joined
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
  def no_package(name):
    raise ModuleNotFoundError(name)

  for find_spec in (lambda name: None, no_package):  # a jax_plugins package without it, or none at all
    monkeypatch.setattr(deviceless.importlib.util, "find_spec", find_spec)
    with pytest.raises(UserError, match=r"pip install --no-deps --target=.deviceless jax-cuda12-plugin==.*PYTHONPATH"):
      deviceless.check("h100")


def test_the_kernel_layout_follows_the_platform_compiled_for():
  with layers.kernel_layout_for("gpu"):
    assert layers.kernels_output_major()
    with layers.kernel_layout_for("cpu"):
      assert layers.kernels_output_major() == (not layers._cpu_has_avx512())
  with pytest.raises(ZeroDivisionError), layers.kernel_layout_for("gpu"):
    1 / 0
  assert layers._LAYOUT_PLATFORMS == []  # left as it was, an error or not
  assert deviceless.platform() != "gpu" and deviceless.place((None,)) == (None,)  # no target: as given


class _Lowered:
  """A lowered call whose first compile fails as XLA:GPU's Triton emitter does without a tiling."""

  def __init__(self, message):
    self.message, self.options = message, []

  def compile(self, compiler_options=None):
    self.options.append(compiler_options)
    if len(self.options) == 1:
      raise deviceless.jax.errors.JaxRuntimeError(self.message)
    return "compiled"


def test_a_product_without_a_triton_tiling_is_compiled_again_on_cublas_for_a_target_only(monkeypatch):
  message = "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.1 = bf16[16,384,128]"
  with pytest.raises(deviceless.jax.errors.JaxRuntimeError):  # for the backend in use: XLA's error as it is
    deviceless.compile(_Lowered(message))
  monkeypatch.setattr(deviceless, "_active", ["h100"])
  monkeypatch.setattr(deviceless, "FALLBACKS", [])
  lowered = _Lowered(message)
  assert deviceless.compile(lowered, {"xla_dump_to": "x"}) == "compiled"
  assert lowered.options == [{"xla_dump_to": "x"}, {"xla_dump_to": "x", "xla_gpu_enable_triton_gemm": False}]
  assert deviceless.FALLBACKS == [message]
  with pytest.raises(deviceless.jax.errors.JaxRuntimeError):  # any other failure stands
    deviceless.compile(_Lowered("INTERNAL: something else"))


def test_the_benchmark_names_a_bad_target_or_a_missing_plugin_before_jax_starts(tmp_path):
  out = subprocess.run([sys.executable, "-m", "experiments.benchmark_memory", "--target=a100"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and "unknown compile target 'a100'" in out.stderr and "Traceback" not in out.stderr
  env = dict(os.environ, PYTHONPATH=ROOT)  # no plugin on the path: no jax_plugins package at all
  out = subprocess.run([sys.executable, "-m", "experiments.benchmark_memory", "--target=h100",
                        f"--output_json={tmp_path / 'out.json'}"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 2 and "pip install --no-deps --target=.deviceless" in out.stderr, out.stderr[-2000:]
  assert "Traceback" not in out.stderr and not (tmp_path / "out.json").exists()


def _plugin_env() -> dict:
  if not os.path.isdir(os.path.join(PLUGIN_DIR, "jax_plugins", "xla_cuda12")):
    if os.environ.get("CI"):
      pytest.fail(f"XLA's CUDA plugin is not in {PLUGIN_DIR} (.ci/run installs it there)")
    pytest.skip(f"XLA's CUDA plugin is not in {PLUGIN_DIR}: {deviceless.install_command()} --target=.deviceless")
  path = [PLUGIN_DIR, ROOT] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
  return dict(os.environ, PYTHONPATH=os.pathsep.join(path), JAX_PLATFORMS="cpu")


@pytest.mark.heavy
def test_an_h100_decode_step_reads_each_cache_block_where_it_lies():
  out = subprocess.run([sys.executable, "-c", DECODE_SCRIPT], cwd=ROOT, env=_plugin_env(), capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["platform"] == "gpu" and result["output_major"]  # compiled as a GPU lays its kernels out
  assert result["blocks"] == 3 and result["merged"] == []
  assert result["temp"] > 0


def test_builds_h100_tables_are_the_committed_runs():
  """BUILD.md's figures for the H100 compiled without one are those of docs/memory/benchmark_memory_h100.json."""
  with open(os.path.join(ROOT, "docs", "memory", "benchmark_memory_h100.json")) as f:
    run = json.load(f)
  with open(os.path.join(ROOT, "BUILD.md")) as f:
    build = f.read().split("### Compiled for an H100 without one", 1)[1].split("\n### ", 1)[0]
  assert run["backend"] == "gpu" and run["target"].startswith("NVIDIA H100")
  gib = 2**30
  for row in run["generation"]:
    line = next(line for line in build.splitlines() if line.startswith(f"| {row['preset']} | "))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[1] == f"{row['slots']} × {row['rows']}" and cells[3] == f"{row['estimate_bytes'] / gib:.2f}"
    assert cells[4] == f"{row['xla_bytes'] / gib:.2f}" and cells[5] == f"{row['ratio']:.2f}"
  for cost in run["decode_cost"]:
    line = next(line for line in build.splitlines() if line.startswith(f"| {cost['blocks']} ({cost['span']}"))
    assert f"{cost['step_bytes'] / 1e9:.2f} GB" in line and f"{cost['ratio']:.2f}×" in line
    assert f"{cost['amortized_ratio']:.2f}×" in line and f"{cost['bandwidth_bound_ms']:.2f} ms" in line
  assert f"{len(run['cublas_fallbacks']['generation'])} of the 40 calls compiled on cuBLAS" in build


def test_builds_budget_table_is_the_committed_runs_at_both_shares():
  """BUILD.md's decode step at the default and the wide budget: docs/memory/benchmark_memory_h100.json and
  benchmark_memory_h100_wide.json (`--free_share=0.9`), whose layouts are the planner's at those budgets."""
  from jaxloc.bench import memory
  from jaxloc.models.presets import PRESETS

  with open(os.path.join(ROOT, "BUILD.md")) as f:
    build = f.read().split("### Compiled for an H100 without one", 1)[1].split("\n### ", 1)[0]
  model = PRESETS["llama-3.1-8b"]
  for name, share in (("benchmark_memory_h100.json", 0.6), ("benchmark_memory_h100_wide.json", 0.9)):
    with open(os.path.join(ROOT, "docs", "memory", name)) as f:
      run = json.load(f)
    assert run.get("free_share", 0.6) == share and run["target"].startswith("NVIDIA H100")
    plan = memory.gpu80_generation_plan(model, memory.GSM8K_GENERATION, share)
    for cost in run["decode_cost"]:
      assert (cost["slots"], cost["rows"]) == (plan.slots, plan.rows)
      row = (f"  | {share:.0%} ({memory.gpu80_budget(model, share) / memory.GIB:.2f} GiB) | {cost['slots']} × "
             f"{cost['rows']} | {cost['blocks']} ({cost['span']}) | {cost['step_bytes'] / 1e9:.2f} GB | "
             f"{cost['ratio']:.2f}× | {cost['bandwidth_bound_ms']:.2f} ms | {cost['decode_minutes']:.1f} min |")
      assert row in build.splitlines(), row
