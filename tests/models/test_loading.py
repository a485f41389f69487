"""Loader behaviour: every kind of spec, clear errors, and the conversion cache."""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.models import checkpoints
from jaxloc.models.config import config_from_hf
from jaxloc.engine.config import EngineConfig
from jaxloc.models.loading import ConversionCache, default_dtype, load_model, read_config, resolve, resolve_dtype


def test_missing_path_is_a_clear_error(tmp_path):
  with pytest.raises(UserError, match="not found"):
    resolve(str(tmp_path / "nope" / "model.gguf"))
  with pytest.raises(UserError, match="not an existing path"):
    resolve("./no/such/dir")


def test_directory_without_config(tmp_path):
  with pytest.raises(UserError, match="config.json"):
    resolve(str(tmp_path))


def test_unsupported_model_type_lists_supported():
  with pytest.raises(UserError, match=r"unsupported model_type 'gpt2'.*llama, mistral, qwen2, qwen3, gemma2, gemma3_text, olmo2"):
    config_from_hf({"model_type": "gpt2"})


def test_unsupported_rope_type_lists_supported():
  hf = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
  with pytest.raises(UserError, match=r"unsupported rope type 'yarn'.*default, linear, llama3"):
    config_from_hf(hf)


def test_offline_hub_id_names_missing_files(monkeypatch, tmp_path):
  from huggingface_hub import constants

  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
  with pytest.raises(UserError) as err:
    load_model("meta-llama/Llama-3.1-8B-Instruct", cache_dir=None)
  message = str(err.value)
  assert "config.json" in message and "safetensors" in message and "--model=/path/to/dir" in message


