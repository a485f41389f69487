"""Two runs compared: overlaps, rank correlation, the scores of the masks both measured."""

import numpy as np

from jaxloc.api import Run
from jaxloc.report import agreement


def _run(directory, order, coefficients, masks, scores, drop, dtype):
  heads = [{"name": f"L0H{h}"} for h in order]
  info = {"heads": heads, "top_k": [h["name"] for h in heads[:2]], "baseline": 1.0, "engine": {"dtype": dtype},
          "timing": {"seconds_per_mask": 0.5}}
  scores = np.asarray(scores, float)
  return Run(directory, info, {"held_out": {"task_relative_drop": drop}}, np.asarray(coefficients, float),
             np.asarray(masks, bool), scores, 1.0, {"logprob": -10 * scores})


def test_agreement_counts_what_two_runs_share():
  masks = np.eye(4, dtype=bool)[:, None, :]
  a = _run("a", [0, 1, 2, 3], [[-3, -2, -1, 0]], masks, [0.1, 0.2, 0.3, 0.4], 0.5, "float32")
  # b ranks heads 1 and 0 first (swapped), measured masks 2 and 3 and one a did not.
  other = np.concatenate([masks[2:], np.ones((1, 1, 4), bool)])
  b = _run("b", [1, 0, 3, 2], [[-2, -3, 0, -0.5]], other, [0.35, 0.4, 0.9], 0.4, "bfloat16")
  result = agreement.agreement(a, b, ks=(1, 2, 3))
  assert result["top_k_overlap"] == {"1": 0, "2": 2, "3": 2}
  assert result["selection_overlap"] == 2 and result["dtypes"] == ["float32", "bfloat16"]
  assert result["common_masks"] == 2 and np.isclose(result["max_score_difference"], 0.05)
  assert result["metric_difference"].keys() == {"logprob"}
  assert np.allclose(list(result["metric_difference"]["logprob"].values()), [0.25, 0.5])
  assert np.isclose(result["coefficient_spearman"], 0.6) and result["max_coefficient_difference"] == 1.0
  table = agreement.markdown(result)
  assert "| top-2 overlap | 2 of 2 |" in table and "| float32 | bfloat16 |" in table and "50.0%" in table
