"""Confirmed selection: candidates in ranking order are measured alone until enough pass, the reported ones together
too, in the order of their target drop alone; measurements the method already made are reused; aliased groups are
resolved by measurement; a resumed run measures nothing again; the run's selection (`find_heads`) is what measurement
confirms, whatever the estimates said."""

import numpy as np

from jaxloc.localize import confirm, decisions, selection, specificity
from jaxloc.localize.methods import Measured, Ranking
from jaxloc.localize.settings import LocalizeSettings


class FakeScorer:
  """Relative drops per head (target, general) from a table, adding up over heads ablated together; counts the heads
  it was asked to measure alone and the sets it was asked to measure together."""

  names = ["target", "general"]

  def __init__(self, table):
    self.table, self.asked, self.sets = table, [], []


def _judge(scorer, threshold=0.1):
  """The point rule (a FakeScorer has means only): every general drop ≤ threshold."""
  return decisions.Judge(scorer, decisions.Rule(threshold, "point"))


def _patch(monkeypatch, scorer):
  def single_head_drops(heads, s):
    s.asked.extend(heads)
    return np.array([s.table[h] for h in heads], np.float64)

  def set_drops(sets, s):
    s.sets.append([tuple(k) for k in sets])  # one list per batch
    return np.array([np.sum([s.table[h] for h in k], axis=0) for k in sets], np.float64)

  monkeypatch.setattr(confirm.validate, "single_head_drops", single_head_drops)
  monkeypatch.setattr(confirm.validate, "set_drops", set_drops)


TABLE = {0: [0.5, 0.5], 1: [0.4, 0.0], 2: [0.3, 0.05], 3: [0.2, 0.3], 4: [0.1, 0.0], 5: [0.05, 0.0], 6: [0.0, 0.0],
         7: [0.01, 0.0]}


def test_candidates_are_measured_until_enough_pass(monkeypatch, tmp_path):
  scorer = FakeScorer(TABLE)
  _patch(monkeypatch, scorer)
  known = {1: np.array([0.4, 0.0])}  # the method measured head 1 alone already
  selected, c = confirm.confirm([0, 1, 2, 3, 4, 5, 6, 7], 3, _judge(scorer), known, lambda h: [h], str(tmp_path))
  assert selected == [1, 2, 4] and c.rejected == [0, 3] and c.reused == [1]
  assert 1 not in scorer.asked and set(c.measured) == set(scorer.asked) and len(c.measured) >= 4
  # A resumed run reads the saved confirmations and measures nothing again.
  again = FakeScorer(TABLE)
  _patch(monkeypatch, again)
  again_selected, _ = confirm.confirm([0, 1, 2, 3, 4, 5, 6, 7], 3, _judge(again), known, lambda h: [h], str(tmp_path))
  assert again_selected == [1, 2, 4]
  assert again.asked == []


