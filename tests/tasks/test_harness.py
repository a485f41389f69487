"""lm-evaluation-harness tasks through jaxloc's engine, checked against lm-eval's own `simple_evaluate` with its HF
backend: the same task YAMLs (written here, reading local JSON files through lm-eval's `dataset_path: json`), one
per request type, on SmolLM2, unablated and with two heads ablated (jaxloc: one batch of masks; lm-eval: the
transformers model with the heads hooked)."""

import json
import math

import numpy as np
import pytest

from jaxloc.engine.requests import ScoreOutputs
from jaxloc.errors import UserError
from jaxloc.tasks.registry import get_task
from tests.optional import optional_module

optional_module("lm_eval")
torch = pytest.importorskip("torch")

HEADS = ["L1H5", "L1H4", "L1H3", "L8H1", "L20H5"]  # the default run's universal and plurals heads: every metric moves
WORDS = [("dog", "dogs"), ("cat", "cats"), ("mouse", "mice"), ("box", "boxes"), ("child", "children"),
         ("city", "cities"), ("foot", "feet"), ("leaf", "leaves"), ("knife", "knives"), ("tooth", "teeth")]
TEXTS = ["The cat sat on the mat and looked out of the window.", "Paris is the capital and largest city of France.",
         "def add(a, b):\n    return a + b\n", "Two plus two is four, and four plus four is eight."]


def _docs():
  docs = []
  for i, (word, plural) in enumerate(WORDS):
    wrong = [word, word + "es" if plural == word + "s" else word + "s"]
    choices = [plural, *wrong] if i % 3 == 0 else [*wrong, plural] if i % 3 == 1 else [wrong[0], plural, wrong[1]]
    docs.append({"word": word, "plural": plural, "choices": choices, "label": choices.index(plural),
                 "text": TEXTS[i % len(TEXTS)]})
  return docs


def _yaml(name, data, body):
  return (f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
          + body)


TASKS = {
    "multiple_choice": """output_type: multiple_choice
fewshot_split: test
num_fewshot: 2
fewshot_config:
  sampler: first_n
doc_to_text: "Plural of {{word}}:"
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list:
  - metric: acc
  - metric: acc_norm
""",
    "loglikelihood": """output_type: loglikelihood
doc_to_text: "The plural of {{word}} is "
doc_to_target: "{{plural}}"
metric_list:
  - metric: acc
  - metric: perplexity
""",
    "loglikelihood_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
    "generate_until": """output_type: generate_until
fewshot_split: test
num_fewshot: 3
fewshot_config:
  sampler: first_n
doc_to_text: "Plural of {{word}}:"
doc_to_target: " {{plural}}"
target_delimiter: ""
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
filter_list:
  - name: none
    filter:
      - function: take_first
  - name: first-word
    filter:
      - function: regex
        regex_pattern: "(\\\\w+)"
      - function: take_first
metric_list:
  - metric: exact_match
""",
}


ZERO_SHOT_CHOICE = """output_type: multiple_choice
doc_to_text: "The word {{word}} in the plural is"
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list:
  - metric: acc
  - metric: acc_norm
"""
# A group of two multiple-choice tasks scored as lm-eval scores mmlu: the size-weighted mean over its tasks.
GROUP = """group: toy_group
task:
  - toy_multiple_choice
  - toy_zero_shot_choice
aggregate_metric_list:
  - metric: acc
    weight_by_size: true
  - metric: acc_norm
    weight_by_size: true
"""


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
  directory = tmp_path_factory.mktemp("lm_eval_tasks")
  data = directory / "plurals.jsonl"
  data.write_text("".join(json.dumps(doc) + "\n" for doc in _docs()))
  files = {}
  for kind, body in {**TASKS, "zero_shot_choice": ZERO_SHOT_CHOICE}.items():
    path = directory / f"toy_{kind}.yaml"
    path.write_text(_yaml(f"toy_{kind}", data, body))
    files[kind] = str(path)
  files["group"] = str(directory / "toy_group.yaml")
  (directory / "toy_group.yaml").write_text(GROUP)
  return files


