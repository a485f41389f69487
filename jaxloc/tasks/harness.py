"""lm-evaluation-harness tasks as capabilities: `get_task("lm_eval:boolq")`, a group such as `lm_eval:mmlu`, or
`lm_eval:path/to/task.yaml` (a task or a group YAML; lm-eval also indexes that YAML's directory, where a group's
member tasks are found).

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
`loglikelihood` and `loglikelihood_rolling` tasks also report `loglikelihood` per document: the continuation's
summed log-probability, which is lm-eval's response itself (what lm-eval's perplexity aggregates). It is the
continuous score to localize when the task's own metric is a coarse 0/1 per document.

Few-shot examples: each document's context is built with the task's few-shot sampler freshly seeded with
lm-eval's default few-shot seed (1234). A document's prompt then depends on that document alone, whatever
documents are evaluated with it. It equals lm-eval's prompt for the document evaluated alone, and lm-eval's
full run for zero-shot tasks and deterministic samplers (`first_n`). lm-eval's sequential sampler gives later
documents of a full run other examples.

Groups and tags: their leaf tasks' documents are pooled (`{"task", "doc_id", "doc"}`, tasks in name order) and
each document is scored by its own task (prompts, filters, process_results). The metrics are those every leaf task
reports; a per-document metric's mean over the pooled documents is lm-eval's size-weighted group score
(`weight_by_size: true`, as mmlu's). A group whose tasks mix output types is an error.

Options: `num_fewshot` (as lm-eval's `--num_fewshot`, for every task of a group). Documents: the evaluation split
(test, else validation), seeded subsets by `--num_samples` as for every jaxloc task (lm-eval's `--limit` takes
the first n). Needs the optional extra: `pip install -e '.[lm-eval]'`.

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
LOGLIKELIHOOD_METRIC = "loglikelihood"
SCORED_TYPES = ("loglikelihood", "loglikelihood_rolling")  # one scored request per document
# Instances built for the last few document sets: `requests` and every metric call use the same ones.
_CACHED_DOC_SETS = 8


def _require_lm_eval() -> None:
  try:
    import lm_eval  # noqa: F401
  except ImportError:
    raise UserError("lm_eval: tasks need lm-evaluation-harness: pip install -e '.[lm-eval]' "
                    "(or pip install lm-eval)") from None


@functools.cache
def task_manager(include_path: str | None = None):
  """lm-eval's TaskManager over its built-in tasks, and the task YAMLs under `include_path` (a group YAML names
  its member tasks, which lm-eval finds there). Building the index takes seconds: once per directory and process."""
  _require_lm_eval()
  from lm_eval.tasks import TaskManager

  return TaskManager(include_path=include_path)


def _is_yaml(spec: str) -> bool:
  return spec.endswith((".yaml", ".yml"))


def include_path(spec: str) -> str | None:
  """The directory lm-eval indexes besides its own tasks for `spec`: a task YAML's own (where a group YAML's member
  tasks are), else none."""
  return os.path.dirname(os.path.abspath(spec)) if _is_yaml(spec) else None


def load_name(spec: str) -> str:
  """What to ask lm-eval's TaskManager for: a task YAML's path, but a group YAML's group name (lm-eval indexes the
  YAML's directory and builds a group by its name, not from its file)."""
  if not _is_yaml(spec):
    return spec
  from lm_eval.tasks._yaml_loader import load_yaml

  try:
    config = load_yaml(spec, resolve_func=False)
  except Exception as e:  # noqa: BLE001 - a YAML lm-eval cannot read is the user's file, not our bug
    raise UserError(f"lm-eval cannot read task file {spec}: {type(e).__name__}: {e}") from e
  return config["group"] if isinstance(config.get("group"), str) else os.path.abspath(spec)


