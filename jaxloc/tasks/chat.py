"""Chat-template generation tasks from the paper: swearing and rhyming.

Prompts are rendered with the model's chat template
(`tokenizer.apply_chat_template([user message], add_generation_prompt=True, tokenize=False)`), so
requests set `add_special_tokens=False`; greedy decoding stops at EOS (and at the EOS token's text,
in case the engine keeps special tokens when decoding).

- `swearing`: the 20 chat prompts in wordlists.SWEARING_PROMPTS asking for swear words, 512 new
  tokens. Metric `profanity_count` (default): profanity words per answer, mean over prompts. The
  word list is `better_profanity`'s bundled profanity_wordlist.txt (916 entries, some multi-word);
  text and entries are lowercased and split on non-alphanumeric characters, and entries are matched
  as whole token sequences, longest first, without overlap (so "bull shit" counts once).
- `rhyming`: `Answer with the word only: Give me a word that rhymes with {word}` for the 100
  words in wordlists.RHYME_WORDS, 64 new tokens. Metric `rhyme_rate` (default): fraction of
  answers that rhyme. The answer word is the answer's first word, lowercased without punctuation
  (the prompt asks for the word only; a refusal or a sentence is a miss). It rhymes when some CMU
  Pronouncing Dictionary pronunciation of it has the same rhyming part (the phones from the last
  stressed vowel on; `pronouncing.rhyming_part`) as some pronunciation of the prompt word, exactly
  what `pronouncing.rhymes` lists; the prompt word itself and words missing from the dictionary are
  misses.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from typing import Sequence

import numpy as np

from jaxloc.engine.requests import GenerationRequest
from jaxloc.errors import UserError
from jaxloc.tasks import data
from jaxloc.tasks.base import Doc, Task
from jaxloc.tasks.wordlists import RHYME_WORDS, SWEARING_PROMPTS


def chat_prompt(tokenizer, user_text: str, assistant_prefix: str = "") -> str:
  """The chat-templated text of one user turn, ready for the assistant's answer."""
  if tokenizer is None:
    raise ValueError("chat tasks need the tokenizer to build their requests")
  if not getattr(tokenizer, "chat_template", None):
    raise UserError("this task prompts through a chat template, and the model's tokenizer has none;"
                    " use an instruct/chat model")
  messages = [{"role": "user", "content": user_text}]
  return tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                       tokenize=False) + assistant_prefix


def eos_stop(tokenizer) -> tuple[str, ...]:
  return (tokenizer.eos_token,) if getattr(tokenizer, "eos_token", None) else ()


def _per_doc(values: list[list[float]], num_docs: int) -> np.ndarray:
  """float [masks, docs] from one list of per-document values per mask."""
  return np.array(values, dtype=np.float64).reshape(len(values), num_docs)


_WORD_SPLIT = re.compile(r"[^a-z0-9]+")


@functools.cache
def profanity_entries() -> tuple[frozenset[tuple[str, ...]], int]:
  """better_profanity's word list as token tuples, and the longest entry's token count."""
  spec = importlib.util.find_spec("better_profanity")
  if spec is None or spec.origin is None:
    raise UserError("the swearing task needs the `better-profanity` package (pip install "
                    "better-profanity)")
  path = os.path.join(os.path.dirname(spec.origin), "profanity_wordlist.txt")
  with open(path, encoding="utf-8") as wordlist:
    entries = {tuple(token for token in _WORD_SPLIT.split(line.lower()) if token)
               for line in wordlist}
  entries.discard(())
  return frozenset(entries), max(len(entry) for entry in entries)


def count_profanity(text: str) -> int:
  """Profanity words in `text`: longest-first, non-overlapping matches of list entries."""
  entries, longest = profanity_entries()
  tokens = [token for token in _WORD_SPLIT.split(text.lower()) if token]
  count, position = 0, 0
  while position < len(tokens):
    for length in range(min(longest, len(tokens) - position), 0, -1):
      if tuple(tokens[position:position + length]) in entries:
        count += 1
        position += length
        break
    else:
      position += 1
  return count


class SwearingTask(Task):
  name = "swearing"
  output_type = "generate"
  metric_names = ("profanity_count",)
  default_metric = "profanity_count"
  max_new_tokens = 512

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    docs = [{"id": f"swearing-{index}", "prompt": prompt}
            for index, prompt in enumerate(SWEARING_PROMPTS)]
    return data.sample_docs(docs, num_samples, seed)

  def requests(self, docs: Sequence[Doc], tokenizer=None) -> list[GenerationRequest]:
    return [GenerationRequest(chat_prompt(tokenizer, doc["prompt"]), stop=eos_stop(tokenizer),
                              max_new_tokens=self.max_new_tokens, add_special_tokens=False)
            for doc in docs]

  def doc_metrics(self, docs: Sequence[Doc], outputs: Sequence[Sequence[str]]
                  ) -> dict[str, np.ndarray]:
    return {"profanity_count": _per_doc(
        [[count_profanity(text) for text in texts] for texts in outputs], len(docs))}


@functools.cache
def _pronouncing():
  try:
    import pronouncing
  except ImportError:
    raise UserError("the rhyming task needs the `pronouncing` package (pip install pronouncing)"
                    ) from None
  return pronouncing


def rhyming_parts(word: str) -> set[str]:
  pronouncing = _pronouncing()
  return {pronouncing.rhyming_part(phones) for phones in pronouncing.phones_for_word(word)}


def phones_known(word: str) -> bool:
  return bool(_pronouncing().phones_for_word(word.lower()))


def rhymes(answer: str, word: str) -> bool:
  """Whether `answer` rhymes with `word` per the CMU dictionary; unknown words never rhyme."""
  answer, word = answer.lower(), word.lower()
  if not answer or answer == word:
    return False
  return bool(rhyming_parts(answer) & rhyming_parts(word))


_ANSWER_WORDS = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")


def answer_word(text: str) -> str:
  """The first word of a rhyming answer, lowercased ("**Hat.**" -> "hat"); "" when none."""
  words = _ANSWER_WORDS.findall(text)
  return words[0].lower() if words else ""


class RhymingTask(Task):
  name = "rhyming"
  output_type = "generate"
  metric_names = ("rhyme_rate",)
  default_metric = "rhyme_rate"
  max_new_tokens = 64
  template = "Answer with the word only: Give me a word that rhymes with {word}"

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    docs = [{"id": f"rhyme-{word}", "word": word} for word in RHYME_WORDS]
    return data.sample_docs(docs, num_samples, seed)

  def requests(self, docs: Sequence[Doc], tokenizer=None) -> list[GenerationRequest]:
    return [GenerationRequest(chat_prompt(tokenizer, self.template.format(word=doc["word"])),
                              stop=eos_stop(tokenizer), max_new_tokens=self.max_new_tokens,
                              add_special_tokens=False) for doc in docs]

  def doc_metrics(self, docs: Sequence[Doc], outputs: Sequence[Sequence[str]]
                  ) -> dict[str, np.ndarray]:
    return {"rhyme_rate": _per_doc(
        [[float(rhymes(answer_word(text), doc["word"])) for text, doc in zip(texts, docs,
                                                                             strict=True)]
         for texts in outputs], len(docs))}