def test_the_reported_heads_are_confirmed_together_too(monkeypatch, tmp_path):
  # Heads 1, 2 and 5 each spare the general task alone (0.0, 0.05, 0.05): 1 + 2 pass together (0.05), 1 + 2 + 5 do
  # not (0.10 > 0.09), so 5 is turned away and 6 joins; past the first `together` heads only the single rule holds,
  # and 5, turned away, comes back there before 7.
  table = {**TABLE, 5: [0.05, 0.05], 6: [0.04, 0.0], 7: [0.03, 0.05]}
  scorer = FakeScorer(table)
  _patch(monkeypatch, scorer)
  selected, c = confirm.confirm([0, 1, 2, 3, 4, 5, 6, 7], 4, _judge(scorer, 0.09), {}, lambda h: [h], str(tmp_path),
                                together=3)
  assert selected == [1, 2, 4, 5] and c.rejected == [0, 3]  # 4 (0.0 general) joins before 5; 5 is the fourth
  assert not c.rejected_together
  scorer = FakeScorer(table)
  _patch(monkeypatch, scorer)
  selected, c = confirm.confirm([1, 2, 5, 6, 7], 4, _judge(scorer, 0.09), {}, lambda h: [h], str(tmp_path / "b"),
                                together=3)
  assert selected == [1, 2, 6, 5] and c.rejected_together == {5: (1, 2, 5)} and c.rejected == []
  assert c.together == 3 and (1, 2, 6) in c.set_drops
  # First batch: the selection grown by 2, then by 5, as if each joined; turning 5 away took one more batch.
  assert scorer.sets == [[(1, 2), (1, 2, 5)], [(1, 2, 6)]]
  assert c.masks == len(c.measured) + 3 and sorted(c.measured_sets) == [(1, 2), (1, 2, 5), (1, 2, 6)]
  # A resumed run reads the saved sets and measures nothing again.
  again = FakeScorer(table)
  _patch(monkeypatch, again)
  assert confirm.confirm([1, 2, 5, 6, 7], 4, _judge(again, 0.09), {}, lambda h: [h], str(tmp_path / "b"),
                         together=3)[0] == [1, 2, 6, 5]
  assert again.asked == [] and again.sets == []


def test_the_heads_confirmed_together_are_taken_by_their_target_drop_alone(monkeypatch):
  # The ranking puts 2 (5% of the target, 8% of the general task alone) before 3 (40%, 5%): taken in ranking order, 2
  # would spend the general margin and 1 + 2 + 3 (13%) would turn 3 away. Taken by the target drop alone, 3 joins
  # first and 2 is the one turned away (1 + 3 + 2); 4, next in the ranking, replaces it.
  table = {1: [0.5, 0.0], 2: [0.05, 0.08], 3: [0.4, 0.05], 4: [0.3, 0.0], 5: [0.2, 0.0]}
  scorer = FakeScorer(table)
  _patch(monkeypatch, scorer)
  selected, c = confirm.confirm([1, 2, 3, 4, 5], 3, _judge(scorer), {}, lambda h: [h], None, together=3)
  assert selected == [1, 3, 4] and c.rejected_together == {2: (1, 3, 2)} and c.rejected == []
  assert scorer.sets == [[(1, 3), (1, 3, 2)], [(1, 3, 4)]]
  # Past the heads confirmed together, the order is the ranking's again, the heads turned away first; no more heads
  # are measured alone than the selection needs (2, turned away, comes back: one batch of 6, one spare).
  scorer = FakeScorer({**table, 6: [0.1, 0.0], 7: [0.1, 0.0], 8: [0.1, 0.0]})
  _patch(monkeypatch, scorer)
  selected, c = confirm.confirm([1, 2, 3, 4, 5, 6, 7, 8], 5, _judge(scorer), {}, lambda h: [h], None, together=3)
  assert selected == [1, 3, 4, 2, 5] and sorted(c.measured) == [1, 2, 3, 4, 5, 6]
  assert [k for k in c.consulted if len(k) == 1] == [(1,), (3,), (2,), (4,), (5,)]  # 6, measured, was never read


def test_speculation_follows_the_measured_order_and_stops_at_the_count(monkeypatch):
  # 10 and 11 always ablated together: both measured alone; the four taken by their target drop alone (1, 11, 2, 10),
  # and one batch holds the selection grown by each of them as if each joined.
  table = {1: [0.5, 0.0], 2: [0.4, 0.0], 3: [0.3, 0.0], 10: [0.2, 0.0], 11: [0.45, 0.0]}
  scorer = FakeScorer(table)
  _patch(monkeypatch, scorer)
  groups = {10: [10, 11], 11: [10, 11]}
  selected, c = confirm.confirm([1, 10, 2, 3], 4, _judge(scorer), {}, lambda h: groups.get(h, [h]), None, together=4)
  assert selected == [1, 11, 2, 10] and c.regrouped == [[11, 10]]
  assert scorer.sets == [[(1, 11), (1, 11, 2), (1, 11, 2, 10)]]  # one batch, every set the one needed
  scorer = FakeScorer(table)
  _patch(monkeypatch, scorer)
  selected, c = confirm.confirm([1, 2, 3], 2, _judge(scorer), {}, lambda h: [h], None, together=5)
  assert selected == [1, 2] and scorer.sets == [[(1, 2)]] and c.together == 2  # no set beyond the count
  one, c = confirm.confirm([1, 2, 3], 1, _judge(FakeScorer(table)), {}, lambda h: [h], None, together=5)
  assert one == [1] and c.together == 0 and "together" not in c.facts(str, ["t", "g"], 0.1)["rule"]


