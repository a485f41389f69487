"""Export the edited model: a Hugging Face checkpoint with a run's heads (or neurons) ablated in its weights.

    python -m experiments.export --run_dir=docs/default_run --output=/tmp/smollm2_edited
    python -m experiments.export --model=smollm2-135m --heads=L8H1,L20H5 --output=/tmp/smollm2_edited
"""

from jaxloc.main.export import console

if __name__ == "__main__":
  console()
