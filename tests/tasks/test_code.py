"""Code tasks: pinned prompts and pass@1 on known-correct and known-wrong solutions."""

import numpy as np

from jaxloc.tasks import registry

MBPP_ROW = {
    "task_id": 11,
    "text": "Write a python function to remove first and last occurrence of a given character from "
            "the string.",
    "code": "def remove_Occ(s,ch): \r\n    for i in range(len(s)): \r\n        if (s[i] == ch): "
            "\r\n            s = s[0 : i] + s[i + 1:] \r\n            break\r\n    for i in "
            "range(len(s) - 1,-1,-1):  \r\n        if (s[i] == ch): \r\n            s = s[0 : i] + "
            "s[i + 1:] \r\n            break\r\n    return s ",
    "test_list": ["assert remove_Occ(\"hello\",\"l\") == \"heo\"",
                  "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"",
                  "assert remove_Occ(\"PHP\",\"P\") == \"H\""],
}


def test_mbpp_pinned_prompt(write_jsonl, tmp_path):
  write_jsonl("mbpp/test.jsonl", [MBPP_ROW])
  task = registry.get_task("mbpp")
  [request] = task.requests(task.load_docs(data_dir=str(tmp_path)))
  assert request.context.startswith(
      "You are an expert Python programmer, and here is your task: Write a function to find the "
      "similar elements from the given two tuple lists. Your code should pass these tests:\n\n"
      "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)\n")
  assert "  return (res) \n[DONE]\n\nYou are an expert Python programmer" in request.context
  assert request.context.endswith(
      "[DONE]\n\nYou are an expert Python programmer, and here is your task: Write a python "
      "function to remove first and last occurrence of a given character from the string. Your "
      "code should pass these tests:\n\nassert remove_Occ(\"hello\",\"l\") == \"heo\"\n"
      "assert remove_Occ(\"abcda\",\"a\") == \"bcd\"\nassert remove_Occ(\"PHP\",\"P\") == \"H\"\n"
      "[BEGIN]\n")
  assert request.context.count("[BEGIN]") == 4 and request.context.count("[DONE]") == 3
  assert request.stop == ("[DONE]",) and request.max_new_tokens == 256


def test_mbpp_pass_at_1(write_jsonl, tmp_path):
  write_jsonl("mbpp/test.jsonl", [MBPP_ROW])
  task = registry.get_task("mbpp")
  docs = task.load_docs(data_dir=str(tmp_path))
  outputs = [
      [MBPP_ROW["code"]],  # mask 0: the reference solution
      ["def remove_Occ(s, ch):\n  return s[1:-1]"],  # mask 1: wrong answer
      ["def remove_Occ(s, ch):\n  while True: pass"],  # mask 2: hangs
  ]
  task.limits = type(task.limits)(timeout_s=2.0)
  np.testing.assert_allclose(task.compute_metrics(docs, outputs)["pass@1"], [1.0, 0.0, 0.0])


def test_humaneval_pinned_prompt(tokenizer):
  task = registry.get_task("humaneval")
  docs = task.load_docs()
  assert len(docs) == 164 and docs[0]["id"] == "HumanEval/0"
  [request] = task.requests(docs[:1], tokenizer)
  assert request.context.startswith(
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
      "<|im_end|>\n<|im_start|>user\nWrite a solution to the following problem and make sure that "
      "it passes the tests:\n```python\nfrom typing import List\n\n\ndef has_close_elements(")
  prompt = docs[0]["prompt"]
  assert request.context.endswith(
      prompt + "\n```\n<|im_end|>\n<|im_start|>assistant\nHere is the completed function:\n"
      "```python\n" + prompt + "\n")
  assert prompt.startswith("from typing import List\n\n\ndef has_close_elements(numbers: "
                           "List[float], threshold: float) -> bool:\n")
  assert request.stop == ("\nclass", "\ndef", "\n#", "\nif", "\nprint", "```")
  assert request.max_new_tokens == 1024 and not request.add_special_tokens


CANONICAL_0 = ("    for idx, elem in enumerate(numbers):\n"
               "        for idx2, elem2 in enumerate(numbers):\n"
               "            if idx != idx2:\n                distance = abs(elem - elem2)\n"
               "                if distance < threshold:\n                    return True\n\n"
               "    return False\n")


def test_humaneval_pass_at_1_with_check_functions():
  task = registry.get_task("humaneval")
  docs = task.load_docs()[:2]
  canonical_1 = ("    result = []\n    current_string = []\n    current_depth = 0\n\n"
                 "    for c in paren_string:\n        if c == '(':\n"
                 "            current_depth += 1\n"
                 "            current_string.append(c)\n        elif c == ')':\n"
                 "            current_depth -= 1\n            current_string.append(c)\n\n"
                 "            if current_depth == 0:\n"
                 "                result.append(''.join(current_string))\n"
                 "                current_string.clear()\n\n    return result\n")
  outputs = [
      [CANONICAL_0, canonical_1],
      # The text after the closing fence is dropped before running, as lm-eval does.
      [CANONICAL_0 + "```\nThis checks every pair.", "    return []\n"],
      ["    return None\n", "    return paren_string.split()\n"],
  ]
  np.testing.assert_allclose(task.compute_metrics(docs, outputs)["pass@1"], [1.0, 0.5, 0.0])


def test_humaneval_solutions_scores_the_canonical_solution_after_the_prompt():
  task = registry.get_task("humaneval_solutions")
  assert task.output_type == "loglikelihood" and task.default_metric == "logprob"
  docs = task.load_docs()
  assert len(docs) == 164
  first = next(doc for doc in docs if doc["id"] == "HumanEval/0")
  [request] = task.requests([first])
  assert request.context.startswith("from typing import List\n\n\ndef has_close_elements(")
  assert request.context == first["prompt"]
  assert request.continuation.startswith("    for idx, elem in enumerate(numbers):")
  subset = task.load_docs(num_samples=5, seed=1)
  assert subset == task.load_docs(num_samples=5, seed=1) and len(subset) == 5