def test_sharded_safetensors_with_index(tmp_path):
  """A checkpoint split over two files with an index loads like the single file."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(0)
  config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2)
  model = transformers.AutoModelForCausalLM.from_config(config)
  single, sharded = tmp_path / "single", tmp_path / "sharded"
  model.save_pretrained(single)
  model.save_pretrained(sharded, max_shard_size="20KB")
  assert os.path.exists(sharded / "model.safetensors.index.json")
  with open(sharded / "model.safetensors.index.json") as f:
    assert len(set(json.load(f)["weight_map"].values())) > 1
  a = load_model(str(single), cache_dir=None, dtype=jnp.float32)
  b = load_model(str(sharded), cache_dir=None, dtype=jnp.float32)
  assert jax.tree.all(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a.params, b.params))


def test_bfloat16_load_reads_straight_into_target_dtype(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2)
  transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp_path)
  loaded = load_model(str(tmp_path), cache_dir=None, dtype=jnp.bfloat16)
  assert {leaf.dtype for leaf in jax.tree.leaves(loaded.params)} == {jnp.dtype(jnp.bfloat16)}


def test_conversion_cache_round_trips(tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2)
  transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "ckpt")
  fresh = load_model(str(tmp_path / "ckpt"), cache_dir=str(tmp_path / "cache"), dtype=jnp.float32)
  cached = load_model(str(tmp_path / "ckpt"), cache_dir=str(tmp_path / "cache"), dtype=jnp.float32)
  assert cached.config == fresh.config
  assert jax.tree.all(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), fresh.params, cached.params))


def test_gguf_rotary_unpermute_inverts_llama_cpp_permute():
  rng = np.random.default_rng(0)
  w = rng.normal(size=(3 * 8, 5))

  def llama_cpp_permute(weights, n_head):  # convert_hf_to_gguf.py LlamaModel.permute
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))

  assert np.array_equal(checkpoints._unpermute_rotary(llama_cpp_permute(w, 3), 3), w)


def test_not_a_gguf_file(tmp_path):
  bad = tmp_path / "broken.gguf"
  bad.write_bytes(b"not a gguf file at all")
  with pytest.raises(UserError, match="not a readable GGUF"):
    load_model(str(bad), cache_dir=None)


def test_random_presets_have_published_shapes():
  from jaxloc.models.presets import PRESETS

  llama = PRESETS["llama-3.1-8b"]
  non_embedding = llama.flops_per_token(with_lm_head=False) / 2
  assert 6.9e9 < non_embedding < 7.0e9  # Llama-3.1-8B: 8.03B params, 1.05B of them embeddings + LM head
  assert PRESETS["qwen2.5-7b"].num_heads * PRESETS["qwen2.5-7b"].head_dim == 3584


def test_presets_of_the_other_families_have_their_published_parameter_counts():
  """Each built by the converter from its config.json values; the counts are the model cards' rounded figures, so a
  wrong field (an untied head, the vocabulary, a layer count) would show."""
  import jax.numpy as jnp

  from jaxloc.bench.memory import param_bytes
  from jaxloc.models.config import FULL, SLIDING
  from jaxloc.models.presets import PRESETS

  published = {"gemma-2-2b": 2.61e9, "gemma-3-1b": 1.00e9, "qwen3-8b": 8.19e9, "olmo-2-7b": 7.30e9}
  for name, count in published.items():
    assert abs(param_bytes(PRESETS[name], jnp.float32) / 4 / count - 1) < 0.005, name
  gemma3 = PRESETS["gemma-3-1b"]
  assert gemma3.layer_types[:6] == (SLIDING,) * 5 + (FULL,) and gemma3.sliding_window == 512
  assert PRESETS["gemma-2-2b"].attn_softcap == 50.0 and PRESETS["qwen3-8b"].qk_norm == "head"


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_random_model_loads_and_runs():
  loaded = load_model("random:smollm2-135m", dtype=jnp.float32)
  assert loaded.config.num_heads == 9 and loaded.tokenizer is not None
  with pytest.raises(UserError, match="unknown random preset"):
    load_model("random:gpt-5")


def _reader_config(path):
  """A GGUF file's config as gguf's own reader decodes its metadata (every tensor mapped)."""
  import gguf

  from jaxloc.models.config import config_from_gguf

  reader = gguf.GGUFReader(path)
  fields = {name: field.contents() for name, field in reader.fields.items()
            if name not in checkpoints._GGUF_LARGE_FIELDS and not name.startswith("GGUF.")}
  fields.setdefault(f"{fields['general.architecture']}.vocab_size", len(reader.fields["tokenizer.ggml.tokens"].data))
  return config_from_gguf(fields, {t.name for t in reader.tensors})


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
@pytest.mark.parametrize("alias", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_read_config_of_a_gguf_is_its_headers_and_equals_the_readers(alias):
  try:
    _, path = resolve(alias)
  except UserError as e:
    pytest.skip(str(e))
  assert read_config(alias) == _reader_config(path)


def test_read_config_of_every_other_kind(tmp_path):
  from jaxloc.models.presets import PRESETS

  assert read_config("random:llama-3.2-1b") == PRESETS["llama-3.2-1b"]
  hf = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 2,
        "num_attention_heads": 2}
  (tmp_path / "config.json").write_text(json.dumps(hf))
  assert read_config(str(tmp_path)) == config_from_hf(hf)
  (tmp_path / "config.json").write_text("{")
  with pytest.raises(UserError, match="config.json is not valid JSON"):
    read_config(str(tmp_path))


def test_a_truncated_gguf_is_named_truncated_before_any_tensor_is_read(tmp_path):
  _, path = resolve("smollm2-135m")
  size = os.path.getsize(path)
  for kept, says in [(100, "its header ends past its 100 bytes"),
                     (3_000_000, f"it has 3,000,000 bytes, its tensors need {size:,}"),
                     (size - 1, f"it has {size - 1:,} bytes, its tensors need {size:,}")]:
    truncated = tmp_path / "model.gguf"
    with open(path, "rb") as f:
      truncated.write_bytes(f.read(kept))
    for attempt in (read_config, lambda spec: load_model(spec, cache_dir=None)):
      with pytest.raises(UserError, match=f"{truncated} is truncated: {says}"):
        attempt(str(truncated))


def test_auto_dtypes_are_decided_in_one_place_each():
  """The model's "auto" (`resolve_dtype`: float32 on this CPU) and the activations' (`EngineConfig.activations_for`:
  the model's), whatever spells them."""
  assert resolve_dtype(None) is resolve_dtype("auto") is default_dtype() is jnp.float32
  assert resolve_dtype("bfloat16") is jnp.bfloat16 and resolve_dtype(jnp.float16) is jnp.float16
  with pytest.raises(UserError, match="unknown dtype 'float9'"):
    resolve_dtype("float9")
  assert EngineConfig().activations_for("bfloat16") == "bfloat16"
  assert EngineConfig(activation_dtype="float32").activations_for("bfloat16") == "float32"


_CUSTOM_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import PretrainedConfig, PreTrainedTokenizerFast
class CustomConfig(PretrainedConfig):
  model_type = "custom_llama"
class CustomTokenizer(PreTrainedTokenizerFast):
  pass
"""


def _with_custom_code(source, directory, marker, *, fits):
  """A copy of the HF directory `source` whose tokenizer (and, unless a built-in tokenizer `fits`, config) name a
  module of their own (`auto_map`) that writes `marker` when it is imported."""
  shutil.copytree(source, directory)
  (directory / "custom.py").write_text(_CUSTOM_CODE.format(marker=str(marker)))
  for name, edit in (("tokenizer_config.json", {"auto_map": {"AutoTokenizer": [None, "custom.CustomTokenizer"]}}),
                     ("config.json", {"auto_map": {"AutoConfig": "custom.CustomConfig"}})):
    payload = json.loads((directory / name).read_text())
    payload.update(edit)
    if not fits:  # nothing transformers ships reads these: only the checkpoint's code would
      payload.update({"tokenizer_class": "CustomTokenizer"} if name == "tokenizer_config.json"
                     else {"model_type": "custom_llama"})
    (directory / name).write_text(json.dumps(payload))
  return directory


def test_a_checkpoints_own_code_is_never_run_nor_asked_about(tiny_model_dir, tmp_path):
  marker = tmp_path / "marker"
  fits = _with_custom_code(tiny_model_dir, tmp_path / "fits", marker, fits=True)
  needs_code = _with_custom_code(tiny_model_dir, tmp_path / "needs_code", marker, fits=False)
  script = ("import sys\nfrom jaxloc.errors import UserError\nfrom jaxloc.models.loading import load_tokenizer\n"
            "for directory in sys.argv[1:]:\n  try:\n    print(type(load_tokenizer('hf_dir', directory)).__name__)\n"
            "  except UserError as e:\n    print(f'error: {e}')\n")
  # A yes on stdin, as a user who answers transformers' prompt would give: it must never be read.
  result = subprocess.run([sys.executable, "-c", script, str(fits), str(needs_code)], input="y\ny\ny\n",
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules")))
  assert result.returncode == 0, result.stderr
  assert not marker.exists() and "[y/N]" not in result.stdout + result.stderr
  assert result.stdout.splitlines() == [
      "TokenizersBackend",
      f"error: {needs_code} needs its own code for its tokenizer (auto_map in tokenizer_config.json and config.json), "
      "and jaxloc never runs a checkpoint's code: no built-in transformers tokenizer fits it; give a checkpoint whose "
      "tokenizer_config.json names a transformers tokenizer_class"]
  assert (f"{fits} names custom code (auto_map in tokenizer_config.json and config.json): jaxloc never runs a "
          "checkpoint's code; it uses transformers' built-in TokenizersBackend") in result.stderr


def test_a_cache_dir_that_is_a_file_is_one_line_before_the_checkpoint_is_read(tiny_model_dir, tmp_path):
  (tmp_path / "cache").write_text("")
  with pytest.raises(UserError, match=rf"^--cache_dir={tmp_path}/cache is a file, not a directory: give a directory "
                                      r"\(it is created when missing\), or --cache_dir=none to cache nothing$"):
    load_model(tiny_model_dir, cache_dir=str(tmp_path / "cache"))
  with pytest.raises(UserError, match=rf"^--cache_dir={tmp_path}/cache/sub is below the file {tmp_path}/cache, not"):
    load_model(tiny_model_dir, cache_dir=str(tmp_path / "cache" / "sub"))


def test_the_conversion_cache_never_writes_through_a_link(tiny_model_dir, tmp_path):
  cache = ConversionCache(str(tmp_path / "cache"), tiny_model_dir, jnp.float32)
  os.makedirs(cache.root)
  victim = json.dumps(read_config(tiny_model_dir).to_dict())  # a config it reads back, then writes over
  (tmp_path / "victim.json").write_text(victim)
  (tmp_path / "victim_params").mkdir()
  (tmp_path / "victim_tokenizer").mkdir()
  os.symlink(tmp_path / "victim.json", cache.config_path)
  os.symlink(tmp_path / "victim_params", cache.params_path)
  os.symlink(tmp_path / "victim_tokenizer", cache.tokenizer_path)
  loaded = load_model(tiny_model_dir, cache_dir=str(tmp_path / "cache"), dtype=jnp.float32)
  assert loaded.tokenizer is not None and loaded.config.num_layers == 3
  assert (tmp_path / "victim.json").read_text() == victim and not os.path.islink(cache.config_path)
  assert os.listdir(tmp_path / "victim_params") == [] and os.listdir(tmp_path / "victim_tokenizer") == []
