"""CNL's enhancement experiment: fine-tune only the located neurons of a neurons run, against as many random neurons.

    python -m experiments.finetune_neurons --neurons_run=runs/smollm2_arithmetic_cnl --steps=30 \
        --learning_rate=1e-5 --output_json=runs/arithmetic_finetune.json

See `jaxloc.main.finetune_neurons`.
"""

from jaxloc.main.finetune_neurons import console

if __name__ == "__main__":
  console()