@pytest.mark.parametrize("kind", [*sorted(TASKS), "group"])
def test_jaxloc_equals_lm_eval_hf_backend_unablated_and_ablated(kind, task_files, smollm2, smollm2_torch,
                                                                smollm2_engine):
  from jaxloc.tasks.harness_reference import compare, table

  task = get_task("lm_eval:" + task_files[kind])
  report = compare(smollm2_engine, smollm2_torch, smollm2.tokenizer, task, task.load_docs(), HEADS)
  print("\n" + table(report))  # the agreement figures, with pytest -s
  unablated, ablated = report["rows"]
  assert ablated["heads"] == HEADS
  for row in report["rows"]:
    assert set(row["metrics"]) == set(task.metric_names + task.aggregate_metric_names) - {"loglikelihood"}
    for name, pair in row["metrics"].items():
      if name in ("acc", "acc_norm") or name.startswith("exact_match"):
        assert pair["jaxloc"] == pair["lm_eval"], (row["heads"], name)
      else:  # perplexities: exponentials of float32 sums of log-probabilities
        assert math.isclose(pair["jaxloc"], pair["lm_eval"], rel_tol=2e-3), (row["heads"], name, pair)
    if task.output_type == "generate":
      assert row["identical_generations"] == 1.0
    else:
      assert row["max_abs_logprob_diff"] < 2e-3
  assert any(unablated["metrics"][n]["jaxloc"] != ablated["metrics"][n]["jaxloc"] for n in unablated["metrics"]), (
      "ablating the heads changed nothing")
  if kind == "generate_until":
    assert unablated["metrics"]["exact_match"]["jaxloc"] > 0  # the comparison is not all zeros


def test_prompts_and_per_document_metrics_are_lm_evals(task_files, smollm2, smollm2_torch, smollm2_engine):
  from jaxloc.tasks.evaluator import Evaluator
  from jaxloc.tasks.harness_reference import lm_eval_run

  for kind, metric in (("multiple_choice", "acc"), ("generate_until", "exact_match")):
    task = get_task("lm_eval:" + task_files[kind])
    docs = task.load_docs(num_samples=7, seed=1)
    _, samples = lm_eval_run(smollm2_torch, smollm2.tokenizer, task, docs, [])
    assert [[i.args for i in group] for group in task.instances(docs)] == [s["arguments"] for s in samples]
    per_doc = Evaluator.build(smollm2_engine, task.name, task, docs).run(np.ones((1, 30, 9)), per_doc=True)
    assert per_doc[metric][0].tolist() == [s[metric] for s in samples]


@pytest.mark.heavy
def test_metric_kinds_names_and_requests(task_files):
  mc = get_task("lm_eval:" + task_files["multiple_choice"])
  assert mc.output_type == "loglikelihood" and mc.metric_names == ("acc", "acc_norm") and mc.default_metric == "acc"
  mc_docs = mc.load_docs()
  labels = [doc["doc"]["label"] for doc in mc_docs]
  assert mc.scored_request_index(mc_docs).tolist() == [3 * i + label for i, label in enumerate(labels)]
  ll = get_task("lm_eval:" + task_files["loglikelihood"])
  assert ll.metric_names == ("acc", "loglikelihood") and ll.aggregate_metric_names == ("perplexity",)
  # lm-eval's aggregations applied to the responses: perplexity = exp(-mean log-likelihood), acc = mean greedy
  ll_docs = ll.load_docs()
  rng = np.random.default_rng(0)
  logprob, greedy = -rng.uniform(0, 5, (2, len(ll_docs))), rng.uniform(size=(2, len(ll_docs))) < 0.5
  metrics = ll.compute_metrics(ll_docs, ScoreOutputs(logprob, greedy, np.ones(len(ll_docs), int)))
  np.testing.assert_allclose(metrics["loglikelihood"], logprob.mean(axis=1))
  np.testing.assert_allclose(metrics["perplexity"], np.exp(-logprob.mean(axis=1)))
  np.testing.assert_allclose(metrics["acc"], greedy.mean(axis=1))
  assert ll.scored_request_index(ll_docs).tolist() == list(range(len(ll_docs)))
  rolling = get_task("lm_eval:" + task_files["loglikelihood_rolling"])
  assert rolling.metric_names == ("loglikelihood",)
  assert set(rolling.aggregate_metric_names) == {"word_perplexity", "byte_perplexity", "bits_per_byte"}
  group = get_task("lm_eval:" + task_files["group"])
  assert group.group == "toy_group" and list(group.subtasks) == ["toy_multiple_choice", "toy_zero_shot_choice"]
  assert group.metric_names == ("acc", "acc_norm") and len(group.load_docs()) == 2 * len(WORDS)
  group_docs = group.load_docs(num_samples=6, seed=3)
  assert {doc["task"] for doc in group_docs} == set(group.subtasks)
  assert [r.context.startswith("The word") for r in group.requests(group_docs)] == [
      doc["task"] == "toy_zero_shot_choice" for doc in group_docs for _ in range(3)]
  gen = get_task("lm_eval:" + task_files["generate_until"])
  assert gen.output_type == "generate" and gen.metric_names == ("exact_match", "exact_match,first-word")
  docs = gen.load_docs(num_samples=4, seed=0)
  requests = gen.requests(docs)
  assert [r.stop for r in requests] == [("\n",)] * 4 and {r.max_new_tokens for r in requests} == {6}
  # each document's prompt depends on the document alone (a fresh few-shot draw per document)
  assert gen.requests(docs[1:2]) == requests[1:2]
  assert requests[0].context.count("Plural of") == 4
  assert get_task("lm_eval:" + task_files["generate_until"], num_fewshot="0").requests(docs[:1])[0].context == (
      f"Plural of {docs[0]['doc']['word']}:")


