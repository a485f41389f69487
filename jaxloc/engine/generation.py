"""Greedy decoding under head and/or neuron masks: one jitted prefill plus a `lax.while_loop` over new tokens.

Rows whose masks ablate nothing below layer l can resume the prefill at l from the prompts' unablated prefill
(`prompt_streams`, computed once per prompt and shared by every mask).

Axes: `batch` B (one (mask, request) pair each; every sequence carries its own head mask), `seq` S
(left-padded prompt), `cache` C = S + max_new_tokens, `layers` L, `kv_heads` K, `head_dim` Dh,
`vocab` V, `states` Q (of the stop-string automaton).

Stopping: EOS ids, and stop strings found in the decoded text inside the loop by an Aho–Corasick
automaton over characters, folded into per-token tables (`stop_tables`); the text is then cut at
the first stop string on the host. `generator.py` jits these functions and feeds them batches.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.models.layers import Context
from jaxloc.models.decoder import Ablation, OutputSpec, Resume, lm_logits


def stop_tables(token_strings: Sequence[str], stop_strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
  """An Aho–Corasick automaton over `stop_strings`, folded into per-token tables.

  Returns next_state [V, Q] (int32) and hit [V, Q] (bool): starting in automaton state q and reading
  the text of token v, the automaton ends in next_state[v, q], and hit[v, q] says whether any stop
  string ended on the way. Running it token by token therefore finds a stop string in the decoded text
  exactly, however the tokenizer split it (a stop "\n#" inside a token ")\n" followed by "#" too).
  Q = 1 + total stop length at most; tables for a 150k vocabulary take a few MB.
  """
  stops = [s for s in dict.fromkeys(stop_strings) if s]
  vocab = len(token_strings)
  if not stops:
    return np.zeros((vocab, 1), np.int32), np.zeros((vocab, 1), bool)
  alphabet = {ch: i for i, ch in enumerate(sorted(set("".join(stops))))}
  other = len(alphabet)  # any character no stop string contains: back to the root
  goto: list[dict[int, int]] = [{}]
  accept = [False]
  for stop in stops:
    state = 0
    for ch in stop:
      symbol = alphabet[ch]
      if symbol not in goto[state]:
        goto.append({})
        accept.append(False)
        goto[state][symbol] = len(goto) - 1
      state = goto[state][symbol]
    accept[state] = True
  num_states = len(goto)
  delta = np.zeros((num_states, other + 1), np.int32)
  fail = [0] * num_states
  queue = []
  for symbol in range(other):
    child = goto[0].get(symbol)
    if child is not None:
      delta[0, symbol] = child
      queue.append(child)
  while queue:  # breadth first: a state's failure link is final before its children need it
    state = queue.pop(0)
    accept[state] = accept[state] or accept[fail[state]]
    for symbol in range(other):
      child = goto[state].get(symbol)
      if child is None:
        delta[state, symbol] = delta[fail[state], symbol]
      else:
        fail[child] = delta[fail[state], symbol]
        delta[state, symbol] = child
        queue.append(child)
  accept_arr = np.asarray(accept)
  lengths = np.array([len(t) for t in token_strings])
  order = np.argsort(-lengths, kind="stable")  # longest first: at position p the live tokens lead
  next_state = np.tile(np.arange(num_states, dtype=np.int32), (vocab, 1))
  hit = np.zeros((vocab, num_states), bool)
  for position in range(int(lengths.max(initial=0))):
    live = order[:int((lengths > position).sum())]
    symbols = np.array([alphabet.get(token_strings[v][position], other) for v in live], np.int32)
    moved = delta[next_state[live], symbols[:, None]]
    next_state[live] = moved
    hit[live] |= accept_arr[moved]
  return next_state, hit


def _positions(prompt_valid):
  return jnp.maximum(jnp.cumsum(prompt_valid, axis=-1) - 1, 0)


def prompt_streams(module, params, prompt, prompt_valid, *, dtype):
  """The unablated prefill of distinct left-padded prompts [P, S]: the residual stream entering every layer
  [L, P, S, D] and every layer's keys and values [L, P, S, K, Dh]. Rows whose masks ablate nothing below layer l
  resume from them at l (`prefill`)."""
  out = module.apply({"params": params}, prompt[None], _positions(prompt_valid)[None],
                     segments=jnp.where(prompt_valid, 0, -1)[None], outputs=OutputSpec(kv=True, residuals=True),
                     dtype=dtype)
  return out.residual[:, 0], out.k[:, 0], out.v[:, 0]


def prefill(module, params, ablation: Ablation, prompt, prompt_valid, shared, dtype):
  """The prompts' model output under each row's masks: final hidden states [B, 1, S, D], keys/values
  [L, B, 1, S, K, Dh].

  shared: None, or (start_layer, row_prompt [B], streams): `streams` are `prompt_streams` of distinct prompts (at
  least as wide), row b holds prompt row_prompt[b], and no row ablates anything below start_layer; every row then
  resumes from its prompt's residual stream at start_layer and takes the keys/values of the layers below from it.
  """
  segments = jnp.where(prompt_valid, 0, -1)[:, None]
  positions = _positions(prompt_valid)[:, None]
  if shared is None:
    return module.apply({"params": params}, prompt[:, None], positions, ablation=ablation, segments=segments,
                        outputs=OutputSpec(kv=True), dtype=dtype)
  start_layer, row_prompt, (residuals, keys, values) = shared
  seq = prompt.shape[1]  # left padding: a prompt's streams at a narrower width are the last `seq` columns
  out = module.apply({"params": params}, prompt[:, None], positions, ablation=ablation, segments=segments,
                     start=Resume(start_layer, residuals[start_layer][row_prompt][:, None, -seq:]),
                     outputs=OutputSpec(kv=True), dtype=dtype)
  below = (jnp.arange(out.k.shape[0]) < start_layer).reshape((-1,) + (1,) * (out.k.ndim - 1))
  per_row = lambda kv: kv[:, row_prompt][:, :, None, -seq:]  # noqa: E731  [L, P, W, ...] -> [L, B, 1, S, ...]
  return dataclasses.replace(out, k=jnp.where(below, per_row(keys), out.k), v=jnp.where(below, per_row(values), out.v))


def truncate_at_stop(text: str, stop_strings: Sequence[str]) -> str:
  cut = len(text)
  for stop in stop_strings:
    at = text.find(stop)
    if at != -1:
      cut = min(cut, at)
  return text[:cut]


def greedy_generate(module, config, params, ablation: Ablation, prompt, prompt_valid, active, eos_ids, stop_next,
                    stop_hit, shared=None, *, max_new_tokens: int, pad_id: int, dtype):
  """Greedy continuation of left-padded prompts.

  prompt, prompt_valid: [B, S]; ablation: head/neuron masks [B, L, H] / [B, L, F], one per row; active: bool [B],
  False on rows that only pad the batch (they start finished, so they never keep the loop running); eos_ids: [E];
  stop_next, stop_hit: [V, Q], the stop-string automaton of `stop_tables`.
  shared: None, or (start_layer int32 scalar, row_prompt [B], `prompt_streams` of the distinct prompts) when no
    row ablates anything below start_layer: the rows' prefill resumes there (`prefill`).
  Returns tokens [B, max_new_tokens] (pad_id after a sequence ends) and how many each emitted [B],
  its stop token included.
  """
  batch, seq = prompt.shape
  positions = _positions(prompt_valid)
  out = prefill(module, params, ablation, prompt, prompt_valid, shared, dtype)
  pad = ((0, 0), (0, 0), (0, max_new_tokens), (0, 0), (0, 0))
  cache_k = jnp.pad(out.k[:, :, 0], pad)  # [L, B, C, K, Dh]
  cache_v = jnp.pad(out.v[:, :, 0], pad)
  cache_valid = jnp.concatenate([prompt_valid, jnp.zeros((batch, max_new_tokens), bool)], axis=1)
  first = jnp.argmax(lm_logits(config, params, out.hidden[:, 0, -1]), axis=-1).astype(jnp.int32)
  next_pos = positions[:, -1] + 1
  # Every cache slot's position (the new tokens' are known ahead): sliding-window layers see the keys of the last
  # `window` positions only, however long the cache.
  cache_positions = jnp.concatenate([positions, next_pos[:, None] + jnp.arange(max_new_tokens)], axis=1)[:, None]

  def cond(state):
    step, done = state[0], state[7]
    return (step < max_new_tokens) & ~done.all()

  def body(state):
    step, tokens, current, pos, cache_k, cache_v, cache_valid, done, automaton, lengths = state
    tokens = tokens.at[:, step].set(jnp.where(done, pad_id, current))
    lengths = lengths + (~done).astype(jnp.int32)
    done = done | (current[:, None] == eos_ids[None]).any(-1) | stop_hit[current, automaton]
    automaton = stop_next[current, automaton]
    context = Context(cache_k, cache_v, cache_valid[:, None, :], cache_positions)
    out = module.apply({"params": params}, current[:, None, None], pos[:, None, None], ablation=ablation,
                       context=context, outputs=OutputSpec(kv=True), dtype=dtype)
    write = seq + step
    cache_k = jax.lax.dynamic_update_slice_in_dim(cache_k, out.k[:, :, 0], write, axis=2)
    cache_v = jax.lax.dynamic_update_slice_in_dim(cache_v, out.v[:, :, 0], write, axis=2)
    cache_valid = jax.lax.dynamic_update_slice_in_dim(cache_valid, jnp.ones((batch, 1), bool), write, axis=1)
    following = jnp.argmax(lm_logits(config, params, out.hidden[:, 0, 0]), axis=-1).astype(jnp.int32)
    return step + 1, tokens, following, pos + 1, cache_k, cache_v, cache_valid, done, automaton, lengths

  state = (jnp.int32(0), jnp.full((batch, max_new_tokens), pad_id, jnp.int32), first, next_pos, cache_k,
           cache_v, cache_valid, ~active, jnp.zeros((batch,), jnp.int32),
           jnp.zeros((batch,), jnp.int32))
  final = jax.lax.while_loop(cond, body, state)
  return final[1], final[9]
