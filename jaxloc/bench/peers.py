"""The peer libraries' side of the patching benchmark: TransformerLens 4.3 (`TransformerBridge`) and nnsight 0.8.1
(`LanguageModel`) run on a `transformers` Llama-family model already loaded (torch, float32, eager attention), each
returning numpy arrays and the seconds its own patching took.

Both are the optional `peers` extra (`pip install -e '.[peers]'`, not in CI) and are imported inside the functions:
jaxloc never needs them. Prompts are token ids (one prompt, no padding, no BOS added), so every library sees the same
tokens jaxloc does (`Model.tokens`).

Axes: `layers` L (L' for a chosen subset, in the order given), `tokens` S, `heads` H, `kv_heads` K, `head_dim` Dh,
`embed` D, `mlp` F, `vocab` V.

`tl_cache` returns jaxloc's sites (`jaxloc.models.sites`) from these TransformerLens hooks ({l} the layer; no
compatibility mode, so activations are the HF model's own, not HookedTransformer's folded and centred ones):

| site | axes | TransformerLens hook | what it holds there |
|---|---|---|---|
| embed | [S, D] | hook_embed | token embeddings |
| resid_pre | [L, S, D] | blocks.{l}.hook_resid_pre | residual stream entering layer l |
| q | [L, S, H, Dh] | blocks.{l}.attn.hook_q | query projection before rotary (post-rotary: hook_rot_q); a Llama has no q-norm |
| k, v | [L, S, K, Dh] | blocks.{l}.attn.hook_k / hook_v | the KV heads' projections, not repeated; k before rotary |
| scores | [L, H, S, S] | blocks.{l}.attn.hook_attn_scores | rotary q.k / sqrt(Dh) before softmax; unseen keys hold float32's lowest finite value (-3.4e38), where jaxloc's hold -inf |
| pattern | [L, H, S, S] | blocks.{l}.attn.hook_pattern | softmax of scores, query x key |
| z | [L, S, H, Dh] | blocks.{l}.attn.hook_z | each head's output, the o_proj input |
| head_out | [L, S, H, D] | blocks.{l}.attn.hook_result | z_h @ W_O_h (no bias), fires only with use_attn_result |
| attn_out | [L, S, D] | blocks.{l}.hook_attn_out | what attention adds to the residual |
| resid_mid | [L, S, D] | blocks.{l}.hook_resid_mid | residual between attention and MLP |
| mlp_pre | [L, S, F] | blocks.{l}.mlp.hook_pre | gate projection before its activation (= mlp.gate.hook_out; mlp.hook_pre_linear is the up projection) |
| mlp_post | [L, S, F] | blocks.{l}.mlp.hook_post | act(gate) * up, the down_proj input |
| mlp_out | [L, S, D] | blocks.{l}.hook_mlp_out | what the MLP adds to the residual |
| resid_post | [L, S, D] | blocks.{l}.hook_resid_post | residual leaving layer l |
| final | [S, D] | ln_final.hook_out | the final norm's output, the unembedding's input |
| logits | [S, V] | (the bridge's output) | logits |

`final` is `ln_final.hook_out`, not the `ln_final.hook_normalized` that `jaxloc.models.sites` names: on the bridge
`hook_normalized` is x / rms(x) before the norm's weight, so it is not the unembedding's input (with
`enable_compatibility_mode()` the weight is folded into the unembedding instead, and it is again x / rms(x)).
"""

from __future__ import annotations

import copy
import time
from typing import Any, Callable, Sequence

import numpy as np

# The bridge's name for SmolLM2: with `hf_model` given, TransformerLens takes the architecture from the model's own
# config, so this only names it (offline, nothing is fetched).
SMOLLM2_NAME = "HuggingFaceTB/SmolLM2-135M"

