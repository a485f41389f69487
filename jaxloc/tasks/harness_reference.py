"""jaxloc against lm-eval's own evaluation of the same lm-eval task: the reference for `lm_eval:` tasks.

lm-eval runs the task with its HF backend (transformers, PyTorch) on the same documents, with the ablated heads
hooked the paper's way (`models.torch_reference.ablated_heads`); jaxloc evaluates the unablated model and the
ablated one as one batch of masks. `compare` reports, for each, every metric from both, the largest per-request
log-likelihood difference (scored tasks) and the share of identical generations (generation tasks). Needs torch
and lm-eval's HF backend (`pip install -e '.[test,lm-eval]'`); jaxloc never needs them at run time.

Few-shot prompts agree for zero-shot tasks and deterministic samplers (harness.py explains why lm-eval's sequential
random sampler gives later documents of a run other examples).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from jaxloc.errors import UserError
from jaxloc.units import head_name, keep_mask, parse_heads
from jaxloc.models.torch_reference import ablated_heads
from jaxloc.tasks.base import Doc
from jaxloc.tasks.evaluator import Evaluator
from jaxloc.tasks.harness import HarnessTask, include_path, load_name, metric_key, task_manager

# lm-eval's result keys that are not metrics.
_NOT_METRICS = ("alias", "name", "sample_len", "samples")


def lm_eval_run(hf_model, tokenizer, task: HarnessTask, docs: Sequence[Doc], heads: Sequence[tuple[int, int]],
                batch_size: int = 16) -> tuple[dict[str, float], list[dict[str, Any]]]:
  """lm-eval's `simple_evaluate` of `task` on `docs` with its HF backend over `hf_model`, `heads` hooked: (the task's
  or group's metrics by jaxloc's names, lm-eval's logged samples of each document under its task's first filter,
  in `docs`' order)."""
  import torch
  from lm_eval import simple_evaluate
  from lm_eval.models.huggingface import HFLM

  if task.group is None and len(task.subtasks) > 1:
    raise UserError(f"{task.name} is a tag of {len(task.subtasks)} tasks: lm-eval reports no score of the whole to "
                    "compare with; compare one of its tasks")
  chosen: dict[str, list[int]] = {}
  for doc in docs:
    chosen.setdefault(doc["task"], []).append(int(doc["doc_id"]))
  missing = sorted(set(task.subtasks) - set(chosen))
  if missing:  # lm-eval reads an empty selection as "every document"
    raise UserError(f"no documents of {', '.join(missing)} among those chosen; compare more documents")
  lm = HFLM(pretrained=hf_model, tokenizer=tokenizer, batch_size=batch_size, device="cpu")
  with torch.no_grad(), ablated_heads(hf_model, heads):
    out = simple_evaluate(model=lm, tasks=[load_name(task.spec)], task_manager=task_manager(include_path(task.spec)),
                          num_fewshot=task.num_fewshot, samples={k: sorted(v) for k, v in chosen.items()},
                          log_samples=True, bootstrap_iters=0)
  metrics = {}
  for key, value in out["results"][task.group or next(iter(task.subtasks))].items():
    metric, _, filter_name = key.partition(",")
    if filter_name and not metric.endswith("_stderr") and metric not in _NOT_METRICS and value != "N/A":
      metrics[metric_key(metric, filter_name)] = float(value)
  logged = {(name, s["doc_id"]): s for name in task.subtasks for s in out["samples"][name]
            if s["filter"] == task.filters[name][0].name}
  return metrics, [logged[(doc["task"], int(doc["doc_id"]))] for doc in docs]


def compare(engine, hf_model, tokenizer, task: HarnessTask, docs: Sequence[Doc], heads: str | Sequence[str] = (),
            batch_size: int = 16) -> dict[str, Any]:
  """jaxloc and lm-eval on `task` and `docs`, unablated and with `heads` ablated (module docstring):
  {"task", "num_docs", "rows": [{"heads", "metrics": {name: {"jaxloc", "lm_eval"}}, "max_abs_logprob_diff",
  "identical_generations"}]}."""
  c = engine.model_config
  head_sets = [[], parse_heads(heads, c.num_layers, c.num_heads)] if heads else [[]]
  masks = np.stack([keep_mask(h, c.num_layers, c.num_heads) for h in head_sets])
  # One evaluation gives both the task's metrics and the per-request responses compared below.
  outputs = Evaluator(engine, task.name, task, list(docs)).joined_outputs(masks.astype(np.float32))
  ours = task.compute_metrics(docs, outputs)
  rows = []
  for m, ablated in enumerate(head_sets):
    theirs, samples = lm_eval_run(hf_model, tokenizer, task, docs, ablated, batch_size)
    row: dict[str, Any] = {"heads": [head_name(layer, head) for layer, head in ablated],
                           "metrics": {k: {"jaxloc": float(ours[k][m]), "lm_eval": v} for k, v in theirs.items()},
                           "max_abs_logprob_diff": None, "identical_generations": None}
    responses = [resp[0] for sample in samples for resp in sample["resps"]]
    if task.output_type == "generate":
      row["identical_generations"] = float(np.mean([a == b for a, b in zip(outputs[m], responses)]))
    else:
      reference = [r[0] if isinstance(r, (tuple, list)) else r for r in responses]
      row["max_abs_logprob_diff"] = float(np.max(np.abs(outputs.logprob[m] - np.asarray(reference))))
    rows.append(row)
  return {"task": task.name, "num_docs": len(docs), "rows": rows}


def table(report: dict[str, Any]) -> str:
  """The comparison as a Markdown table: one line per (head set, metric)."""
  lines = [f"{report['task']}, {report['num_docs']} documents", "",
           "| heads ablated | metric | jaxloc | lm-eval (HF backend) | difference | relative |",
           "|---|---|---|---|---|---|"]
  for row in report["rows"]:
    heads = ",".join(row["heads"]) or "none"
    for name, pair in row["metrics"].items():
      difference = abs(pair["jaxloc"] - pair["lm_eval"])
      relative = f"{difference / abs(pair['lm_eval']):.1g}" if pair["lm_eval"] else ""
      lines.append(f"| {heads} | {name} | {pair['jaxloc']:.6g} | {pair['lm_eval']:.6g} | {difference:.2g} | "
                   f"{relative} |")
    if row["max_abs_logprob_diff"] is not None:
      lines.append(f"| {heads} | largest per-request log-likelihood difference (nats) | | | "
                   f"{row['max_abs_logprob_diff']:.2g} | |")
    if row["identical_generations"] is not None:
      lines.append(f"| {heads} | identical generations | | | {100 * row['identical_generations']:.0f}% | |")
  return "\n".join(lines)
