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
from jaxloc.api import interventions as interventions_lib
from jaxloc.api.cache import Cache, blank_padding
from jaxloc import checks
from jaxloc.api import patching, readouts
from jaxloc.api.forward import Batch, Forward, Prompts, Readout, tokenize
from jaxloc.api.gradients import Gradients
from jaxloc.api.patching import Patching
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.requests import GenerationRequest, Sampling, ScoringRequest
from jaxloc.errors import UserError
from jaxloc.units import parse_unit
from jaxloc.masks import MaskSet, Names
from jaxloc.models import checkpoints
from jaxloc.models import sites as sites_lib
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


class Model:
  """A language model to query under many masks at once. `loaded` is the `LoadedModel` (config, params, module,
  tokenizer); `engine` the `Engine` that `score` and `generate` run on (built on first use, with `engine_config`)."""

  def __init__(self, loaded: LoadedModel, engine_config: EngineConfig | None = None):
    self.loaded = loaded
    self._engine_config = engine_config
    self._engine: Engine | None = None
    self._forward = Forward(loaded)
    self._gradients = Gradients(loaded)

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
             neurons: Names | None = None, last: bool = False, top_k: int | None = None,
             columns: Sequence[int] | None = None, interventions: Sequence[Any] | None = None
             ) -> np.ndarray | TopK:
    """Logits of every prompt under every row: the masks, or the intervention rows.

    Args:
      prompts: strings, or token-id lists.
      masks: a `jaxloc.masks` MaskSet or head keep-masks [M, L, H]; heads / neurons: names of the units one mask
        ablates ("L8H1,L20H5"); none of them: the unablated model (M = 1).
      last: each prompt's last token only.
      top_k: the k likeliest tokens and their log-probabilities instead (`TopK`).
      columns: these vocabulary columns only (e.g. the answers' token ids).
      interventions: rows of `jaxloc.interventions` (each one intervention or a list applied together, in its
        order), M of them, in few compiled calls (rows grouped by the first layer and token they touch); with masks,
        one mask for every row or one per row.

    Returns:
      float32 [M, P, S, V] (S the longest prompt; a shorter prompt's positions past its end hold NaN, never a
      padding token's logits), [M, P, V] with `last`, [..., T] with `columns`; with `top_k` a `TopK` [M, P, (S,) K].
    """
    if top_k is not None and not 1 <= top_k <= self.config.vocab_size:
      raise UserError(f"top_k={top_k} must be between 1 and the vocabulary size {self.config.vocab_size}")
    batch, _ = tokenize(self.loaded, prompts)
    if columns is not None:
      columns = checks.check_columns(columns, self.config.vocab_size)
    chosen, edits = self._rows(batch, masks, heads, neurons, interventions)
    out = self._forward.run(batch, chosen, Readout(last=last, top_k=top_k, columns=columns is not None),
                            columns=columns, edits=edits, resume=bool(edits))
    if top_k is not None:
      tokens_, logprobs = out["top_tokens"], out["top_logprobs"]
      if not last:
        tokens_ = tokens_[:, :, :batch.width]
        logprobs = blank_padding(logprobs[:, :, :batch.width], "P S V", batch.lengths, 1)
      return TopK(tokens_, logprobs, self.tokenizer)
    logits = out["logits"]
    return logits if last else blank_padding(logits[:, :, :batch.width], "P S V", batch.lengths, 1)

  def _rows(self, batch: Batch, masks: Masks, heads: Names | None, neurons: Names | None,
            interventions: Sequence[Any] | None) -> tuple[MaskSet, tuple]:
    """The masks and site edits of a call's rows: the masks alone, or intervention rows (with one mask for all, or
    one mask per row)."""
    chosen = self.masks(masks, heads, neurons)
    if interventions is None:
      return chosen, ()
    edits, labels = interventions_lib.compile_rows(interventions, self.config, batch.lengths, batch.ids.shape[1])
    if len(chosen) == 1:
      chosen = chosen[np.zeros(len(labels), int)]
    elif len(chosen) != len(labels):
      raise UserError(f"{len(chosen)} masks for {len(labels)} intervention rows: give one mask, or one per row")
    return MaskSet(chosen.heads, chosen.neurons, labels if masks is None and heads is None and neurons is None
                   else [f"{m} | {r}" for m, r in zip(chosen.labels, labels)]), edits

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
    checks.require_prompts(prompts)
    checks.check_texts(list(prompts) + list(continuations))
    chosen = self.masks(masks, heads, neurons)
    requests = [ScoringRequest(p, c) for p, c in zip(prompts, continuations)]
    return self.engine.score(requests, chosen.heads, neuron_masks=chosen.neurons, exact=exact).logprob

  def generate(self, prompts: Sequence[str], masks: Masks = None, *, heads: Names | None = None,
               neurons: Names | None = None, max_new_tokens: int = 32, stop: Sequence[str] = (),
               temperature: float = 0.0, top_k: int | None = None, top_p: float = 1.0, seed: int = 0
               ) -> list[list[str]]:
    """Continuations of every prompt under every mask, cut at the first of `stop` (continuous batching, the prompts'
    shared prefix computed once per mask): greedy at temperature 0, else sampled in the compiled decode step.

    A sampled row's draws depend on the seed, its mask's index, its prompt's index and the token's index alone
    (`jaxloc.engine.requests.Sampling`): the same seed gives the same texts, and a row's text does not change with
    the other masks or prompts in the call, nor with how the engine batches them.

    Args:
      prompts: the prompts (a string is one prompt).
      masks, heads, neurons: the masks, as `logits` takes them.
      max_new_tokens: at most this many new tokens per continuation, at least 1.
      stop: strings that end a continuation (cut off before the first).
      temperature: 0 for greedy decoding, else the softmax temperature of the draws.
      top_k: sample among the k likeliest tokens only (None: all).
      top_p: then among the smallest set of the likeliest whose probability reaches top_p (1: all).
      seed: the draws' seed, an int in [0, 2**32).

    Returns:
      texts [M][P].
    """
    if isinstance(prompts, str):
      prompts = [prompts]
    checks.require_prompts(prompts)
    checks.check_texts(prompts)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
      raise UserError(f"max_new_tokens={max_new_tokens!r} must be an int at least 1")
    sampling = Sampling(temperature, top_k, top_p, seed).check_vocab(self.config.vocab_size)
    if self.tokenizer is not None:
      lengths = [len(ids) for ids in self.tokenizer(list(prompts))["input_ids"]]
      checks.warn_past_positions(lengths, self.config.max_position_embeddings, new_tokens=int(max_new_tokens),
                                 stacklevel=3)
    chosen = self.masks(masks, heads, neurons)
    requests = [GenerationRequest(p, tuple(stop), int(max_new_tokens), sampling=sampling) for p in prompts]
    return self.engine.generate(requests, chosen.heads, neuron_masks=chosen.neurons)

  def run_with_cache(self, prompts: Prompts, masks: Masks = None, *, heads: Names | None = None,
                     neurons: Names | None = None, names: Any = None, interventions: Sequence[Any] | None = None
                     ) -> Cache:
    """The named activations of every prompt under every row (masks, or intervention rows), in one pass.

    Args:
      prompts, masks, heads, neurons, interventions: as `logits` takes them.
      names: which sites to keep (`jaxloc.models.sites.SITES`): a site ("z"), a TransformerLens name
        ("blocks.8.attn.hook_z": that layer only), a glob pattern ("resid_*"), a list of those, or a callable on
        site names; None keeps every site. Only what is asked is computed and returned.

    Returns:
      a `Cache`: each site [M, L, P, S, ...] on real tokens (NaN past a shorter prompt's end), with `lengths`.
    """
    batch, ids = tokenize(self.loaded, prompts)
    try:
      wanted = sites_lib.resolve_names(names, self.config.num_layers)
    except ValueError as e:
      raise UserError(str(e)) from None
    chosen, edits = self._rows(batch, masks, heads, neurons, interventions)
    readout = Readout(last="logits" not in wanted, sites=tuple(sorted(n for n in wanted if n != "logits")))
    out = self._forward.run(batch, chosen, readout, edits=edits)
    values, layers = {}, {}
    for name, held in wanted.items():
      value = out[name] if name != "logits" else out["logits"]
      site = sites_lib.SITES[name]
      if site.per_layer:
        layers[name] = held if held is not None else tuple(range(self.config.num_layers))
        value = value[:, list(layers[name])]
      cut = [slice(None)] * value.ndim
      leading = 2 if site.per_layer else 1
      for i, axis in enumerate(site.axes.split()):
        if axis == "S":
          cut[leading + i] = slice(0, batch.width)
      values[name] = blank_padding(value[tuple(cut)], site.axes, batch.lengths, leading)
    return Cache(values, layers, ids, batch.lengths, chosen.labels, self.config)

  def patch(self, clean: Prompts, corrupted: Prompts, units: MaskSet | Names | None = None, *,
            columns: Sequence[int] | None = None) -> Patching:
    """Activation patching, every unit set of a sweep in one compiled call: for each set of `units` (default every
    head alone, `jaxloc.masks.single_heads`; names "L8H1,L3N117" one set each; or a MaskSet, whose ablated units
    form each set), the corrupted prompts run with those units' outputs replaced, at every position, by their
    outputs on the clean prompt of the same pair. Clean and corrupted prompts pair up by index and must have the
    same number of tokens. `columns`: return only these vocabulary columns (e.g. the answers' token ids)."""
    clean_batch, corrupted_batch = patching.paired(self, clean, corrupted)
    if units is None:
      sets = masks_lib.single_heads(self)
    elif isinstance(units, MaskSet):
      sets = units
    else:
      names: list[Any] = [n.strip() for n in units.split(",") if n.strip()] if isinstance(units, str) else \
          [units] if isinstance(units, tuple) and len(units) == 2 and all(isinstance(x, int) for x in units) \
          else list(units)
      sets = masks_lib.MaskSet(None, None, [])
      for name in names:  # a (layer, index) pair is a head
        neuron = isinstance(name, str) and "N" in name
        sets = sets + (masks_lib.neurons(self, [name]) if neuron else masks_lib.heads(self, [name]))
    sets = masks_lib.checked(self, sets)
    if columns is not None:
      columns = checks.check_columns(columns, self.config.vocab_size)
    readout = Readout(last=True, columns=columns is not None)
    unablated = masks_lib.none(self)
    captured = self._forward.run(clean_batch, unablated, Readout(last=True, columns=columns is not None,
                                                                 sites=("mlp_post", "z")), columns=columns)
    # The clean run's outputs per position, laid out as the decoder's fills: [L, P, S, H, Dh] and [L, P, S, F].
    head_fill, neuron_fill = captured["z"][0], captured["mlp_post"][0]
    corrupted_logits = self._forward.run(corrupted_batch, unablated, readout, columns=columns)["logits"][0]
    patched = self._forward.run(corrupted_batch, sets, readout, head_fill=head_fill, neuron_fill=neuron_fill,
                                columns=columns)["logits"]
    return Patching(patched, captured["logits"][0], corrupted_logits, sets.labels)


  def patch_by_position(self, clean: Prompts, corrupted: Prompts, site: str = "z", *,
                        layers: Sequence[int] | None = None, positions: Sequence[int] | None = None,
                        each_unit: bool = True, columns: Sequence[int] | None = None,
                        skip_unchanged: bool = True) -> Patching:
    """Activation patching of every (layer, position, unit) of `site` alone, clean into corrupted, in few compiled
    calls (TransformerLens' `get_act_patch_attn_head_out_by_pos` for `z`, `get_act_patch_resid_pre` for
    `resid_pre`).

    Args:
      clean, corrupted: prompts that pair up, all of one token length.
      site: an editable site (`jaxloc.models.sites.EDITABLE`).
      layers, positions: the cells to patch (default all; negative positions from the end).
      each_unit: one cell per head (or KV head, neuron) of a site that has units; False patches them together.
      columns: keep only these vocabulary columns of the patched logits.
      skip_unchanged: a cell whose clean value equals its corrupted one bit for bit (a token before the first that
        differs) patches nothing; its logits are the corrupted run's without running it. False runs every cell.

    Returns:
      a `Patching` whose `grid` is {"layer", "position"[, "head"]}; `metric(LogitDiff(...))` lays a metric out so.
    """
    return patching.by_position(self, clean, corrupted, site, layers=layers, positions=positions,
                                each_unit=each_unit, columns=columns, skip_unchanged=skip_unchanged)

  def path_patch(self, clean: Prompts, corrupted: Prompts, senders: Names, receivers: Names | None = None,
                 receiver_site: str = "q", *, columns: Sequence[int] | None = None) -> Patching:
    """Path patching from each sender head to the receiver heads' `receiver_site` (q, k or v), or to the logits
    directly (no receivers): `jaxloc.api.patching.path`. One row per sender."""
    return patching.path(self, clean, corrupted, senders, receivers, receiver_site, columns)

  def attribution_patch(self, clean: Prompts, corrupted: Prompts, metric: Any, site: str = "z"
                        ) -> tuple[np.ndarray, dict[str, list[int]]]:
    """Attribution patching: the linear estimate [L, S, U] of patching every (layer, position, unit) of `site`,
    from one forward and one backward pass (`jaxloc.api.patching.attribution`); with its grid."""
    return patching.attribution(self, clean, corrupted, metric, site)

  def gradients(self, prompts: Prompts, metric: Any, sites: Sequence[str] = ("z",), masks: Masks = None, *,
                heads: Names | None = None, neurons: Names | None = None) -> tuple[float, dict[str, np.ndarray]]:
    """A metric of the last tokens' logits and its gradients with respect to sites, in one forward and backward.

    Args:
      prompts: the prompts.
      metric: a hashable function of logits [P, V] (each prompt's last token) returning a scalar, written with
        jax.numpy (e.g. `jaxloc.LogitDiff`).
      sites: editable sites (`jaxloc.models.sites.EDITABLE`).
      masks, heads, neurons: one mask to run under (default: the unablated model).

    Returns:
      (the metric, {site: gradient [L, P, S, ...], the site's axes}).
    """
    batch, _ = tokenize(self.loaded, prompts)
    chosen = self.masks(masks, heads, neurons)
    if len(chosen) != 1:
      raise UserError(f"gradients run under one mask, not {len(chosen)}")
    return self._gradients.run(batch, None if chosen.heads is None else chosen.heads[0],
                               None if chosen.neurons is None else chosen.neurons[0], metric, list(sites))

  def logit_lens(self, cache: Cache, site: str = "resid_post", *, columns: Sequence[int] | None = None
                 ) -> np.ndarray:
    """Every held layer's residual stream through the final norm and the unembedding: logits [M, L, P, S, V]
    (`jaxloc.api.readouts.logit_lens`)."""
    return readouts.logit_lens(self.loaded, cache, site, columns)

  def direct_logit_attribution(self, cache: Cache, tokens: Sequence[int], position: int = -1
                               ) -> dict[str, np.ndarray]:
    """Each component's share of the logit of `tokens` (one per prompt) at `position`: embed, each head, each
    layer's attention and MLP (`jaxloc.api.readouts.direct_logit_attribution`)."""
    return readouts.direct_logit_attribution(self.loaded, cache, tokens, position)


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