def test_an_aliased_group_is_ordered_by_measurement_and_members_without_effect_leave(monkeypatch):
  scorer = FakeScorer(TABLE)
  _patch(monkeypatch, scorer)
  groups = {6: [6, 4], 4: [6, 4]}  # identical columns: the ranking put 6 (no effect alone) first
  selected, c = confirm.confirm([6, 1, 5], 3, _judge(scorer), {}, lambda h: groups.get(h, [h]), None)
  assert c.regrouped == [[4, 6]] and selected == [4, 1, 5]


def test_measured_alone_reads_single_unit_masks():
  masks = np.zeros((3, 2, 2), bool)
  masks[0, 0, 1] = True  # head 1 alone
  masks[1, 1, :] = True  # two heads: not a single-head measurement
  masks[2, 1, 1] = True  # head 3 alone
  found = confirm.measured_alone(masks, [np.array([0.5, 0.1, 1.0]), np.array([2.0, 0.0, 1.0])], [1.0, 2.0])
  assert sorted(found) == [1, 3]
  np.testing.assert_allclose(found[1], [0.5, 0.0])
  np.testing.assert_allclose(found[3], [0.0, 0.5])


class TableMeasures:
  """`validate.Measures` over 1 layer of N heads: every task scores 1.0 unablated and 1 - drops[h][task] with head h
  ablated alone, the drops adding up over heads ablated together. Counts the heads of single-head masks it is asked,
  and the masks of several heads in `sets`."""

  def __init__(self, drops, names=("target", "general")):
    self.drops, self.names = np.asarray(drops, np.float64), list(names)
    self.num_layers, self.units_per_layer = 1, len(self.drops)
    self.asked, self.sets = [], []

  def means(self, keep):
    ablated = np.asarray(keep).reshape(len(keep), -1) < 0.5
    rows = []
    for row in ablated:
      heads = np.flatnonzero(row)
      if len(heads) > 1:
        self.sets.append(tuple(heads.tolist()))
      else:
        self.asked.extend(heads.tolist())
      rows.append(1.0 - self.drops[heads].sum(axis=0))
    return list(np.array(rows).T)


# Measured alone, per head (target, general): head 0 breaks the general task that its estimate says it spares.
MEASURED = [[0.6, 0.5], [0.5, 0.0], [0.4, 0.05], [0.3, 0.0], [0.2, 0.0], [0.1, 0.0]]


def _find(selection="specific", unit="heads", known_heads=(), **overrides):
  ranking = Ranking(np.arange(6), -np.array([0.6, 0.5, 0.4, 0.3, 0.2, 0.1]))  # the target's order is 0..5
  general = Ranking(np.arange(6), np.array([0.0, -0.5, 0.0, 0.0, 0.0, 0.0]))  # estimates: head 1 breaks it
  masks = np.zeros((len(known_heads), 1, 6), bool)
  masks[np.arange(len(known_heads)), 0, list(known_heads)] = True
  table = np.asarray(MEASURED)
  measured = [Measured(masks, {"accuracy": 1.0 - table[list(known_heads), t]}, {"accuracy": 1.0}, "accuracy")
              for t in range(2)]
  settings = LocalizeSettings.make(**{"task": "synthetic", "output_dir": "unused", "unit": unit, "top_k": 2,
                                      "curve_k": 2, "selection": selection, **overrides})
  scorer = TableMeasures(MEASURED)  # the identification documents (the held-out ones check universal candidates)
  found = confirm.find_heads(settings, ranking, [general], measured, np.zeros(6, bool), TableMeasures(MEASURED),
                             scorer, None)
  return found, scorer


