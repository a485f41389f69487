"""The edited model as an HF checkpoint: `transformers` loading the export computes what jaxloc computes under the
same mask (float32 logits within 1e-4 on tiny Llama, Qwen2 and Gemma 3 configs, 1e-3 on SmolLM2) and greedy decoding
gives the same tokens; mean ablation folds into biases where transformers' config can hold them and is refused where
it cannot; the tensor and config conversions invert the readers exactly."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.errors import UserError
from jaxloc.models import checkpoints
from jaxloc.models.config import config_from_hf, config_to_hf
from jaxloc.models.decoder import Ablation, lm_logits
from jaxloc.models.export import fold_ablation, read_metadata, write_hf_checkpoint
from tests.models.parity import keep_mask, neuron_keep_mask
from tests.tiny import GEMMA3, make_tiny

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
DEFAULT_RUN = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                           "default_run")
PROMPTS = ["The cats sat on the mats while the dogs", "Once upon a time, in a land far away,",
           "def add(a, b):\n    return"]
FAMILIES = {"llama": {}, "qwen2": dict(model_type="qwen2", qkv_bias=True, tie_word_embeddings=False),
            "gemma3": GEMMA3}
HEADS = [(0, 1), (1, 4), (2, 5)]
NEURONS = [(0, 3), (1, 17), (2, 60)]


def _tiny(tokenizer, family):
  """A tiny model of `family` whose biases and norms are perturbed, so that none of them is inert."""
  model = make_tiny(tokenizer, **FAMILIES[family])
  keys = iter(jax.random.split(jax.random.PRNGKey(1), 64))
  flat = checkpoints.flatten(model.params)
  for path, value in flat.items():
    if path.endswith(("bias", "scale")):
      flat[path] = value + 0.1 * jax.random.normal(next(keys), value.shape, value.dtype)
  return dataclasses.replace(model, params=checkpoints.nest(flat))


def _jaxloc_logits(model, ids, ablation: Ablation) -> np.ndarray:
  tokens = jnp.asarray(ids)[None, None]
  out = model.module.apply({"params": model.params}, tokens, jnp.arange(len(ids))[None, None], ablation=ablation)
  return np.asarray(lm_logits(model.config, model.params, out.hidden))[0, 0]


def _export(model, directory, heads=(), neurons=(), head_fill=None, neuron_fill=None):
  config, params = fold_ablation(model.config, model.params, heads, neurons, head_fill, neuron_fill)
  write_hf_checkpoint(str(directory), config, params, model.tokenizer, {"jaxloc_test": "yes"})
  return transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32,
                                                           attn_implementation="eager")


def _hf_logits(hf_model, ids) -> np.ndarray:
  with torch.no_grad():
    return hf_model(torch.tensor([ids])).logits[0].numpy()


def _max_difference(model, hf_model, ablation: Ablation) -> tuple[float, float]:
  """(largest |Δlogit| between the export and jaxloc under `ablation`, largest change the ablation makes)."""
  difference = change = 0.0
  for prompt in PROMPTS:
    ids = model.tokenizer(prompt)["input_ids"]
    ours = _jaxloc_logits(model, ids, ablation)
    difference = max(difference, float(np.abs(_hf_logits(hf_model, ids) - ours).max()))
    change = max(change, float(np.abs(ours - _jaxloc_logits(model, ids, Ablation())).max()))
  return difference, change


def _check_greedy(model, hf_model, ablation: Ablation, new_tokens: int = 12) -> None:
  ids = [model.tokenizer(p)["input_ids"] for p in PROMPTS]
  engine = Engine(model, EngineConfig(generation_batch=len(ids)))
  head_masks = None if ablation.head_mask is None else np.asarray(ablation.head_mask)
  neuron_masks = None if ablation.neuron_mask is None else np.asarray(ablation.neuron_mask)
  ours = engine.generate_tokens(ids, head_masks, new_tokens, ablation.head_fill, neuron_masks=neuron_masks,
                                neuron_fill=ablation.neuron_fill)[0]
  for prompt, generated in zip(ids, ours):
    with torch.no_grad():
      expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                   eos_token_id=model.config.eos_token_ids[0])
    assert generated == expected[0, len(prompt):].tolist()


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
@pytest.mark.parametrize("family", list(FAMILIES))
def test_zero_ablation_export_matches_jaxloc_under_the_mask(tokenizer, tmp_path, family):
  """Heads and neurons zeroed in one export (each alone moves the logits, so a wrong column of either shows)."""
  model = _tiny(tokenizer, family)
  hf_model = _export(model, tmp_path, HEADS, NEURONS)
  ablation = Ablation(head_mask=keep_mask(model.config, HEADS), neuron_mask=neuron_keep_mask(model.config, NEURONS))
  difference, change = _max_difference(model, hf_model, ablation)
  print(f"{family} heads and neurons: max |Δlogit| {difference:.2e} (the ablation moves logits by up to {change:.2f})")
  assert difference < TOL
  for alone in (Ablation(head_mask=ablation.head_mask), Ablation(neuron_mask=ablation.neuron_mask)):
    assert _max_difference(model, hf_model, alone)[0] > 1e-2  # the export holds both edits
  _check_greedy(model, hf_model, ablation)
  assert read_metadata(str(tmp_path))["jaxloc_test"] == "yes"


def _fills(config, seed=2):
  head_key, neuron_key = jax.random.split(jax.random.PRNGKey(seed))
  return (np.asarray(jax.random.normal(head_key, (config.num_layers, config.num_heads, config.head_dim))),
          np.asarray(jax.random.normal(neuron_key, (config.num_layers, config.intermediate_size))))


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_mean_ablation_folds_into_biases(tokenizer, tmp_path, family):
  model = _tiny(tokenizer, family)
  head_fill, neuron_fill = _fills(model.config)
  neurons = NEURONS if family == "llama" else []  # only Llama's config has an MLP bias option
  hf_model = _export(model, tmp_path, HEADS, neurons, head_fill, neuron_fill if neurons else None)
  assert hf_model.config.attention_bias and (hf_model.config.mlp_bias if neurons else True)
  ablation = Ablation(head_mask=keep_mask(model.config, HEADS), head_fill=jnp.asarray(head_fill),
                      neuron_mask=neuron_keep_mask(model.config, neurons) if neurons else None,
                      neuron_fill=jnp.asarray(neuron_fill) if neurons else None)
  difference, change = _max_difference(model, hf_model, ablation)
  zero_difference, _ = _max_difference(model, hf_model, Ablation(head_mask=keep_mask(model.config, HEADS)))
  print(f"{family} mean ablation: max |Δlogit| {difference:.2e}")
  assert difference < TOL and change > 1e-2 and zero_difference > 1e-2  # the fill matters, and is in the export
  _check_greedy(model, hf_model, ablation)


@pytest.mark.parametrize("family, units", [("qwen2", "heads"), ("qwen2", "neurons"), ("gemma3", "neurons")])
def test_mean_ablation_without_a_bias_option_is_refused(tokenizer, family, units):
  model = make_tiny(tokenizer, **FAMILIES[family])
  head_fill, neuron_fill = _fills(model.config)
  with pytest.raises(UserError, match="cannot hold"):
    if units == "heads":
      fold_ablation(model.config, model.params, heads=HEADS, head_fill=head_fill)
    else:
      fold_ablation(model.config, model.params, neurons=NEURONS, neuron_fill=neuron_fill)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_hf_tensors_invert_the_reader(tokenizer, tmp_path, family):
  model = _tiny(tokenizer, family)
  path = str(tmp_path / "model.safetensors")
  checkpoints.write_safetensors(path, checkpoints.hf_tensors(model.config, model.params))
  back = checkpoints.load_safetensors_params(str(tmp_path), model.config, jnp.float32)
  assert jax.tree.structure(back) == jax.tree.structure(model.params)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(model.params)))


def _llama3_biases():
  return transformers.LlamaConfig(
      vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, attention_bias=True, mlp_bias=True, eos_token_id=[1, 2],
      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64})


def _qwen2():
  return transformers.Qwen2Config(vocab_size=99, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def test_config_to_hf_inverts_config_from_hf():
  from tests.models.test_families import CONFIGS

  for name, make in {**CONFIGS, "llama3_biases": _llama3_biases, "qwen2": _qwen2}.items():
    config = config_from_hf(make().to_dict())
    written = transformers.AutoConfig.for_model(**config_to_hf(config))
    assert config_from_hf(written.to_dict()) == config, name


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_configs_transformers_cannot_express_are_refused(tokenizer):
  config = make_tiny(tokenizer, model_type="qwen2", qkv_bias=True, o_bias=True).config
  with pytest.raises(UserError, match="qwen2 config cannot hold"):
    config_to_hf(config)


def test_smollm2_export_of_the_default_run_matches_jaxloc(smollm2, tmp_path):
  """The default run's heads (docs/default_run) on the embedded model: the dequantized export in transformers gives
  jaxloc's masked logits within 1e-3 and the same greedy tokens."""
  from jaxloc.api import read_run

  run = read_run(DEFAULT_RUN)
  heads = [(h["layer"], h["head"]) for h in run.heads if h["name"] in run.top_k]
  assert len(heads) == 5
  hf_model = _export(smollm2, tmp_path, heads)
  ablation = Ablation(head_mask=keep_mask(smollm2.config, heads))
  difference, change = _max_difference(smollm2, hf_model, ablation)
  print(f"SmolLM2 default run heads: max |Δlogit| {difference:.2e} (the ablation moves logits by up to {change:.2f})")
  assert difference < 1e-3 and change > 1e-2
  _check_greedy(smollm2, hf_model, ablation, new_tokens=16)
