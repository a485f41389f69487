"""Evaluator.run / batches dispatch on output_type and return one value per mask."""

import numpy as np
import pytest

from jaxloc.engine.requests import GenerationRequest, ScoreOutputs, ScoringRequest
from jaxloc.tasks import evaluator, registry
from jaxloc.tasks.evaluator import Evaluator


class FakeEngine:
  """Scores '+1 per kept head' and generates '#### <kept heads>' so outputs depend on the mask."""

  tokenizer = None

  def __init__(self, masks_per_batch=2):
    self.calls, self.fills, self.masks_per_batch = [], [], masks_per_batch

  def score_batches(self, requests, head_masks, head_fill=None, few_calls=False, exact=False):
    assert all(isinstance(r, ScoringRequest) for r in requests)
    self.calls.append("score held out" if few_calls else "score")
    self.fills.append(head_fill)
    kept = np.asarray(head_masks).reshape(len(head_masks), -1).sum(axis=1)
    for begin in range(0, len(kept), self.masks_per_batch):
      part = kept[begin:begin + self.masks_per_batch]
      greedy = np.repeat((part == kept.max())[:, None], len(requests), axis=1)
      yield slice(begin, begin + len(part)), ScoreOutputs(
          np.repeat(part[:, None], len(requests), axis=1).astype(float), greedy,
          np.ones(len(requests), int))

  def score(self, requests, head_masks, head_fill=None, progress=None):
    parts = list(self.score_batches(requests, head_masks, head_fill))
    if progress:
      progress(len(head_masks))
    return ScoreOutputs(np.concatenate([p.logprob for _, p in parts]),
                        np.concatenate([p.is_greedy for _, p in parts]), parts[0][1].num_tokens)

  def generate(self, requests, head_masks, head_fill=None, progress=None):
    assert all(isinstance(r, GenerationRequest) for r in requests)
    self.calls.append("generate")
    self.fills.append(head_fill)
    kept = np.asarray(head_masks).reshape(len(head_masks), -1).sum(axis=1)
    return [[f"#### {int(k)}" for _ in requests] for k in kept]

  def ablation_means(self, requests):
    self.mean_requests = requests
    return np.zeros((2, 4, 8), np.float32), np.zeros((2, 16), np.float32)


def test_loglikelihood_task_goes_through_score():
  engine, task = FakeEngine(), registry.get_task("counting")
  masks = np.ones((3, 2, 4))
  masks[1, 0, :] = 0
  metrics = Evaluator(engine, "counting", task, task.load_docs(num_samples=5), "fill").run(masks)
  assert engine.calls == ["score"] and engine.fills == ["fill"]
  np.testing.assert_allclose(metrics["accuracy"], [1.0, 0.0, 1.0])
  evaluator = Evaluator(engine, "counting", task, task.load_docs(num_samples=5), "fill")
  held_out = evaluator.on(task.load_docs(num_samples=3))
  np.testing.assert_allclose(held_out.run(masks)["accuracy"], [1.0, 0.0, 1.0])
  assert engine.calls == ["score", "score held out"]  # scored in a few calls: its layout may pad (few_calls)
  np.testing.assert_allclose(metrics["logprob"], [8.0, 4.0, 8.0])


def test_generation_task_goes_through_generate():
  engine, task = FakeEngine(), registry.get_task("gsm8k")
  docs = [{"question": "q", "answer": "#### 8"}, {"question": "r", "answer": "#### 4"}]
  masks = np.ones((2, 2, 4))
  masks[1, 1, :] = 0
  metrics = Evaluator(engine, task.name, task, list(docs)).run(masks)
  assert engine.calls == ["generate"]
  np.testing.assert_allclose(metrics["exact_match_strict"], [0.5, 0.5])


def test_run_batches_follows_engine_batches_and_matches_run():
  engine, task = FakeEngine(masks_per_batch=2), registry.get_task("counting")
  docs = task.load_docs(num_samples=4)
  masks = np.ones((5, 2, 4))
  masks[3, :, :2] = 0
  batches = list(Evaluator(engine, task.name, task, list(docs)).batches(masks))
  assert [where for where, _ in batches] == [slice(0, 2), slice(2, 4), slice(4, 5)]
  joined = np.concatenate([metrics["logprob"] for _, metrics in batches])
  np.testing.assert_allclose(joined, Evaluator(FakeEngine(), task.name, task, list(docs)).run(masks)["logprob"])


