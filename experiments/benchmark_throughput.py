"""Mask-evaluation throughput: jaxloc vs PyTorch (reference style and best effort), plus generation.

    python -m experiments.benchmark_throughput --output_json=benchmark_throughput.json

Writes the JSON and prints a table. Run it on a quiet machine: every figure is from this one run.
"""

import json

from absl import flags

from jaxloc import cli
from jaxloc.bench import throughput
from jaxloc.engine.engine import Engine

flags.DEFINE_integer("num_requests", 100, "Requests of the 4-shot 2-digit addition task.", lower_bound=1)
flags.DEFINE_integer("jax_masks", 32, "Masks jaxloc evaluates (after a warm-up batch).", lower_bound=1)
flags.DEFINE_integer("reference_masks", 2, "Masks for the reload-per-mask PyTorch baseline.", lower_bound=1)
flags.DEFINE_integer("best_effort_masks", 3, "Masks for the best-effort PyTorch baseline.", lower_bound=1)
flags.DEFINE_integer("ablated_per_mask", 27, "Random heads ablated in each mask.", lower_bound=0)
flags.DEFINE_integer("generation_tokens", 64, "New tokens per sequence in the generation benchmark.",
                     lower_bound=1)
flags.DEFINE_integer("generation_prompts", 16, "Prompts (batch size) in the generation benchmark.", lower_bound=1)
flags.DEFINE_bool("skip_torch", False, "Skip the PyTorch baselines (e.g. on accelerators without torch).")
flags.DEFINE_bool("compare_unshared", True, "Also time jaxloc without prefix sharing.")
flags.DEFINE_integer("default_masks", 300, "Stratified masks of the default workload (plurals).", lower_bound=1)
flags.DEFINE_integer("workload_generation_masks", 16, "Single-head masks of the generation workload.", lower_bound=1)
flags.DEFINE_integer("workload_generation_prompts", 8, "HumanEval prompts of the generation workload (its batch).",
                     lower_bound=1)
flags.DEFINE_integer("workload_generation_tokens", 32, "New tokens per row in the generation workload.", lower_bound=1)
flags.DEFINE_bool("only_workloads", False, "Run only the workloads (default, one-shot greedy, generation).")
flags.DEFINE_string("output_json", "benchmark_throughput.json", "Where to write the figures.")
cli.define_model_flags()
FLAGS = flags.FLAGS


def main(argv):
  del argv
  engine = cli.engine_from_flags()
  unshared = None
  if FLAGS.compare_unshared and not FLAGS.only_workloads:
    unshared = Engine(engine.model, mesh=engine.mesh, memory_budget_bytes=engine.memory_budget,
                      tokens_per_batch=engine.tokens_per_batch, share_prefix=False)
  cfg = throughput.ThroughputConfig(
      model=FLAGS.model, num_requests=FLAGS.num_requests, jax_masks=FLAGS.jax_masks,
      reference_masks=FLAGS.reference_masks, best_effort_masks=FLAGS.best_effort_masks,
      ablated_per_mask=FLAGS.ablated_per_mask, generation_batch=FLAGS.generation_prompts,
      generation_tokens=FLAGS.generation_tokens, skip_torch=FLAGS.skip_torch, default_masks=FLAGS.default_masks,
      generation_prompts_workload=FLAGS.workload_generation_prompts, generation_masks=FLAGS.workload_generation_masks,
      generation_new_tokens=FLAGS.workload_generation_tokens, only_workloads=FLAGS.only_workloads)
  report = throughput.run(engine, cfg, unshared)
  print(throughput.format_table(report))
  with open(FLAGS.output_json, "w") as f:
    json.dump(report, f, indent=2, default=float)


if __name__ == "__main__":
  cli.run(main)
