"""The Python API refuses bad inputs at its boundary (`jaxloc.checks`), on the tiny random Llama: each defect
below once gave NaN logits, a silently wrapped token id, a raw KeyError / AttributeError / TypeError or an empty
answer, and is now one `UserError` naming the bad value (or a warning, where the call can still run). Most checks
refuse before anything compiles; the property tests drive the unit-name parser and the token-id checker with
arbitrary inputs (a result or a UserError, never another exception)."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxloc
from jaxloc import checks
from jaxloc.errors import UserError
from jaxloc.units import parse_unit, parse_units


@pytest.fixture(scope="module")
def model(tiny_model):
  """The tiny Llama (3 layers x 6 heads, 64 neurons per layer, the real tokenizer's vocabulary) as a `jaxloc.Model`;
  its weights do not matter to a check."""
  return jaxloc.Model(tiny_model)


def _keep(model, value=1.0):
  c = model.config
  return np.full((4, c.num_layers, c.num_heads), value, np.float32)


# 1. Mask values: NaN made every logit NaN, 7 was accepted, generate under a NaN mask returned ''.
def test_nan_and_out_of_range_mask_values_are_refused_where_masks_enter(model):
  c = model.config
  nan = _keep(model)
  nan[3, 2, 1] = np.nan
  with pytest.raises(UserError, match=r"mask 3, L2H1: nan is not a keep-mask value"):
    jaxloc.masks.resolve(model, nan)
  with pytest.raises(UserError, match=r"mask 3, L2H1: nan"):
    model.logits(["The plural of mouse is"], masks=nan)
  with pytest.raises(UserError, match=r"mask 3, L2H1: nan"):
    model.generate(["Once upon a time"], masks=nan, max_new_tokens=2)
  with pytest.raises(UserError, match=r"mask 0, L0H0: 7 is not"):
    model.masks(masks=_keep(model, 7.0))
  with pytest.raises(UserError, match=r"mask 0 \('x'\), L0N0: -inf"):
    jaxloc.masks.MaskSet(None, np.full((1, c.num_layers, c.intermediate_size), -np.inf), ["x"])
  design = np.zeros((2, c.num_layers, c.num_heads))
  design[1, 0, 4] = np.nan
  with pytest.raises(UserError, match=r"design mask 1, L0H4: nan"):
    jaxloc.masks.from_design(model, design)
  changed = jaxloc.masks.none(model)  # valid when built, then changed in place: the call checks it again
  changed.heads[0, 1, 1] = 2.0
  with pytest.raises(UserError, match=r"mask 0 \('none'\), L1H1: 2"):
    model.masks(changed)
  soft = jaxloc.masks.resolve(model, _keep(model, 0.5))  # soft masks in [0, 1] stay allowed
  assert np.all(soft.heads == 0.5)


# 2. A mask set of no masks was a KeyError ('logits') from the forward pass.
def test_a_mask_set_of_no_masks_is_refused(model):
  c = model.config
  empty = jaxloc.masks.MaskSet(np.ones((0, c.num_layers, c.num_heads), np.float32), None, [])
  with pytest.raises(UserError, match="no masks"):
    model.logits(["The plural of mouse is"], masks=empty)
  with pytest.raises(UserError, match="no masks"):
    model.logits(["The plural of mouse is"], masks=np.ones((0, c.num_layers, c.num_heads)))
  with pytest.raises(UserError, match="no masks"):
    model.patch(["The plural of mouse is"], ["The plural of house is"], [])


# 3. Token ids: -1 wrapped to the last id, 1.5 became 1, True became 1, 2**40 overflowed, vocab_size read past the
# embedding table; patch's vocabulary columns likewise.
@pytest.mark.parametrize("bad, shown", [(-1, "token id -1 is outside"), (1.5, r"1.5 \(float\) is not a token id"),
                                        (True, r"True \(bool\) is not a token id"),
                                        (2**40, f"token id {2**40} is outside"), ("vocab", "token id {vocab} is outside")])
def test_token_ids_outside_the_vocabulary_are_refused_with_prompt_and_position(model, bad, shown):
  vocab_size = model.config.vocab_size
  bad, shown = (vocab_size if bad == "vocab" else bad), shown.replace("{vocab}", str(vocab_size))
  with pytest.raises(UserError, match=rf"prompt 1, position 2: {shown}"):
    model.logits([[1, 2, 3], [4, 5, bad, 6]])
  with pytest.raises(UserError, match=rf"columns, position 1: {shown}"):
    model.patch(["The plural of mouse is"], ["The plural of house is"], "L0H1", columns=[7, bad])
  assert model.tokens([np.array([1, 2]), (3,)]) == [[1, 2], [3]]  # integer arrays and tuples stay accepted


# 4. (layer, index) tuples were a raw AttributeError ('tuple' object has no attribute 'strip').
def test_layer_index_pairs_name_units_wherever_names_do(model):
  by_name = jaxloc.masks.resolve(model, heads_=["L2H1", "L0H5"], neurons_="L1N63")
  by_pair = jaxloc.masks.resolve(model, heads_=[(2, 1), (np.int64(0), 5)], neurons_=[(1, 63)])
  np.testing.assert_array_equal(by_pair.heads, by_name.heads)
  np.testing.assert_array_equal(by_pair.neurons, by_name.neurons)
  assert by_pair.labels == by_name.labels == ["L2H1,L0H5,L1N63"]
  assert jaxloc.masks.heads(model, (2, 1)).labels == ["L2H1"]  # one pair alone is one head
  assert model.masks(heads=[(2, 1)]).labels == ["L2H1"]
  with pytest.raises(UserError, match=r"head \(3, 0\) is out of range: this model has layers 0-2"):
    jaxloc.masks.heads(model, [(3, 0)])
  with pytest.raises(UserError, match=r"neuron \(0, -1\) is out of range"):
    jaxloc.masks.neurons(model, [(0, -1)])
  with pytest.raises(UserError, match=r"bad head \(1, 2, 3\) \(tuple\): expected a name L<layer>H<index>"):
    jaxloc.masks.heads(model, [(1, 2, 3)])
  with pytest.raises(UserError, match="bad head name 'L0X1': expected L<layer>H<index>, e.g. L15H13"):
    jaxloc.masks.heads(model, ["L0X1"])  # a malformed name keeps its message
  with pytest.raises(UserError, match="duplicate heads in L2H1,L2H1"):
    jaxloc.masks.heads(model, ["L2H1", (2, 1)])


# 5. generate([]) returned [[]] where logits([]) raised.
@pytest.mark.parametrize("call", ["logits", "run_with_cache", "generate", "tokens", "patch"])
def test_an_empty_prompt_list_is_refused_by_every_call(model, call):
  with pytest.raises(UserError, match="^no prompts given$"):
    if call == "patch":
      model.patch([], [])
    else:
      getattr(model, call)([])
  with pytest.raises(UserError, match=r"prompts \[1\] have no tokens"):
    model.logits([[1], []])


# 6. Prompts past max_position_embeddings ran silently on positions the model never saw.
def test_prompts_past_the_models_positions_warn(tokenizer):
  from tests.tiny import make_tiny

  short = jaxloc.Model(make_tiny(tokenizer, max_position_embeddings=8))
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    short.tokens([list(range(1, 9))])  # exactly 8 tokens: no warning
  with pytest.warns(UserWarning, match=r"1 of 2 prompts are longer than the model's 8 positions "
                    r"\(max_position_embeddings\): the longest, prompt 1, has 10 tokens") as caught:
    logits = short.logits([[1, 2], list(range(1, 11))], last=True)
  assert logits.shape[:2] == (1, 2)  # the call still runs
  assert caught[0].filename == __file__  # the warning points at the caller's line
  with pytest.warns(UserWarning, match=r"prompt 0, has 6 tokens \+ 3 new = 9"):
    checks.warn_past_positions([6, 2], 8, new_tokens=3)  # what generate's prompt + max_new_tokens check calls
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    checks.warn_past_positions([6, 2], 8, new_tokens=2)


# 7. A lone surrogate reached the tokenizer and failed there (TypeError: TextEncodeInput must be ...).
def test_a_lone_surrogate_in_a_prompt_is_refused_with_its_offset(model):
  with pytest.raises(UserError, match=r"prompt 1 is not valid Unicode text: a lone surrogate '\\ud800' at character 3"):
    model.logits(["fine", "abc\ud800def"])
  assert model.tokens(["emoji \U0001F600"])  # a paired character is fine


# Property tests: any input gives a result or a UserError, never another exception.
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.binary(max_size=4), st.sampled_from(["L1H2", " L0H5 ", "L2N3", "L9H0"]),
                    st.sampled_from([np.int64(1), np.int32(-3), np.float32(1.0), np.bool_(True), np.array(2),
                                     np.array([1, 2]), np.array(1.5)]))
NESTED = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner)),
                      max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(name=NESTED, unit=st.sampled_from(["heads", "neurons"]))
def test_unit_parsers_give_units_or_a_user_error(name, unit):
  for parse in (parse_unit, parse_units):
    try:
      result = parse(name, 3, 6, unit)
    except UserError:
      continue
    pairs = [result] if parse is parse_unit else result
    assert all(0 <= layer < 3 and 0 <= index < 6 for layer, index in pairs)


@settings(max_examples=300, deadline=None)
@given(prompts=st.one_of(NESTED, st.lists(st.lists(st.integers(-5, 60), max_size=5), max_size=3)))
def test_the_token_id_checker_gives_ids_or_a_user_error(prompts):
  try:
    ids = checks.token_ids(prompts, 50)
  except UserError:
    return
  assert all(isinstance(t, int) and 0 <= t < 50 for prompt in ids for t in prompt)
