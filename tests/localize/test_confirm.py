"""Confirmed selection: candidates in ranking order are measured alone until enough pass; measurements the method
already made are reused; aliased groups are resolved by measurement; a resumed run measures nothing again."""

import numpy as np

from jaxloc.localize import confirm


class FakeScorer:
  """Relative drops per head (target, general) from a table; counts the heads it was asked to measure."""

  def __init__(self, table):
    self.table, self.asked = table, []


def _patch(monkeypatch, scorer):
  def single_head_drops(heads, s):
    s.asked.extend(heads)
    return np.array([s.table[h] for h in heads], np.float64)

  monkeypatch.setattr(confirm.validate, "single_head_drops", single_head_drops)


def passes(drops):
  return bool(np.all(drops[1:] <= 0.1))


TABLE = {0: [0.5, 0.5], 1: [0.4, 0.0], 2: [0.3, 0.05], 3: [0.2, 0.3], 4: [0.1, 0.0], 5: [0.05, 0.0], 6: [0.0, 0.0],
         7: [0.01, 0.0]}


def test_candidates_are_measured_until_enough_pass(monkeypatch, tmp_path):
  scorer = FakeScorer(TABLE)
  _patch(monkeypatch, scorer)
  known = {1: np.array([0.4, 0.0])}  # the method measured head 1 alone already
  selected, c = confirm.confirm([0, 1, 2, 3, 4, 5, 6, 7], 3, passes, known, scorer, lambda h: [h], str(tmp_path))
  assert selected == [1, 2, 4] and c.rejected == [0, 3] and c.reused == [1]
  assert 1 not in scorer.asked and set(c.measured) == set(scorer.asked) and len(c.measured) >= 4
  # A resumed run reads the saved confirmations and measures nothing again.
  again = FakeScorer(TABLE)
  _patch(monkeypatch, again)
  assert confirm.confirm([0, 1, 2, 3, 4, 5, 6, 7], 3, passes, known, again, lambda h: [h], str(tmp_path))[0] == [1, 2, 4]
  assert again.asked == []


def test_an_aliased_group_is_ordered_by_measurement_and_members_without_effect_leave(monkeypatch):
  scorer = FakeScorer(TABLE)
  _patch(monkeypatch, scorer)
  groups = {6: [6, 4], 4: [6, 4]}  # identical columns: the ranking put 6 (no effect alone) first
  selected, c = confirm.confirm([6, 1, 5], 3, passes, {}, scorer, lambda h: groups.get(h, [h]), None)
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