# jaxloc site -> TransformerLens hook ({l} the layer), as the module docstring's table.
TL_HOOKS = {
    "embed": "hook_embed",
    "resid_pre": "blocks.{l}.hook_resid_pre",
    "q": "blocks.{l}.attn.hook_q",
    "k": "blocks.{l}.attn.hook_k",
    "v": "blocks.{l}.attn.hook_v",
    "scores": "blocks.{l}.attn.hook_attn_scores",
    "pattern": "blocks.{l}.attn.hook_pattern",
    "z": "blocks.{l}.attn.hook_z",
    "head_out": "blocks.{l}.attn.hook_result",
    "attn_out": "blocks.{l}.hook_attn_out",
    "resid_mid": "blocks.{l}.hook_resid_mid",
    "mlp_pre": "blocks.{l}.mlp.hook_pre",
    "mlp_post": "blocks.{l}.mlp.hook_post",
    "mlp_out": "blocks.{l}.hook_mlp_out",
    "resid_post": "blocks.{l}.hook_resid_post",
    "final": "ln_final.hook_out",
}

Metric = Callable[[Any], Any]  # TransformerLens' patching metric: logits [1, S, V] (torch) -> a scalar tensor


def logit_difference(io: int, s: int) -> Metric:
  """The IOI metric as TransformerLens takes it: logit[io] - logit[s] at the last position of the one prompt."""
  return lambda logits: logits[0, -1, io] - logits[0, -1, s]


def tl_bridge(hf_model: Any, tokenizer: Any, model_name: str = SMOLLM2_NAME) -> Any:
  """A TransformerLens `TransformerBridge` over a deep copy of `hf_model` (booting rewrites the model it is given in
  place and forces eager attention; the caller's model stays as it was), in eval mode. Needs HF_HUB_OFFLINE=1 to
  stay offline.

  Every hook `tl_cache` reads exists without `enable_compatibility_mode()`, which is not called: it would fold the
  norms' weights into the next linear layers and centre the writing weights and the unembedding (logits shift by a
  constant per position), so activations and logits would no longer be the HF model's.

  Args:
    hf_model: a `transformers` causal LM (float32).
    tokenizer: its tokenizer (copied too: booting configures the one it is given).
    model_name: the name TransformerLens records for the model.
  Returns:
    The bridge.
  """
  import torch
  from transformer_lens.model_bridge import TransformerBridge

  bridge = TransformerBridge.boot_transformers(model_name, hf_model=copy.deepcopy(hf_model),
                                               tokenizer=copy.deepcopy(tokenizer), device="cpu", dtype=torch.float32)
  return bridge.eval()


def _chosen_layers(num_layers: int, layers: Sequence[int] | None) -> list[int]:
  return list(range(num_layers)) if layers is None else [int(layer) for layer in layers]


def tl_cache(bridge: Any, token_ids: Sequence[int]) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """TransformerLens' `run_with_cache` of one prompt, as jaxloc's sites.

  Args:
    bridge: from `tl_bridge`.
    token_ids: one prompt's token ids [S].
  Returns:
    ({site: array} with the axes of the module docstring's table, every layer stacked in front; and what a plain
    `run_with_cache()` of the prompt holds, under the bridge's own settings: `entries` and `mib`). `head_out` needs
    `use_attn_result`, switched on for a second run and back off after.
  """
  import torch

  ids = torch.tensor([list(token_ids)])
  with torch.no_grad():
    _, plain = bridge.run_with_cache(ids)
    footprint = {"entries": len(plain), "mib": sum(v.numel() * v.element_size() for v in plain.values()) / 2**20}
    del plain
    was = bool(bridge.cfg.use_attn_result)
    bridge.set_use_attn_result(True)
    try:
      logits, cache = bridge.run_with_cache(ids)
    finally:
      bridge.set_use_attn_result(was)
  layers = range(bridge.cfg.n_layers)
  out: dict[str, np.ndarray] = {}
  for site, hook in TL_HOOKS.items():
    if "{l}" in hook:
      out[site] = np.stack([cache[hook.format(l=layer)][0].float().numpy() for layer in layers])
    else:
      out[site] = cache[hook][0].float().numpy()
  out["logits"] = logits[0].float().numpy()
  return out, footprint


