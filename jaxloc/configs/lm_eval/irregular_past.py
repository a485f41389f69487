"""The documents of irregular_past.yaml: irregular_past.jsonl beside this file, split by its `split` field (lm-eval's
`custom_dataset` hook, so that the task works from any directory)."""

import json
import os

import datasets


def load(**_):
  with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "irregular_past.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return datasets.DatasetDict({split: datasets.Dataset.from_list([r for r in rows if r["split"] == split])
                               for split in ("train", "test")})
