"""A few held-out documents per task as the model answers them, unablated and with the selection's top-k ablated
together: `examples.json` of a validated run, shown on its report page (`jaxloc.report.page`) beside the numbers.

For each task, the first `PER_TASK` held-out documents: the prompt, the target, the model's greedy continuation
(at most `MAX_NEW_TOKENS` tokens, up to the first newline, for a scored task; the task's own generation for a
generating one) and the document's metric, under both masks. A run without the file (older runs) shows no examples.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from jaxloc import files
from jaxloc.engine.requests import GenerationRequest
from jaxloc.localize.validate import TaskMeasures
from jaxloc.tasks.evaluator import Evaluator, engine_masks
from jaxloc.tasks.names import task_label

FILE = "examples.json"
PER_TASK = 3
MAX_NEW_TOKENS = 12
# A prompt is shown up to its last this many characters (a few-shot prompt's final question is what matters).
PROMPT_CHARACTERS = 400


def _asks(evaluator: Evaluator) -> tuple[list[str], list[str], list[GenerationRequest] | None]:
  """(prompts, targets, the greedy requests of a scored task or None for a generating one) of an evaluator's
  documents."""
  docs, requests = evaluator.docs, evaluator.requests()
  if evaluator.task.output_type == "generate":
    targets = [str(d.get("target", d.get("answer", ""))) for d in docs]
    return [r.context for r in requests], targets, None
  scored = [requests[i] for i in evaluator.task.scored_request_index(docs)]
  asks = [GenerationRequest(r.context, stop=("\n",), max_new_tokens=MAX_NEW_TOKENS,
                            add_special_tokens=r.add_special_tokens) for r in scored]
  return [r.context for r in scored], [r.continuation for r in scored], asks


def collect(held_out: TaskMeasures, top: Sequence[int]) -> dict[str, Any]:
  """The examples record: every task of `held_out` (target first) on its first PER_TASK documents, unablated and
  with the units `top` (flat indices) ablated together. The metrics come from the scorer (its curves scored both
  masks already); the scored tasks' continuations are generated in one call when they share a fill (zero ablation)."""
  keep = np.ones((2, held_out.num_layers * held_out.units_per_layer), np.float32)
  keep[1, np.asarray(list(top), np.int64)] = 0
  keep = keep.reshape(2, held_out.num_layers, held_out.units_per_layer)
  scores = held_out.per_doc(keep)  # per task [2, docs]
  few = [Evaluator(e.engine, e.name, e.task, e.docs[:PER_TASK], e.fill, e.unit, held_out=True)
         for e in held_out.eval_sets]
  asked = [_asks(e) for e in few]
  texts: list[list[list[str]] | None] = [None] * len(few)
  together = [i for i, (e, a) in enumerate(zip(few, asked)) if a[2] is not None and e.fill is None]
  if together:
    joined = few[0].engine.generate([r for i in together for r in asked[i][2]], **engine_masks(few[0].unit, keep, None))
    start = 0
    for i in together:
      n = len(asked[i][2])
      texts[i] = [row[start:start + n] for row in joined]
      start += n
  for i, (e, a) in enumerate(zip(few, asked)):
    if texts[i] is None:
      texts[i] = (e.joined_outputs(keep) if a[2] is None
                  else e.engine.generate(a[2], **engine_masks(e.unit, keep, e.fill)))
  tasks = {}
  for e, metric, (prompts, targets, _), out, values in zip(few, held_out.metrics, asked, texts, scores):
    tasks[task_label(e.name)] = {"metric": metric, "examples": [
        {"prompt": prompts[d][-PROMPT_CHARACTERS:], "prompt_truncated": len(prompts[d]) > PROMPT_CHARACTERS,
         "target": targets[d], "unablated": out[0][d], "ablated": out[1][d],
         "unablated_score": float(values[0, d]), "ablated_score": float(values[1, d])} for d in range(len(e.docs))]}
  return {"k": len(top), held_out.unit: [held_out.name(h) for h in top], "per_task": PER_TASK,
          "max_new_tokens": MAX_NEW_TOKENS, "tasks": tasks}


def write(output_dir: str, held_out: TaskMeasures, top: Sequence[int]) -> None:
  """`examples.json` in a run directory (`collect`)."""
  files.write_json(os.path.join(output_dir, FILE), collect(held_out, top))