def test_run_batches_for_generation_covers_every_mask(monkeypatch):
  monkeypatch.setattr(evaluator, "GENERATION_MASKS_PER_BATCH", 3)
  engine, task = FakeEngine(), registry.get_task("gsm8k")
  docs = [{"question": "q", "answer": "#### 8"}]
  masks = np.ones((7, 2, 4))
  masks[6, 0] = 0
  batches = list(Evaluator(engine, task.name, task, list(docs)).batches(masks))
  assert [where for where, _ in batches] == [slice(0, 3), slice(3, 6), slice(6, 7)]
  assert batches[-1][1]["exact_match_strict"].tolist() == [0.0]
  assert batches[0][1]["exact_match_strict"].tolist() == [1.0, 1.0, 1.0]


def test_mean_ablation_uses_the_task_text():
  engine = FakeEngine()
  task = registry.get_task("boolq")
  docs = [{"query": "Is it? Answer:", "choices": ["no", "yes"], "gold": 0}]
  assert evaluator.mean_ablation_values(engine, task, docs).shape == (2, 4, 8)
  assert engine.mean_requests == [ScoringRequest("Is it? Answer:", " no", joint=True),  # lm-eval's encoding
                                  ScoringRequest("Is it? Answer:", " yes", joint=True)]
  gsm = registry.get_task("gsm8k")
  evaluator.mean_ablation_values(engine, gsm, [{"question": "q", "answer": "#### 1"}])
  [request] = engine.mean_requests
  assert request.context + request.continuation == gsm.requests(
      [{"question": "q", "answer": "#### 1"}])[0].context


def test_masks_must_be_three_dimensional():
  with pytest.raises(ValueError, match=r"\[masks, layers, heads\]"):
    list(Evaluator(FakeEngine(), "counting", registry.get_task("counting"), []).batches(np.ones((2, 4))))


def test_per_document_metrics_average_to_the_task_metrics():
  engine, task = FakeEngine(masks_per_batch=2), registry.get_task("counting")
  docs = task.load_docs(num_samples=4)
  masks = np.ones((3, 2, 4))
  masks[1, :, :3] = 0
  per_doc = Evaluator(engine, task.name, task, list(docs)).run(masks, per_doc=True)
  assert per_doc["logprob"].shape == (3, 4)
  for name, values in Evaluator(FakeEngine(), task.name, task, list(docs)).run(masks).items():
    np.testing.assert_allclose(per_doc[name].mean(axis=1), values)
  [(_, first), *_] = Evaluator(engine, task.name, task, list(docs)).batches(masks, per_doc=True)
  assert first["accuracy"].shape == (2, 4)


@pytest.mark.parametrize("name", ["plurals", "arithmetic_1d_4shot", "counting", "induction"])
def test_held_out_documents_are_disjoint_from_the_identification_documents(name):
  task, docs, held_out = evaluator.load_task_split(name, num_samples=100, validation_samples=100, seed=3,
                                                    data_dir=None)
  assert docs == evaluator.load_task(name, num_samples=100, seed=3, data_dir=None)[1]  # unchanged by the split
  assert len(held_out) == 100 and not {d["id"] for d in docs} & {d["id"] for d in held_out}
  assert evaluator.load_task_split(name, num_samples=100, validation_samples=0, seed=3, data_dir=None)[2] == []


def test_too_few_documents_for_both_splits_is_a_user_error():
  from jaxloc.errors import UserError

  with pytest.raises(UserError, match=r"task counting has 200 documents; identification \(150\) and held-out "
                                      r"validation \(100\) need 250"):
    evaluator.load_task_split("counting", num_samples=150, validation_samples=100, seed=0, data_dir=None)


def test_more_documents_are_disjoint_from_both_splits_seeded_and_bounded_by_the_split():
  task, docs, held_out = evaluator.load_task_split("induction", num_samples=100, validation_samples=100, seed=3,
                                                    data_dir=None)
  more = evaluator.load_more_docs(task, docs + held_out, 150, seed=3, data_dir=None)
  used = {evaluator._doc_key(d) for d in docs + held_out}
  assert len(more) == 150 and not used & {evaluator._doc_key(d) for d in more}
  assert len({evaluator._doc_key(d) for d in more}) == 150
  assert more == evaluator.load_more_docs(task, docs + held_out, 150, seed=3, data_dir=None)
  assert evaluator.load_more_docs(task, docs + held_out, 200, seed=3, data_dir=None)[:150] == more  # nested
  # induction holds 500 documents: 300 beyond the two splits, then no more.
  assert len(evaluator.load_more_docs(task, docs + held_out, 1000, seed=3, data_dir=None)) == 300
  assert evaluator.load_more_docs(task, docs + held_out, 0, seed=3, data_dir=None) == []
