"""lm-evaluation-harness tasks as capabilities: `get_task("lm_eval:boolq")` or `lm_eval:path/to/task.yaml`.

lm-eval builds the task with its own `TaskManager`: dataset, prompts, few-shot examples, filters and metrics.
jaxloc's engine then evaluates the task's requests under every head mask at once, in its batched compiled
calls, rather than through lm-eval's one-model-at-a-time loop. Each mask's responses go back through the task's
own filters, `process_results` and aggregation, as lm-eval's evaluator post-processes one model's responses.

Request types:
- `loglikelihood`, `multiple_choice`: teacher-forced scores of (context, continuation) pairs, encoded as
  lm-eval's HF backend encodes them (`ScoringRequest.joint`); the response is (log-probability, is_greedy).
- `loglikelihood_rolling`: the whole document scored after the BOS (else EOS) token. It must fit the model's
  context: lm-eval's rolling windows over longer documents are not implemented, and a longer document is an
  error naming its length.
- `generate_until`: greedy decoding until a stop string (`until`), EOS or `max_gen_toks`. Sampling settings
  (`do_sample: true`, `temperature > 0`) and `repeats > 1` are errors: jaxloc decodes greedily.

Metrics are lm-eval's `metric,filter` keys with `,none` left out (`acc`, `acc_norm`,
`exact_match,strict-match`). Those that lm-eval aggregates as the mean of per-document values and that are
higher-is-better are per-document metrics (`metric_names`): localization targets, bootstrapped over
documents. The rest (corpus-level f1, bleu, perplexities; lower-is-better means) are `aggregate_metric_names`:
`experiments.evaluate` reports them, aggregated with lm-eval's own functions, and localization refuses them.
A `loglikelihood_rolling` task also reports `loglikelihood` per document (the summed log-probability, which is
lm-eval's response itself).

Few-shot examples: each document's context is built with the task's few-shot sampler freshly seeded with
lm-eval's default few-shot seed (1234). A document's prompt then depends on that document alone, whatever
documents are evaluated with it. It equals lm-eval's prompt for the document evaluated alone, and lm-eval's
full run for zero-shot tasks and deterministic samplers (`first_n`). lm-eval's sequential sampler gives later
documents of a full run other examples.

Options: `num_fewshot` (as lm-eval's `--num_fewshot`). Documents: the task's evaluation split (test, else
validation), seeded subsets by `--num_samples` as for every jaxloc task (lm-eval's `--limit` takes the first
n). Needs the optional extra: `pip install -e '.[lm_eval]'`.

Axes: `masks`, `requests` (lm-eval instances, a document's in order), `docs`.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Sequence

import numpy as np

from jaxloc.engine.requests import GenerationRequest, ScoreOutputs, ScoringRequest
from jaxloc.errors import UserError
from jaxloc.tasks import data
from jaxloc.tasks.base import Doc, Task

PREFIX = "lm_eval:"
# lm-eval's `simple_evaluate(fewshot_random_seed=1234)` default.
FEWSHOT_SEED = 1234
REQUEST_TYPES = ("loglikelihood", "multiple_choice", "loglikelihood_rolling", "generate_until")
ROLLING_METRIC = "loglikelihood"
# Instances built for the last few document sets: `requests` and every metric call use the same ones.
_CACHED_DOC_SETS = 8


def _require_lm_eval() -> None:
  try:
    import lm_eval  # noqa: F401
  except ImportError:
    raise UserError("lm_eval: tasks need lm-evaluation-harness: pip install -e '.[lm_eval]' "
                    "(or pip install lm-eval)") from None


@functools.cache
def task_manager():
  """lm-eval's TaskManager over its built-in tasks (building its index takes seconds: once per process)."""
  _require_lm_eval()
  from lm_eval.tasks import TaskManager

  return TaskManager()


def _is_yaml(spec: str) -> bool:
  return spec.endswith((".yaml", ".yml"))


