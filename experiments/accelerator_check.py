"""The accelerator kit, one step per call (see jaxloc/main/accelerator_check.py and BUILD.md's GPU checklist).

    python -m experiments.accelerator_check --steps=device,parity --tokenizer=.kit/tokenizer --output_dir=$OUT
    python -m experiments.accelerator_check --small --output_dir=/tmp/kit  # the CPU variant
"""

from jaxloc.main.accelerator_check import console

if __name__ == "__main__":
  console()
