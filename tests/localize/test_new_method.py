"""A new method is exactly one new file: a module dropped into the methods package (here: a directory added to the
package's path, so the checkout is left alone) is discovered, its flags are derived from its name, and it runs through
the protocol on its own example options. Nothing else is edited: no import list, no test table."""

import sys
import textwrap

import numpy as np
import pytest
from absl import flags

from jaxloc import cli
from jaxloc.localize import methods
from jaxloc.localize.settings import LocalizeSettings
from tests.localize import helpers
from tests.localize.test_methods import EFFECTS, H, L, metrics

NEW_METHOD = '''
"""`random_order`: a seeded random order of the heads, its first --num_masks ablated alone."""

import dataclasses
import types

import numpy as np

from jaxloc.config import setting
from jaxloc.localize.methods.base import Method, confirmation_plan


@dataclasses.dataclass
class RandomOrderSettings:
  salt: int = setting(0, "Mixed with --seed into the random order.", lower=0, measured=True)
  spread: float = setting(1.0, "Unused; a float setting, held to the number rule.", lower=0.0)


@dataclasses.dataclass(frozen=True)
class RandomOrder(Method):
  name: str = "random_order"
  units = ("heads", "neurons")
  settings_class = RandomOrderSettings
  run_settings = types.MappingProxyType({"num_masks": "heads of a random order ablated alone"})
  example_options = types.MappingProxyType({"num_masks": 12, "random_order_salt": 1})

  def plan(self, settings, context):
    order = np.random.default_rng([settings.seed, settings.method_settings.salt]).permutation(context.num_total)
    return confirmation_plan(order, settings.num_masks, context, {"screen": "a seeded random order"})


METHODS = (RandomOrder(),)
'''


@pytest.fixture()
def one_new_file(tmp_path):
  (tmp_path / "random_order.py").write_text(textwrap.dedent(NEW_METHOD))
  methods.__path__.append(str(tmp_path))
  try:
    yield methods.discover([str(tmp_path)])
  finally:
    methods.__path__.remove(str(tmp_path))
    if "random_order" in methods.names():  # not when discovering failed: its error is the one to see
      methods.unregister("random_order")
    sys.modules.pop("jaxloc.localize.methods.random_order", None)


def test_a_method_is_one_new_file(one_new_file, tmp_path):
  from jaxloc.main.localize import LocalizeConfig

  assert one_new_file == ["random_order"] and "random_order" in methods.names()
  method = methods.get("random_order")
  # Its flags: the prefix derived from its name; flags, keywords and the number rule come with them.
  assert method.flag_prefix == "random_order_"
  assert list(method.flag_fields()) == ["random_order_salt", "random_order_spread"]
  flag_values = flags.FlagValues()
  cli.define_flags(LocalizeConfig, skip=("model",), flag_values=flag_values)
  flag_values(["localize", "--task=counting", f"--output_dir={tmp_path}", "--method=random_order",
               "--random_order_salt=3"])
  config = cli.settings_from_flags(LocalizeConfig, flag_values)
  assert config.settings.method_object is method and config.settings.flags()["random_order_salt"] == 3
  assert "random_order" in flag_values["method"].parser.enum_values
  with pytest.raises(flags.IllegalFlagValueError, match="nan is not a finite number"):
    flag_values.random_order_spread = float("nan")  # absl validates an assignment as it does a parse
  # The protocol on its own example options: measures, ranks the planted head first among those it measured.
  settings = helpers.settings("random_order", **method.example_options)
  settings.check()
  assert method.measurement_settings(settings) == {"num_masks": 12, "random_order_salt": 1}
  plan = method.plan(settings, helpers.context(L, H))
  measured = helpers.drive(plan, metrics(), L, H)
  assert len(measured) == 12 and plan.rank(measured).order[0] == int(np.argmin(EFFECTS))
  # It declares no `listing_order`: listed after the methods that do.
  assert methods.names()[-1] == "random_order"
  assert LocalizeSettings.make(task="counting", output_dir="x", method="random_order").method_settings.salt == 0