def load_harness_task(spec: str):
  """lm-eval's task object for a task name or a task YAML path; one task, not a group."""
  if not spec:
    raise UserError("lm_eval: needs a task name or a task YAML path, e.g. lm_eval:boolq")
  if _is_yaml(spec) and not os.path.isfile(spec):
    raise UserError(f"lm-eval task file {spec} not found")
  manager = task_manager()
  try:
    loaded = manager.load(os.path.abspath(spec) if _is_yaml(spec) else spec)
  except KeyError:
    raise UserError(f"unknown lm-eval task {spec!r}: neither a task, group or tag lm-eval knows nor a task "
                    "YAML file (list them with `lm-eval ls tasks`)") from None
  except Exception as e:  # a dataset lm-eval cannot reach, a malformed YAML: the user's task, not our bug
    raise UserError(f"lm-eval could not build task {spec}: {type(e).__name__}: {e}") from e
  tasks = loaded["tasks"]
  if len(tasks) != 1:
    names = sorted(tasks)
    shown = ", ".join(names[:8]) + (", …" if len(names) > 8 else "")
    raise UserError(f"lm_eval:{spec} is a group of {len(names)} tasks ({shown}); give one of them, "
                    f"e.g. lm_eval:{names[0]}")
  task = next(iter(tasks.values()))
  from lm_eval.api.task import ConfigurableTask

  if not isinstance(task, ConfigurableTask):
    raise UserError(f"lm_eval:{spec} is a Python-class lm-eval task ({type(task).__name__}); jaxloc takes "
                    "YAML-configured tasks (ConfigurableTask), which nearly all lm-eval tasks are")
  return task


def metric_key(metric: str, filter_name: str) -> str:
  """jaxloc's name of an lm-eval metric under a filter: lm-eval's `metric,filter` without `,none`."""
  return metric if filter_name == "none" else f"{metric},{filter_name}"


