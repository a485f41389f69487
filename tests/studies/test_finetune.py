"""Fine-tuning chosen neurons moves only their parameters and raises the trained log-probability."""

import dataclasses

import jax
import numpy as np
import pytest

from jaxloc.engine.engine import Engine
from jaxloc.studies import finetune
from tests.engine.test_scoring import few_shot_requests
from tests.tiny import make_tiny


@pytest.mark.heavy  # over 3.5 s on a quiet 2-core machine
def test_only_the_neurons_parameters_move_and_the_loss_falls(tokenizer):
  engine = Engine(make_tiny(tokenizer))
  requests = few_shot_requests(6, seed=7)
  neurons = [(0, 5), (2, 63)]
  trained = finetune.finetune(engine, requests, neurons, steps=5, learning_rate=1e-2)
  assert trained.losses[-1] < trained.losses[0]
  d = engine.model_config.hidden_size
  assert trained.trained_parameters == len(neurons) * 3 * d
  before, after = engine.params, trained.params
  moved = jax.tree_util.tree_map(lambda a, b: np.asarray(a != b), before, after)
  mlp = moved["layers"]["mlp"]
  assert mlp["gate_kernel"][0, :, 5].all() and mlp["up_kernel"][2, :, 63].all() and mlp["down_kernel"][0, 5].all()
  total = sum(int(m.sum()) for m in jax.tree_util.tree_leaves(moved))
  assert total == trained.trained_parameters  # nothing else changed, not one bit
  # The trained model scores the training requests higher.
  tuned = Engine(dataclasses.replace(engine.model, params=after), engine.config)
  ones = np.ones((1, engine.model_config.num_layers, engine.model_config.num_heads), np.float32)
  assert tuned.score(requests, ones).logprob.mean() > engine.score(requests, ones).logprob.mean()
