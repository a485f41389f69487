"""Entry points: one module per command, each a dataclass config (its fields are the command's flags) and a
`main(config)` that calls the library. `python -m experiments.<name>` and the `jaxloc-<name>` console scripts run
them; flagfiles and their docs live in `experiments/`. `engine_flags` is no command: it loads the model of those
that load one (apart from `jaxloc.cli`, which must not import JAX)."""
