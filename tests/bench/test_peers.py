"""The peer libraries' side of the patching benchmark (`jaxloc.bench.peers`) on the tiny random Llama: TransformerLens'
cache is the HF model's own forward, and TransformerLens and nnsight patching agree.

TransformerLens and nnsight are the optional `peers` extra, which CI does not install: these tests skip without them
(`pytest.importorskip`, not `tests.optional`, which would fail in CI). Run them with the extra's environment:
`python -m venv --system-site-packages .peers && .peers/bin/pip install -e '.[peers]'`, then
`.peers/bin/python -m pytest tests/bench/test_peers.py -q`.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")
pytest.importorskip("nnsight")

from jaxloc.bench import peers  # noqa: E402

pytestmark = pytest.mark.heavy  # boots TransformerLens and nnsight, and runs a forward per patch: ~20 s on 2 cores

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tokenizer):
  hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32,
                                                         attn_implementation="eager").eval()
  clean, corrupted = (tokenizer(p)["input_ids"] for p in (CLEAN, CORRUPTED))
  io, s = (tokenizer(" " + n, add_special_tokens=False)["input_ids"][0] for n in ("Mary", "John"))
  bridge = peers.tl_bridge(hf, tokenizer, model_name=tiny_model_dir)
  return hf, bridge, clean, corrupted, (io, s), tokenizer


def _metric(hf, ids, io, s):
  with torch.no_grad():
    logits = hf(torch.tensor([ids])).logits[0, -1]
  return float(logits[io] - logits[s])


def test_tl_cache_is_the_hf_forward_and_leaves_the_callers_model_alone(setup):
  hf, bridge, clean, _, _, _ = setup
  config = hf.config
  before = {name: p.detach().clone() for name, p in hf.named_parameters()}
  sites, footprint = peers.tl_cache(bridge, clean)
  with torch.no_grad():
    out = hf(torch.tensor([clean]), output_hidden_states=True)
  layers, tokens, heads, kv = config.num_hidden_layers, len(clean), config.num_attention_heads, config.num_key_value_heads
  head_dim, width = config.hidden_size // heads, config.hidden_size
  # The bridge runs its own copy of the forward (to fire its hooks), summing in another order: with the fixture's
  # scaled-up weights (residuals near 200, logits near 35) that drifts ~1e-5 of the values' size, where a wrong hook or
  # a missing rotary would be off by their whole size.
  close = lambda a, b: np.abs(a - b).max() < 1e-5 * np.abs(b).max()
  assert close(sites["logits"], out.logits[0].numpy())
  assert close(sites["resid_pre"], np.stack([h[0].numpy() for h in out.hidden_states[:layers]]))
  assert close(sites["final"], out.hidden_states[-1][0].numpy())  # HF's last hidden state is the final norm's output
  assert np.abs(sites["embed"] - out.hidden_states[0][0].numpy()).max() == 0
  assert sites["q"].shape == (layers, tokens, heads, head_dim) and sites["k"].shape == (layers, tokens, kv, head_dim)
  assert sites["scores"].shape == sites["pattern"].shape == (layers, heads, tokens, tokens)
  assert sites["head_out"].shape == (layers, tokens, heads, width)
  np.testing.assert_allclose(sites["head_out"].sum(2), sites["attn_out"], atol=1e-4)
  np.testing.assert_allclose(sites["resid_mid"], sites["resid_pre"] + sites["attn_out"], atol=1e-4)
  np.testing.assert_allclose(sites["resid_post"], sites["resid_mid"] + sites["mlp_out"], atol=1e-4)
  assert not bridge.cfg.use_attn_result  # switched back off after the cache
  assert footprint["entries"] > 20 * layers and footprint["mib"] > 0
  assert hf.config._attn_implementation == "eager"
  assert all(torch.equal(p, before[name]) for name, p in hf.named_parameters())


def test_transformer_lens_and_nnsight_head_position_patching_agree(setup):
  hf, bridge, clean, corrupted, (io, s), tokenizer = setup
  tl, tl_seconds, tl_patches = peers.tl_head_position_patching(bridge, clean, corrupted, peers.logit_difference(io, s))
  nn, nn_seconds, nn_patches = peers.nnsight_head_position_patching(hf, clean, corrupted, (io, s), invokes_per_trace=7,
                                                                    tokenizer=tokenizer)
  layers, heads = hf.config.num_hidden_layers, hf.config.num_attention_heads
  assert tl.shape == nn.shape == (layers, len(clean), heads) and tl_patches == nn_patches == tl.size
  assert np.abs(tl - nn).max() < 1e-4
  baseline = _metric(hf, corrupted, io, s)
  differs = [p for p in range(len(clean)) if clean[p] != corrupted[p]]
  # Before the one token that differs, the two runs are equal: patching there changes nothing.
  np.testing.assert_allclose(tl[:, :differs[0]], baseline, atol=1e-4)
  assert np.abs(tl - baseline).max() > 1e-3
  subset, _, patches = peers.tl_head_position_patching(bridge, clean, corrupted, peers.logit_difference(io, s),
                                                       layers=[2])
  assert patches == len(clean) * heads and np.abs(subset[0] - tl[2]).max() < 1e-5
  assert tl_seconds > 0 and nn_seconds > 0


def test_resid_pre_patching_and_attribution_patching(setup):
  hf, bridge, clean, corrupted, (io, s), _ = setup
  metric = peers.logit_difference(io, s)
  resid, _, patches = peers.tl_resid_pre_patching(bridge, clean, corrupted, metric)
  assert resid.shape == (hf.config.num_hidden_layers, len(clean)) and patches == resid.size
  [differs] = [p for p in range(len(clean)) if clean[p] != corrupted[p]]
  # Layer 0's input at the one differing token is all that separates the runs: patching it gives the clean run.
  assert abs(resid[0, differs] - _metric(hf, clean, io, s)) < 1e-4
  estimate, seconds = peers.tl_attribution_patching(bridge, clean, corrupted, metric)
  assert estimate.shape == (hf.config.num_hidden_layers, len(clean), hf.config.num_attention_heads) and seconds > 0
  assert np.abs(estimate[:, :differs]).max() < 1e-6 and np.abs(estimate).max() > 1e-4  # z equal before the change
