"""What the model says for these prompts under these masks: `jaxloc.load(spec)` / `jaxloc.from_hf(model_or_dir)`
give a `Model` whose every call takes many masks at once.

    import jaxloc
    model = jaxloc.load("smollm2-135m")
    model.logits(["The plural of mouse is"], heads=["L8H1"])            # [1 mask, 1 prompt, tokens, vocab]
    model.logits(prompts, masks=jaxloc.masks.single_heads(model), last=True, top_k=5)  # 270 masks, one call
    model.score(["The plural of mouse is"], [" mice"], masks=jaxloc.masks.random(model, 100))  # [100, 1]
    model.generate(["Once upon a time"], masks=jaxloc.masks.heads(model, "L8H1,L20H5", each=True))  # [2][1] texts
    cache = model.run_with_cache(prompts)          # residual streams, per-head outputs, attention patterns
    cache.pattern("L8H1")                          # [tokens, tokens]
    patched = model.patch(clean, corrupted)        # every head patched from the clean run, in one compiled call

Axes: `masks` M, `prompts` P, `tokens` S, `layers` L, `heads` H, `head_dim` Dh, `embed` D, `mlp` F, `vocab` V,
`top` K. Logits and scores come from the decoder under the masks as data (`forward.py`); `score` and `generate`
run on the engine (packing, shared prefixes, continuous batching).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from jaxloc import masks as masks_lib
from jaxloc.api.forward import Forward, Prompts, Readout, tokenize
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.requests import GenerationRequest, ScoringRequest
from jaxloc.errors import UserError
from jaxloc.units import parse_unit
from jaxloc.masks import MaskSet, Names
from jaxloc.models import checkpoints
from jaxloc.models.config import ModelConfig, config_from_hf
from jaxloc.models.decoder import Transformer
from jaxloc.models.loading import LoadedModel, load_model, load_tokenizer, resolve_dtype

Masks = MaskSet | np.ndarray | None


@dataclasses.dataclass
class TopK:
  """The k likeliest next tokens: tokens int [..., K] and their log-probabilities float [..., K] (leading axes those
  of the logits they come from); `strings` decodes them."""

  tokens: np.ndarray
  logprobs: np.ndarray
  tokenizer: Any = dataclasses.field(repr=False, default=None)

  def strings(self) -> np.ndarray:
    """The tokens as text, object [..., K]."""
    if self.tokenizer is None:
      raise UserError("this model has no tokenizer to decode tokens with")
    flat = [self.tokenizer.decode([int(t)]) for t in self.tokens.reshape(-1)]
    return np.array(flat, object).reshape(self.tokens.shape)


@dataclasses.dataclass
class Cache:
  """A run's activations under every mask (`Model.run_with_cache`), masks first.

  residual: [M, L, P, S, D] the residual stream entering each layer; hidden: [M, P, S, D] after the final norm
    (transformers' `hidden_states` are residual[:, 0..L-1] then hidden).
  heads: [M, L, P, S, H, Dh] each head's output (the `o_proj` input, after the mask).
  neurons: [M, L, P, S, F] MLP neuron values (the `down_proj` input, after the mask).
  attention: [M, L, P, H, S, S] attention probabilities (query, key).
  logits: [M, P, S, V]. tokens: each prompt's ids (positions past a prompt's length are padding). labels: [M].
  """

  residual: np.ndarray
  hidden: np.ndarray
  heads: np.ndarray
  neurons: np.ndarray
  attention: np.ndarray
  logits: np.ndarray
  tokens: list[list[int]]
  labels: list[str]
  config: ModelConfig = dataclasses.field(repr=False)

  def pattern(self, head: str, mask: int = 0, prompt: int = 0) -> np.ndarray:
    """Attention pattern [S, S] (query, key) of one head ("L8H1") for one prompt under one mask, cut to the
    prompt's length."""
    layer, index = parse_unit(head, self.config.num_layers, self.config.num_heads)
    length = len(self.tokens[prompt])
    return self.attention[mask, layer, prompt, index, :length, :length]


@dataclasses.dataclass
class Patching:
  """An activation-patching sweep (`Model.patch`): logits at each prompt's last token when each unit set takes its
  clean-run value in the corrupted run.

  logits: [U, P, V] (or [U, P, T] for the `columns` asked for); clean, corrupted: [P, V] (or [P, T]) unpatched;
  labels: [U] the unit sets ("L8H1").
  """

  logits: np.ndarray
  clean: np.ndarray
  corrupted: np.ndarray
  labels: list[str]

  def recovered(self, metric: np.ndarray, clean: np.ndarray, corrupted: np.ndarray) -> np.ndarray:
    """(metric - corrupted) / (clean - corrupted): 1 where patching restores the clean value, 0 where it changes
    nothing (any metric computed alike on `logits`, `clean` and `corrupted`)."""
    return (metric - corrupted) / np.where(clean == corrupted, np.nan, clean - corrupted)


