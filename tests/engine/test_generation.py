"""Greedy generation under masks against transformers and against the generator it replaced (the very same tokens
under head, neuron and mean ablation, stop strings included), continuous batching, and stop handling."""

import numpy as np
import pytest

from jaxloc.bench.previous_generation import PreviousGenerator
from jaxloc.engine import generation_kernels
from jaxloc.engine.config import EngineConfig
from jaxloc.engine.engine import Engine
from jaxloc.engine.generator import shared_prefix_length
from jaxloc.engine.requests import GenerationRequest
from jaxloc.engine.stops import stop_tables, truncate_at_stop
from jaxloc.models import decoder
from jaxloc.tasks import gsm8k
from tests.tiny import GEMMA3, make_tiny

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "1, 2, 3, 4,",
           "The quick brown fox", "import numpy as np\n", "Paris is the capital of", "My favourite food is",
           "Q: Who wrote Hamlet?\nA:", "<|endoftext|>Alice and Bob went"]


@pytest.mark.parametrize("heads", [pytest.param([], marks=pytest.mark.slow), [(0, 3), (5, 4), (10, 1), (20, 7)]],
                         ids=["unmasked", "four_ablated"])  # CI: the ablated case, which also runs the unablated layers
def test_masked_generation_matches_transformers(smollm2, smollm2_engine, smollm2_torch, heads):
  import torch
  from jaxloc.models.torch_reference import ablated_heads

  tok = smollm2.tokenizer
  ids = [tok(p)["input_ids"] for p in PROMPTS]
  mask = np.ones((1, 30, 9), np.float32)
  for layer, head in heads:
    mask[0, layer, head] = 0
  ours = smollm2_engine.generate_tokens(ids, mask, max_new_tokens=16)[0]
  for prompt, generated in zip(ids, ours):
    with torch.no_grad(), ablated_heads(smollm2_torch, heads):
      expected = smollm2_torch.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)
    assert generated == expected[0, len(prompt):].tolist()


def test_stop_strings_cut_text_and_end_early(tiny_model):
  engine = Engine(tiny_model)
  requests = [GenerationRequest("Count: 1 2 3", stop=(" ",), max_new_tokens=12),
              GenerationRequest("Hello", stop=(), max_new_tokens=5)]
  texts = engine.generate(requests, np.ones((2, 3, 6)))
  assert len(texts) == 2 and all(len(t) == 2 for t in texts)
  assert " " not in texts[0][0]


def _first_stop_token(token_strings, ids, stops, tables=None):
  """Index of the token on which the automaton reports a stop string, or None."""
  next_state, hit = tables or stop_tables(token_strings, stops)
  state = 0
  for position, token in enumerate(ids):
    if hit[token, state]:
      return position
    state = next_state[token, state]
  return None


def test_stop_automaton_finds_stop_strings_across_token_boundaries(tokenizer):
  tok = tokenizer
  strings = [tok.decode([i], skip_special_tokens=True) for i in range(len(tok))]
  rng = np.random.default_rng(0)
  pieces = ["def f(x):", "\n", "    return x", ")\n", "#", " Test", "Question", ":", " 42", "[", "DONE", "]",
            "\n\n", "ab", "Quest"]
  stops = ["\n#", "Question:", "[DONE]", "\n\n"]
  tables = stop_tables(strings, stops)
  for _ in range(200):
    text = "".join(rng.choice(pieces, size=8))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    found = _first_stop_token(strings, ids, stops, tables)
    ends = [text.find(s) + len(s) for s in stops if s in text]
    if not ends:
      assert found is None
    else:  # the stop is reported on the token that completes its first occurrence
      decoded_before = tok.decode(ids[:found])
      decoded_through = tok.decode(ids[:found + 1])
      assert not any(s in decoded_before for s in stops)
      assert any(s in decoded_through for s in stops)


def test_stop_automaton_handles_overlapping_patterns():
  strings = ["ab", "a", "b", "c", "xa", "bcx"]
  assert _first_stop_token(strings, [1, 1, 2], ["aab"]) == 2
  assert _first_stop_token(strings, [4, 5], ["abc"]) == 1  # "xa" + "bcx": the stop straddles tokens
  assert _first_stop_token(strings, [3, 3, 3], ["ab"]) is None
  next_state, hit = stop_tables(strings, [])
  assert next_state.shape == (6, 1) and not hit.any()


def test_truncate_at_first_stop():
  assert truncate_at_stop("42\n\nQuestion: next", ["Question:", "\n\n"]) == "42"
  assert truncate_at_stop("no stop here", ["[DONE]"]) == "no stop here"