def _tl_patching(bridge: Any, clean_ids: Sequence[int], corrupted_ids: Sequence[int], metric: Metric,
                 patch: Callable[..., Any], hook_suffix: str, index: list[tuple[int, ...]],
                 columns: list[str]) -> tuple[np.ndarray, float]:
  """One TransformerLens patching utility over the cells `index` (one DataFrame row each, layer first), warmed on
  one cell: (metric [cells], seconds of the clean cache plus every patched forward)."""
  import pandas as pd
  import torch

  clean, corrupted = torch.tensor([list(clean_ids)]), torch.tensor([list(corrupted_ids)])
  index_df = pd.DataFrame(index, columns=columns)

  def run(cells: pd.DataFrame) -> Any:
    # Only the patched activation is cached from the clean run: what a careful user does, and the peer's best.
    _, clean_cache = bridge.run_with_cache(clean, names_filter=lambda name: name.endswith(hook_suffix))
    # index_df with index_axis_names=None: the utility's partial sets index_axis_names, which excludes index_df.
    return patch(bridge, corrupted, clean_cache, metric, index_axis_names=None, index_df=cells)

  with torch.no_grad():
    run(index_df.iloc[:1])  # warm
    start = time.perf_counter()
    values = run(index_df)
    seconds = time.perf_counter() - start
  return values.float().numpy(), seconds


def tl_head_position_patching(bridge: Any, clean_ids: Sequence[int], corrupted_ids: Sequence[int], metric: Metric,
                              layers: Sequence[int] | None = None) -> tuple[np.ndarray, float, int]:
  """Every (layer, position, head)'s `hook_z` patched from the clean run into the corrupted one, one forward each,
  by TransformerLens' own `patching.get_act_patch_attn_head_out_by_pos`.

  Args:
    bridge: from `tl_bridge`.
    clean_ids, corrupted_ids: the two prompts' token ids [S] (one length).
    metric: logits -> scalar tensor, as TransformerLens takes it (`logit_difference`).
    layers: the layers to patch (all by default): a subset times a part, to extrapolate per patch.
  Returns:
    (metric [L', S, H], seconds of the clean cache and every patched forward, patches run).
  """
  from transformer_lens import patching

  layers = _chosen_layers(bridge.cfg.n_layers, layers)
  tokens, heads = len(corrupted_ids), bridge.cfg.n_heads
  index = [(layer, p, h) for layer in layers for p in range(tokens) for h in range(heads)]
  values, seconds = _tl_patching(bridge, clean_ids, corrupted_ids, metric, patching.get_act_patch_attn_head_out_by_pos,
                                 "attn.hook_z", index, ["layer", "pos", "head"])
  return values.reshape(len(layers), tokens, heads), seconds, len(index)


def tl_resid_pre_patching(bridge: Any, clean_ids: Sequence[int], corrupted_ids: Sequence[int], metric: Metric,
                          layers: Sequence[int] | None = None) -> tuple[np.ndarray, float, int]:
  """Every (layer, position)'s `hook_resid_pre` patched from the clean run, one forward each, by TransformerLens'
  `patching.get_act_patch_resid_pre`. Arguments as `tl_head_position_patching`.

  Returns:
    (metric [L', S], seconds of the clean cache and every patched forward, patches run).
  """
  from transformer_lens import patching

  layers = _chosen_layers(bridge.cfg.n_layers, layers)
  tokens = len(corrupted_ids)
  index = [(layer, p) for layer in layers for p in range(tokens)]
  values, seconds = _tl_patching(bridge, clean_ids, corrupted_ids, metric, patching.get_act_patch_resid_pre,
                                 "hook_resid_pre", index, ["layer", "pos"])
  return values.reshape(len(layers), tokens), seconds, len(index)


def tl_attribution_patching(bridge: Any, clean_ids: Sequence[int], corrupted_ids: Sequence[int],
                            metric: Metric) -> tuple[np.ndarray, float]:
  """Attribution patching (AtP) of every head at every position with TransformerLens hooks: the linear estimate of
  patching `hook_z` from the clean run into the corrupted one, sum over Dh of (z_clean - z_corrupted) * d metric /
  d z at the corrupted run. Warmed by one untimed run.

  Args:
    bridge: from `tl_bridge`.
    clean_ids, corrupted_ids: the two prompts' token ids [S].
    metric: logits -> scalar tensor (`logit_difference`).
  Returns:
    (estimate [L, S, H], seconds of the clean cache, the corrupted forward and the backward).
  """
  import torch

  clean, corrupted = torch.tensor([list(clean_ids)]), torch.tensor([list(corrupted_ids)])
  names = [f"blocks.{layer}.attn.hook_z" for layer in range(bridge.cfg.n_layers)]

  def run() -> np.ndarray:
    with torch.no_grad():
      _, clean_cache = bridge.run_with_cache(clean, names_filter=names)
    z_corrupted: dict[str, Any] = {}
    grads: dict[str, Any] = {}

    # Keyed by the name the hook was added under: `hook.name` is the bridge's own (`attn.o.hook_in`), hook_z an alias.
    def keep(store: dict[str, Any], name: str) -> Callable[[Any, Any], None]:
      return lambda value, hook: store.__setitem__(name, value.detach())

    with torch.enable_grad(), bridge.hooks(fwd_hooks=[(n, keep(z_corrupted, n)) for n in names],
                                           bwd_hooks=[(n, keep(grads, n)) for n in names]):
      metric(bridge(corrupted)).backward()
    bridge.zero_grad(set_to_none=True)
    return torch.stack([((clean_cache[n] - z_corrupted[n]) * grads[n]).sum(-1)[0] for n in names]).numpy()

  run()  # warm
  start = time.perf_counter()
  estimate = run()
  return estimate, time.perf_counter() - start


