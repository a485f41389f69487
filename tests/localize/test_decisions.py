"""Confirmation decisions with their uncertainty: every drop carries its paired-bootstrap interval, a straddling one
gets more documents of its task (only the new ones scored, up to the cap) before the rule decides, each rule reads
the interval as documented, a resumed confirmation reads its per-document values back; and the power of a general
task (one-sided exact binomial) plans its documents or marks it unable to veto."""

import numpy as np
import pytest
from scipy import stats

from jaxloc.errors import UserError
from jaxloc.localize import confirm, decisions, validate
from jaxloc.localize.methods import Measured
from jaxloc.localize.settings import LocalizeSettings


class _Model:
  class model_config:  # noqa: N801 - the face validate.TaskMeasures reads: engine.model_config
    num_layers = 1


# A fixed uniform draw per document (row 0: is it right unablated; row h + 1: does ablating head h make it wrong).
UNIFORM = np.random.default_rng(0).random((9, 11_000))


class DocEvaluator:
  """A task over integer documents (1 layer of 8 heads): document d is right unablated when UNIFORM[0, d] is below
  `baseline`, and ablating head h makes a right document wrong when UNIFORM[h + 1, d] is below that head's drop
  (`drops[h]`), the heads of a set each on their own. Counts the documents it scores."""

  engine = _Model()
  unit, units_per_layer = "heads", 8

  def __init__(self, name, docs, drops, baseline=1.0, counter=None):
    self.name, self.docs, self.drops, self.baseline = name, list(docs), dict(drops), baseline
    self.counter = counter if counter is not None else {"docs": 0}

  def on(self, docs):
    return DocEvaluator(self.name, docs, self.drops, self.baseline, self.counter)

  def run(self, keep, per_doc=False):
    assert per_doc
    docs = np.asarray(self.docs, np.int64)
    self.counter["docs"] += len(keep) * len(docs)
    right = UNIFORM[0][docs] < self.baseline
    out = []
    for row in np.asarray(keep).reshape(len(keep), -1):
      lost = np.zeros(len(docs), bool)
      for h in np.flatnonzero(row < 0.5):
        lost |= UNIFORM[h + 1][docs] < self.drops.get(int(h), 0.0)
      out.append((right & ~lost).astype(float))
    return {"accuracy": np.array(out)}


def _scorer(general_drops, own=100, reserve=700, baseline=1.0):
  counter = {"docs": 0}
  target = DocEvaluator("target", range(own), {h: 0.5 for h in range(8)}, counter=counter)
  general = DocEvaluator("general", range(own), general_drops, baseline, counter)
  scorer = validate.TaskMeasures([target, general], ["accuracy", "accuracy"],
                           reserves=[[], list(range(10_000, 10_000 + reserve))])
  return scorer, counter


def test_a_straddling_interval_gets_more_documents_and_a_clear_one_does_not():
  # Head 0 drops the general task by ~10% (the threshold): its interval on 100 documents straddles 10%. Head 1
  # drops it by ~60%, head 2 not at all: both are decided on the first 100 documents.
  scorer, counter = _scorer({0: 0.10, 1: 0.6, 2: 0.0})
  judge = decisions.Judge(scorer, decisions.Rule(0.1, "interval"))
  straddling, veto, spare = judge.measure([(0,), (1,), (2,)])
  assert veto.docs[1] == 100 and judge.verdict(veto, 1) == "veto" and veto.low[1] > 0.1
  assert spare.docs[1] == 100 and judge.verdict(spare, 1) == "pass" and spare.high[1] <= 0.1
  assert judge.confidence(veto) > 0.99 and judge.confidence(spare) > 0.99
  assert straddling.docs[1] > 100 and straddling.docs[1] in decisions.schedule(100, 800)
  assert straddling.docs[0] == 100  # the target is never extended
  # Every drop is the paired bootstrap's over the documents used (validate's, one implementation).
  np.testing.assert_allclose([straddling.low[1], straddling.high[1]],
                             validate.drop_interval(straddling.values[1], level=0.95)[1])
  assert straddling.low[1] <= 0.1 < straddling.high[1] or straddling.docs[1] == 800 or not straddling.straddles(1, 0.1)
  # Only the new documents were scored: 4 masks x 100, then the straddling mask and the baseline on the rest.
  extra = int(straddling.docs[1]) - 100
  assert counter["docs"] == 4 * 100 * 2 + 2 * extra


