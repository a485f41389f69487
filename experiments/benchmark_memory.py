"""The batch planner's memory estimate against XLA's accounting, and the batches it picks on accelerators.

    python -m experiments.benchmark_memory --output_json=benchmark_memory.json

For every preset shape (`random:<preset>`) and task shape (the embedded tasks' real request sets under the
SmolLM2 tokenizer, plus two long synthetic shapes), the engine's plan is made twice: with the CPU defaults (2048
tokens per call, 8 GiB) and as on an 80 GB GPU (65536 tokens per call, the default budget of a 75% `bytes_limit`
less the bfloat16 parameters). Each planned call is compiled with abstract parameters (nothing is allocated) and
XLA's `memory_analysis()` is compared with the planner's estimate (`jaxloc.bench.memory`; on a CPU the larger of
the graph XLA:CPU runs and the graph without its library fusions, which holds what an accelerator holds). Compiled
on this backend in float32: XLA's CPU backend upcasts bfloat16 matmuls to float32 (copying the weights), which
would not describe an accelerator. Then the batches an 80 GB GPU and a 16 GiB TPU core get, per preset and task. `--parts=generation,decode_cost`
compares the generator's layouts with XLA likewise and counts a decode step's bytes against its floor
(`jaxloc/main/benchmark_memory.py`).
"""

from jaxloc.main.benchmark_memory import console

if __name__ == "__main__":
  console()
