"""jaxloc's hand-written benchmark tasks against lm-eval's own definitions of the same tasks.

lm-eval's registered task (its YAML, its process_docs, its templates) is built with its dataset pointed at a local
JSON file holding the very rows jaxloc's hand-written task reads from `--data_dir`; both must ask the model the same
thing: the same (context, continuation) pairs, encoded the same way (lm-eval's HF encoding, `joint`), or the same
generation prompt and stop strings. What remains different is pinned here too (and said in README/registry docs):
gsm8k draws its five examples with lm-eval's `first_n` sampler (lm-eval: random per question); wmdp also reports
acc_norm; gsm8k names its metrics exact_match_strict/_flexible (lm-eval: exact_match,strict-match/,flexible-extract).
"""

import json

import pytest

from jaxloc.engine.requests import GenerationRequest
from jaxloc.tasks import benchmarks, gsm8k
from jaxloc.tasks.registry import get_task
from tests.optional import optional_module

optional_module("lm_eval")

HELLASWAG = [benchmarks.HellaSwagTask.spec.example,
             {"ind": 12, "activity_label": "Playing the harmonica [title] How to play",
              "ctx_a": "A man is sitting on a bench [step] holding a harmonica.", "ctx_b": "he",
              "endings": ["plays a tune [title] loudly.", "puts it away.", "throws it  far.", "eats it."],
              "label": "0"}]
BOOLQ = [benchmarks.BoolQTask.spec.example,
         {"passage": "The Eiffel Tower is a wrought-iron lattice tower in Paris.",
          "question": "is the eiffel tower in paris", "label": 1}]
ARC = [benchmarks.ARCChallengeTask.spec.example,
       {"id": "x1", "question": "Which gas do plants take in?", "answerKey": "2",
        "choices": {"text": ["oxygen", "carbon dioxide", "helium"], "label": ["1", "2", "3"]}}]
MMLU = [{"question": " Find all zeros of x^2 + 1 in Z_2. ", "subject": "abstract_algebra",
         "choices": ["0", "1", "0,1", "none"], "answer": 1}, benchmarks.MMLUTask.spec.example]
WMDP = [{"question": "Which of the following is a virus?", "choices": ["E. coli", "Influenza", "Yeast", "Algae"],
         "answer": 1}]
GSM8K = [gsm8k.SPEC.example, {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
                              "answer": "3 + 4 = <<3+4=7>>7\n#### 7"}]


def _lm_eval_requests(name, splits, directory, **overrides):
  """lm-eval's registered task `name`, its dataset replaced by local JSON files {split: rows}: each document's
  request arguments, in lm-eval's order."""
  from jaxloc.tasks.harness import FEWSHOT_SEED, task_manager

  files = {}
  for split, rows in splits.items():
    path = directory / f"{name}_{split}.json"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    files[split] = str(path)
  manager = task_manager()
  task = manager._factory.build(  # noqa: SLF001 - the registered YAML with a local dataset, as lm-eval merges overrides
      manager._index[name], registry=manager._index,  # noqa: SLF001
      overrides={"dataset_path": "json", "dataset_name": None, "dataset_kwargs": {"data_files": files}, **overrides})
  task.set_fewshot_seed(FEWSHOT_SEED)
  task.build_all_requests()
  by_doc = {}
  for instance in sorted(task.instances, key=lambda i: (i.doc_id, i.idx)):
    by_doc.setdefault(instance.doc_id, []).append(instance.args)
  return list(by_doc.values())


def _jaxloc_requests(name, rows, directory, local_name=None, split="test", **options):
  path = directory / "data" / (local_name or name) / f"{split}.jsonl"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(row) + "\n" for row in rows))
  task = get_task(name, **options)
  docs = task.load_docs(data_dir=str(directory / "data"))
  return task, docs, task.requests(docs)


@pytest.mark.parametrize("name,lm_eval_name,rows,split,options", [
    ("hellaswag", "hellaswag", HELLASWAG, "validation", {}),
    ("boolq", "boolq", BOOLQ, "validation", {}),
    ("arc_challenge", "arc_challenge", ARC, "test", {}),
    ("mmlu", "mmlu_abstract_algebra", MMLU, "test", {"subjects": "abstract_algebra"}),
    ("wmdp_bio", "wmdp_bio", WMDP, "test", {}),
])
@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_multiple_choice_tasks_ask_what_lm_eval_asks(name, lm_eval_name, rows, split, options, tmp_path):
  task, docs, ours = _jaxloc_requests(name, rows, tmp_path, split=split, **options)
  theirs = _lm_eval_requests(lm_eval_name, {split: rows, "train": rows, "dev": rows}, tmp_path)
  assert all(request.joint for request in ours)
  per_doc, start = [], 0
  for doc in docs:
    per_doc.append([(r.context, r.continuation) for r in ours[start:start + len(doc["choices"])]])
    start += len(doc["choices"])
  assert per_doc == theirs


def test_gsm8k_asks_what_lm_eval_asks_with_its_first_n_sampler(tmp_path):
  train = [{"question": q, "answer": a} for q, a in gsm8k.FEW_SHOT]
  _, _, ours = _jaxloc_requests("gsm8k", GSM8K, tmp_path)
  theirs = _lm_eval_requests("gsm8k", {"test": GSM8K, "train": train}, tmp_path, fewshot_config={"sampler": "first_n"})
  assert all(isinstance(r, GenerationRequest) for r in ours)
  assert [[(r.context,)] for r in ours] == [[(args[0],)] for (args,) in theirs]
  assert {tuple(args[1]["until"]) for (args,) in theirs} == {r.stop for r in ours}
  # lm-eval's default sampler draws other examples: the one deviation of the hand-written task
  sampled = _lm_eval_requests("gsm8k", {"test": GSM8K, "train": train * 2}, tmp_path)
  assert [args[0] for (args,) in sampled] != [r.context for r in ours]