def test_at_the_cap_interval_takes_the_point_estimate_and_upper_bound_vetoes():
  # A drop of exactly about the threshold straddles it even on 200 documents (the cap here).
  scorer, _ = _scorer({0: 0.095}, reserve=100)
  interval = decisions.Judge(scorer, decisions.Rule(0.1, "interval"))
  (d,) = interval.measure([(0,)])
  assert d.docs[1] == 200 and d.straddles(1, 0.1)
  assert interval.verdict(d, 1) == ("pass" if d.drops[1] <= 0.1 else "veto")
  upper = decisions.Judge(scorer, decisions.Rule(0.1, "upper_bound"))
  (u,) = upper.measure([(0,)])
  assert upper.verdict(u, 1) == "veto" and not upper.passes(u)
  # The confidence is the share of resamples on the side decided: far from certain at the threshold.
  assert 0.2 < interval.confidence(d) < 0.9
  record = upper.record(u, ["target", "general"])
  assert record["passed"] is False and record["tasks"]["general"]["docs"] == 200
  assert record["tasks"]["general"]["straddles"] and len(record["tasks"]["general"]["interval"]) == 2


def test_the_point_rule_adds_no_documents():
  scorer, counter = _scorer({0: 0.10})
  judge = decisions.Judge(scorer, decisions.Rule(0.1, "point"))
  (d,) = judge.measure([(0,)])
  assert d.docs[1] == 100 and counter["docs"] == 2 * 2 * 100
  assert not np.isnan(d.low[1])  # intervals are still recorded
  assert judge.passes(d) == bool(d.drops[1] <= 0.1)


def test_a_task_whose_power_falls_short_starts_on_more_documents_or_cannot_veto():
  # At baseline 0.5, 100 documents detect only a ~25% drop: decisions start on the first doubling that detects 10%.
  power = decisions.plan_power("general", 0.5, 100, 800, 0.1, 0.05, 0.8)
  assert power.able and power.planned == 800 and power.planned_detectable <= 0.1 < power.detectable
  scorer, _ = _scorer({1: 0.6}, baseline=0.5)
  judge = decisions.Judge(scorer, decisions.Rule(0.1), [power])
  (d,) = judge.measure([(1,)])
  assert d.docs[1] == 800 and not judge.passes(d)
  # With a cap of 400 the task cannot detect 10%: unable to veto at the threshold, a drop of ~15% (its interval
  # straddling 10%) lets the head by under every rule, on the task's own documents; a 60% drop, which no noise of 100
  # documents explains, still vetoes.
  weak = decisions.plan_power("general", 0.5, 100, 400, 0.1, 0.05, 0.8)
  assert not weak.able and weak.planned == 100
  scorer, _ = _scorer({1: 0.6, 2: 0.15}, baseline=0.5)
  for how in decisions.RULES:
    judge = decisions.Judge(scorer, decisions.Rule(0.1, how), [weak])
    clear, noisy = judge.measure([(1,), (2,)])
    assert noisy.drops[1] > 0.1 and noisy.straddles(1, 0.1) and noisy.docs[1] == 100
    assert judge.verdict(noisy, 1) == "unable" and judge.passes(noisy) and judge.confidence(noisy) is None
    assert judge.verdict(clear, 1) == "veto" and clear.low[1] > 0.1 and not judge.passes(clear)
  assert "UNABLE TO VETO" in decisions.describe_power("general", weak.facts())
  assert "decisions start on 800 documents" in decisions.describe_power("general", power.facts())


def test_the_detectable_drop_is_where_the_exact_binomial_test_reaches_its_power():
  for docs, baseline in [(100, 0.9), (60, 0.8), (400, 0.5), (1000, 0.3)]:
    drop = decisions.detectable_drop(docs, baseline, 0.05, 0.8)
    c = decisions.rejection_count(docs, baseline, 0.05)
    assert stats.binom.cdf(c, docs, baseline) <= 0.05 < stats.binom.cdf(c + 1, docs, baseline)
    assert decisions.power_at(docs, baseline, drop, 0.05) >= 0.8 > decisions.power_at(docs, baseline, drop - 1e-3,
                                                                                     0.05)
    # The normal approximation agrees within the test's discreteness.
    z = stats.norm.ppf(0.95) * np.sqrt(baseline * (1 - baseline)) + stats.norm.ppf(0.8) * np.sqrt(
        baseline * (1 - drop) * (1 - baseline * (1 - drop)))
    assert abs(drop - z / np.sqrt(docs) / baseline) < 0.05
  assert decisions.detectable_drop(400, 0.9, 0.05, 0.8) < decisions.detectable_drop(100, 0.9, 0.05, 0.8)
  assert decisions.detectable_drop(100, 0.0, 0.05, 0.8) is None  # nothing to lose
  assert decisions.detectable_drop(2, 0.5, 0.05, 0.8) is None  # no count is rare enough
  assert decisions.schedule(100, 800) == [100, 200, 400, 800] and decisions.schedule(60, 100) == [60, 100]
  odd = decisions.plan_power("logprob", -3.2, 100, 800, 0.1, 0.05, 0.8)
  assert odd.able and not odd.proportion and "no binomial power" in decisions.describe_power("x", odd.facts())


