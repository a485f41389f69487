"""The efficiency benchmark's parts: recall, the mask cache, nested budgets, synthetic sweeps, and the
two-stage and gradient methods (on a synthetic problem and on a tiny random Llama)."""

import numpy as np
import pytest

from jaxloc.bench import efficiency
from jaxloc.bench.mask_cache import MaskCache
from jaxloc.errors import UserError
from jaxloc.localize import designs
from jaxloc.localize.synthetic import SyntheticResponse


class CountingEvaluator:
  """A fake evaluator: score = -(number of ablated heads among `important`); counts what it is asked."""

  def __init__(self, important=(0, 1)):
    self.important = list(important)
    self.calls = 0
    self.masks = 0

  def __call__(self, masks):
    self.calls += 1
    self.masks += len(masks)
    flat = masks.reshape(len(masks), -1)
    score = -flat[:, self.important].sum(axis=1).astype(np.float64)
    for begin in range(0, len(masks), 3):  # batches of 3, as an engine would yield them
      where = slice(begin, min(begin + 3, len(masks)))
      yield where, {"accuracy": score[where], "logprob": 2 * score[where]}


def _random_masks(count, seed=0, shape=(2, 3)):
  return np.random.default_rng(seed).random((count,) + shape) < 0.4


def test_recall_counts_the_overlap_of_the_top_k():
  assert efficiency.recall([3, 1, 2, 9, 8, 4], [1, 2, 3, 4, 5], 5) == pytest.approx(0.6)
  assert efficiency.recall([5, 4, 3, 2, 1], [1, 2, 3, 4, 5], 5) == 1.0
  assert efficiency.recall([7, 8], [1, 2], 2) == 0.0
  # Only the top-k of the method counts: head 4 at position 6 is not a hit.
  assert efficiency.recall([9, 8, 7, 6, 5, 4], [4, 0, 1, 2, 3], 5) == 0.0
  with pytest.raises(UserError):
    efficiency.recall([1], [1], 0)


def test_ground_truth_breaks_accuracy_ties_by_logprob():
  change_acc = np.array([-0.1, -0.1, 0.0, -0.3])
  change_lp = np.array([-0.5, -0.9, -2.0, -1.0])
  assert efficiency.lexicographic_ranking(change_acc, change_lp).tolist() == [3, 1, 0, 2]


def test_cache_serves_repeated_masks_without_evaluating_them(tmp_path):
  evaluator = CountingEvaluator()
  settings = {"model": "fake", "task": "t", "num_samples": 10, "sample_seed": 0}
  cache = MaskCache(str(tmp_path), settings, evaluator, 2, 3, "accuracy")
  masks = _random_masks(7)
  masks[5] = masks[1]  # a repeat inside one request
  first = cache.measure(masks)
  assert evaluator.masks == len({m.tobytes() for m in masks}) == 6
  assert cache.evaluated == 6 and cache.served == 1
  np.testing.assert_array_equal(first["accuracy"][5], first["accuracy"][1])
  # A second request overlapping the first evaluates only its new masks.
  more = np.concatenate([masks[:3], _random_masks(2, seed=1)])
  second = cache.measure(more)
  assert evaluator.masks == 6 + 2 and cache.served == 1 + 3
  np.testing.assert_array_equal(second["logprob"][:3], first["logprob"][:3])
  # A new process on the same directory evaluates nothing it saved.
  fresh = CountingEvaluator()
  reopened = MaskCache(str(tmp_path), settings, fresh, 2, 3, "accuracy")
  again = reopened.measure(np.concatenate([masks, more]))
  assert fresh.calls == 0 and reopened.loaded == 8
  np.testing.assert_array_equal(again["accuracy"][:7], first["accuracy"])
  # Measurements made under other settings are refused, not mixed.
  with pytest.raises(UserError, match="num_samples"):
    MaskCache(str(tmp_path), dict(settings, num_samples=20), fresh, 2, 3, "accuracy")


def test_cache_keeps_every_finished_batch_when_the_evaluator_dies(tmp_path):
  def dies_after_one_batch(masks):
    yield slice(0, 3), {"accuracy": np.zeros(3), "logprob": np.zeros(3)}
    raise KeyboardInterrupt

  masks = _random_masks(8, seed=2)
  masks = masks[np.unique([m.tobytes() for m in masks], return_index=True)[1]]
  cache = MaskCache(str(tmp_path), {"task": "t"}, dies_after_one_batch, 2, 3, "accuracy")
  with pytest.raises(KeyboardInterrupt):
    cache.measure(masks)
  evaluator = CountingEvaluator()
  resumed = MaskCache(str(tmp_path), {"task": "t"}, evaluator, 2, 3, "accuracy")
  resumed.measure(masks)
  assert resumed.loaded == 3 and evaluator.masks == len(masks) - 3