class HarnessTask(Task):
  """An lm-eval task, evaluated for a stack of head masks by jaxloc's engine (module docstring)."""

  def __init__(self, spec: str, num_fewshot: int | str | None = None):
    self.spec = spec
    self.name = PREFIX + spec
    self.harness = load_harness_task(spec)
    config = self.harness.config
    self.request_type = self.harness.OUTPUT_TYPE
    if self.request_type not in REQUEST_TYPES:
      raise UserError(f"{self.name}: lm-eval output type {self.request_type!r} is not supported; supported: "
                      f"{', '.join(REQUEST_TYPES)}")
    if num_fewshot is not None:
      try:
        num_fewshot = int(num_fewshot)
      except ValueError:
        raise UserError(f"{self.name}: num_fewshot must be an integer ≥ 0, got {num_fewshot!r}") from None
      if num_fewshot < 0:
        raise UserError(f"{self.name}: num_fewshot must be ≥ 0, got {num_fewshot}")
      self.harness.set_config(key="num_fewshot", value=num_fewshot)
    if (config.repeats or 1) != 1:
      raise UserError(f"{self.name}: repeats={config.repeats}; jaxloc decodes greedily once per request")
    generation = config.generation_kwargs or {}
    if self.request_type == "generate_until" and (generation.get("do_sample") or
                                                   float(generation.get("temperature") or 0) > 0):
      raise UserError(f"{self.name}: generation_kwargs ask for sampling ({generation}); jaxloc decodes greedily")
    self.output_type = "generate" if self.request_type == "generate_until" else "loglikelihood"
    self.filters = list(self.harness._filters)  # noqa: SLF001 - the task's filter ensembles, as lm-eval applies them
    aggregation, higher = self.harness.aggregation(), self.harness.higher_is_better()
    from lm_eval.api.metrics import mean

    per_doc, aggregate = [], []
    for ensemble in self.filters:
      for metric, function in aggregation.items():
        is_mean = function is mean and higher.get(metric, True)
        (per_doc if is_mean else aggregate).append(metric_key(metric, ensemble.name))
    if self.request_type == "loglikelihood_rolling":
      per_doc.append(ROLLING_METRIC)
    self.aggregations = {metric_key(m, e.name): aggregation[m] for e in self.filters for m in aggregation}
    self.metric_names = tuple(per_doc)
    self.aggregate_metric_names = tuple(aggregate)
    self.default_metric = (per_doc or aggregate)[0]
    self._instances_of: dict[tuple[int, ...], list[list[Any]]] = {}

  # -- documents and requests -------------------------------------------------------------------

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    """`{"doc_id", "doc"}` for the task's evaluation split (lm-eval's documents, after its process_docs)."""
    data.check_num_samples(num_samples)
    docs = [{"doc_id": i, "doc": doc} for i, doc in enumerate(self.harness.eval_docs)]
    if not docs:
      raise UserError(f"{self.name} has no evaluation documents")
    return data.sample_docs(docs, num_samples, seed)

  def instances(self, docs: Sequence[Doc]) -> list[list[Any]]:
    """lm-eval's request instances of each document (in lm-eval's order), the same objects on every call."""
    key = tuple(int(doc["doc_id"]) for doc in docs)
    if key not in self._instances_of:
      if len(self._instances_of) >= _CACHED_DOC_SETS:
        self._instances_of.pop(next(iter(self._instances_of)))
      self._instances_of[key] = [self._build(doc) for doc in docs]
    return self._instances_of[key]

  def _build(self, doc: Doc) -> list[Any]:
    harness = self.harness
    harness.set_fewshot_seed(FEWSHOT_SEED)
    context = harness.fewshot_context(doc["doc"], num_fewshot=harness.config.num_fewshot or 0,
                                      gen_prefix=harness.doc_to_prefix(doc["doc"]))
    built = harness.construct_requests(doc=doc["doc"], ctx=context,
                                       metadata=(harness.config.task, int(doc["doc_id"]), 1))
    return sorted(built if isinstance(built, list) else [built], key=lambda instance: instance.idx)

  def requests(self, docs: Sequence[Doc], tokenizer=None) -> list[ScoringRequest] | list[GenerationRequest]:
    return [self._request(instance) for group in self.instances(docs) for instance in group]

  def _request(self, instance) -> ScoringRequest | GenerationRequest:
    if self.request_type == "loglikelihood_rolling":
      (text,) = instance.args
      return ScoringRequest("", text, joint=True)
    if self.request_type == "generate_until":
      context, options = instance.args
      until = options.get("until") or ()
      return GenerationRequest(context, stop=(until,) if isinstance(until, str) else tuple(until),
                               max_new_tokens=int(options.get("max_gen_toks", 256)))
    context, continuation = instance.args
    return ScoringRequest(context, continuation, joint=True)

  # -- metrics ----------------------------------------------------------------------------------

  def _responses(self, outputs, num_requests: int) -> tuple[int, Any]:
    """(masks, response of (mask, request)) in lm-eval's response types."""
    if self.output_type == "generate":
      texts = list(outputs)
      if any(len(row) != num_requests for row in texts):
        raise ValueError(f"{self.name}: expected {num_requests} generations per mask")
      return len(texts), lambda m, r: texts[m][r]
    if not isinstance(outputs, ScoreOutputs) or outputs.logprob.shape[1] != num_requests:
      raise ValueError(f"{self.name}: expected ScoreOutputs for {num_requests} requests")
    logprob, greedy = np.asarray(outputs.logprob, np.float64), np.asarray(outputs.is_greedy)
    if self.request_type == "loglikelihood_rolling":
      return len(logprob), lambda m, r: float(logprob[m, r])
    return len(logprob), lambda m, r: (float(logprob[m, r]), bool(greedy[m, r]))

  def results(self, docs: Sequence[Doc], outputs) -> dict[str, np.ndarray]:
    """Every metric's per-document value, name -> object array [masks, docs]: lm-eval's filters and
    `process_results` applied to each mask's responses."""
    groups = self.instances(docs)
    flat = [instance for group in groups for instance in group]
    num_masks, response = self._responses(outputs, len(flat))
    values: dict[str, np.ndarray] = {}
    for m in range(num_masks):
      for r, instance in enumerate(flat):
        instance.resps = [response(m, r)]
        instance.filtered_resps = {}
      for ensemble in self.filters:
        ensemble.apply(flat)
      for ensemble in self.filters:
        for d, (doc, group) in enumerate(zip(docs, groups)):
          produced = self.harness.process_results(doc["doc"], [i.filtered_resps[ensemble.name] for i in group])
          for metric, value in produced.items():
            name = metric_key(metric, ensemble.name)
            if name in self.aggregations:
              values.setdefault(name, np.empty((num_masks, len(docs)), object))[m, d] = value
      if self.request_type == "loglikelihood_rolling":
        values.setdefault(ROLLING_METRIC, np.empty((num_masks, len(docs)), object))[m] = [
            instance.resps[0] for instance in flat]
    return values

  def doc_metrics(self, docs: Sequence[Doc], outputs) -> dict[str, np.ndarray]:
    results = self.results(docs, outputs)
    return {name: results[name].astype(np.float64) for name in self.metric_names}

  def compute_metrics(self, docs: Sequence[Doc], outputs) -> dict[str, np.ndarray]:
    """Every metric per mask, aggregated with lm-eval's own aggregation functions."""
    results = self.results(docs, outputs)
    aggregated = {}
    for name, values in results.items():
      function = self.aggregations.get(name)
      aggregated[name] = np.array([float(np.mean(row)) if function is None else float(function(list(row)))
                                   for row in values], np.float64)
    return aggregated
