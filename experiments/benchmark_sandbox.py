"""Sandbox overhead per generated program, by isolation mode (the file view against the modes before it).

    python -m experiments.benchmark_sandbox --output_json=benchmark_sandbox.json
"""

from absl import flags

from jaxloc import cli
from jaxloc.bench import sandbox_overhead
from jaxloc.errors import UserError
from jaxloc.files import write_json
from jaxloc.tasks import sandbox

flags.DEFINE_integer("programs", 200, "Trivial programs per mode.", lower_bound=1)
flags.DEFINE_list("modes", ["namespaces", "namespaces_host_visible", "uid_only", "none"],
                  "Isolation modes to compare (see jaxloc/tasks/sandbox.py).")
flags.DEFINE_string("output_json", None, "Where to write the figures.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  unknown = [m for m in FLAGS.modes if m not in sandbox.MODES]
  if unknown:
    raise UserError(f"unknown --modes {unknown}; valid: {', '.join(sandbox.MODES)}")
  rows = sandbox_overhead.measure(FLAGS.modes, FLAGS.programs)
  print(f"isolation mode probed on this machine: {sandbox.isolation_mode()}")
  print(sandbox_overhead.format_table(rows))
  if FLAGS.output_json:
    write_json(FLAGS.output_json, {"isolation_mode": sandbox.isolation_mode(), "rows": rows})


if __name__ == "__main__":
  cli.run(main)