def _fake_problem(evaluator, num_layers=4, num_heads=8):
  cache = MaskCache(None, {}, evaluator, num_layers, num_heads, "accuracy")
  base = cache.measure(np.zeros((1, num_layers, num_heads), bool))
  problem = efficiency.Problem("fake", num_layers, num_heads, cache.measure,
                               {m: float(v[0]) for m, v in base.items()}, ["accuracy", "logprob"])
  return problem, cache


def test_nested_budgets_reuse_the_measurements_of_smaller_budgets():
  evaluator = CountingEvaluator(important=(3, 17))
  problem, cache = _fake_problem(evaluator)
  spec = efficiency.parse_method("cs_stratified-r0.25")
  for num_masks in (4, 8, 16):  # 12.5%, 25%, 50% of 32 heads
    efficiency.run_method(spec, problem, num_masks, seed=3)
  assert evaluator.masks == 1 + 16  # the baseline and the largest prefix, nothing twice
  # Each budget's masks are the prefix of the largest design.
  full = designs.make_design("stratified", 4, 8, num_masks=16, ablation_rate=0.25, seed=3)
  for m in full:
    assert cache.contains(m)
  # A sweep over budgets and seeds measures each (design, seed) once: its largest prefix.
  evaluator2 = CountingEvaluator(important=(3, 17))
  problem2, _ = _fake_problem(evaluator2)
  truth = efficiency.one_shot_ground_truth(problem2)
  after_truth = evaluator2.masks
  efficiency.sweep(problem2, [spec, efficiency.parse_method("cs_stratified-logprob-r0.25")], [0.25, 0.5], [0, 1],
                   2, truth)
  design_masks = sum(len({m.tobytes() for m in designs.make_design("stratified", 4, 8, num_masks=16,
                                                                  ablation_rate=0.25, seed=s)}) for s in (0, 1))
  top_k_masks = evaluator2.masks - after_truth - design_masks
  assert 0 <= top_k_masks <= 2 * 2 * 2  # at most one per (method, budget, seed); coinciding sets once


def test_method_names_parse_and_bad_names_are_refused():
  spec = efficiency.parse_method("cs_stratified-logprob-r0.05-nonpositive-upto0.5")
  assert (spec.family, spec.metric, spec.ablation_rate, spec.nonpositive, spec.max_budget) == (
      "cs_stratified", "logprob", 0.05, True, 0.5)
  assert efficiency.parse_method("two_stage-s0.3").screen_fraction == 0.3
  with pytest.raises(UserError, match="unknown method"):
    efficiency.parse_method("lasso")
  with pytest.raises(UserError, match="unknown token"):
    efficiency.parse_method("cs_stratified-fast")
  with pytest.raises(UserError, match="cs_"):
    efficiency.parse_method("gradient-nonpositive")


def test_synthetic_sweep_recovers_the_planted_heads_at_a_generous_budget():
  cfg = efficiency.EfficiencyConfig(output_dir="unused", methods=["cs_stratified", "one_shot_greedy"],
                                    budgets=[1.0], seeds=[0], synthetic_sizes=[(8, 16)], synthetic_planted=5,
                                    synthetic_interaction_scale=0.0)
  report = efficiency.run(cfg, synthetic=True)
  (task,) = report["tasks"]
  by_method = {r["method"]: r for r in task["summary"]}
  assert by_method["cs_stratified"]["recall_planted_mean"] >= 0.8
  assert by_method["one_shot_greedy"]["recall_mean"] == 1.0  # greedy at 100% is the ground truth
  assert by_method["cs_stratified"]["evaluations"] == 128
  assert task["cache"]["served_from_cache"] > 0  # greedy at 100% re-asks the ground truth's masks


def test_saved_reports_render_together(tmp_path):
  cfg = efficiency.EfficiencyConfig(output_dir="unused", methods=["cs_stratified"], budgets=[0.5], seeds=[0],
                                    synthetic_sizes=[(4, 8)], synthetic_planted=3)
  report = efficiency.run(cfg, synthetic=True)
  for name in ("a", "b"):
    efficiency.write_outputs(report, str(tmp_path / name), k=5)
  paths = [str(tmp_path / name / "efficiency.json") for name in ("a", "b")]
  combined = efficiency.combine_reports(paths)
  assert [t["task"] for t in combined["tasks"]] == ["synthetic N=32"] * 2
  tables = efficiency.write_outputs(combined, str(tmp_path / "both"), k=5)
  assert tables.count("### synthetic N=32") == 2 and (tmp_path / "both" / "efficiency.png").exists()
  with pytest.raises(UserError, match="missing.json"):
    efficiency.combine_reports([str(tmp_path / "missing.json")])


