"""Stop strings of greedy generation: an Aho–Corasick automaton over characters folded into per-token tables, run
inside the compiled decode loop (`stop_tables`), and the host-side cut of the decoded text (`truncate_at_stop`).

Axes: `vocab` V, `states` Q (of the automaton).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


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


def truncate_at_stop(text: str, stop_strings: Sequence[str]) -> str:
  cut = len(text)
  for stop in stop_strings:
    at = text.find(stop)
    if at != -1:
      cut = min(cut, at)
  return text[:cut]
