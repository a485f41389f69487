"""How far two finished localization runs agree (e.g. --dtype=bfloat16 against float32, or two seeds).

    python -m experiments.compare_runs --runs=runs/smollm2_default,runs/smollm2_default_bf16 \
        --output_json=runs/bf16_vs_f32.json

Prints a table: top-5/top-10 overlap of the rankings, the overlap of the selections, the Spearman rank
correlation and largest difference of the coefficients, the largest score difference over the masks both runs
measured, the baselines and the held-out drops. No model is loaded.
"""

from jaxloc.main.compare_runs import console

if __name__ == "__main__":
  console()
