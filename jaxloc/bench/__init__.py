"""Benchmarks: the figures `experiments.benchmark_*` print (throughput, memory, efficiency of the methods, generation,
patching, the sandbox), each measured against a baseline in the same run."""
