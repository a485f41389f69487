"""Check jaxloc against lm-eval's own evaluation of an lm-eval task: unablated, and with --heads ablated.

    python -m experiments.compare_lm_eval --task=lm_eval:experiments/configs/lm_eval/irregular_past.yaml \
        --heads=L1H5,L8H1 --num_samples=40 --output_json=/tmp/compare.json

lm-eval runs the task with its HF backend (transformers on the CPU, heads hooked on o_proj); jaxloc evaluates both
head sets as one batch. Prints every metric from both, the largest per-request log-likelihood difference (scored
tasks) or the share of identical generations (generation tasks). Needs pip install -e '.[test,lm-eval]'.
"""

from jaxloc.main.compare_lm_eval import console

if __name__ == "__main__":
  console()
