"""Eight devices give the scores one device gives (CPU devices forced by XLA_FLAGS, in a subprocess)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jaxloc.engine.engine import Engine
    from jaxloc.engine.mesh import make_mesh
    from jaxloc.engine.requests import GenerationRequest, ScoringRequest
    from jaxloc.models.loading import load_model
    from tests.tiny import make_tiny

    assert len(jax.devices()) == 8, jax.devices()
    model = make_tiny(load_model("smollm2-135m").tokenizer)
    requests = [ScoringRequest("One two three four five six seven: " + w, " " + w) for w in
                ["alpha", "beta", "gamma", "delta", "epsilon"]]
    rng = np.random.default_rng(0)
    masks = (rng.random((6, 3, 6)) > 0.3).astype(np.float32)
    out = {}
    for name, devices, model_parallel in [("one", jax.devices()[:1], 1), ("data8", jax.devices(), 1),
                                          ("data4_model2", jax.devices(), 2)]:
      engine = Engine(model, mesh=make_mesh(model_parallel, devices))
      scores = engine.score(requests, masks)
      prompts = ["Once upon", "One two three four five six seven eight nine ten eleven twelve thirteen fourteen "
                              "fifteen sixteen seventeen eighteen nineteen twenty"]
      texts = engine.generate([GenerationRequest(p, max_new_tokens=5) for p in prompts], masks[:3])  # two widths
      out[name] = {"logprob": scores.logprob.tolist(), "greedy": scores.is_greedy.tolist(), "texts": texts,
                   "masks_per_call": engine.masks_per_call(requests)}
    print("RESULT" + json.dumps(out))
""")


@pytest.mark.heavy
def test_eight_devices_equal_one():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.split("RESULT", 1)[1])
  one = result["one"]
  for name in ("data8", "data4_model2"):
    assert np.abs(np.array(result[name]["logprob"]) - np.array(one["logprob"])).max() < 1e-4
    assert result[name]["greedy"] == one["greedy"]
    assert result[name]["texts"] == one["texts"]
  assert result["data8"]["masks_per_call"] % 8 == 0 or result["data8"]["masks_per_call"] < 8