def load_harness_tasks(spec: str) -> tuple[str | None, dict[str, Any]]:
  """(the group's name or None, {task name: lm-eval task}) for a task, group or tag, by name or YAML path: one task,
  or a group's or tag's leaf tasks."""
  if not spec:
    raise UserError("lm_eval: needs a task name or a task YAML path, e.g. lm_eval:boolq")
  if _is_yaml(spec) and not os.path.isfile(spec):
    raise UserError(f"lm-eval task file {spec} not found")
  manager = task_manager(include_path(spec))
  name = load_name(spec)
  offline = False
  try:
    with data.hub_access() as offline:  # no network: lm-eval's datasets come from the local cache, at once
      loaded = manager.load(name)
  except KeyError:
    raise UserError(f"unknown lm-eval task {spec!r}: neither a task, group or tag lm-eval knows nor a task "
                    "YAML file (list them with `lm-eval ls tasks`)") from None
  except Exception as e:  # a dataset lm-eval cannot reach, a malformed YAML: the user's task, not our bug
    where = (" (offline: the hub is unreachable and the local Hugging Face cache lacks its dataset; a task YAML "
             "of your own can read local files)" if offline else "")
    raise UserError(f"lm-eval could not build task {spec}{where}: {type(e).__name__}: {e}") from e
  from lm_eval.api.task import ConfigurableTask

  tasks = dict(sorted(loaded["tasks"].items()))
  for name, task in tasks.items():
    if not isinstance(task, ConfigurableTask):
      raise UserError(f"lm_eval:{spec}: {name} is a Python-class lm-eval task ({type(task).__name__}); jaxloc takes "
                      "YAML-configured tasks (ConfigurableTask), which nearly all lm-eval tasks are")
  members = {child for children in loaded["group_map"].values() for child in children}
  roots = [group for group in loaded["groups"] if group not in members]
  return (roots[0] if len(roots) == 1 else None), tasks


def metric_key(metric: str, filter_name: str) -> str:
  """jaxloc's name of an lm-eval metric under a filter: lm-eval's `metric,filter` without `,none`."""
  return metric if filter_name == "none" else f"{metric},{filter_name}"