def test_two_stage_confirms_its_candidates_by_single_head_ablation():
  problem, cache, response = efficiency.synthetic_problem(8, 16, seed=1, num_planted=5, interaction_scale=0.0)
  truth = efficiency.one_shot_ground_truth(problem)
  evaluated = cache.evaluated
  spec = efficiency.parse_method("two_stage-s0.5")
  result = efficiency.run_method(spec, problem, 64, seed=0)
  assert result.evaluations == 64 and result.info["screen_masks"] == 32 and result.info["confirmed_heads"] == 32
  # The confirmation masks are the ground truth's single-head masks: only the 32 screen masks are new.
  assert cache.evaluated - evaluated == 32
  # Among the confirmed heads the order is the ground truth's order.
  confirmed = set(result.ranking[:32].tolist())
  assert [h for h in truth.ranking["accuracy"] if h in confirmed][:5] == result.ranking[:5].tolist()
  assert efficiency.recall(result.ranking, response.true_top_k(5), 5) >= 0.8
  # A budget too small to confirm anything cannot run.
  assert efficiency.run_method(efficiency.parse_method("two_stage-s1.0"), problem, 4, seed=0) is None


def test_gradient_methods_on_a_synthetic_gradient():
  # Noise-free accuracy, so the ground truth is the planted truth and the test is exact.
  problem, _, response = efficiency.synthetic_problem(8, 16, seed=2, num_planted=5, interaction_scale=0.0,
                                                      num_samples=None)
  truth = efficiency.one_shot_ground_truth(problem)
  planted = response.true_top_k(5)
  assert set(truth.top_k("accuracy", 5)) == set(planted)
  # A gradient that knows the first 3 planted heads and ranks the other 2 after 20 decoys.
  gradient = np.zeros(problem.num_total)
  decoys = [h for h in range(problem.num_total) if h not in set(response.planted.tolist())][:20]
  gradient[response.planted[:3]] = [-3.0, -2.9, -2.8]
  gradient[decoys] = -np.linspace(2.0, 1.0, 20)
  gradient[response.planted[3:]] = -0.5
  problem.gradient, problem.gradient_cost = gradient, 3.5
  alone = efficiency.run_method(efficiency.parse_method("gradient"), problem, 10, seed=0)
  assert alone.evaluations == 3.5 and set(alone.ranking[:3]) == set(response.planted[:3])
  small = efficiency.run_method(efficiency.parse_method("gradient_confirm"), problem, 10, seed=0)
  large = efficiency.run_method(efficiency.parse_method("gradient_confirm"), problem, 30, seed=0)
  assert small.evaluations == 3.5 + 6 and large.evaluations == 3.5 + 26
  assert large.info["confirmed_heads"] == 26
  # Confirming beyond the decoys finds the planted heads the gradient under-ranked.
  assert efficiency.recall(small.ranking, planted, 5) == pytest.approx(0.6)
  assert efficiency.recall(large.ranking, planted, 5) == 1.0


def test_synthetic_evaluator_is_a_fixed_function_of_the_mask():
  responses = {"accuracy": SyntheticResponse(64, seed=0), "logprob": SyntheticResponse(64, metric="logprob", seed=0)}
  evaluate = efficiency.synthetic_evaluator(responses, noise_seed=0)
  masks = _random_masks(5, shape=(8, 8))
  (_, first), = list(evaluate(masks))
  (_, second), = list(evaluate(masks[::-1]))
  np.testing.assert_array_equal(first["accuracy"], second["accuracy"][::-1])
  assert np.ptp(first["accuracy"]) > 0  # noise differs between masks


def test_gradient_methods_on_a_tiny_model(smollm2, tmp_path):
  from jaxloc.engine.engine import Engine
  from jaxloc.tasks.registry import get_task
  from tests.engine.tiny import make_tiny

  engine = Engine(make_tiny(smollm2.tokenizer), tokens_per_batch=256)
  task = get_task("counting")
  docs = task.load_docs(num_samples=6, seed=0)
  problem, cache = efficiency.real_problem(engine, "tiny", "counting", docs, task, output_dir=str(tmp_path),
                                           num_samples=6, sample_seed=0, part="all", headline_metric="logprob")
  gradient = efficiency.measure_gradient(engine, task, docs, problem, repeats=1)
  assert gradient["available"] and gradient["forward_equivalents"] > 0
  assert problem.gradient.shape == (18,)
  truth = efficiency.one_shot_ground_truth(problem)
  evaluated = cache.evaluated
  # A budget that confirms every head reproduces the ground truth, from the cache.
  full = efficiency.run_method(efficiency.parse_method("gradient_confirm"), problem,
                               int(np.ceil(18 + problem.gradient_cost)), seed=0)
  assert full.info["confirmed_heads"] == 18
  assert full.ranking.tolist() == truth.ranking["logprob"].tolist()
  assert cache.evaluated == evaluated
  # The gradient is a first-order view of single-head ablation: it agrees with it more than by chance.
  assert efficiency._spearman(problem.gradient, truth.change["logprob"]) > 0.3