def test_generation_batches_equal_one_by_one(tiny_model):
  requests = [GenerationRequest(p, max_new_tokens=6) for p in PROMPTS[:5]]
  masks = np.ones((3, 3, 6), np.float32)
  masks[1, 0, 2] = 0
  masks[2, 2, 5] = 0
  batched = Engine(tiny_model, EngineConfig(generation_batch=16)).generate(requests, masks)
  one_at_a_time = Engine(tiny_model, EngineConfig(generation_batch=1))
  single = [[one_at_a_time.generate([r], m[None])[0][0] for r in requests] for m in masks]
  assert batched == single


def test_both_kernel_layouts_generate_the_same_texts(tiny_model, monkeypatch):
  """The decode step's kernels output-major (a CPU without AVX-512) or as stored (one with it,
  `decoder.kernels_output_major`): the same texts, a machine of either kind testing both."""
  requests = [GenerationRequest(p, max_new_tokens=8) for p in PROMPTS[:6]]
  masks = np.ones((2, 3, 6), np.float32)
  masks[1, 1, :3] = 0
  texts = []
  for output_major in (True, False):
    monkeypatch.setattr(decoder, "kernels_output_major", lambda output_major=output_major: output_major)
    texts.append(Engine(tiny_model, EngineConfig(generation_batch=4)).generate(requests, masks))
  assert texts[0] == texts[1]
  assert texts[0][0] != texts[0][1]  # the mask changes what is generated


def test_idle_rows_do_not_keep_the_loop_running(tiny_model):
  """5 prompts in 8 row slots (3 never filled): once the real rows end, the decode loop ends, whatever the budget."""
  stops = tuple(chr(c) for c in range(32, 127)) + ("\n",)  # every printable character: each row ends at once
  requests = [GenerationRequest(f"Hello there {i}", stop=stops, max_new_tokens=512) for i in range(5)]
  engine = Engine(tiny_model, EngineConfig(generation_batch=8))
  before = engine.stats.calls
  engine.generate(requests, np.ones((1, 3, 6)))
  stopped = engine.stats.calls - before
  requests = [GenerationRequest(f"Hello there {i}", stop=(), max_new_tokens=512) for i in range(5)]
  before = engine.stats.calls
  engine.generate(requests, np.ones((1, 3, 6)))
  assert stopped <= 4 < 512 // 16 <= engine.stats.calls - before  # weights, load, insert, a chunk; else every chunk