def test_joint_encoding_is_lm_eval_hf_encoding(task_files, tokenizer):
  """Trailing context whitespace moves into the continuation and the pair is split after encoding the whole,
  as lm-eval's HF backend does; jaxloc's own convention encodes the two strings apart."""
  from lm_eval.models.huggingface import HFLM

  from jaxloc.engine import scoring_kernels
  from jaxloc.engine.requests import ScoringRequest

  tok = tokenizer
  lm = HFLM.__new__(HFLM)  # only the tokenizer methods: no model
  lm.tokenizer, lm.backend, lm.add_bos_token, lm.custom_prefix_token_id = tok, "causal", None, None
  pairs = [("The plural of mouse is ", "mice"), ("Question: 2+2?\nAnswer:", " 4"), ("", "Hello world"),
           ("x=", "=y"), ("a  ", " b")]
  joint = scoring_kernels.tokenize(tok, [ScoringRequest(c, t, joint=True) for c, t in pairs], 8192)
  for (context, target), sequence, start in zip(pairs, joint.sequences, joint.target_start):
    if context:
      expected_context, expected_target = lm._encode_pair(context, target)
    else:
      expected_context, expected_target = [tok.bos_token_id], tok(target, add_special_tokens=False)["input_ids"]
    assert sequence[:start].tolist() == expected_context and sequence[start:].tolist() == expected_target
  separate = scoring_kernels.tokenize(tok, [ScoringRequest(*pairs[0])], 8192)
  assert separate.sequences[0].tolist() != joint.sequences[0].tolist()


@pytest.mark.heavy
def test_user_errors(task_files, tmp_path):
  with pytest.raises(UserError, match="unknown lm-eval task 'no_such_task_xyz'"):
    get_task("lm_eval:no_such_task_xyz")
  with pytest.raises(UserError, match="not found"):
    get_task("lm_eval:" + str(tmp_path / "missing.yaml"))
  with pytest.raises(UserError, match="no option"):
    get_task("lm_eval:" + task_files["multiple_choice"], shots=3)
  with pytest.raises(UserError, match="num_fewshot must be an integer"):
    get_task("lm_eval:" + task_files["multiple_choice"], num_fewshot="many")
  sampled = tmp_path / "sampled.yaml"
  sampled.write_text(open(task_files["generate_until"]).read().replace("do_sample: false", "do_sample: true")
                     .replace("task: toy_generate_until", "task: toy_sampled"))
  with pytest.raises(UserError, match="decodes greedily"):
    get_task("lm_eval:" + str(sampled))
  mixed = tmp_path.parent / (tmp_path.name + "_mixed")
  mixed.mkdir()
  for kind in ("multiple_choice", "generate_until"):
    (mixed / f"{kind}.yaml").write_text(open(task_files[kind]).read().replace("task: toy_", "task: mixed_"))
  (mixed / "group.yaml").write_text("group: mixed_group\ntask:\n  - mixed_multiple_choice\n  - mixed_generate_until\n")
  with pytest.raises(UserError, match="mixes lm-eval output types"):
    get_task("lm_eval:" + str(mixed / "group.yaml"))
  unreadable = tmp_path / "unreadable.yaml"
  unreadable.write_text("task: [unclosed\n")
  with pytest.raises(UserError, match="^lm-eval cannot read task file"):
    get_task("lm_eval:" + str(unreadable))
  broken = tmp_path / "broken.yaml"
  broken.write_text(_yaml("toy_broken", tmp_path / "absent.jsonl", TASKS["multiple_choice"]))
  with pytest.raises(UserError, match="lm-eval could not build task"):
    get_task("lm_eval:" + str(broken))