class Model:
  """A language model to query under many masks at once. `loaded` is the `LoadedModel` (config, params, module,
  tokenizer); `engine` the `Engine` that `score` and `generate` run on (built on first use, with `engine_config`)."""

  def __init__(self, loaded: LoadedModel, engine_config: EngineConfig | None = None):
    self.loaded = loaded
    self._engine_config = engine_config
    self._engine: Engine | None = None
    self._forward = Forward(loaded)

  def __repr__(self) -> str:
    c = self.config
    return (f"Model({self.loaded.name!r}: {c.num_layers} layers x {c.num_heads} heads, "
            f"{c.intermediate_size} neurons per layer, {jnp.dtype(self.loaded.dtype).name})")

  @property
  def config(self) -> ModelConfig:
    return self.loaded.config

  @property
  def tokenizer(self) -> Any:
    return self.loaded.tokenizer

  @property
  def engine(self) -> Engine:
    if self._engine is None:
      self._engine = Engine(self.loaded, self._engine_config)
    return self._engine

  def masks(self, masks: Masks = None, heads: Names | None = None, neurons: Names | None = None) -> MaskSet:
    """The masks of a call (`jaxloc.masks.resolve`)."""
    return masks_lib.resolve(self, masks, heads, neurons)

  def tokens(self, prompts: Prompts) -> list[list[int]]:
    """Each prompt's token ids, as every call reads them."""
    return tokenize(self.loaded, prompts)[1]

  def logits(self, prompts: Prompts, masks: Masks = None, *, heads: Names | None = None,
             neurons: Names | None = None, last: bool = False, top_k: int | None = None) -> np.ndarray | TopK:
    """Logits float32 [M, P, S, V] of every prompt under every mask (S the longest prompt; a shorter prompt's
    positions past its end are padding), or [M, P, V] at each prompt's last token with `last`; with `top_k`, the
    k likeliest tokens and their log-probabilities instead (`TopK`, [M, P, (S,) K]).

    masks: a `jaxloc.masks` MaskSet or head keep-masks [M, L, H]; heads / neurons: names of the units one mask
    ablates ("L8H1,L20H5"); none of them: the unablated model (M = 1)."""
    if top_k is not None and not 1 <= top_k <= self.config.vocab_size:
      raise UserError(f"top_k={top_k} must be between 1 and the vocabulary size {self.config.vocab_size}")
    batch, _ = tokenize(self.loaded, prompts)
    out = self._forward.run(batch, self.masks(masks, heads, neurons), Readout(last=last, top_k=top_k))
    if top_k is not None:
      return TopK(out["top_tokens"], out["top_logprobs"], self.tokenizer)
    return out["logits"]

  def score(self, prompts: Sequence[str], continuations: Sequence[str], masks: Masks = None, *,
            heads: Names | None = None, neurons: Names | None = None, exact: bool = False) -> np.ndarray:
    """Log-probability float32 [M, P] of each continuation after its prompt (summed over its tokens, teacher
    forced), under every mask.

    exact: each mask's scores bit for bit the same whatever other masks share the call (one mask alone, or among
    hundreds): every compiled call then runs the layout's full number of masks, padding a short one with unablated
    masks, so a call of one mask costs as much as a full call. Without it, the last call of a few masks may take a
    smaller compiled size, whose kernels can round differently (float32 rounding)."""
    if isinstance(prompts, str) or isinstance(continuations, str):
      raise UserError("score takes lists: prompts=[...], continuations=[...] (one continuation per prompt)")
    if len(prompts) != len(continuations):
      raise UserError(f"{len(prompts)} prompts but {len(continuations)} continuations; give one per prompt")
    chosen = self.masks(masks, heads, neurons)
    requests = [ScoringRequest(p, c) for p, c in zip(prompts, continuations)]
    return self.engine.score(requests, chosen.heads, neuron_masks=chosen.neurons, exact=exact).logprob

  def generate(self, prompts: Sequence[str], masks: Masks = None, *, heads: Names | None = None,
               neurons: Names | None = None, max_new_tokens: int = 32, stop: Sequence[str] = ()
               ) -> list[list[str]]:
    """Greedy continuations [M][P] of every prompt under every mask, cut at the first of `stop` (continuous
    batching, the prompts' shared prefix computed once per mask)."""
    if isinstance(prompts, str):
      prompts = [prompts]
    chosen = self.masks(masks, heads, neurons)
    requests = [GenerationRequest(p, tuple(stop), max_new_tokens) for p in prompts]
    return self.engine.generate(requests, chosen.heads, neuron_masks=chosen.neurons)

  def run_with_cache(self, prompts: Prompts, masks: Masks = None, *, heads: Names | None = None,
                     neurons: Names | None = None) -> Cache:
    """Every layer's residual stream, per-head outputs, neuron values and attention patterns, and the logits, of
    every prompt under every mask (`Cache`)."""
    batch, ids = tokenize(self.loaded, prompts)
    chosen = self.masks(masks, heads, neurons)
    out = self._forward.run(batch, chosen, Readout(capture=True))
    return Cache(out["residual"], out["hidden"], out["heads"], out["neurons"], out["attention"], out["logits"], ids,
                 chosen.labels, self.config)

  def patch(self, clean: Prompts, corrupted: Prompts, units: MaskSet | Names | None = None, *,
            columns: Sequence[int] | None = None) -> Patching:
    """Activation patching, every unit set of a sweep in one compiled call: for each set of `units` (default every
    head alone, `jaxloc.masks.single_heads`; names "L8H1,L3N117" one set each; or a MaskSet, whose ablated units
    form each set), the corrupted prompts run with those units' outputs replaced, at every position, by their
    outputs on the clean prompt of the same pair. Clean and corrupted prompts pair up by index and must have the
    same number of tokens. `columns`: return only these vocabulary columns (e.g. the answers' token ids)."""
    clean_batch, clean_ids = tokenize(self.loaded, clean)
    corrupted_batch, corrupted_ids = tokenize(self.loaded, corrupted)
    if len(clean_ids) != len(corrupted_ids):
      raise UserError(f"{len(clean_ids)} clean prompts but {len(corrupted_ids)} corrupted ones; pair them up")
    unequal = [i for i, (a, b) in enumerate(zip(clean_ids, corrupted_ids)) if len(a) != len(b)]
    if unequal:
      i = unequal[0]
      raise UserError(f"clean and corrupted prompts must have the same number of tokens to patch position by "
                      f"position: pair {i} has {len(clean_ids[i])} and {len(corrupted_ids[i])} (pairs {unequal})")
    if units is None:
      sets = masks_lib.single_heads(self)
    elif isinstance(units, MaskSet):
      sets = units
    else:
      names = [n.strip() for n in units.split(",") if n.strip()] if isinstance(units, str) else list(units)
      sets = masks_lib.MaskSet(None, None, [])
      for name in names:
        sets = sets + (masks_lib.neurons(self, [name]) if "N" in name else masks_lib.heads(self, [name]))
    readout = Readout(last=True, columns=columns is not None)
    unablated = masks_lib.none(self)
    captured = self._forward.run(clean_batch, unablated, Readout(last=True, columns=columns is not None,
                                                                 capture=True), columns=columns)
    # The clean run's outputs per position, laid out as the decoder's fills: [L, P, S, H, Dh] and [L, P, S, F].
    head_fill, neuron_fill = captured["heads"][0], captured["neurons"][0]
    corrupted_logits = self._forward.run(corrupted_batch, unablated, readout, columns=columns)["logits"][0]
    patched = self._forward.run(corrupted_batch, sets, readout, head_fill=head_fill, neuron_fill=neuron_fill,
                                columns=columns)["logits"]
    return Patching(patched, captured["logits"][0], corrupted_logits, sets.labels)