def _ablations(config, rng):
  """Keyword sets of `Engine.generate` for head, neuron and mean ablation: three masks each, one keeping all."""
  heads = np.ones((3, config.num_layers, config.num_heads), np.float32)
  heads[1].reshape(-1)[rng.choice(config.num_head_total, 3, replace=False)] = 0
  heads[2, config.num_layers // 2] = 0
  neurons = np.ones((3, config.num_layers, config.intermediate_size), np.float32)
  neurons[1, 0, rng.choice(config.intermediate_size, config.intermediate_size // 4, replace=False)] = 0
  neurons[2, -1, :config.intermediate_size // 2] = 0
  fill = rng.normal(size=(config.num_layers, config.num_heads, config.head_dim)).astype(np.float32)
  return {"heads": dict(head_masks=heads), "neurons": dict(neuron_masks=neurons),
          "mean": dict(head_masks=heads, head_fill=fill)}


def _few_shot_requests(max_new_tokens, stop=("\n\n", "Q:")):
  shots = "".join(f"Q: what is {a} and {b}?\nA: {a + b}\n\n" for a, b in [(2, 3), (4, 1), (5, 2)])
  questions = ["what is 1 and 1?", "name a colour", "what is 7 and 2? think step by step", "x", "count to five"]
  return [GenerationRequest(shots + f"Q: {q}\nA:", stop=stop, max_new_tokens=max_new_tokens) for q in questions]


# Each kind of ablation and each family in CI; every pairing in the slow tier (each compiles for ~40 s on 2 cores).
@pytest.mark.parametrize("kind,family", [("heads", "gemma3"), ("neurons", "llama"), ("mean", "llama"),
                                         pytest.param("heads", "llama", marks=pytest.mark.slow),
                                         pytest.param("neurons", "gemma3", marks=pytest.mark.slow),
                                         pytest.param("mean", "gemma3", marks=pytest.mark.slow)])
def test_generation_equals_the_previous_generator(tokenizer, family, kind, monkeypatch):
  """Shared prefix, rows refilled and masks swapped in two row slots, each row's cache in blocks (of 8 positions here,
  so that the rows' ~10-40 cross several) read as far as the rows have come, Gemma 3's sliding layers reading the
  prefix from the first entry their window still sees (in steps of 8 here, so that this ~60-token prefix has some to
  skip): every text as the generator before them gave it (which recomputed each row's whole prompt)."""
  model = make_tiny(tokenizer, **(GEMMA3 if family == "gemma3" else {}))
  monkeypatch.setattr(generation_kernels, "CACHE_BLOCK", 8)
  monkeypatch.setattr(generation_kernels, "WINDOW_SKIP_STEP", 8)
  read = []
  read_blocks = generation_kernels.read_blocks
  monkeypatch.setattr(generation_kernels, "read_blocks", lambda *args: read.append(read_blocks(*args)) or read[-1])
  skips = []
  window_skip = generation_kernels.window_skip
  monkeypatch.setattr(generation_kernels, "window_skip", lambda *args: skips.append(window_skip(*args)) or skips[-1])
  requests = _few_shot_requests(24)
  kwargs = _ablations(model.config, np.random.default_rng(0))[kind]
  engine = Engine(model, EngineConfig(generation_batch=2))
  ours = engine.generate(requests, **kwargs)
  assert ours == PreviousGenerator(engine.shared).generate(requests, **kwargs)
  assert len({tuple(texts) for texts in ours}) > 1  # the masks change what is generated
  layout = next(iter(engine.generator._layouts.values()))  # noqa: SLF001
  assert layout.slots * layout.rows == 2  # so 15 (mask, prompt) pairs needed refills and mask swaps
  assert (max(skips) > 0) == (family == "gemma3")  # the sliding layers' chunks left out the front of the prefix
  assert len(set(read)) > 2  # calls read more blocks as their rows grew


def test_a_row_cache_is_held_in_blocks_and_read_as_far_as_it_is_filled():
  assert generation_kernels.cache_blocks(384) == (64,) * 6
  assert generation_kernels.cache_blocks(48) == (48,)
  assert generation_kernels.cache_blocks(150) == (64, 64, 22)
  assert generation_kernels.cache_blocks(1792) == (224,) * 8  # at most 8 blocks
  assert [generation_kernels.read_blocks(n, 150) for n in (0, 1, 64, 65, 128, 129, 150)] == [0, 1, 1, 2, 2, 3, 3]


def test_window_skip_leaves_out_only_what_every_window_has_passed():
  """A query at p sees keys at positions > p - window: the front below p - window + 1, in whole steps of 128, short
  of the whole prefix; nothing for a model without sliding layers."""
  from jaxloc.models.config import FULL, SLIDING, ModelConfig

  fields = dict(model_type="gemma3_text", vocab_size=16, hidden_size=8, intermediate_size=8, num_layers=2,
                num_heads=1, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4)
  gemma = ModelConfig(**fields, sliding_window=512, layer_types=(SLIDING, FULL))
  assert generation_kernels.window_skip(gemma, 768, 717) == 128  # GSM8K's first step: 206 passed
  assert generation_kernels.window_skip(gemma, 768, 639) == 128 and generation_kernels.window_skip(gemma, 768, 638) == 0
  assert generation_kernels.window_skip(gemma, 768, 1000) == 384
  assert generation_kernels.window_skip(gemma, 256, 5000) == 128  # at least one entry left
  assert generation_kernels.window_skip(gemma, 0, 5000) == 0  # no prefix
  assert generation_kernels.window_skip(ModelConfig(**dict(fields, model_type="llama")), 768, 5000) == 0


def test_rows_refill_and_masks_swap_as_rows_end(tiny_model):
  """Uneven lengths (a stop string most rows meet early, a budget that ends the rest): with few row slots each is
  filled again as its row ends, and a mask slot takes the next mask once its mask's rows have all ended; every
  (mask, prompt) pair comes back exactly once, with the tokens it gets generated alone."""
  from jaxloc.engine.masks import check_fills, check_masks

  requests = _few_shot_requests(20)
  masks = np.ones((4, 3, 6), np.float32)
  masks[1, 0, 2] = masks[2, 2, 5] = masks[3, 1, :] = 0
  engine = Engine(tiny_model, EngineConfig(generation_batch=4))
  ids = [tiny_model.tokenizer(r.context)["input_ids"] for r in requests]
  stops = ("s",)  # ends rows after 1, 10, 12 or 20 tokens on this model
  config = tiny_model.config
  got = list(engine.generator._generate_grid(ids, list(range(len(ids))), check_masks(config, masks),  # noqa: SLF001
                                             check_fills(config, None), stops, 20))
  assert sorted(pair for pair, _ in got) == [(m, i) for m in range(len(masks)) for i in range(len(ids))]
  assert len({len(tokens) for _, tokens in got}) > 2  # rows ended at different steps
  alone = Engine(tiny_model, EngineConfig(generation_batch=1))
  for (m, i), tokens in got:
    assert tokens == next(alone.generator._generate_grid(ids, [i], check_masks(config, masks[m:m + 1]),  # noqa: SLF001
                                                         check_fills(config, None), stops, 20))[1]
  assert engine.generator._insert_fn.compiled_shapes() >= 2  # noqa: SLF001  the first fill and smaller refills


def test_a_job_without_a_wide_prefix_spreads_masks_over_slots_and_prefills_by_width(tiny_model, monkeypatch):
  """Prompts of different lengths that share no prefix wider than themselves, more (mask, prompt) pairs than a call
  holds: the planner spreads the call's rows over mask slots of one row, a free slot takes on a mask whose prompts are
  still pending once every mask has started, and rows are prefilled at their own width (not the longest prompt's);
  every pair comes back exactly once, with the tokens it gets generated alone."""
  from jaxloc.engine import generator
  from jaxloc.engine.masks import check_fills, check_masks

  words = "the cat sat on a mat and then it ran far away from home".split() * 4
  prompts = [" ".join(words[:n]) for n in (2, 3, 5, 8, 30, 50)] * 2
  masks = np.ones((4, 3, 6), np.float32)
  masks[1, 0, 2] = masks[2, 2, 5] = masks[3, 1, :] = 0
  engine = Engine(tiny_model, EngineConfig(generation_batch=8))
  assigned = []
  assign = generator.assign_masks

  def recording(*args):
    got = assign(*args)
    assigned.append(got)
    return got

  monkeypatch.setattr(generator, "assign_masks", recording)
  insert, widths = engine.generator._insert_fn, set()  # noqa: SLF001

  def inserting(params, state, slot, row, tokens, lengths, **static):
    widths.add(tokens.shape[-1])
    return insert(params, state, slot, row, tokens, lengths, **static)

  monkeypatch.setattr(engine.generator, "_insert_fn", inserting)
  ids = [tiny_model.tokenizer(p)["input_ids"] for p in prompts]
  stops = ("s",)
  config = tiny_model.config
  got = list(engine.generator._generate_grid(ids, list(range(len(ids))), check_masks(config, masks),  # noqa: SLF001
                                             check_fills(config, None), stops, 20))
  layout = next(iter(engine.generator._layouts.values()))  # noqa: SLF001
  assert (layout.slots, layout.rows) == (8, 1)  # the call's 8 rows over 8 mask slots
  assert sorted(pair for pair, _ in got) == [(m, i) for m in range(len(masks)) for i in range(len(ids))]
  assert len({len(tokens) for _, tokens in got}) > 2  # rows ended at different steps
  first = [m for _, m in assigned[0]]
  assert sorted(first[:4]) == [0, 1, 2, 3] and len(first) == 8  # four slots beside the masks' own take on their work
  assert len(widths) >= 2  # short prompts prefilled narrower than the longest
  alone = Engine(tiny_model, EngineConfig(generation_batch=1))
  for (m, i), tokens in got:
    assert tokens == next(alone.generator._generate_grid(ids, [i], check_masks(config, masks[m:m + 1]),  # noqa: SLF001
                                                         check_fills(config, None), stops, 20))[1]


def test_shared_prefix_length_leaves_every_prompt_a_token():
  assert shared_prefix_length([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7]]) == 5
  assert shared_prefix_length([[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 9, 9]]) == 4  # the shorter one keeps its last token
  assert shared_prefix_length([[1, 2, 3, 9], [1, 2, 3, 8]]) == 0  # under the minimum worth a call
  assert shared_prefix_length([[4, 4, 4, 4, 4, 4, 4]]) == 6  # one prompt: all but its last token, once per mask


def _gsm8k_requests(tokenizer, count, max_new_tokens):
  questions = [q for q, _ in gsm8k.FEW_SHOT]
  del tokenizer
  return [GenerationRequest(gsm8k.few_shot_prefix() + gsm8k.question_text(questions[i % len(questions)]),
                            stop=gsm8k.STOP, max_new_tokens=max_new_tokens) for i in range(count)]


@pytest.mark.slow  # two minutes a kind: the tiny Llama and Gemma 3 cover all three kinds in CI
@pytest.mark.parametrize("kind", ["heads", "neurons", "mean"])
def test_smollm2_gsm8k_generation_equals_the_previous_generator(smollm2, smollm2_engine, kind):
  """The real 5-shot GSM8K prompt (about 700 shared tokens) on the embedded default in float32: the texts, cut at
  `Question:`, equal the previous generator's under every kind of ablation."""
  requests = _gsm8k_requests(smollm2.tokenizer, 3, 48)
  kwargs = _ablations(smollm2.config, np.random.default_rng(1))[kind]
  ours = smollm2_engine.generate(requests, **kwargs)
  assert ours == PreviousGenerator(smollm2_engine.shared).generate(requests, **kwargs)
  assert any("####" in text or "Question" not in text for text in ours[0])


def test_a_layout_near_the_budget_is_checked_against_xla(tiny_model, caplog):
  """Where the planner's estimate comes within half the budget, the compiled decode call's memory analysis decides;
  the job then runs on that very executable and generates what an unconstrained engine does."""
  import logging

  from jaxloc.engine.planner import GIB

  requests = _few_shot_requests(8)
  masks = np.ones((2, 3, 6), np.float32)
  masks[1, 0, 2] = 0
  free = Engine(tiny_model, EngineConfig(generation_batch=8))
  expected = free.generate(requests, masks)
  estimate = next(iter(free.generator._layouts.values())).estimated_bytes  # noqa: SLF001
  tight = Engine(tiny_model, EngineConfig(generation_batch=8, memory_budget_gb=1.5 * estimate / GIB,
                                          residual_cache_gb=0))
  with caplog.at_level(logging.INFO, logger="jaxloc.engine.generator"):
    assert tight.generate(requests, masks) == expected
  assert any("XLA" in r.message for r in caplog.records)
  assert tight.generator._decode_fn.compiled_shapes() >= 1  # noqa: SLF001


def test_xla_over_the_budget_with_held_layers_lets_them_go_first(tiny_model, monkeypatch):
  """Where XLA measures the held layout over the budget (here made to), the job keeps its slots and rows and lets go
  of the held layers (each decode call lays them out itself) before it shrinks, and generates the held job's
  tokens."""
  from jaxloc.engine import generator
  from jaxloc.engine.planner import GIB

  requests = _few_shot_requests(8)
  masks = np.ones((2, 3, 6), np.float32)
  masks[1, 0, 2] = 0
  free = Engine(tiny_model, EngineConfig(generation_batch=8))
  expected = free.generate(requests, masks)
  held = next(iter(free.generator._layouts.values()))  # noqa: SLF001
  assert held.held_layers
  measure = generator.xla_bytes
  # The decode call's resident arrays leave out the laid-out layers exactly where the job holds them.
  monkeypatch.setattr(generator, "xla_bytes", lambda executable, resident: measure(executable, resident)
                      + (0 if "layers" in resident else 1 << 40))
  tight = Engine(tiny_model, EngineConfig(generation_batch=8, memory_budget_gb=1.5 * held.estimated_bytes / GIB,
                                          residual_cache_gb=0))
  assert tight.generate(requests, masks) == expected
  unheld = next(iter(tight.generator._layouts.values()))  # noqa: SLF001
  assert (unheld.slots, unheld.rows, unheld.held_layers) == (held.slots, held.rows, False)



def test_inserts_and_mask_loads_within_a_prefill_room_generate_the_same_texts(tiny_model, monkeypatch):
  """A layout's prefill room bounds what each insert and mask load holds (`Planner.insert_call`,
  `Planner.load_masks`): in a room of one byte (made so here) every insert starts one row in one mask slot and every
  load loads one mask, and the job generates what an unbounded one does."""
  import dataclasses

  from jaxloc.engine.planner import Planner

  requests = _few_shot_requests(8) * 4
  masks = np.ones((4, 3, 6), np.float32)
  masks[1, 0, 2] = masks[2, 1, 0] = masks[3, 2, 5] = 0
  free = Engine(tiny_model, EngineConfig(generation_batch=8))
  expected = free.generate(requests, masks)
  free_calls = free.shared.stats.calls
  (key, layout), = free.generator._layouts.items()  # noqa: SLF001
  prefix, suffix = key[2:4]
  assert layout.prefill_room is None and free.shared.planner.insert_call(layout.slots, layout.rows, suffix) != (1, 1)
  plan = Planner.generation_slots
  monkeypatch.setattr(Planner, "generation_slots",
                      lambda self, **kw: dataclasses.replace(plan(self, **kw), prefill_room=1))
  roomless = Engine(tiny_model, EngineConfig(generation_batch=8))
  assert roomless.generate(requests, masks) == expected
  planner = roomless.shared.planner
  assert planner.insert_call(layout.slots, layout.rows, suffix, prefix=prefix, room=1) == (1, 1)
  assert planner.load_masks(layout.slots, prefix, 1) == 1
  assert roomless.shared.stats.calls > free_calls  # the same rows, started in more calls
