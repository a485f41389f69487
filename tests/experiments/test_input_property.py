"""Generated inputs to `experiments.localize` (settings valid and not: NaN, inf, negatives, huge integers, unknown
tasks and metrics; task files valid, malformed or empty), each run as a user runs the command: it finishes (exit
status 0, its heads.json written), or ends in one `error:` line, the last on stderr, with exit status 2 and no
traceback, before the model loads wherever the input alone decides (all but `MODEL_DECIDED`).

The command runs in this process (`cli.run` is absl's app.run, which parses the flags again on each run), so an
example costs milliseconds when it is refused and a few seconds when it runs on the tiny model; whether the model
loaded is whether `engine_flags.load_engine` was called.
"""

import json
import math
import os
import sys
import tempfile

import pytest
from absl import flags
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from jaxloc.main import engine_flags, localize
from tests.experiments.reliability import CAPITALS

pytestmark = pytest.mark.heavy  # a few whole runs on the tiny model

# Flags that keep a run small (no bootstrap, a few documents, small batches), and the metric a random model can
# localize (it never gets a target right: accuracy is "nothing to localize"); a drawn flag comes after, so it wins.
FIXED = ("--cache_dir=none", "--metric=logprob", "--num_samples=4", "--general_samples=4", "--bootstrap=0",
         "--tokens_per_batch=64", "--progress=false", "--curve_k=3", "--universal_candidates=2")


def _line(row) -> str:
  country, city = row
  return json.dumps({"prompt": f"The capital of {country} is", "target": f" {city}"})


GOOD_LINE = st.sampled_from(CAPITALS).map(_line)
BAD_LINE = st.sampled_from([
    "not json", "[1, 2]", '{"prompt": 1, "target": " Paris"}', '{"prompt": "The capital of Peru is"}',
    '{"prompt": "The capital of Peru is", "target": ""}', '{"prompt": "x", "target": " y", "extra": 1}',
    '{"prompt": "x", "choices": [" a"], "label": 0}', '{"prompt": "x", "choices": [" a", " b"], "label": 2}',
    '{"prompt": "x", "target": " y", "id": 1.5}', "{"])
BAD_FLOATS = [math.nan, math.inf, -math.inf, -0.5, 1.5, 1e308]
# Refusals that need the model's own scores (an unablated baseline of zero: nothing to localize), so after it loads.
MODEL_DECIDED = ("nothing to localize",)


def _valid_or(valid, invalid):
  """A flag's text: omitted (None), a valid value, or with `bad` an invalid one."""
  def draw(bad: bool):
    options = [st.none(), valid.map(str)] + ([invalid.map(str)] if bad else [])
    return st.one_of(*options)
  return draw


FLAGS_DRAWN = {
    "seed": _valid_or(st.integers(0, 2**32 - 1), st.one_of(st.integers(-2**40, -1), st.integers(2**32, 2**80))),
    "num_masks": _valid_or(st.integers(2, 12), st.one_of(st.integers(-3, 0), st.integers(10**12, 10**18))),
    "num_samples": _valid_or(st.integers(2, 4), st.one_of(st.integers(-2, 0), st.integers(7, 10**6))),
    "top_k": _valid_or(st.integers(1, 12), st.one_of(st.integers(13, 10**9), st.integers(-2, 0))),
    "ablation_rate": _valid_or(st.floats(0.1, 0.5), st.sampled_from(BAD_FLOATS + [0.05])),  # 0.05: < 1 of 12 heads
    "universal_threshold": _valid_or(st.floats(0.05, 1.0), st.sampled_from(BAD_FLOATS)),
    "specific_max_general_drop": _valid_or(st.floats(0.0, 1.0), st.sampled_from(BAD_FLOATS)),
    # accuracy is valid, but the tiny random model never gets a target right: "nothing to localize" (MODEL_DECIDED)
    "metric": _valid_or(st.just("logprob"), st.sampled_from(["bleu", "acc_norm", "accuracy"])),
    "selection": _valid_or(st.sampled_from(["raw", "specific"]), st.just("best")),
    "general_tasks": _valid_or(st.sampled_from(["", "{task}", "counting"]),
                               st.sampled_from(["nope", "counting,nope", "lm_eval:nope"])),
    "task": _valid_or(st.just("{task}"), st.sampled_from(["nope", "{tmp}/missing.jsonl", "{tmp}"])),
}


@st.composite
def inputs(draw):
  """(task file lines, flags): with `bad` drawn false every value is valid and there are documents enough (the run
  must finish); with true any value may be invalid, and a flag may be given twice."""
  bad = draw(st.booleans())
  lines = draw(st.lists(st.one_of(GOOD_LINE, BAD_LINE) if bad else GOOD_LINE, min_size=0 if bad else 6,
                        max_size=10))
  args = [f"--{name}={text}" for name, strategy in FLAGS_DRAWN.items()
          if (text := draw(strategy(bad))) is not None]
  if bad and args and draw(st.booleans()):
    args.append(draw(st.sampled_from(args)).split("=")[0] + "=" + draw(st.sampled_from(["3", "nan", "raw", ""])))
  validate = not bad and draw(st.booleans())
  return lines, args + (["--validate", "--validation_samples=2"] if validate else ["--novalidate"])


@pytest.fixture(scope="module")
def localize_flags():
  if "task" not in flags.FLAGS:  # experiments.localize's flags, once per process (tests/experiments/test_configs.py)
    localize.define_flags()
  yield
  flags.FLAGS.unparse_flags()


def _run(argv: list[str]) -> int:
  """The command's exit status, run in this process as `python -m experiments.localize` runs it."""
  flags.FLAGS.unparse_flags()
  before = sys.argv
  sys.argv = argv
  try:
    localize.run_command()
  except SystemExit as e:
    return 0 if e.code is None else e.code
  finally:
    sys.argv = before
  return 0


@settings(max_examples=10, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(example=inputs())
def test_every_input_finishes_or_is_one_line_before_the_model_loads(example, localize_flags, tiny_model_dir, capfd,
                                                                    monkeypatch):
  lines, args = example
  loads = []
  load_engine = engine_flags.load_engine
  with monkeypatch.context() as patch, tempfile.TemporaryDirectory() as tmp:
    patch.setattr(engine_flags, "load_engine", lambda *a, **k: loads.append(a) or load_engine(*a, **k))
    task = os.path.join(tmp, "task.jsonl")
    with open(task, "w") as f:
      f.write("".join(line + "\n" for line in lines))
    out = os.path.join(tmp, "run")
    argv = ["localize", f"--model={tiny_model_dir}", f"--output_dir={out}", f"--task={task}", *FIXED,
            *(a.format(task=task, tmp=tmp) for a in args)]
    capfd.readouterr()
    status = _run(argv)
    stderr = capfd.readouterr().err
    finished = os.path.isfile(os.path.join(out, "heads.json"))
  event(f"exit status {status}" + (" (model loaded)" if loads else ""))
  lines_out = [line for line in stderr.splitlines() if line.strip()]
  errors = [line for line in lines_out if line.startswith("error:")]
  assert "Traceback" not in stderr, (argv, stderr[-3000:])
  if status == 0:
    assert finished and not errors, (argv, stderr[-3000:])
  else:
    assert status == 2 and errors == lines_out[-1:], (argv, status, stderr[-3000:])
    if not any(words in errors[0] for words in MODEL_DECIDED):
      assert not loads, (argv, errors)  # the input alone decides: refused before the model loads