def test_the_selection_is_what_measurement_confirms_not_what_the_estimates_say():
  estimated = selection.Specific(0.1).select(list(range(6)), specificity.Effects(["target", "general"], np.array(
      [[0.6, 0.5, 0.4, 0.3, 0.2, 0.1], [0.0, 0.5, 0.0, 0.0, 0.0, 0.0]])), np.zeros(6, bool), [], 2)
  assert estimated == [0, 2]  # what the estimates alone would call specific
  found, scorer = _find()
  assert found.selected == [1, 2] and found.confirmation.rejected == [0]
  assert found.confirmation_masks == len(found.confirmation.measured) + 1 == len(set(scorer.asked)) + 1 >= 4
  assert scorer.sets == [(1, 2)]  # the two reported heads, together
  assert found.confirmation.confirmed == 2 and found.confirmation.estimated == 0
  # Heads the method measured alone cost nothing more.
  reused, scorer = _find(known_heads=(0, 1))
  assert reused.selected == [1, 2] and sorted(reused.confirmation.reused) == [0, 1]
  assert not {0, 1} & set(scorer.asked) and reused.confirmation_masks == found.confirmation_masks - 2
  # Raw selection and runs without general tasks confirm nothing.
  raw, _ = _find(selection="raw")
  assert raw.selected == [0, 1] and raw.confirmation is None and raw.confirmation_masks == 0


def test_universal_heads_confirmed_alone_leave_the_selection_before_it_is_confirmed():
  found, _ = _find(universal_threshold=0.45)  # head 0 breaks both tasks by ≥ 45%, but its estimate says 0
  assert found.universal == [] and found.candidates == [1]  # head 1 is flagged, and spares the general task alone
  ranking = Ranking(np.arange(6), -np.array([0.6, 0.5, 0.4, 0.3, 0.2, 0.1]))
  general = Ranking(np.arange(6), np.array([-0.5, 0.0, 0.0, 0.0, 0.0, 0.0]))  # now they flag head 0
  measured = [Measured(np.zeros((0, 1, 6), bool), {"accuracy": np.zeros(0)}, {"accuracy": 1.0}, "accuracy")] * 2
  settings = LocalizeSettings.make(task="synthetic", output_dir="unused", top_k=2, curve_k=2,
                                   universal_threshold=0.45)
  scorer = TableMeasures(MEASURED)
  found = confirm.find_heads(settings, ranking, [general], measured, np.zeros(6, bool), scorer, scorer, None)
  assert found.universal == [0] and found.selected == [1, 2] and found.confirmation.rejected == []


def test_a_neuron_selection_is_confirmed_at_its_head_and_continues_with_the_estimates():
  found, _ = _find(unit="neurons", top_k=4, curve_k=1)
  assert found.selected[:1] == [1] and found.confirmation.confirmed == 1  # 0 rejected by measurement
  assert found.selected == [1, 2, 3, 4] and found.confirmation.estimated == 3


def test_a_method_that_measured_its_candidates_alone_adds_only_the_mask_of_them_together():
  # The default run's case: gradient_confirm ablated its best heads alone on every task's identification documents,
  # so the confirmed selection reads those measurements and ablates nothing more.
  found, scorer = _find(known_heads=tuple(range(6)))
  assert found.selected == [1, 2] and found.confirmation.rejected == [0]
  assert scorer.asked == [] and sorted(found.confirmation.reused) == [0, 1, 2]
  assert found.confirmation_masks == 1 and scorer.sets == [(1, 2)]  # only the reported heads together