def test_a_resumed_confirmation_reads_its_documents_back_and_scores_nothing(tmp_path):
  scorer, counter = _scorer({0: 0.10, 1: 0.6, 2: 0.0, 3: 0.0})
  judge = decisions.Judge(scorer, decisions.Rule(0.1))
  selected, c = confirm.confirm([1, 0, 2, 3], 2, judge, {}, lambda h: [h], str(tmp_path), together=2)
  assert 1 in c.rejected and selected[-1] in (2, 3)
  facts = c.facts(str, ["target", "general"], 0.1)
  assert facts["decision_rule"]["rule"] == "interval" and facts["decision_rule"]["intervals"]
  assert [d["units"] for d in facts["decisions"]][:2] == [["1"], ["0"]]
  assert facts["extra_documents"] == c.extra_documents() == sum(
      int(c.decided[k].docs[1]) - 100 for k in c.consulted)
  again, again_counter = _scorer({0: 0.10, 1: 0.6, 2: 0.0, 3: 0.0})
  selected_again, c_again = confirm.confirm([1, 0, 2, 3], 2, decisions.Judge(again, decisions.Rule(0.1)), {},
                                            lambda h: [h], str(tmp_path), together=2)
  assert selected_again == selected and again_counter["docs"] == 0
  for key, d in c.decided.items():
    np.testing.assert_array_equal(c_again.decided[key].docs, d.docs)
    np.testing.assert_allclose(c_again.decided[key].high, d.high)


def test_a_methods_own_measurement_is_extended_by_its_new_documents_only():
  scorer, counter = _scorer({0: 0.10})
  ones = np.ones((2, 1, 8), np.float32)
  ones[1, 0, 0] = 0
  per = scorer.per_doc(ones)  # what the method measured: the baseline and head 0 alone on the own documents
  counter["docs"] = 0
  fresh, _ = _scorer({0: 0.10})
  fresh_counter = fresh.eval_sets[0].counter
  masks = np.zeros((1, 1, 8), bool)
  masks[0, 0, 0] = True
  measured = [Measured(masks, {"accuracy": p[1:].mean(axis=1)}, {"accuracy": float(p[0].mean())}, "accuracy",
                       {"accuracy": p[1:]}, {"accuracy": p[0]}) for p in per]
  known = confirm.measured_alone(masks, [m.scores for m in measured], [m.baselines["accuracy"] for m in measured],
                                 [m.doc_metrics["accuracy"] for m in measured],
                                 [m.doc_baselines["accuracy"] for m in measured])
  judge = decisions.Judge(fresh, decisions.Rule(0.1))
  selected, c = confirm.confirm([0], 1, judge, known, lambda h: [h], None)
  d = c.decided[(0,)]
  assert c.reused == [0] and c.measured == [] and d.docs[1] > 100
  assert fresh_counter["docs"] == 2 * (int(d.docs[1]) - 100)  # baseline and head 0 on the new documents only


@pytest.mark.parametrize("changes, message", [
    ({"specific_confidence": 1.5}, "specific_confidence"),
    ({"specific_rule": "median"}, "specific_rule"),
    ({"general_samples": 200, "general_max_samples": 100}, "--general_max_samples=100 is below"),
    ({"veto_power": 0.2}, "veto_power"),
])
def test_bad_decision_settings_are_named(changes, message):
  with pytest.raises((UserError, ValueError), match=message):
    LocalizeSettings.make(task="synthetic", output_dir="unused", **changes).check()


def test_a_detectable_drop_that_misses_the_threshold_never_reads_as_the_threshold():
  """60 documents at 0.95 detect a drop just above 10%: said with a decimal, not as "a 10% drop ..., not 10%"."""
  facts = decisions.plan_power("counting", 0.95, 60, 800, 0.1, 0.05, 0.8).facts()
  assert 0.1 < facts["detectable_relative_drop"] < 0.105
  line = decisions.describe_power("counting", facts)
  assert f"detect a {100 * facts['detectable_relative_drop']:.1f}% drop" in line and "detect a 10% drop" not in line
