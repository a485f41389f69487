"""Many masks in one `Model.score` call against one call per mask, on the tiny model (`tests/tiny.py`): equal to
float32 rounding by default, and bit for bit with `exact=True` (`Scorer.score_batches`)."""

import numpy as np
import pytest

import jaxloc
from jaxloc.api.model import Model

PROMPTS = ["The plural of mouse is", "When Mary and John went to the store, John gave a drink to"]
ANSWERS = [" mice", " Mary"]
# Default mode: the last call of a few masks may run a smaller compiled size, whose kernels round differently.
TOLERANCE = 1e-4

pytestmark = pytest.mark.heavy  # the tiny model compiled for three call sizes (~30 s on 2 busy cores)


def test_eight_masks_in_one_call_equal_eight_single_calls(tiny_model):
  model = Model(tiny_model)
  masks = jaxloc.masks.random(model, 8, 0.25, seed=3)
  together = model.score(PROMPTS, ANSWERS, masks)
  one_by_one = np.concatenate([model.score(PROMPTS, ANSWERS, masks[i]) for i in range(len(masks))])
  assert together.shape == (8, 2) and np.ptp(together[:, 0]) > 1e-3  # the masks matter
  assert np.abs(together - one_by_one).max() <= TOLERANCE * max(1.0, float(np.abs(together).max()))
  exact = model.score(PROMPTS, ANSWERS, masks, exact=True)
  exact_one_by_one = np.concatenate([model.score(PROMPTS, ANSWERS, masks[i], exact=True) for i in range(len(masks))])
  assert np.array_equal(exact, exact_one_by_one)
  assert np.abs(exact - together).max() <= TOLERANCE * max(1.0, float(np.abs(together).max()))
