"""Named sites and interventions (`run_with_cache(names=...)`, `jaxloc.interventions`) and what is built on them
(`patch_by_position`, `path_patch`, `attribution_patch`, `gradients`, `logit_lens`, `direct_logit_attribution`)
against transformers' eager Llama with PyTorch hooks on its modules, on a tiny random model: every site against the
module it names, every operation against a hook doing the same, each sweep against one hooked forward per cell."""

import numpy as np
import pytest

import jaxloc
from jaxloc import interventions as iv
from jaxloc.errors import UserError
from jaxloc.models import sites as sites_lib
from tests.api.test_model import TOLERANCE, _torch_run, gap, model, torch_model  # noqa: F401  (fixtures)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.heavy  # compiles the tiny model a few dozen times (2-3 minutes on 2 busy cores)

PROMPTS = ["The plural of mouse is", "When Mary and John went to the store, John gave a drink to"]  # 5 and 14 tokens
# Pairs of one token length (11 each): the clean run names the indirect object, the corrupted one repeats it.
CLEAN = ["When Mary and John went out, John gave it to", "When Tom and Anna went out, Tom gave it to"]
CORRUPTED = ["When Mary and John went out, Mary gave it to", "When Tom and Anna went out, Anna gave it to"]
# Pairs of two lengths (11 and 5 tokens), for edits whose negative positions count from each prompt's end.
MIXED_CLEAN = ["When Mary and John went out, John gave it to", "The plural of mouse is"]
MIXED = ["When Mary and John went out, Mary gave it to", "The plural of house is"]
REFERENCE = ["The cat sat on the", "When Tom and Anna went out, Tom gave it to"]  # a mean's prompts (5 and 11)


def _token(model, word: str) -> int:
  (ids,) = model.tokens([word])
  assert len(ids) == 1, (word, ids)
  return ids[0]


def _close(ours, reference) -> float:
  """`gap` of two arrays that must hold NaN at the same places (a shorter prompt's padding)."""
  ours, reference = np.asarray(ours), np.asarray(reference)
  assert ours.shape == reference.shape
  assert np.array_equal(np.isnan(ours), np.isnan(reference))
  return gap(np.nan_to_num(ours), np.nan_to_num(reference))


def _hooked(torch_model, ids, pre=(), post=()) -> np.ndarray:
  """Logits [B, S, V] of token ids (one prompt's list, or a [B, S] tensor) with forward pre-hooks `pre` and forward
  hooks `post`, each (module, hook), in place for this forward only."""
  handles = [m.register_forward_pre_hook(h) for m, h in pre] + [m.register_forward_hook(h) for m, h in post]
  try:
    with torch.no_grad():
      return torch_model(ids if torch.is_tensor(ids) else torch.tensor([ids])).logits.numpy()
  finally:
    for handle in handles:
      handle.remove()


def _input(edit):
  """A forward pre-hook whose module reads edit(a copy of its first input) instead."""
  def hook(module, args):
    return (edit(args[0].clone()),) + tuple(args[1:])
  return hook


def _output(edit):
  """A forward hook whose module returns edit(a copy of its output) instead."""
  def hook(module, args, output):
    return edit(output.clone())
  return hook


def _torch_sites(torch_model, ids) -> tuple[dict, np.ndarray]:
  """Every site of one prompt as hooks on transformers' modules read it: {(site, layer or None): [S, ...]} (the
  projections flat, [S, H * Dh]), and the logits [S, V]."""
  inner = torch_model.model
  found: dict = {}

  def keep(name, layer, read):
    def hook(module, args, output=None):
      found[name, layer] = read(args, output)[0].detach().clone().numpy()  # a batch of one
    return hook

  first_input, output = (lambda a, o: a[0]), (lambda a, o: o)
  pre, post = [], [(inner.embed_tokens, keep("embed", None, output)), (inner.norm, keep("final", None, output))]
  for layer, block in enumerate(inner.layers):
    attn, mlp = block.self_attn, block.mlp
    pre += [(block, keep("resid_pre", layer, first_input)), (attn.o_proj, keep("z", layer, first_input)),
            (block.post_attention_layernorm, keep("resid_mid", layer, first_input)),
            (mlp.down_proj, keep("mlp_post", layer, first_input))]
    post += [(attn.q_proj, keep("q", layer, output)), (attn.k_proj, keep("k", layer, output)),
             (attn.v_proj, keep("v", layer, output)), (attn.o_proj, keep("attn_out", layer, output)),
             (mlp.gate_proj, keep("mlp_pre", layer, output)), (mlp, keep("mlp_out", layer, output)),
             (block, keep("resid_post", layer, output))]
  handles = [m.register_forward_pre_hook(h) for m, h in pre] + [m.register_forward_hook(h) for m, h in post]
  try:
    out = _torch_run(torch_model, ids, output_hidden_states=True, output_attentions=True)
  finally:
    for handle in handles:
      handle.remove()
  for layer in range(len(inner.layers)):
    found["hidden_states", layer] = out.hidden_states[layer][0].numpy()
    found["attentions", layer] = out.attentions[layer][0].numpy()
  return found, out.logits[0].numpy()


