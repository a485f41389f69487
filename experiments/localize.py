"""Find the attention heads (or, with --unit=neurons, the MLP neurons) that carry a capability.

    python -m experiments.localize --flagfile=experiments/configs/smollm2_default.flags
    python -m experiments.localize --flagfile=experiments/configs/smollm2_plurals_cnl.flags  # neurons, CNL

Every flag: `python -m experiments.localize --helpfull`; the command is `jaxloc.main.localize`.
"""

from jaxloc.main.localize import console

if __name__ == "__main__":
  console()
