"""lm-evaluation-harness tasks through jaxloc's engine, checked against lm-eval's own `simple_evaluate` with its HF
backend: the same task YAMLs (written here, reading local JSON files through lm-eval's `dataset_path: json`), one
per request type, on SmolLM2, unablated and with two heads ablated (jaxloc: one batch of masks; lm-eval: the
transformers model with the heads hooked)."""

import json
import math

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.evaluate import evaluate_heads
from jaxloc.tasks.registry import get_task

lm_eval = pytest.importorskip("lm_eval")
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


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
  directory = tmp_path_factory.mktemp("lm_eval_tasks")
  data = directory / "plurals.jsonl"
  data.write_text("".join(json.dumps(doc) + "\n" for doc in _docs()))
  files = {}
  for kind, body in TASKS.items():
    path = directory / f"toy_{kind}.yaml"
    path.write_text(_yaml(f"toy_{kind}", data, body))
    files[kind] = str(path)
  return files


def _lm_eval_run(model, tokenizer, yaml_path, heads):
  """lm-eval's own evaluation with its HF backend, `heads` hooked: ({metric key: value}, samples by doc_id)."""
  from lm_eval import simple_evaluate
  from lm_eval.models.huggingface import HFLM

  from jaxloc.heads import parse_heads
  from jaxloc.models.torch_reference import ablated_heads
  from jaxloc.tasks.harness import task_manager

  lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=16, device="cpu")
  with torch.no_grad(), ablated_heads(model, parse_heads(heads, 30, 9)):
    out = simple_evaluate(model=lm, tasks=[yaml_path], task_manager=task_manager(), log_samples=True)
  (name,) = out["results"]
  results = {k.replace(",none", ""): v for k, v in out["results"][name].items()
             if "," in k and "_stderr" not in k}
  return results, out["samples"][name]


@pytest.mark.parametrize("kind", sorted(TASKS))
def test_metrics_equal_lm_eval_hf_backend_unablated_and_ablated(kind, task_files, smollm2, smollm2_torch,
                                                               smollm2_engine):
  ours = evaluate_heads(smollm2_engine, "lm_eval:" + task_files[kind], heads=HEADS, curve=True)
  unablated, ablated = ours["curve"][0]["metrics"], ours["curve"][-1]["metrics"]
  for metrics, heads in ((unablated, []), (ablated, HEADS)):
    expected, _ = _lm_eval_run(smollm2_torch, smollm2.tokenizer, task_files[kind], heads)
    assert set(expected) <= set(metrics)
    for name, value in expected.items():
      if name in ("acc", "acc_norm") or name.startswith("exact_match"):
        assert metrics[name] == value, (heads, name)
      else:  # perplexities: float32 sums of log-probabilities through exp
        assert math.isclose(metrics[name], value, rel_tol=2e-3), (heads, name, metrics[name], value)
  assert any(unablated[name] != ablated[name] for name in unablated), "ablating the heads changed nothing"


def test_per_document_values_equal_lm_eval_samples(task_files, smollm2, smollm2_torch, smollm2_engine):
  """Per-document responses, not only means: log-likelihoods of every choice and the generated texts."""
  from jaxloc.tasks.evaluation import Evaluator

  for kind in ("multiple_choice", "generate_until"):
    task = get_task("lm_eval:" + task_files[kind])
    docs = task.load_docs()
    evaluator = Evaluator.build(smollm2_engine, task.name, task, docs)
    per_doc = evaluator.run(np.ones((1, 30, 9), np.float32), per_doc=True)
    _, samples = _lm_eval_run(smollm2_torch, smollm2.tokenizer, task_files[kind], [])
    samples = sorted((s for s in samples if s["filter"] == "none"), key=lambda s: s["doc_id"])
    instances = task.instances(docs)
    requests = task.requests(docs)
    if kind == "multiple_choice":
      ours = smollm2_engine.score(requests, np.ones((1, 30, 9), np.float32)).logprob[0]
      theirs = [lp for s in samples for (lp, _), in s["resps"]]
      np.testing.assert_allclose(ours, theirs, atol=2e-3)
      assert per_doc["acc"][0].tolist() == [s["acc"] for s in samples]
    else:
      ours = smollm2_engine.generate(requests, np.ones((1, 30, 9), np.float32))[0]
      assert ours == [s["resps"][0][0] for s in samples]
      assert per_doc["exact_match"][0].tolist() == [s["exact_match"] for s in samples]
      assert sum(s["exact_match"] for s in samples) > 0  # the comparison is not all zeros
    assert [[i.args for i in group] for group in instances] == [s["arguments"] for s in samples]


def test_metric_kinds_names_and_requests(task_files):
  mc = get_task("lm_eval:" + task_files["multiple_choice"])
  assert mc.output_type == "loglikelihood" and mc.metric_names == ("acc", "acc_norm") and mc.default_metric == "acc"
  ll = get_task("lm_eval:" + task_files["loglikelihood"])
  assert ll.metric_names == ("acc",) and ll.aggregate_metric_names == ("perplexity",)
  rolling = get_task("lm_eval:" + task_files["loglikelihood_rolling"])
  assert rolling.metric_names == ("loglikelihood",)
  assert set(rolling.aggregate_metric_names) == {"word_perplexity", "byte_perplexity", "bits_per_byte"}
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


def test_joint_encoding_is_lm_eval_hf_encoding(task_files, smollm2):
  """Trailing context whitespace moves into the continuation and the pair is split after encoding the whole,
  as lm-eval's HF backend does; jaxloc's own convention encodes the two strings apart."""
  from lm_eval.models.huggingface import HFLM

  from jaxloc.engine import scoring
  from jaxloc.engine.requests import ScoringRequest

  tok = smollm2.tokenizer
  lm = HFLM.__new__(HFLM)  # only the tokenizer methods: no model
  lm.tokenizer, lm.backend, lm.add_bos_token, lm.custom_prefix_token_id = tok, "causal", None, None
  pairs = [("The plural of mouse is ", "mice"), ("Question: 2+2?\nAnswer:", " 4"), ("", "Hello world"),
           ("x=", "=y"), ("a  ", " b")]
  joint = scoring.tokenize(tok, [ScoringRequest(c, t, joint=True) for c, t in pairs], 8192)
  for (context, target), sequence, start in zip(pairs, joint.sequences, joint.target_start):
    if context:
      expected_context, expected_target = lm._encode_pair(context, target)
    else:
      expected_context, expected_target = [tok.bos_token_id], tok(target, add_special_tokens=False)["input_ids"]
    assert sequence[:start].tolist() == expected_context and sequence[start:].tolist() == expected_target
  separate = scoring.tokenize(tok, [ScoringRequest(*pairs[0])], 8192)
  assert separate.sequences[0].tolist() != joint.sequences[0].tolist()


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
  broken = tmp_path / "broken.yaml"
  broken.write_text(_yaml("toy_broken", tmp_path / "absent.jsonl", TASKS["multiple_choice"]))
  with pytest.raises(UserError, match="lm-eval could not build task"):
    get_task("lm_eval:" + str(broken))