def _torch_scores(torch_model, q, k) -> np.ndarray:
  """Scaled scores [H, S, S] (query x key) from the q/k projections [S, H * Dh] and [S, K * Dh], rotated as
  transformers' Llama rotates them."""
  from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

  c = torch_model.config
  heads, kv_heads, n = c.num_attention_heads, c.num_key_value_heads, q.shape[0]
  head_dim = c.hidden_size // heads
  q = torch.tensor(q).view(1, n, heads, head_dim).transpose(1, 2)
  k = torch.tensor(k).view(1, n, kv_heads, head_dim).transpose(1, 2)
  with torch.no_grad():
    cos, sin = torch_model.model.rotary_emb(q, torch.arange(n)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
  k = k.repeat_interleave(heads // kv_heads, dim=1)  # head h reads KV head h // G
  return (q @ k.transpose(-1, -2))[0].numpy() * head_dim**-0.5


def test_every_site_matches_hooks_on_the_transformers_modules(model, torch_model):
  cache = model.run_with_cache(PROMPTS)
  c = model.config
  heads, kv_heads, head_dim, hidden = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
  assert set(cache.keys()) == set(sites_lib.SITES) and list(cache.lengths) == [5, 14]
  assert cache["z"].shape == (1, c.num_layers, 2, 14, heads, head_dim)
  assert cache["pattern"].shape == (1, c.num_layers, 2, heads, 14, 14)
  assert cache["logits"].shape == (1, 2, 14, c.vocab_size)
  for p, ids in enumerate(cache.tokens):
    n = len(ids)
    ref, logits = _torch_sites(torch_model, ids)
    for site in ("embed", "final"):
      assert gap(cache.get(site, prompt=p), ref[site, None]) < TOLERANCE, site
    assert gap(cache.get("logits", prompt=p), logits) < TOLERANCE
    for layer in range(c.num_layers):
      z = ref["z", layer].reshape(n, heads, head_dim)
      o_proj = torch_model.model.layers[layer].self_attn.o_proj.weight.detach().numpy()  # [D, H * Dh]
      expected = {
          "resid_pre": ref["hidden_states", layer], "q": ref["q", layer].reshape(n, heads, head_dim),
          "k": ref["k", layer].reshape(n, kv_heads, head_dim), "v": ref["v", layer].reshape(n, kv_heads, head_dim),
          "pattern": ref["attentions", layer], "z": z,
          "head_out": np.einsum("shd,ehd->she", z, o_proj.reshape(hidden, heads, head_dim)),
          "attn_out": ref["attn_out", layer], "resid_mid": ref["resid_mid", layer],
          "mlp_pre": ref["mlp_pre", layer], "mlp_post": ref["mlp_post", layer], "mlp_out": ref["mlp_out", layer],
          "resid_post": ref["resid_post", layer]}
      for site, value in expected.items():
        ours = cache.get(site, layer, prompt=p)
        assert not np.isnan(ours).any(), (site, layer, p)
        assert gap(ours, value) < TOLERANCE, (site, layer, p, gap(ours, value))
      assert gap(cache.get("resid_pre", layer, prompt=p), ref["resid_pre", layer]) < TOLERANCE
      if layer + 1 < c.num_layers:  # transformers' last hidden state is after the final norm
        assert gap(cache.get("resid_post", layer, prompt=p), ref["hidden_states", layer + 1]) < TOLERANCE
      scores = cache.get("scores", layer, prompt=p)  # [H, n, n]
      seen = np.tril(np.ones((n, n), bool))
      assert gap(scores[:, seen], _torch_scores(torch_model, ref["q", layer], ref["k", layer])[:, seen]) < TOLERANCE
      assert np.all(scores[:, ~seen] == -np.inf)
      softmax = np.exp(scores - scores.max(-1, keepdims=True))
      assert gap(softmax / softmax.sum(-1, keepdims=True), cache.get("pattern", layer, prompt=p)) < TOLERANCE
      assert np.allclose(cache.get("pattern", layer, prompt=p).sum(-1), 1.0, atol=1e-5)
  # The short prompt's positions past its end hold NaN on every tokens axis of every site; its real ones, none.
  short = int(cache.lengths[0])
  for name, value in cache.values.items():
    site = sites_lib.SITES[name]
    lead = 2 if site.per_layer else 1
    assert not np.isnan(value[(slice(None),) * lead + (1,)]).any(), name  # the longest prompt
    value = value[(slice(None),) * lead + (0,)]  # [M, (L,) ...]: the short prompt's
    tokens_axes = [lead + i for i, axis in enumerate(site.axes.split()[1:]) if axis == "S"]
    for axis in tokens_axes:
      assert value.shape[axis] == 14
      assert np.isnan(np.take(value, np.arange(short, 14), axis=axis)).all(), name
    real = value[tuple(slice(0, short) if a in tokens_axes else slice(None) for a in range(value.ndim))]
    assert not np.isnan(real).any(), name
  # A layer, by index or by its TransformerLens name.
  assert np.array_equal(cache["z", 1], cache["z"][:, 1], equal_nan=True)
  assert np.array_equal(cache["blocks.1.attn.hook_z"], cache["z"][:, 1], equal_nan=True)
  assert np.array_equal(cache["blocks.2.hook_resid_post"], cache["resid_post"][:, 2], equal_nan=True)
  assert np.array_equal(cache["hook_embed"], cache["embed"], equal_nan=True)
  assert np.array_equal(cache[sites_lib.SITES["final"].hook], cache["final"], equal_nan=True)
  assert np.array_equal(cache.pattern("L1H2", prompt=1), cache.get("pattern", 1, prompt=1)[2])


def test_names_filter_takes_names_hook_names_globs_and_callables(model):
  full = model.run_with_cache(PROMPTS, names=["z", "resid_*", "mlp_pre", "mlp_post", "mlp_out", "pattern"])
  assert set(full.keys()) == {"z", "resid_pre", "resid_mid", "resid_post", "mlp_pre", "mlp_post", "mlp_out",
                              "pattern"}
  named = model.run_with_cache(PROMPTS, names=["blocks.1.attn.hook_z", "resid_*", "hook_embed"])
  assert set(named.keys()) == {"z", "resid_pre", "resid_mid", "resid_post", "embed"}
  assert named.layers["z"] == (1,) and named.layers["resid_mid"] == (0, 1, 2)
  assert named["z"].shape[1] == 1
  assert _close(named["z", 1], full["z", 1]) < TOLERANCE
  assert _close(named["resid_post"], full["resid_post"]) < TOLERANCE
  with pytest.raises(UserError, match=r"holds z at layers \[1\], not layer 0"):
    named["z", 0]
  globbed = model.run_with_cache(PROMPTS, names="blocks.*.attn.hook_pattern")
  assert set(globbed.keys()) == {"pattern"} and globbed.layers["pattern"] == (0, 1, 2)
  assert _close(globbed["pattern"], full["pattern"]) < TOLERANCE
  called = model.run_with_cache(PROMPTS, names=lambda name: name.startswith("mlp_"))
  assert set(called.keys()) == {"mlp_pre", "mlp_post", "mlp_out"}
  assert _close(called["mlp_post"], full["mlp_post"]) < TOLERANCE


def test_logits_run_to_the_longest_prompt_and_minus_one_is_the_last_real_token(model, torch_model):
  short = "The plural of mouse is"
  ids = model.tokens([short])[0]
  reference = _torch_run(torch_model, ids).logits[0].numpy()
  ours = model.logits([short])
  assert ours.shape == (1, 1, len(ids), model.config.vocab_size)  # 5 tokens, not rounded up to the call's 8
  assert gap(ours[0, 0, -1], reference[-1]) < TOLERANCE
  both = model.logits(PROMPTS)
  assert both.shape[2] == 14
  assert np.isnan(both[0, 0, 5:]).all() and not np.isnan(both[0, 0, :5]).any() and not np.isnan(both[0, 1]).any()
  assert gap(both[0, 0, :5], reference) < TOLERANCE
  assert gap(model.logits(PROMPTS, last=True)[0, 0], reference[-1]) < TOLERANCE
  top = model.logits(PROMPTS, top_k=2)
  assert top.tokens.shape == (1, 2, 14, 2) and np.isnan(top.logprobs[0, 0, 5:]).all()
  edited = model.logits(PROMPTS, interventions=[iv.scale("z", 0, 1.0)])  # an edit that changes nothing
  assert _close(edited, both) < TOLERANCE


def _hooks_for(torch_model, clean_resid, reference_mean, vector, head_vector, lengths):
  """The transformers hooks doing what each row of `_rows` does, per prompt p: (pre, post) of `_hooked`."""
  layers = torch_model.model.layers
  head_dim = torch_model.config.hidden_size // torch_model.config.num_attention_heads
  unit = lambda u: slice(u * head_dim, (u + 1) * head_dim)  # noqa: E731  a head's (or KV head's) slice

  def at(x, positions, value):  # x[0, positions] = value(x[0, positions])
    x[0, positions] = value(x[0, positions])
    return x

  def zero_z(p):
    return [(layers[0].self_attn.o_proj, _input(lambda x: at(x, [lengths[p] - 1], lambda a: _cut(a, unit(1)))))], []

  def scale_z(p):
    return [(layers[1].self_attn.o_proj, _input(lambda x: _times(x, unit(2), 2.5)))], []

  def add_resid(p):
    return [(layers[1], _input(lambda x: x + torch.tensor(vector)))], []

  def patch_resid(p):
    where = [lengths[p] - 4, lengths[p] - 2]
    return [(layers[1], _input(lambda x: at(x, where, lambda a: torch.tensor(clean_resid[p][where]))))], []

  def mean_neuron(p):
    return [(layers[2].mlp.down_proj, _input(lambda x: _fill(x, 7, reference_mean)))], []

  def zero_v(p):
    return [], [(layers[0].self_attn.v_proj, _output(lambda x: _cut(x, unit(1))))]

  def scale_mlp_out(p):
    return [], [(layers[i].mlp, _output(lambda x: x * 0.5)) for i in (0, 2)]

  def add_gate(p):
    return [], [(block.mlp.gate_proj, _output(lambda x: _bump(x, lengths[p] - 1, 5, 3.0))) for block in layers]

  def add_z(p):
    def edit(x):
      x[0, lengths[p] - 1, unit(0)] += torch.tensor(head_vector)
      return x
    return [(layers[2].self_attn.o_proj, _input(edit))], []

  def zero_k(p):
    return [], [(layers[1].self_attn.k_proj, _output(lambda x: at(x, [2, lengths[p] - 1], lambda a: _cut(a, unit(0)))))]

  def zero_and_add(p):
    (pre_a, _), (pre_b, _) = zero_z(p), add_resid(p)
    return pre_a + pre_b, []

  return [zero_z, scale_z, add_resid, patch_resid, mean_neuron, zero_v, scale_mlp_out, add_gate, add_z, zero_k,
          zero_and_add]


def _cut(x, sl):
  x[..., sl] = 0
  return x


def _times(x, sl, factor):
  x[..., sl] *= factor
  return x


def _fill(x, index, value):
  x[..., index] = value
  return x


def _bump(x, position, index, value):
  x[0, position, index] += value
  return x


def _rows(clean_cache, reference_cache, vector, head_vector):
  """One row per operation (and layer choice), in the order of `_hooks_for`."""
  return [iv.zero("z", 0, unit=1, positions=[-1]),
          iv.scale("z", 1, 2.5, unit=2),
          iv.add("resid_pre", 1, vector),
          iv.patch("resid_pre", 1, clean_cache, positions=[-4, -2]),
          iv.mean("mlp_post", 2, reference_cache, unit=7),
          iv.zero("v", 0, unit=1),
          iv.scale("mlp_out", [0, 2], 0.5),
          iv.add("mlp_pre", None, 3.0, unit=5, positions=-1),
          iv.add("z", 2, head_vector, unit=0, positions=[-1]),
          iv.zero("k", 1, unit=0, positions=[2, -1]),
          [iv.zero("z", 0, unit=1, positions=[-1]), iv.add("resid_pre", 1, vector)]]


def test_each_operation_matches_a_torch_hook_and_rows_together_equal_one_call_each(model, torch_model):
  rng = np.random.default_rng(0)
  vector = (5 * rng.normal(size=model.config.hidden_size)).astype(np.float32)
  head_vector = (5 * rng.normal(size=model.config.head_dim)).astype(np.float32)
  clean_cache = model.run_with_cache(MIXED_CLEAN, names=["resid_pre"])
  reference_cache = model.run_with_cache(REFERENCE, names=["mlp_post"])
  rows = _rows(clean_cache, reference_cache, vector, head_vector)
  # The torch side's own sources: the clean run's residual entering layer 1, layer 2's neuron 7 over REFERENCE.
  clean_resid = [_torch_sites(torch_model, ids)[0]["hidden_states", 1] for ids in model.tokens(MIXED_CLEAN)]
  neurons = np.concatenate([_torch_sites(torch_model, ids)[0]["mlp_post", 2] for ids in model.tokens(REFERENCE)])
  ids = model.tokens(MIXED)
  lengths = [len(x) for x in ids]
  hooks = _hooks_for(torch_model, clean_resid, float(neurons[:, 7].mean()), vector, head_vector, lengths)
  unedited = model.logits(MIXED)
  one_by_one = []
  for r, (row, hook) in enumerate(zip(rows, hooks)):
    ours = model.logits(MIXED, interventions=[row])
    assert ours.shape == (1, 2, 11, model.config.vocab_size)
    for p, prompt_ids in enumerate(ids):
      pre, post = hook(p)
      reference = _hooked(torch_model, prompt_ids, pre, post)[0]
      assert gap(ours[0, p, :lengths[p]], reference) < TOLERANCE, (r, p, gap(ours[0, p, :lengths[p]], reference))
    assert np.nanmax(np.abs(ours - unedited)) > 1e-2, r  # the edit mattered
    one_by_one.append(ours)
  together = model.logits(MIXED, interventions=rows)
  assert _close(together, np.concatenate(one_by_one)) < TOLERANCE
  cache = model.run_with_cache(MIXED, names=["logits"], interventions=rows)
  assert _close(cache["logits"], together) < TOLERANCE
  assert cache.labels[0] == "zero z L0[1]@-1" and " + " in cache.labels[-1]


def test_patch_by_position_matches_a_hook_loop_and_a_pass_of_every_layer(model, torch_model):
  from jaxloc.api.forward import Readout, first_touched, tokenize
  from jaxloc.api.interventions import compile_rows
  from jaxloc.models.torch_reference import o_proj_inputs

  c = model.config
  layers, width = [0, 2], 11
  clean_ids, corrupted_ids = torch.tensor(model.tokens(CLEAN)), torch.tensor(model.tokens(CORRUPTED))
  blocks = torch_model.model.layers
  patched = model.patch_by_position(CLEAN, CORRUPTED, site="z", layers=layers)
  assert patched.grid == {"layer": layers, "position": list(range(width)), "head": list(range(c.num_heads))}
  assert patched.logits.shape == (len(layers) * width * c.num_heads, 2, c.vocab_size)
  clean_z = o_proj_inputs(torch_model, clean_ids)
  reference = []
  for layer in layers:
    for position in range(width):
      for head in range(c.num_heads):
        sl = slice(head * c.head_dim, (head + 1) * c.head_dim)
        hook = _input(_from(clean_z[layer], position, sl))
        reference.append(_hooked(torch_model, corrupted_ids, [(blocks[layer].self_attn.o_proj, hook)])[:, -1])
  assert gap(patched.logits, np.stack(reference)) < TOLERANCE
  assert gap(patched.clean, _hooked(torch_model, clean_ids)[:, -1]) < TOLERANCE
  assert gap(patched.corrupted, _hooked(torch_model, corrupted_ids)[:, -1]) < TOLERANCE
  assert np.abs(patched.logits - patched.corrupted).max() > 1e-2

  resid = model.patch_by_position(CLEAN, CORRUPTED, site="resid_pre", layers=layers, positions=[1, -4, -1])
  assert resid.grid == {"layer": layers, "position": [1, 7, 10]}
  with torch.no_grad():
    clean_hidden = torch_model(clean_ids, output_hidden_states=True).hidden_states
  reference = [_hooked(torch_model, corrupted_ids, [(blocks[layer], _input(_from(clean_hidden[layer], position)))])
               [:, -1] for layer in layers for position in (1, 7, 10)]
  assert gap(resid.logits, np.stack(reference)) < TOLERANCE
  assert np.abs(resid.logits - resid.corrupted).max() > 1e-2

  # The sweep resumes each row at its first touched layer (and, for one prompt, token); a pass of every layer and
  # token gives the same logits.
  for clean, corrupted, sweep in ((CLEAN, CORRUPTED, patched), (CLEAN[:1], CORRUPTED[:1], None)):
    source = model.run_with_cache(clean, names=["z"])
    rows = [iv.patch("z", layer, source, unit=h, positions=[p]) for layer in layers for p in range(width)
            for h in range(c.num_heads)]
    batch, _ = tokenize(model.loaded, corrupted)
    edits, _ = compile_rows(rows, c, batch.lengths, batch.ids.shape[1])
    unablated = model.masks()[np.zeros(len(rows), int)]
    first_layers, first_tokens = first_touched(unablated, edits, c.num_layers, batch.ids.shape[1])
    assert sorted(set(first_layers.tolist())) == layers and first_tokens.max() == width - 1  # rows do resume
    every_layer = model._forward.run(batch, unablated, Readout(last=True), edits=edits, resume=False)["logits"]
    if sweep is None:
      sweep = model.patch_by_position(clean, corrupted, site="z", layers=layers)
    assert gap(sweep.logits, every_layer) < TOLERANCE
    assert gap(model.logits(corrupted, interventions=rows, last=True), every_layer) < TOLERANCE


def _from(source, position, sl=slice(None)):
  """An edit setting x[:, position, sl] to the same entries of `source` [B, S, ...]."""
  def edit(x):
    x[:, position, sl] = source[:, position, sl]
    return x
  return edit


def test_attribution_patching_is_the_linearization_of_exact_patching(model):
  import dataclasses

  metric = jaxloc.LogitDiff((_token(model, " Mary"), _token(model, " Anna")),
                            (_token(model, " John"), _token(model, " Tom")))
  patched = model.patch_by_position(CLEAN, CORRUPTED, site="z", columns=metric.columns)
  assert patched.logits.shape[-1] == len(metric.columns)
  values, clean_value, corrupted_value = patched.metric(metric)
  assert clean_value == pytest.approx(float(metric(model.logits(CLEAN, last=True))[0]), rel=1e-4, abs=1e-4)
  exact = values - corrupted_value  # [L, S, H]
  estimate, grid = model.attribution_patch(CLEAN, CORRUPTED, metric)
  assert grid == patched.grid and estimate.shape == exact.shape == (3, 11, model.config.num_heads)
  # The tiny model's weights are scaled up 8x, so a patch moves it far from linear: layer 0's patches change the
  # metric by up to ~2 where their linear estimates say ~0.1. The last layer's z reaches the logits through one MLP.
  correlation = np.corrcoef(exact.ravel(), estimate.ravel())[0, 1]
  last_layer = np.corrcoef(exact[-1].ravel(), estimate[-1].ravel())[0, 1]
  assert correlation > 0.5 and last_layer > 0.99, (correlation, last_layer)  # 0.62 and 0.997 on this model
  # Exactly what it estimates: the derivative of the metric along each patch, (clean - corrupted) at one cell, here
  # by central differences of patches to corrupted + t (clean - corrupted), t = +-eps, at the largest cells.
  caches = [model.run_with_cache(p, names=["z"]) for p in (CLEAN, CORRUPTED)]
  eps = 1e-2
  towards = [dataclasses.replace(caches[1], values={"z": caches[1]["z"] + t * (caches[0]["z"] - caches[1]["z"])})
             for t in (eps, -eps)]
  cells = list(zip(*np.unravel_index(np.argsort(-np.abs(estimate).ravel())[:4], estimate.shape)))
  rows = [iv.patch("z", int(layer), source, unit=int(head), positions=[int(position)])
          for layer, position, head in cells for source in towards]
  metrics = metric(model.logits(CORRUPTED, interventions=rows, last=True)).reshape(len(cells), 2)
  derivative = (metrics[:, 0] - metrics[:, 1]) / (2 * eps)
  largest = np.array([estimate[cell] for cell in cells])
  assert np.abs(derivative - largest).max() < 1e-2 * np.abs(largest).max(), (derivative, largest)
  value, _ = model.gradients(CORRUPTED, metric)
  assert value == pytest.approx(corrupted_value, rel=1e-4, abs=1e-4)


def test_gradients_match_a_finite_difference_of_an_add(model):
  c = model.config
  metric = jaxloc.LogitDiff((_token(model, " Mary"), _token(model, " mice")),
                            (_token(model, " John"), _token(model, " house")))
  value, grads = model.gradients(MIXED, metric, sites=("z", "resid_pre", "mlp_post"))
  assert value == pytest.approx(float(metric(model.logits(MIXED, last=True))[0]), rel=1e-4, abs=1e-4)
  assert grads["z"].shape == (c.num_layers, 2, 11, c.num_heads, c.head_dim)
  assert grads["resid_pre"].shape == (c.num_layers, 2, 11, c.hidden_size)
  assert grads["mlp_post"].shape == (c.num_layers, 2, 11, c.intermediate_size)
  assert np.all(grads["z"][:, 1, 5:] == 0)  # nothing reads the short prompt's padding
  lengths = np.array([11, 5])
  rng = np.random.default_rng(1)
  cache = model.run_with_cache(MIXED, names=["z", "resid_pre", "mlp_post"])
  for site, layer, unit, positions in (("z", 1, 2, [-2]), ("resid_pre", 2, None, None), ("mlp_post", 0, 7, [-1])):
    gradient = grads[site][layer]  # [P, S, (H,) ...]
    if unit is not None:
      gradient = gradient[:, :, unit]
    if site == "mlp_post":
      gradient = gradient[..., None]
    direction = rng.normal(size=gradient.shape[-1])
    direction /= np.linalg.norm(direction)
    where = np.zeros((2, 11), bool)
    for p, n in enumerate(lengths):
      where[p, :n] = positions is None
      for position in positions or []:
        where[p, n + position] = True
    predicted = float((gradient[where] @ direction).sum())
    eps = 1e-2 * float(np.nanstd(cache[site]))
    steps = [sign * eps * direction for sign in (1, -1)]  # a neuron's add is one number
    rows = [iv.add(site, layer, float(step[0]) if site == "mlp_post" else step, unit, positions) for step in steps]
    plus, minus = metric(model.logits(MIXED, interventions=rows, last=True))
    difference = (plus - minus) / (2 * eps)
    assert abs(difference - predicted) <= 1e-2 * max(abs(predicted), 1e-2), (site, difference, predicted)


def test_logit_lens_of_the_last_layer_is_the_logits_and_a_middle_one_the_final_norm_and_unembedding(model,
                                                                                                  torch_model):
  c = model.config
  cache = model.run_with_cache(PROMPTS, names=["resid_post", "logits"])
  lens = model.logit_lens(cache)
  assert lens.shape == (1, c.num_layers, 2, 14, c.vocab_size)
  assert _close(lens[:, -1], cache["logits"]) < TOLERANCE
  params = model.loaded.params
  assert c.tie_word_embeddings and not c.norm_unit_offset  # the tiny Llama unembeds with its embedding matrix
  scale = np.asarray(params["final_norm"]["scale"], np.float64)
  unembed = np.asarray(params["embed"]["embedding"], np.float64)  # [V, D]
  for p, ids in enumerate(cache.tokens):
    n = len(ids)
    x = cache["resid_post"][0, 1, p, :n].astype(np.float64)
    by_hand = (x / np.sqrt((x * x).mean(-1, keepdims=True) + c.rms_norm_eps) * scale) @ unembed.T
    assert gap(lens[0, 1, p, :n], by_hand) < TOLERANCE
    with torch.no_grad():  # transformers' own final norm and head on the residual leaving layer 1
      hidden = _torch_run(torch_model, ids, output_hidden_states=True).hidden_states[2]
      theirs = torch_model.lm_head(torch_model.model.norm(hidden))[0].numpy()
    assert gap(lens[0, 1, p, :n], theirs) < TOLERANCE
  assert np.isnan(lens[0, :, 0, 5:]).all()
  assert _close(model.logit_lens(cache, columns=[5, 7]), lens[..., [5, 7]]) < TOLERANCE


def test_direct_logit_attribution_adds_up_to_the_logit(model, torch_model):
  c = model.config
  cache = model.run_with_cache(PROMPTS, names=["embed", "head_out", "attn_out", "mlp_out", "resid_post", "logits"])
  tokens = [_token(model, " mice"), _token(model, " Mary")]
  for position in (-1, -2):
    shares = model.direct_logit_attribution(cache, tokens, position=position)
    assert shares["heads"].shape == (1, c.num_layers, 2, c.num_heads)
    assert shares["attn"].shape == shares["mlp"].shape == (1, c.num_layers, 2)
    assert shares["embed"].shape == shares["logit"].shape == (1, 2)
    total = shares["embed"] + shares["attn"].sum(1) + shares["mlp"].sum(1)
    assert gap(total, shares["total"]) < 1e-5
    assert gap(total, shares["logit"]) < 1e-3
    for p, ids in enumerate(cache.tokens):
      reference = _torch_run(torch_model, ids).logits[0, len(ids) + position, tokens[p]].item()
      assert gap(shares["logit"][0, p], reference) < TOLERANCE
    assert not c.o_bias  # with an o_proj bias, attn would exceed the heads' sum by the bias' share
    assert gap(shares["heads"].sum(-1), shares["attn"]) < 1e-4


def test_path_patching_to_the_logits_is_the_senders_direct_effect(model):
  c = model.config
  senders = [(0, 1), (1, 2), (2, 3)]
  path = model.path_patch(CLEAN, CORRUPTED, "L0H1,L1H2,L2H3")
  assert path.labels == ["L0H1", "L1H2", "L2H3"] and path.logits.shape == (3, 2, c.vocab_size)
  assert list(path.grid) == ["sender"] and len(path.grid["sender"]) == 3
  clean, corrupted = (model.run_with_cache(p, names=["head_out", "resid_post"]) for p in (CLEAN, CORRUPTED))
  params = model.loaded.params
  scale = np.asarray(params["final_norm"]["scale"], np.float64)
  unembed = np.asarray(params["embed"]["embedding"], np.float64)
  for i, (layer, head) in enumerate(senders):
    final = corrupted["resid_post"][0, -1, :, -1] + (clean["head_out"][0, layer, :, -1, head]
                                                    - corrupted["head_out"][0, layer, :, -1, head])  # [P, D]
    final = final.astype(np.float64)
    by_hand = (final / np.sqrt((final * final).mean(-1, keepdims=True) + c.rms_norm_eps) * scale) @ unembed.T
    assert gap(path.logits[i], by_hand) < TOLERANCE, (i, gap(path.logits[i], by_hand))
  assert np.abs(path.logits - path.corrupted).max() > 1e-2
  assert gap(path.corrupted, model.logits(CORRUPTED, last=True)[0]) < TOLERANCE


@pytest.mark.parametrize("receiver_site", ["q", "v"])
def test_path_patching_to_receivers_matches_a_two_pass_hook_reference(model, torch_model, receiver_site):
  from jaxloc.models.torch_reference import o_proj_inputs

  c = model.config
  received = model.path_patch(CLEAN, CORRUPTED, "L0H1,L0H3,L1H0", receivers="L2H0,L2H1",
                              receiver_site=receiver_site)
  assert received.logits.shape == (3, 2, c.vocab_size)
  # The tiny model's attention is saturated (patterns ~1 at the last token), so its queries barely matter: ~1e-5
  # through q, ~0.15 through v.
  if receiver_site == "v":
    assert np.abs(received.logits - received.corrupted).max() > 1e-2  # some sender reaches the receivers
  # The first sender by hand: its clean z with every later z and every MLP output from its layer on frozen at the
  # corrupted run, read the receivers' input there; then the corrupted run with only that input set to what was read.
  blocks = torch_model.model.layers
  clean_ids, corrupted_ids = torch.tensor(model.tokens(CLEAN)), torch.tensor(model.tokens(CORRUPTED))
  clean_z, corrupted_z = o_proj_inputs(torch_model, clean_ids), o_proj_inputs(torch_model, corrupted_ids)
  corrupted_mlp = {}
  _hooked(torch_model, corrupted_ids, post=[(blocks[layer].mlp, _keep_output(corrupted_mlp, layer))
                                            for layer in range(c.num_layers)])
  sender = slice(1 * c.head_dim, 2 * c.head_dim)
  pre = [(blocks[0].self_attn.o_proj, _input(_from(clean_z[0], slice(None), sender)))]
  pre += [(blocks[layer].self_attn.o_proj, _input(lambda x, layer=layer: corrupted_z[layer].clone()))
          for layer in (1, 2)]
  post = [(blocks[layer].mlp, _output(lambda x, layer=layer: corrupted_mlp[layer].clone()))
          for layer in range(c.num_layers)]
  projection = getattr(blocks[2].self_attn, f"{receiver_site}_proj")
  read = {}
  _hooked(torch_model, corrupted_ids, pre, post + [(projection, _keep_output(read, receiver_site))])
  # heads 0 and 1 of layer 2: their query slices, or the one KV head they share
  receivers = slice(0, 2 * c.head_dim) if receiver_site == "q" else slice(0, c.head_dim)
  edit = _from(read[receiver_site], slice(None), receivers)
  logits = _hooked(torch_model, corrupted_ids, post=[(projection, _output(edit))])
  assert gap(received.logits[0], logits[:, -1]) < TOLERANCE


def _keep_output(into, key):
  def hook(module, args, output):
    into[key] = output.detach().clone()
  return hook


def test_user_errors_name_the_bad_value(model):
  def logits(rows, prompts=PROMPTS):
    return model.logits(prompts, interventions=rows, last=True)

  with pytest.raises(UserError, match="site 'nope' cannot be edited"):
    logits([iv.zero("nope", 0)])
  with pytest.raises(UserError, match="site 'pattern' cannot be edited"):
    logits([iv.zero("pattern", 0)])
  with pytest.raises(UserError, match="layer 3 is out of range: this model has layers 0-2"):
    logits([iv.zero("z", 3)])
  with pytest.raises(UserError, match="layer 5 is out of range"):
    logits([iv.zero("z", [0, 5])])
  with pytest.raises(UserError, match="unit 4 is out of range for z: 0-3"):
    logits([iv.zero("z", 0, unit=4)])
  with pytest.raises(UserError, match="unit 2 is out of range for v: 0-1"):
    logits([iv.zero("v", 0, unit=2)])
  with pytest.raises(UserError, match="site resid_pre has one vector per token: give unit=None"):
    logits([iv.zero("resid_pre", 0, unit=0)])
  with pytest.raises(UserError, match="position 5 is outside prompt 0, which has 5 tokens"):
    logits([iv.zero("z", 0, positions=[5])])
  with pytest.raises(UserError, match="position -6 is outside prompt 0"):
    logits([iv.zero("z", 0, positions=-6)])
  with pytest.raises(UserError, match="positions=\\[\\] selects no token"):
    iv.zero("z", 0, positions=[])
  with pytest.raises(UserError, match="no intervention rows given"):
    logits([])
  with pytest.raises(UserError, match="intervention row 1 is empty"):
    logits([iv.zero("z", 0), []])
  with pytest.raises(UserError, match="not str"):
    logits(["zero z"])
  with pytest.raises(UserError, match="add at resid_pre takes a finite vector of 32 values, got 3"):
    logits([iv.add("resid_pre", 0, [1.0, 2.0, 3.0])])
  with pytest.raises(UserError, match="scale takes a finite factor"):
    logits([iv.scale("z", 0, float("nan"))])
  source = model.run_with_cache(CLEAN, names=["z"])
  with pytest.raises(UserError, match=r"the source's prompts have \[11, 11\] tokens, these \[5, 14\]"):
    logits([iv.patch("z", 0, source)])
  with pytest.raises(UserError, match=r"holds z at layers \[0\] only"):
    logits([iv.patch("z", 0, model.run_with_cache(CLEAN, names="blocks.0.attn.hook_z"))], CORRUPTED)
  with pytest.raises(UserError, match="reads a jaxloc Cache"):
    logits([iv.mean("z", 0, np.zeros(8))])
  with pytest.raises(UserError, match="no site matches 'nope'"):
    model.run_with_cache(PROMPTS, names=["z", "nope"])
  with pytest.raises(UserError, match="no site matches 'blocks.7.attn.hook_z'"):
    model.run_with_cache(PROMPTS, names="blocks.7.attn.hook_z")
  with pytest.raises(UserError, match="an empty names filter"):
    model.run_with_cache(PROMPTS, names=[])
  with pytest.raises(UserError, match="unknown site 'nope'"):
    source["nope"]
  with pytest.raises(UserError, match="does not hold 'pattern'"):
    source["pattern"]
  with pytest.raises(UserError, match="prompt 2 is out of range"):
    source.get("z", 0, prompt=2)
  with pytest.raises(UserError, match="cannot be patched"):
    model.patch_by_position(CLEAN, CORRUPTED, site="pattern")
  with pytest.raises(UserError, match="needs prompts of one length"):
    model.patch_by_position(MIXED_CLEAN, MIXED)
  with pytest.raises(UserError, match="must have the same number of tokens"):
    model.patch_by_position(CLEAN, MIXED)
  metric = jaxloc.LogitDiff((1, 2), (3, 4))
  with pytest.raises(UserError, match="gradients are taken at editable sites"):
    model.gradients(CLEAN, metric, sites=("pattern",))
  with pytest.raises(UserError, match="a sender must sit below its receivers: L2H0 is not below L1H0"):
    model.path_patch(CLEAN, CORRUPTED, "L2H0", receivers="L1H0")
  with pytest.raises(UserError, match="receiver_site is q, k or v"):
    model.path_patch(CLEAN, CORRUPTED, "L0H0", receivers="L1H0", receiver_site="z")
  with pytest.raises(UserError, match="the logit lens reads a residual stream"):
    model.logit_lens(source, site="z")
  with pytest.raises(UserError, match="direct logit attribution reads embed"):
    model.direct_logit_attribution(source, [1, 2])


def test_a_callable_names_filter_matching_nothing_is_refused(model):
  # A list or a pattern that matches no site is refused; a callable that matches none must be too, not an empty
  # cache that fails later at the first read.
  with pytest.raises(UserError, match="no site"):
    model.run_with_cache(PROMPTS, names=lambda name: False)


def test_a_row_applies_its_interventions_in_its_own_order_whatever_the_other_rows_hold(model):
  vector = np.random.default_rng(5).normal(size=model.config.hidden_size).astype(np.float32)
  scale_then = [iv.scale("resid_pre", 1, 2.0), iv.add("resid_pre", 1, vector)]
  add_then = [iv.add("resid_pre", 1, vector), iv.scale("resid_pre", 1, 2.0)]
  for rows in ([scale_then, add_then], [add_then, scale_then]):
    together = model.logits(PROMPTS, interventions=rows, last=True)
    alone = [model.logits(PROMPTS, interventions=[r], last=True)[0] for r in rows]
    for ours, reference in zip(together, alone):
      assert gap(ours, reference) < TOLERANCE
  assert gap(model.logits(PROMPTS, interventions=[scale_then], last=True),
             model.logits(PROMPTS, interventions=[add_then], last=True)) > 1e-3  # the order matters


def test_logits_at_every_token_under_interventions_of_one_prompt_cover_every_token(model):
  prompt = ["The plural of mouse is"]
  rows = [iv.zero("z", 0, positions=[0]), iv.zero("z", 0, positions=[-1])]
  every = model.logits(prompt, interventions=rows)
  assert every.shape[:3] == (2, 1, 5)
  lasts = model.logits(prompt, interventions=rows, last=True)
  assert gap(every[:, 0, -1], lasts[:, 0]) < TOLERANCE
  unablated = model.logits(prompt)
  assert gap(every[1, 0, :-1], unablated[0, 0, :-1]) < TOLERANCE  # the last token's zero changes no earlier token


def test_path_patching_sets_receivers_in_several_layers(model):
  two = model.path_patch(CLEAN, CORRUPTED, "L0H1", receivers="L1H0,L2H0", receiver_site="v")
  one = model.path_patch(CLEAN, CORRUPTED, "L0H1", receivers="L1H0", receiver_site="v")
  assert two.logits.shape == one.logits.shape and np.isfinite(two.logits).all()


def test_sweeps_and_readouts_refuse_out_of_range_cells_and_tokens(model):
  with pytest.raises(UserError, match="positions \\[11\\] are outside"):
    model.patch_by_position(CLEAN, CORRUPTED, positions=[11])
  with pytest.raises(UserError, match="layers \\[-1\\] are out of range"):
    model.patch_by_position(CLEAN, CORRUPTED, layers=[-1])
  cache = model.run_with_cache(PROMPTS, names=["embed", "attn_out", "mlp_out", "resid_post"])
  with pytest.raises(UserError, match="outside the vocabulary"):
    model.direct_logit_attribution(cache, [-1, 3])
  with pytest.raises(UserError, match="outside the vocabulary"):
    model.logit_lens(cache, columns=[model.config.vocab_size])
  partial = model.run_with_cache(PROMPTS, names=["embed", "blocks.0.hook_attn_out", "mlp_out", "resid_post"])
  with pytest.raises(UserError, match="some layers only"):
    model.direct_logit_attribution(partial, [3, 3])
  with pytest.raises(UserError, match="selects no layer"):
    model.logits(PROMPTS, interventions=[iv.zero("z", [])])
  with pytest.raises(UserError, match="vector of numbers"):
    model.logits(PROMPTS, interventions=[iv.add("resid_pre", 0, "up")])
  assert model.logits(PROMPTS, interventions=[iv.scale("z", 0, np.int64(1))], last=True).shape[0] == 1
