"""Tasks: documents, requests and metrics (registered tasks, custom JSONL files, lm-evaluation-harness tasks), and the
one place a task meets the engine (`evaluator.Evaluator`)."""
