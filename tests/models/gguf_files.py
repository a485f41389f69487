"""GGUF files of tiny `transformers` models, written as llama.cpp's `convert_hf_to_gguf.py` writes them (float32).

Its conventions, which a loader must undo: tensors renamed (`blk.N.attn_q.weight` ...; Llama's
`post_attention_layernorm` is `ffn_norm`, Gemma's is `post_attention_norm` and its MLP's input norm `ffn_norm`),
Llama-architecture q/k rows permuted for llama.cpp's interleaved rotary (`LlamaModel.permute`), 1 added to every
Gemma norm weight (`Gemma2Model.modify_tensors`), Mistral written as architecture `llama` (transformers then tells
it by `general.name`).
"""

import numpy as np

_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
}
_POST_NORM_NAMES = {"post_attention_layernorm.weight": "post_attention_norm.weight",
                    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                    "post_feedforward_layernorm.weight": "post_ffw_norm.weight"}


def _llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
  return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
          .swapaxes(1, 2).reshape(weights.shape))


def write_gguf(model, path: str) -> str:
  """Writes the float32 tiny `model` (a transformers causal LM of a family llama.cpp converts) to `path`."""
  import gguf

  config = model.config
  family = config.model_type
  arch = {"mistral": "llama", "gemma3_text": "gemma3"}.get(family, family)
  gemma = arch in ("gemma2", "gemma3")
  writer = gguf.GGUFWriter(path, arch)
  writer.add_name("mistral tiny" if family == "mistral" else f"{family} tiny")
  writer.add_context_length(config.max_position_embeddings)
  writer.add_embedding_length(config.hidden_size)
  writer.add_block_count(config.num_hidden_layers)
  writer.add_feed_forward_length(config.intermediate_size)
  writer.add_head_count(config.num_attention_heads)
  writer.add_head_count_kv(config.num_key_value_heads)
  writer.add_layer_norm_rms_eps(config.rms_norm_eps)
  writer.add_rope_freq_base(config.rope_parameters.get("full_attention", config.rope_parameters)["rope_theta"])
  writer.add_vocab_size(config.vocab_size)
  head_dim = config.head_dim
  writer.add_key_length(head_dim)
  writer.add_value_length(head_dim)
  if arch == "llama":
    writer.add_rope_dimension_count(head_dim)
  if gemma:
    writer.add_sliding_window(config.sliding_window)
  if arch == "gemma2":
    writer.add_attn_logit_softcapping(config.attn_logit_softcapping)
    writer.add_final_logit_softcapping(config.final_logit_softcapping)
  layer_names = {**_LAYER_NAMES, **(_POST_NORM_NAMES if gemma else {"post_attention_layernorm.weight":
                                                                     "ffn_norm.weight"})}
  for name, tensor in model.state_dict().items():
    w = tensor.detach().float().numpy().copy()
    if name == "lm_head.weight" and config.tie_word_embeddings:
      continue
    if name.startswith("model.layers."):
      _, _, layer, rest = name.split(".", 3)
      target = f"blk.{layer}.{layer_names[rest]}"
    else:
      target = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                "lm_head.weight": "output.weight"}[name]
    if arch == "llama" and target.endswith(("attn_q.weight", "attn_q.bias")):
      w = _llama_cpp_permute(w, config.num_attention_heads)
    elif arch == "llama" and target.endswith(("attn_k.weight", "attn_k.bias")):
      w = _llama_cpp_permute(w, config.num_key_value_heads)
    if gemma and target.endswith("norm.weight"):
      w = w + 1
    writer.add_tensor(target, np.ascontiguousarray(w, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path