def nnsight_head_position_patching(hf_model: Any, clean_ids: Sequence[int], corrupted_ids: Sequence[int],
                                   metric_columns: tuple[int, int], layers: Sequence[int] | None = None,
                                   invokes_per_trace: int = 180, *, tokenizer: Any) -> tuple[np.ndarray, float, int]:
  """Every (layer, position, head) patched with nnsight: head h's slice of layer l's `o_proj` input at position p
  set to its value in the clean run, `invokes_per_trace` patches as the invokes of one trace (one batched forward,
  nnsight's fastest form), each reading logit[io] - logit[s] at the last position. Warmed by one untimed trace of
  two invokes.

  Args:
    hf_model: a `transformers` Llama-family causal LM (float32, eager attention; `model.layers[l].self_attn.o_proj`),
      used as it is: nnsight wraps it without changing its outputs.
    clean_ids, corrupted_ids: the two prompts' token ids [S] (one length).
    metric_columns: the (indirect object, subject) token ids.
    layers: the layers to patch (all by default).
    invokes_per_trace: patches per trace; 1 is one trace a patch.
    tokenizer: the model's tokenizer: nnsight cannot wrap a model object without one, though the prompts are ids.
  Returns:
    (metric [L', S, H], seconds of the clean trace and every patching trace, patches run).
  """
  import warnings

  import torch
  from nnsight import LanguageModel

  with warnings.catch_warnings():  # 0.8.1 names TransformersModel(task="text-generation") instead; the same class
    warnings.simplefilter("ignore")
    model = LanguageModel(hf_model, tokenizer=tokenizer)
  config = hf_model.config
  heads = config.num_attention_heads
  head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
  layers = _chosen_layers(config.num_hidden_layers, layers)
  tokens = len(corrupted_ids)
  io, s = (int(c) for c in metric_columns)
  clean, corrupted = torch.tensor([list(clean_ids)]), torch.tensor([list(corrupted_ids)])
  cells = [(layer, p, h) for layer in layers for p in range(tokens) for h in range(heads)]

  def run(cells: list[tuple[int, int, int]]) -> list[float]:
    # nnsight runs a trace's body as Python of its own and hands back only what was `.save()`d: results go into
    # lists made outside the blocks.
    clean_inputs: list[Any] = []
    with model.trace(clean):
      for layer in sorted(set(layers)):  # in the order the forward reaches them
        clean_inputs.append(model.model.layers[layer].self_attn.o_proj.input.save())
    by_layer = dict(zip(sorted(set(layers)), clean_inputs))
    values: list[Any] = []
    for begin in range(0, len(cells), invokes_per_trace):
      with model.trace() as tracer:
        for layer, p, h in cells[begin:begin + invokes_per_trace]:
          with tracer.invoke(corrupted):
            part = slice(h * head_dim, (h + 1) * head_dim)
            model.model.layers[layer].self_attn.o_proj.input[:, p, part] = by_layer[layer][:, p, part]
            logits = model.lm_head.output
            values.append((logits[0, -1, io] - logits[0, -1, s]).save())
    return [float(v) for v in values]

  with torch.no_grad():
    run(cells[:2])  # warm
    start = time.perf_counter()
    values = run(cells)
    seconds = time.perf_counter() - start
  return np.asarray(values, np.float32).reshape(len(layers), tokens, heads), seconds, len(cells)