def load(spec: str, *, dtype: Any = None, engine_config: EngineConfig | None = None, **options: Any) -> Model:
  """The model `spec` names (an alias such as "smollm2-135m", a .gguf file, an HF directory or hub id,
  random:<preset>), as a `Model`; `dtype` "float32"/"bfloat16" (default: float32 on CPU, bfloat16 on
  accelerators); `options` go to `jaxloc.load_model` (cache_dir, ...)."""
  return Model(load_model(spec, dtype=dtype, **options), engine_config)


def from_hf(model_or_dir: Any, *, tokenizer: Any = None, dtype: Any = None,
            engine_config: EngineConfig | None = None) -> Model:
  """A `Model` from a `transformers` causal LM in memory (its weights converted, not saved) or an HF model
  directory. An in-memory model's tokenizer is `tokenizer`, else the one saved beside it (`name_or_path`), else
  none (prompts then go in as token ids)."""
  if isinstance(model_or_dir, str):
    loaded = load_model(model_or_dir, dtype=dtype)
    if tokenizer is not None:
      loaded.tokenizer = tokenizer
    return Model(loaded, engine_config)
  hf_config = getattr(model_or_dir, "config", None)
  if hf_config is None or not hasattr(model_or_dir, "state_dict"):
    raise UserError(f"from_hf takes a transformers model or an HF model directory, not {type(model_or_dir).__name__}")
  config = config_from_hf(hf_config.to_dict())
  dtype = resolve_dtype(dtype)
  state = model_or_dir.state_dict()

  def tensor(name: str) -> np.ndarray:
    return state[name].detach().float().cpu().numpy()

  params = checkpoints.convert_hf_tensors(config, tensor, set(state), dtype)
  if tokenizer is None:
    tokenizer = _saved_tokenizer(getattr(model_or_dir, "name_or_path", ""))
  name = getattr(model_or_dir, "name_or_path", "") or type(model_or_dir).__name__
  loaded = LoadedModel(name, config, params, Transformer(config, param_dtype=dtype), tokenizer, dtype,
                       "transformers model in memory")
  return Model(loaded, engine_config)


def _saved_tokenizer(path: str) -> Any:
  if not path or not os.path.isdir(path):
    return None
  try:
    return load_tokenizer("hf_dir", path)
  except (OSError, ValueError):
    return None