class HarnessTask(Task):
  """An lm-eval task, group or tag, evaluated for a stack of head masks by jaxloc's engine (module docstring)."""

  def __init__(self, spec: str, num_fewshot: int | str | None = None):
    self.spec = spec
    self.name = PREFIX + spec
    self.group, self.subtasks = load_harness_tasks(spec)
    if num_fewshot is not None:
      try:
        num_fewshot = int(num_fewshot)
      except ValueError:
        raise UserError(f"{self.name}: num_fewshot must be an integer ≥ 0, got {num_fewshot!r}") from None
      if num_fewshot < 0:
        raise UserError(f"{self.name}: num_fewshot must be ≥ 0, got {num_fewshot}")
      for harness in self.subtasks.values():
        harness.set_config(key="num_fewshot", value=num_fewshot)
    self.num_fewshot = num_fewshot  # the override (None: each task's own), as lm-eval's --num_fewshot
    types = {name: harness.OUTPUT_TYPE for name, harness in self.subtasks.items()}
    self.request_type = next(iter(types.values()))
    if len(set(types.values())) > 1:
      raise UserError(f"{self.name} mixes lm-eval output types {sorted(set(types.values()))}; jaxloc scores or "
                      "generates for the whole task: give one of its tasks")
    if self.request_type not in REQUEST_TYPES:
      raise UserError(f"{self.name}: lm-eval output type {self.request_type!r} is not supported; supported: "
                      f"{', '.join(REQUEST_TYPES)}")
    for name, harness in self.subtasks.items():
      config = harness.config
      if (config.repeats or 1) != 1:
        raise UserError(f"{name}: repeats={config.repeats}; jaxloc decodes greedily once per request")
      generation = config.generation_kwargs or {}
      if self.request_type == "generate_until" and (generation.get("do_sample") or
                                                     float(generation.get("temperature") or 0) > 0):
        raise UserError(f"{name}: generation_kwargs ask for sampling ({generation}); jaxloc decodes greedily")
    self.output_type = "generate" if self.request_type == "generate_until" else "loglikelihood"
    self.filters = {name: list(harness._filters)  # noqa: SLF001 - the filter ensembles, as lm-eval applies them
                    for name, harness in self.subtasks.items()}
    self._classify_metrics()
    self._instances_of: dict[tuple[tuple[str, int], ...], list[list[Any]]] = {}

  def _classify_metrics(self) -> None:
    """Per-document and aggregate-only metric names (module docstring), those every task of a group reports."""
    from lm_eval.api.metrics import mean

    kinds: list[dict[str, tuple[bool, Any]]] = []
    for name, harness in self.subtasks.items():
      aggregation, higher = harness.aggregation(), harness.higher_is_better()
      kinds.append({metric_key(metric, ensemble.name): (function is mean and higher.get(metric, True), function)
                    for ensemble in self.filters[name] for metric, function in aggregation.items()})
    common = [key for key in kinds[0] if all(k.get(key) == kinds[0][key] for k in kinds[1:])]
    per_doc = [key for key in common if kinds[0][key][0]]
    if self.request_type in SCORED_TYPES:
      per_doc.append(LOGLIKELIHOOD_METRIC)
    self.metric_names = tuple(per_doc)
    self.aggregate_metric_names = tuple(key for key in common if not kinds[0][key][0])
    self.aggregations = {key: kinds[0][key][1] for key in common}
    if not per_doc and not self.aggregate_metric_names:
      raise UserError(f"{self.name}: its tasks share no metric ({', '.join(self.subtasks)})")
    self.default_metric = (per_doc or list(self.aggregate_metric_names))[0]

  # -- documents and requests -------------------------------------------------------------------

  def load_docs(self, *, num_samples: int | None = None, seed: int = 0,
                data_dir: str | None = None) -> list[Doc]:
    """`{"task", "doc_id", "doc"}` for every task's evaluation split (lm-eval's documents, after its process_docs),
    tasks in name order."""
    data.check_num_samples(num_samples)
    docs = [{"task": name, "doc_id": i, "doc": doc}
            for name, harness in self.subtasks.items() for i, doc in enumerate(harness.eval_docs)]
    if not docs:
      raise UserError(f"{self.name} has no evaluation documents")
    return data.sample_docs(docs, num_samples, seed)

  def instances(self, docs: Sequence[Doc]) -> list[list[Any]]:
    """lm-eval's request instances of each document (in lm-eval's order), the same objects on every call."""
    key = tuple((doc["task"], int(doc["doc_id"])) for doc in docs)
    if key not in self._instances_of:
      if len(self._instances_of) >= _CACHED_DOC_SETS:
        self._instances_of.pop(next(iter(self._instances_of)))
      self._instances_of[key] = [self._build(doc) for doc in docs]
    return self._instances_of[key]

  def _build(self, doc: Doc) -> list[Any]:
    harness = self.subtasks[doc["task"]]
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

  def scored_request_index(self, docs: Sequence[Doc]) -> np.ndarray:
    """A `loglikelihood(_rolling)` document's one request; a multiple-choice document's gold choice (lm-eval's
    `doc_to_target`, an index or the choice's text; the first of several golds)."""
    if self.request_type != "multiple_choice":
      return np.arange(len(docs))
    index, start = [], 0
    for doc, group in zip(docs, self.instances(docs)):
      harness = self.subtasks[doc["task"]]
      gold = harness.doc_to_target(doc["doc"])
      gold = gold[0] if isinstance(gold, list) else gold
      if isinstance(gold, str):
        choices = harness.doc_to_choice(doc["doc"])
        gold = choices.index(gold) if gold in choices else int(gold)
      index.append(start + int(gold))
      start += len(group)
    return np.asarray(index)

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
    """Every metric's per-document value, name -> object array [masks, docs]: each task's own filters and
    `process_results` applied to each mask's responses."""
    groups = self.instances(docs)
    flat = [instance for group in groups for instance in group]
    num_masks, response = self._responses(outputs, len(flat))
    by_task: dict[str, list[Any]] = {}
    for doc, group in zip(docs, groups):
      by_task.setdefault(doc["task"], []).extend(group)
    values = {name: np.empty((num_masks, len(docs)), object) for name in self.aggregations}
    if self.request_type in SCORED_TYPES:
      values[LOGLIKELIHOOD_METRIC] = np.empty((num_masks, len(docs)), object)
    for m in range(num_masks):
      for r, instance in enumerate(flat):
        instance.resps = [response(m, r)]
        instance.filtered_resps = {}
      for name, instances in by_task.items():  # filters see one task's instances, as in lm-eval
        for ensemble in self.filters[name]:
          ensemble.apply(instances)
      for d, (doc, group) in enumerate(zip(docs, groups)):
        harness = self.subtasks[doc["task"]]
        for ensemble in self.filters[doc["task"]]:
          produced = harness.process_results(doc["doc"], [i.filtered_resps[ensemble.name] for i in group])
          for metric, value in produced.items():
            name = metric_key(metric, ensemble.name)
            if name in values:
              values[name][m, d] = value
        if self.request_type in SCORED_TYPES:
          values[LOGLIKELIHOOD_METRIC][m, d] = np.ravel(group[0].resps[0])[0]
    return values

  def doc_metrics(self, docs: Sequence[Doc], outputs) -> dict[str, np.ndarray]:
    results = self.results(docs, outputs)
    return {name: results[name].astype(np.float64) for name in self.metric_names}

  def compute_metrics(self, docs: Sequence[Doc], outputs) -> dict[str, np.ndarray]:
    """Every metric per mask, aggregated over all documents with lm-eval's own aggregation functions."""
    results = self.results(docs, outputs)
    aggregated = {}
    for name, values in results.items():
      function = self.aggregations.get(name)
      aggregated[name] = np.array([float(np.mean(row)) if function is None else float(function(list(row)))
                                   for row in values], np.float64)
    return aggregated
