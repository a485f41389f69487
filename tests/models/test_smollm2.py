"""The embedded default, SmolLM2-135M-Instruct from GGUF, against transformers' own GGUF load."""

import numpy as np
import pytest

from tests.models.parity import check_head_mask_parity, check_neuron_mask_parity, logits, torch_logits

pytest.importorskip("torch")

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "41, 42, 43,",
    "Question: What is 3 plus 4?\nAnswer:",
    "<|endoftext|>Once upon a time, in a small village,",
    "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n",
]


def test_config_matches_measured_facts(smollm2):
  cfg = smollm2.config
  assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (30, 9, 3, 64)
  assert (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size) == (576, 1536, 49152)
  assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_and_greedy_tokens_match_transformers(smollm2, smollm2_torch, prompt):
  ids = smollm2.tokenizer(prompt)["input_ids"]
  ours = logits(smollm2, ids)
  theirs = torch_logits(smollm2_torch, ids)
  assert np.abs(ours - theirs).max() < 1e-3
  assert np.array_equal(ours.argmax(-1), theirs.argmax(-1))


def test_head_mask_matches_o_proj_pre_hook(smollm2, smollm2_torch):
  heads = [(2, 4), (15, 0), (15, 7), (29, 8)]  # query heads whose KV groups keep other heads on
  check_head_mask_parity(smollm2, smollm2_torch, smollm2.tokenizer(PROMPTS[4])["input_ids"], heads)


def test_neuron_mask_matches_zeroed_down_proj_columns(smollm2, smollm2_torch):
  rng = np.random.default_rng(0)
  neurons = [(layer, int(i)) for layer in (0, 14, 29) for i in rng.choice(1536, 100, replace=False)]
  check_neuron_mask_parity(smollm2, smollm2_torch, smollm2.tokenizer(PROMPTS[3])["input_ids"], neurons)
