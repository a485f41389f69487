"""Compiling for a GPU that is not here: XLA:GPU's own optimized graph and memory analysis of a call, on a CPU host.

XLA compiles for a described GPU without one (ahead-of-time, "deviceless"): given the device's description (its
compute capability, cores, memory and bandwidth: `TARGETS`), the CUDA plugin's compiler runs every XLA:GPU pass
(fusion, the dot merger, buffer assignment) and emits the executable a GPU of that kind would
run, with nothing allocated and no driver. What it cannot do without the device is autotune: its matmul tilings are
XLA's defaults, so bytes moved and memory held are the GPU's, times are not. Nothing here runs a compiled call.

    with deviceless.compiling_for("h100"):           # the benchmarks' abstract compiles go to XLA:GPU
      lowered = deviceless.lower(jax.jit(f), *abstract_args)

The plugin is not one of jaxloc's dependencies (about 480 MB): `pip install --no-deps --target=.deviceless
jax-cuda12-plugin==V jax-cuda12-pjrt==V` with V the installed jaxlib's version, then PYTHONPATH=.deviceless
(`install_command`; a folder of its own keeps it out of other runs, where it would look for a GPU at every start).
`compiling_for` says so, as a `UserError`, where it is missing. It loads without a driver only where JAX runs on the
CPU alone: `compiling_for` sets that, before JAX starts (JAX_PLATFORMS=cpu).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from typing import Any, Iterator

import jax
import jaxlib

from jaxloc.errors import UserError
from jaxloc.models import layers

# Device descriptions as CUDA reports them (XLA's `GpuTargetConfigProto.gpu_device_info`).
TARGETS: dict[str, dict[str, Any]] = {
    "h100": {"description": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0), "core_count": 132,
             "fpus_per_core": 128, "clock_rate_ghz": 1.98, "memory_bandwidth": 3_352_320_000_000,
             "device_memory_size": 84_978_434_048, "l2_cache_size": 52_428_800, "shared_memory_per_block": 49_152,
             "shared_memory_per_block_optin": 232_448, "shared_memory_per_core": 233_472,
             "threads_per_block_limit": 1024, "threads_per_core_limit": 2048, "threads_per_warp": 32,
             "registers_per_core_limit": 65_536, "registers_per_block_limit": 65_536}}
# The cuDNN version the described device is taken to have (XLA reads it to choose its cuDNN fusions).
CUDNN_VERSION = (9, 8)

_active: list[str] = []  # the target of the innermost `compiling_for`
# The products compiled again on cuBLAS (`compile`), each as XLA named it, in order.
FALLBACKS: list[str] = []


def install_command() -> str:
  """The commands that install the CUDA plugin matching this jaxlib in .deviceless/ and put it on the path."""
  version = jaxlib.__version__
  return (f"pip install --no-deps --target=.deviceless jax-cuda12-plugin=={version} jax-cuda12-pjrt=={version}, "
          "then run with PYTHONPATH=.deviceless")


def target_config(name: str) -> str:
  """The text of XLA's `GpuTargetConfigProto` for target `name`."""
  spec = TARGETS[name]
  major, minor = spec["compute_capability"]
  info = {key: value for key, value in spec.items() if key not in ("description", "compute_capability")}
  info.update(block_dim_limit_x=2**31 - 1, block_dim_limit_y=65535, block_dim_limit_z=65535)
  fields = "".join(f"  {key}: {value}\n" for key, value in info.items())
  capability = f"  cuda_compute_capability {{\n    major: {major}\n    minor: {minor}\n  }}\n"
  return (f"gpu_device_info {{\n{fields}{capability}}}\n"
          f'platform_name: "CUDA"\ndnn_version_info {{\n  major: {CUDNN_VERSION[0]}\n  minor: {CUDNN_VERSION[1]}\n}}\n'
          f'device_description_str: "{spec["description"]}"\n')


@functools.lru_cache(maxsize=None)
def device(name: str) -> jax.Device:
  """A compile-only device of target `name`: arrays placed on it lower and compile for it, and run nowhere."""
  from jax.experimental import topologies

  topology = topologies.get_topology_desc(platform="cuda", topology="1x1x1", target_config=target_config(name))
  return topology.devices[0]


def check(name: str) -> None:
  """A `UserError` naming what is missing unless target `name` can be compiled for here."""
  if name not in TARGETS:
    raise UserError(f"unknown compile target {name!r}; valid: {', '.join(TARGETS)}")
  try:
    found = importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:  # no jax_plugins package at all
    found = False
  if not found:
    raise UserError(f"compiling for {name} needs XLA's CUDA plugin (no GPU or driver): {install_command()}")
  # The plugin loads without a driver only where JAX runs on the CPU alone: this process's JAX stays on the CPU.
  jax.config.update("jax_platforms", "cpu")
  try:
    device(name)
  except (NotImplementedError, RuntimeError) as error:  # JAX started before, or the plugin is not this jaxlib's
    raise UserError(f"compiling for {name}: XLA's CUDA plugin did not load ({str(error).splitlines()[0]}); run "
                    f"with JAX_PLATFORMS=cpu, with the plugin of this jaxlib: {install_command()}") from error


@contextlib.contextmanager
def compiling_for(name: str | None) -> Iterator[None]:
  """Within it, `lower` compiles for target `name` (None: the backend in use), and the decode step's kernels are laid
  out as on that target's platform (`layers.kernel_layout_for`); `FALLBACKS` starts empty. Sets JAX on the CPU for
  the process (`check`)."""
  if name is None:
    yield
    return
  check(name)
  FALLBACKS.clear()
  _active.append(name)
  try:
    with layers.kernel_layout_for("gpu"):
      yield
  finally:
    _active.pop()


def platform() -> str:
  """The platform the benchmarks' compiles are for: the active target's, else the backend in use."""
  return "gpu" if _active else jax.default_backend()


def place(tree: Any) -> Any:
  """Abstract arguments (`jax.ShapeDtypeStruct`s, None where absent) on the active target's device; as given when no
  target is active."""
  if not _active:
    return tree
  sharding = jax.sharding.SingleDeviceSharding(device(_active[-1]))
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), tree)


def lower(fn: Any, *args: Any, **static: Any) -> Any:
  """`fn.lower(*args, **static)` (a `jax.jit`ted fn, abstract args) for the active target."""
  return fn.lower(*place(args), **static)


def compile(lowered: Any, options: dict | None = None) -> Any:  # noqa: A001 (the stage it is)
  """`lowered.compile(compiler_options=options)`. For a target, where XLA:GPU's Triton matmul emitter finds no tiling
  for a product (Llama-3.2-3B's and Qwen2.5-7B's 3 and 7 query heads a KV head, their prefix attention at a decode
  step: "Couldn't find output tile sizes"), compiled again with its matmuls on cuBLAS, as recorded in `FALLBACKS`. A
  GPU tries each of its matmul's tilings and cuBLAS when it autotunes, and drops one that does not compile; compiled
  without the device, XLA takes its default tiling and stops there."""
  try:
    return lowered.compile(compiler_options=options or None)
  except jax.errors.JaxRuntimeError as error:
    if not _active or "Couldn't find output tile sizes" not in str(error):
      raise
    FALLBACKS.append(str(error).split("\n")[0][:300])
    return lowered.compile(compiler_options={**(options or {}), "xla_gpu_enable_triton_gemm": False})
