"""Evaluate a task with a fixed set of heads or MLP neurons ablated (or, with --curve, each prefix of a ranking).

    python -m experiments.evaluate --model=smollm2-135m --task=plurals --heads=L3H1,L10H4 \
        --num_samples=100 --output_json=/tmp/plurals.json
    python -m experiments.evaluate --model=smollm2-135m --task=plurals --neurons=L3N117,L20N5 --num_samples=100
"""

from jaxloc.main.evaluate import console

if __name__ == "__main__":
  console()
