"""Heads against neurons at equal budgets, for a model and task: is the capability in a few attention heads (the
compressed-sensing paper) or in MLP neurons (CNL)?

    python -m experiments.compare_units --heads_run=runs/plurals_heads --neurons_run=runs/plurals_cnl \
        --head_counts=1,3,5,10 --output_dir=runs/plurals_units

Ablates the heads run's top k heads against the neurons run's top k × head_dim neurons (the same number of zeroed
parameters: a head's o_proj slice against neurons' down_proj columns), and random heads and neurons of the same
budgets, on the held-out documents of the target and the general tasks (as the heads run drew them). Writes
compare_units.json and compare_units.png and prints the table.
"""

from jaxloc.main.compare_units import console

if __name__ == "__main__":
  console()
