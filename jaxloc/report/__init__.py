"""Reports of finished runs: plots, the self-contained report page, summaries and comparisons across runs, read from
the run files (the output contract), never from a model."""
