"""Custom JSONL tasks: both shapes, their metrics, and errors that carry file and line number."""

import logging

import numpy as np
import pytest

from jaxloc.engine.requests import ScoreOutputs, ScoringRequest
from jaxloc.errors import UserError
from jaxloc.tasks import registry


def test_prompt_target_file(write_jsonl):
  path = write_jsonl("capitals.jsonl", [
      {"prompt": "The capital of France is", "target": " Paris", "id": "fr"},
      "",  # blank lines are skipped, not errors
      {"prompt": "The capital of Italy is", "target": " Rome"}])
  task = registry.get_task(str(path))
  docs = task.load_docs()
  assert [doc["id"] for doc in docs] == ["fr", "line3"]
  assert task.requests(docs) == [ScoringRequest("The capital of France is", " Paris"),
                                 ScoringRequest("The capital of Italy is", " Rome")]
  outputs = ScoreOutputs(logprob=np.array([[-0.5, -1.5], [-4.0, -6.0]]),
                         is_greedy=np.array([[True, True], [False, True]]),
                         num_tokens=np.array([1, 1]))
  metrics = task.compute_metrics(docs, outputs)
  np.testing.assert_allclose(metrics["accuracy"], [1.0, 0.5])
  np.testing.assert_allclose(metrics["logprob"], [-1.0, -5.0])
  assert task.default_metric == "accuracy" and task.name == str(path)


def test_multiple_choice_file(write_jsonl):
  path = write_jsonl("mc.jsonl", [
      {"prompt": "2 + 2 =", "choices": [" 4", " five hundred"], "label": 0},
      {"prompt": "Sky colour:", "choices": [" blue", " green", " red"], "label": 0}])
  task = registry.get_task(str(path))
  docs = task.load_docs()
  requests = task.requests(docs)
  # Choices are appended exactly as written: no extra delimiter.
  assert [r.continuation for r in requests] == [" 4", " five hundred", " blue", " green", " red"]
  outputs = ScoreOutputs(logprob=np.array([[-3.0, -7.0, -1.0, -2.0, -3.0]]),
                         is_greedy=np.zeros((1, 5), bool), num_tokens=np.ones(5, int))
  metrics = task.compute_metrics(docs, outputs)
  assert metrics["acc"].tolist() == [1.0]
  assert metrics["acc_norm"].tolist() == [0.5]  # -3/2 < -7/13 on the first doc
  assert task.metric_names == ("acc", "acc_norm")


@pytest.mark.parametrize("lines, bad_line, message", [
    (['{"prompt": "a", "target": " b"}', '{"prompt": "a", "target": }'], 2, "not valid JSON"),
    (['["prompt", "target"]'], 1, "expected a JSON object"),
    (['{"prompt": "a"}'], 1, r"missing field\(s\) \['target'\]"),
    (['{"prompt": "a", "target": " b", "targte": "c"}'], 1, r"unknown field\(s\) \['targte'\]"),
    (['{"prompt": "", "target": " b"}'], 1, "\"prompt\" must be a non-empty string"),
    (['{"prompt": "a", "target": 3}'], 1, "\"target\" must be a non-empty string"),
    (['{"prompt": "a", "choices": [" x", " y"], "label": 2}'], 1,
     "\"label\" must be an integer index into choices, 0 to 1, got 2"),
    (['{"prompt": "a", "choices": [" x", " y"], "label": true}'], 1, "\"label\" must be"),
    (['{"prompt": "a", "choices": [" x"], "label": 0}'], 1, "at least 2 non-empty strings"),
    (['{"prompt": "a", "choices": [" x", " y"]}'], 1, r"missing field\(s\) \['label'\]"),
    (['{"prompt": "a", "target": " b", "choices": [" x", " y"], "label": 0}'], 1,
     "both \"target\" and"),
    (['{"prompt": "a", "target": " b"}', '{"prompt": "a", "choices": [" x", " y"], "label": 0}'],
     2, "one file holds one shape"),
    (['{"prompt": "a", "target": " b", "id": 1}', '{"prompt": "c", "target": " d", "id": 1}'], 2,
     "id 1 already used on line 1"),
    (['{"prompt": "a", "target": " b", "id": [1]}'], 1, "\"id\" must be a string or an integer"),
    (['{"prompt": "a", "target": " b"}', "[" * 100_000], 2, "not valid JSON for a task line \\(nested too deeply"),
])
def test_bad_line_reports_file_and_line(write_jsonl, lines, bad_line, message):
  path = write_jsonl("bad.jsonl", lines)
  with pytest.raises(UserError, match=message) as error:
    registry.get_task(str(path))
  assert f"{path}:{bad_line}:" in str(error.value)


def test_line_numbers_count_blank_lines(write_jsonl):
  path = write_jsonl("gaps.jsonl", ['{"prompt": "a", "target": " b"}', "", "  ", '{"prompt": 1}'])
  with pytest.raises(UserError, match=f"{path}:4:"):
    registry.get_task(str(path))


def test_missing_and_empty_files(tmp_path):
  with pytest.raises(UserError, match="custom task file not found: .*nope.jsonl"):
    registry.get_task(str(tmp_path / "nope.jsonl"))
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n\n")
  with pytest.raises(UserError, match="no samples"):
    registry.get_task(str(empty))


def test_num_samples_subset_is_seeded(write_jsonl):
  path = write_jsonl("many.jsonl", [{"prompt": f"p{i}", "target": f" {i}"} for i in range(50)])
  task = registry.get_task(str(path))
  first, again = task.load_docs(num_samples=10, seed=3), task.load_docs(num_samples=10, seed=3)
  assert first == again and len(first) == 10
  assert first != task.load_docs(num_samples=10, seed=4)


def test_repeated_lines_without_ids_stay_documents_with_one_warning_that_counts_them(write_jsonl, caplog):
  line = {"prompt": "The capital of France is", "target": " Paris"}
  path = write_jsonl("repeats.jsonl", [line, {"prompt": "The capital of Italy is", "target": " Rome"}, line, line,
                                       {**line, "id": "again"}])  # one with an id is a document the user named
  with caplog.at_level(logging.WARNING, logger="jaxloc.tasks.custom"):
    docs = registry.get_task(str(path)).load_docs()
  assert [doc["id"] for doc in docs] == ["line1", "line2", "line3", "line4", "again"]
  assert [record.getMessage() for record in caplog.records] == [
      f'{path} has 2 lines without an "id" repeating an earlier line exactly (the first, line 3, repeats line 1): '
      "each counts as a document of its own; remove the repeats to count each once"]
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="jaxloc.tasks.custom"):
    registry.get_task(str(write_jsonl("distinct.jsonl", [line, {**line, "target": " Lyon"}])))
  assert caplog.records == []
