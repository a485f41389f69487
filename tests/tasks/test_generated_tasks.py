"""Generated tasks (arithmetic, counting, plurals, induction): pinned prompts and tokenization."""

import pytest

from jaxloc.tasks import arithmetic, registry, synthetic


@pytest.mark.parametrize("name, prompt, target", [
    ("arithmetic_2da", "Question: What is 3 plus 47?\nAnswer:", " 50"),
    ("arithmetic_2ds", "Question: What is 88 minus 56?\nAnswer:", " 32"),
    ("arithmetic_2dm", "Question: What is 88 times 89?\nAnswer:", " 7832"),
    ("arithmetic_1dc", "Question: What is (4 * 5) + 9?\nAnswer:", " 29"),
    ("arithmetic_5da", "Question: What is 43630 plus 56276?\nAnswer:", " 99906"),
    ("counting", "1, 2, 3,", " 4"),
])
def test_pinned_first_doc(name, prompt, target):
  task = registry.get_task(name)
  [request] = task.requests(task.load_docs()[:1])
  assert (request.context, request.continuation) == (prompt, target)
  assert request.add_special_tokens


def test_arithmetic_answers_are_correct():
  for subtask in arithmetic.SUBTASKS:
    for doc in arithmetic.generate_subtask(subtask, count=50):
      expression = doc["prompt"].removeprefix("Question: What is ").removesuffix("?\nAnswer:")
      expression = expression.replace(" plus ", "+").replace(" minus ", "-").replace(" times ", "*")
      assert eval(expression) == int(doc["target"]), doc  # noqa: S307 (our own arithmetic)


def test_one_digit_few_shot_prompt():
  task = registry.get_task("arithmetic_1d_4shot")
  docs = task.load_docs()
  assert len(docs) == 3 * 96  # under each of three example sets, all pairs but its four examples
  by_id = {doc["id"]: doc for doc in docs}
  assert "1d-9+0" not in by_id and "1d-9+0-s1" in by_id and "1d-7+1-s1" not in by_id and "1d-7+1" in by_id
  for doc in docs:
    a, b = (int(x) for x in doc["prompt"].rsplit("What is ", 1)[1].removesuffix("?\nAnswer:").split(" plus "))
    assert int(doc["target"]) == a + b and f"What is {a} plus {b}?" not in doc["prompt"].rsplit("\n\n", 1)[0]
  request = task.requests([by_id["1d-7+5"]])[0]
  assert request.context == (
      "Question: What is 2 plus 3?\nAnswer: 5\n\n"
      "Question: What is 6 plus 1?\nAnswer: 7\n\n"
      "Question: What is 4 plus 8?\nAnswer: 12\n\n"
      "Question: What is 9 plus 0?\nAnswer: 9\n\n"
      "Question: What is 7 plus 5?\nAnswer:")
  assert request.continuation == " 12"


def test_plurals_prompt():
  task = registry.get_task("plurals")
  docs = {doc["id"]: doc for doc in task.load_docs()}
  assert "plural-dog" not in docs  # few-shot examples are not test items
  [request] = task.requests([docs["plural-mouse"]])
  assert request.context == "dog: dogs\nbox: boxes\ncity: cities\nchild: children\nmouse:"
  assert request.continuation == " mice"


def test_induction_prompt_and_tokenization(tokenizer):
  task = registry.get_task("induction")
  docs = task.load_docs(num_samples=20)
  requests = task.requests(docs, tokenizer)
  first = task.requests([{"id": "induction-0", "seed": 0}], tokenizer)[0]
  assert first.context == (
      "<|endoftext|> legs refrig proclaim unl highways which pins trustees offset pyramid"
      " legs refrig proclaim unl highways which pins trustees offset")
  assert first.continuation == " pyramid"
  for request in requests:
    context_ids = tokenizer(request.context).input_ids
    target_ids = tokenizer(request.continuation, add_special_tokens=False).input_ids
    assert context_ids[0] == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert len(context_ids) == 1 + 2 * task.sequence_length - 1
    sequence = context_ids[1:]
    half = task.sequence_length
    assert sequence[half:] == sequence[:half - 1] and len(set(sequence[:half])) == half
    assert target_ids == [sequence[half - 1]]
  assert requests == task.requests(docs, tokenizer)  # deterministic


def test_induction_words_round_trip(tokenizer):
  words = synthetic.single_token_words(tokenizer)
  assert len(words) > 1000
  sample = list(words)[::500]
  assert all(tokenizer(word, add_special_tokens=False).input_ids == [words[word]]
             for word in sample)
  assert synthetic.sequence_start(tokenizer) == "<|endoftext|>"


def test_induction_uses_the_bos_a_tokenizer_adds_itself(tokenizer):
  class AddsBos:
    """Wraps the SmolLM2 tokenizer so that it prepends a BOS, like Llama-3's."""

    def __init__(self, inner):
      self.inner = inner
      self.bos_id = inner.convert_tokens_to_ids("<|im_start|>")
      self.bos_token = self.eos_token = None

    def __call__(self, text, add_special_tokens=True):
      encoding = self.inner(text, add_special_tokens=False)
      if add_special_tokens:
        if isinstance(text, str):
          encoding["input_ids"] = [self.bos_id] + encoding["input_ids"]
      return encoding

    def __len__(self):
      return len(self.inner)

    def batch_decode(self, ids):
      return self.inner.batch_decode(ids)

  wrapped = AddsBos(tokenizer)
  assert synthetic.sequence_start(wrapped) == ""
  request = registry.get_task("induction").requests([{"id": "x", "seed": 0}], wrapped)[0]
  assert request.context.startswith(" legs refrig proclaim")
