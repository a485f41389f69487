"""Every bad input tried on the commands, run as a user runs them: what the user sees, the exit status, and whether
it comes before the model loads. Most end in one `error:` line and exit status 2; an input the run can go on with
ends in a warning line and exit status 0, and Ctrl-C in one line and exit status 130. `test_reliability.py` runs
each case; this module also writes the table of docs/reliability.md from the same runs:

    python -m tests.experiments.reliability docs/reliability.md

A case runs `python -m experiments.<command>` on a tiny random Llama saved as an HF directory (`tests.tiny`) and a
12-line custom task. Whether the model loaded is read from the log line `engine_flags.load_engine` writes once it has.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A plain log line, or absl's format (with --verbosity): level, date, time, thread, file:line.
LOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ")
LOADED = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] )?loaded .* \(\d+ layers x \d+ heads\) in ", re.M)
# Small and fast: 4 masks on the target and one general task, no validation or bootstrap.
LOCALIZE = ("--model={model}", "--task={task}", "--output_dir={out}", "--cache_dir=none", "--metric=logprob",
            "--num_samples=8", "--num_masks=4", "--general_tasks=counting", "--general_samples=4", "--validate=false",
            "--bootstrap=0", "--tokens_per_batch=64", "--progress=false")
EVALUATE = ("--model={model}", "--task={task}", "--cache_dir=none", "--progress=false")
CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"), ("Japan", "Tokyo"),
            ("Egypt", "Cairo"), ("Peru", "Lima"), ("Kenya", "Nairobi"), ("Norway", "Oslo"), ("Greece", "Athens"),
            ("Cuba", "Havana"), ("Chile", "Santiago")]


@dataclasses.dataclass
class Context:
  """What a case runs against: `tmp` is its own directory; `out` its --output_dir (tmp/run); `base_run` a finished
  float32 run of LOCALIZE over `task`, copied into `out` by cases that resume it."""

  tmp: str
  model: str
  task: str
  base_run: str | None = None
  helpers: list = dataclasses.field(default_factory=list)  # processes a case started, ended after it

  @property
  def out(self) -> str:
    return os.path.join(self.tmp, "run")

  def fill(self, text: str) -> str:
    return text.format(model=self.model, task=self.task, out=self.out, tmp=self.tmp, python=sys.executable)


@dataclasses.dataclass(frozen=True)
class Case:
  """A bad input: `tried` says it in words; the command's flags (`args`, formatted by `Context.fill`) after its
  usual ones; `message` is part of the one line the user must see (an `error:` line, the last, with exit status 2;
  a warning line with `exit` 0; the `interrupted:` line, the last, with `exit` 130); `before_load` whether it must
  come before the model loads. `setup` prepares the context; `mount` runs the command in a user and mount namespace
  where `tmp`/disk is a tmpfs (options such as "ro" or "size=96k"); `check` (a shell command run after the command,
  in the same namespace) must succeed; `interrupt` (a store's path) sends the command SIGINT, as Ctrl-C does, once
  that store holds a measured mask."""

  name: str
  tried: str
  command: str
  args: tuple[str, ...]
  message: str
  before_load: bool
  setup: Callable[[Context], None] | None = None
  env: tuple[tuple[str, str], ...] = ()
  mount: str | None = None
  check: str | None = None
  resumes_base_run: bool = False
  exit: int = 2
  interrupt: str | None = None


def _copy_base_run(ctx: Context) -> None:
  shutil.copytree(ctx.base_run, ctx.out)


def _file(ctx: Context) -> None:
  with open(ctx.out, "w") as f:
    f.write("not a directory\n")


def _truncated_gradient(ctx: Context) -> None:
  import numpy as np

  os.makedirs(ctx.out)
  path = os.path.join(ctx.out, "gradient.npy")
  np.save(path, np.arange(12, dtype=np.float64))
  os.truncate(path, 100)  # the header and a few of the values


def _truncated_measurements(ctx: Context) -> None:
  _copy_base_run(ctx)
  path = os.path.join(ctx.out, "measurements.npz")
  os.truncate(path, os.path.getsize(path) // 2)


def _truncated_gguf(ctx: Context) -> None:
  from jaxloc.models.loading import SMOLLM2_ALIAS, resolve

  with open(resolve(SMOLLM2_ALIAS)[1], "rb") as source, open(os.path.join(ctx.tmp, "model.gguf"), "wb") as target:
    target.write(source.read(3_000_000))


def _edited_task(ctx: Context) -> None:
  """A finished run over a task file, then every target in the file edited."""
  task = os.path.join(ctx.tmp, "capitals.jsonl")
  shutil.copy(ctx.task, task)
  ctx.task = task
  done = run_command("localize", [ctx.fill(a) for a in LOCALIZE])
  assert done.returncode == 0, done.stderr[-3000:]
  write_task(task, [(country, city.upper()) for country, city in CAPITALS])


def _long_prompt(ctx: Context) -> None:
  """A task file of 8 documents (every one is measured), one of them a 5 MB prompt."""
  task = os.path.join(ctx.tmp, "long.jsonl")
  write_task(task, CAPITALS[:7])
  with open(task, "a") as f:
    long_prompt = ("The capital of France is Paris. " * 160_000)[:5_000_000] + "The capital of Italy is"
    f.write(json.dumps({"prompt": long_prompt, "target": " Rome"}) + "\n")
  ctx.task = task


def _copy_npz_only(ctx: Context) -> None:
  """Only the finished run's .npz files in a new directory: no run.json beside its stores."""
  for root, _, names in os.walk(ctx.base_run):
    for name in names:
      if name.endswith(".npz"):
        target = os.path.join(ctx.out, os.path.relpath(os.path.join(root, name), ctx.base_run))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy(os.path.join(root, name), target)


def _legacy_store_alone(ctx: Context) -> None:
  """The run's measurements.npz as saved before stores carried their settings, without its run.json."""
  import numpy as np

  os.makedirs(ctx.out)
  with np.load(os.path.join(ctx.base_run, "measurements.npz")) as saved:
    arrays = {k: saved[k] for k in saved.files if k not in ("run_settings", "settings_digest")}
  np.savez(os.path.join(ctx.out, "measurements.npz"), **arrays)


def _confirmation_alone(ctx: Context) -> None:
  """The run's confirmation.npz alone in a new directory."""
  os.makedirs(ctx.out)
  shutil.copy(os.path.join(ctx.base_run, "confirmation.npz"), ctx.out)


def _held(ctx: Context) -> None:
  """Another process holds the directory, as a run does while it runs."""
  holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom jaxloc import files\n"
                             "with files.hold_run_directory(sys.argv[1]):\n  print('held', flush=True)\n"
                             "  time.sleep(600)\n", ctx.out], cwd=ROOT, env=_env(), stdout=subprocess.PIPE, text=True)
  ctx.helpers.append(holder)
  assert holder.stdout.readline().strip() == "held"


CASES = [
    Case("output_dir_file", "`--output_dir` is an existing file", "localize", (), "is a file, not a directory",
         True, setup=_file),
    Case("output_dir_under_file", "`--output_dir` below an existing file", "localize",
         ("--output_dir={tmp}/run/inside",), "cannot be created (a parent of it is a file)", True, setup=_file),
    Case("output_dir_read_only", "`--output_dir` on a read-only file system (EROFS)", "localize",
         ("--output_dir={tmp}/disk",), "is not writable (Read-only file system)", True, mount="ro"),
    Case("output_dir_in_use", "a second run into a directory a run holds", "localize", (),
         "is in use by another run (pid ", True, setup=_held),
    Case("disk_full", "the disk fills up while the run writes (a 32 KiB file system)", "localize",
         ("--output_dir={tmp}/disk/run",), "the disk is full: writing ", False, mount="size=32k",
         check="{python} -c 'import numpy, sys; numpy.load(sys.argv[1])[\"masks\"]' {tmp}/disk/run/measurements.npz"),
    Case("disk_full_plot", "a full disk while writing a plot (ENOSPC injected at heatmap.png)", "localize", (),
         "the disk is full: writing {out}/heatmap.png failed (No space left on device); the measurements saved so far",
         False, env=(("JAXLOC_FAULT", "write:heatmap.png@1=enospc"),),
         check="{python} -c 'import numpy, sys; assert len(numpy.load(sys.argv[1])[\"masks\"]) == 4' "
               "{out}/measurements.npz"),
    Case("num_masks_huge", "`--num_masks=1000000000`", "localize", ("--num_masks=1000000000",),
         "--num_masks=1,000,000,000 would need about", True),
    Case("top_k_too_many", "`--top_k=1000` (the model has 12 heads)", "localize", ("--top_k=1000",),
         "--top_k=1000 is more than the 12 heads there are to select (3 layers × 4): give at most 12", True),
    Case("exclude_heads_out_of_range", "`--exclude_heads=L99H0`", "localize", ("--exclude_heads=L99H0",),
         "head L99H0 is out of range: this model has layers 0-2 and query heads 0-3", True),
    Case("truncated_gradient", "a truncated `gradient.npy` in the run directory", "localize",
         ("--method=gradient_confirm",), "{out}/gradient.npy is truncated or corrupt", False,
         setup=_truncated_gradient),
    Case("truncated_measurements", "a truncated `measurements.npz`", "localize", (),
         "{out}/measurements.npz is truncated or corrupt", True, setup=_truncated_measurements,
         resumes_base_run=True),
    Case("resume_dtype", "a float32 run resumed with `--dtype=bfloat16`", "localize", ("--dtype=bfloat16",),
         "--dtype: saved 'float32', now 'bfloat16'", True, setup=_copy_base_run, resumes_base_run=True),
    Case("resume_activation_dtype", "a float32 run resumed with `--activation_dtype=bfloat16`", "localize",
         ("--activation_dtype=bfloat16",), "(--activation_dtype: saved 'float32', now 'bfloat16'; "
         "--float32_matmuls: saved 'highest', now None)", True,
         setup=_copy_base_run, resumes_base_run=True),
    Case("resume_share_prefix", "a run resumed with `--noshare_prefix`", "localize", ("--noshare_prefix",),
         "--share_prefix: saved True, now False", True, setup=_copy_base_run, resumes_base_run=True),
    Case("resume_ablation", "a run resumed with `--ablation=mean`", "localize", ("--ablation=mean",),
         "--ablation: saved 'zero', now 'mean'", True, setup=_copy_base_run, resumes_base_run=True),
    Case("resume_general_samples", "a run resumed with another `--general_samples`", "localize",
         ("--general_samples=6",), "--general_samples: saved 4, now 6", True, setup=_copy_base_run,
         resumes_base_run=True),
    Case("resume_edited_task", "a run resumed after its task file was edited", "localize", (),
         "(the identification documents of {task} (digest): saved ", True, setup=_edited_task),
    Case("truncated_gguf", "a truncated `.gguf` model file", "localize", ("--model={tmp}/model.gguf",),
         "{tmp}/model.gguf is truncated: it has 3,000,000 bytes, its tensors need 98,362,432", True,
         setup=_truncated_gguf),
    Case("evaluate_heads_out_of_range", "`--heads=L99H0`", "evaluate", ("--heads=L99H0",),
         "head L99H0 is out of range: this model has layers 0-2 and query heads 0-3", True),
    Case("evaluate_neurons_out_of_range", "`--neurons=L0N99999`", "evaluate", ("--neurons=L0N99999",),
         "neuron L0N99999 is out of range: this model has layers 0-2 and MLP neurons 0-47", True),
    Case("evaluate_output_json_directory", "`--output_json` is a directory", "evaluate",
         ("--heads=L0H1", "--output_json={tmp}"), "--output_json={tmp} is a directory: give a file path", True),
    Case("evaluate_output_json_read_only", "`--output_json` on a read-only file system", "evaluate",
         ("--heads=L0H1", "--output_json={tmp}/disk/result.json"), "cannot be written (Read-only file system)", True,
         mount="ro"),
    # NaN and inf pass no bound; the config layer's one rule refuses them in every number setting as flags parse.
    Case("specific_max_general_drop_nan", "`--specific_max_general_drop=nan`", "localize",
         ("--specific_max_general_drop=nan",), "nan is not a finite number: give a finite number in [0, 1]", True),
    Case("memory_budget_gb_inf", "`--memory_budget_gb=inf`", "localize", ("--memory_budget_gb=inf",),
         "inf is not a finite number: give a finite number ≥ 0.01", True),
    Case("lasso_alpha_nan", "`--lasso_alpha=nan`", "localize", ("--lasso_alpha=nan",),
         "nan is not a finite number: give 'cv' or a finite number ≥ 0", True),
    Case("ablation_rate_nan", "`--ablation_rate=nan`", "localize", ("--ablation_rate=nan",),
         "nan is not a finite number: give a finite number in [1e-06, 0.999999]", True),
    # A seed is bounded like any integer setting (`jaxloc.config.SEED`).
    Case("seed_negative", "`--seed=-1`", "localize", ("--seed=-1",),
         "flag --seed=-1: -1 is not an integer in the range [0, 4294967295]", True),
    Case("seed_too_large", "`--seed=4294967296` (a JAX key keeps 32 bits: it would be seed 0 again)", "localize",
         ("--seed=4294967296",), "flag --seed=4294967296: 4294967296 is not an integer in the range [0, 4294967295]",
         True),
    # Found by tests/experiments/test_input_property.py, once refused only after the model loaded.
    Case("ablation_rate_under_one_head", "`--ablation_rate=0.05` (less than one of the 12 heads per mask)", "localize",
         ("--ablation_rate=0.05",), "ablation_rate=0.05 ablates fewer than one head per mask on average among 12 heads",
         True),
    # Ctrl-C: one line, exit status 130.
    Case("interrupted", "Ctrl-C (SIGINT) while the run measures", "localize",
         ("--method=cs_bernoulli", "--num_masks=2000", "--tokens_per_batch=64"),
         "masks saved in {out}/measurements.npz", False, exit=130, interrupt="{out}/measurements.npz"),
    # Inputs the run goes on with, taken as the warning says.
    Case("general_task_is_target", "the target among `--general_tasks`", "localize",
         ("--general_tasks=counting,{task}",),
         "--general_tasks includes the target, {task}: it is left out of the general tasks", True, exit=0),
    Case("flag_twice", "a flag given twice with different values", "localize", ("--num_masks=6",),
         "--num_masks is given 2 times with different values: --num_masks=4 (on the command line), --num_masks=6 (on "
         "the command line); the run uses the last, --num_masks=6", True, exit=0),
    Case("long_prompt", "a 5 MB prompt (the model has 2,048 positions)", "localize", (),
         "1 of 8 requests are longer than the model's 2,048 positions: each keeps only the end of its context", False,
         exit=0, setup=_long_prompt),
    # A store carries its settings: whatever files are missing, it is never extended under others.
    Case("resume_npz_only", "a run's `.npz` files alone (no `run.json`) resumed with other settings", "localize",
         ("--dtype=bfloat16", "--ablation=mean", "--num_masks=8"), "(--ablation: saved 'zero', now 'mean'; "
         "--activation_dtype: saved 'float32', now 'bfloat16'; --dtype: saved 'float32', now 'bfloat16'", True,
         setup=_copy_npz_only, resumes_base_run=True),
    Case("resume_old_store_alone", "a `measurements.npz` saved before stores carried their settings, without its "
         "`run.json`", "localize", (), "{out}/measurements.npz was saved before stores carried their settings, and the "
         "run.json that records them is not beside it", True, setup=_legacy_store_alone, resumes_base_run=True),
    Case("confirmation_other_settings", "a `confirmation.npz` measured with other settings", "localize",
         ("--ablation=mean",), "{out}/confirmation.npz was measured with other settings", True,
         setup=_confirmation_alone, resumes_base_run=True),
    Case("evaluate_output_json_in_run", "`--output_json` into a run directory (its `heads.json`)", "evaluate",
         ("--heads=L0H1", "--output_json={out}/heads.json"), "--output_json={out}/heads.json is inside the run "
         "directory {out} (it holds run.json), which only the command that holds it writes", True,
         setup=_copy_base_run, resumes_base_run=True),
]


@dataclasses.dataclass
class Outcome:
  case: Case
  returncode: int
  stderr: str
  line: str  # the line the user must see: the last, or with exit status 0 the warning (without absl's log prefix)
  loaded: bool  # the model loaded before that line
  checked: bool  # the case's check passed (True when it has none)

  @property
  def error_lines(self) -> list[str]:
    return [line for line in self.stderr.splitlines() if line.startswith("error:")]

  @property
  def last_line(self) -> str:
    lines = [line for line in self.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def write_task(path: str, rows) -> str:
  with open(path, "w") as f:
    for country, city in rows:
      f.write(json.dumps({"prompt": f"The capital of {country} is", "target": f" {city}"}) + "\n")
  return path


def _env(**extra: str) -> dict[str, str]:
  return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", JAX_PLATFORMS="cpu", **extra)


def run_command(command: str, args: list[str], env: dict[str, str] | None = None, prefix: list[str] = (),
                timeout: int = 600) -> subprocess.CompletedProcess:
  return subprocess.run([*prefix, sys.executable, "-m", f"experiments.{command}", *args], cwd=ROOT,
                        env=env or _env(), capture_output=True, text=True, timeout=timeout)


def namespaces_work() -> bool:
  """Whether this host lets a process mount a tmpfs in its own user and mount namespace."""
  try:
    return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs none /mnt"], capture_output=True,
                          timeout=30).returncode == 0
  except (OSError, subprocess.TimeoutExpired):
    return False


def interrupt_command(command: str, args: list[str], env: dict[str, str], store: str,
                      timeout: int = 120) -> subprocess.CompletedProcess:
  """Runs the command and sends it SIGINT, as Ctrl-C in a terminal does, once `store` holds a measured mask."""
  import numpy as np

  # SIGINT as a terminal delivers it to its foreground command, even where these tests run in the background: a shell
  # starts a background command with SIGINT ignored, and a child inherits an ignored signal (the run would never see
  # it), where a handled one starts at its default. So this process handles SIGINT while it starts the run.
  ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  if ignored:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    proc = subprocess.Popen([sys.executable, "-m", f"experiments.{command}", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  finally:
    if ignored:
      signal.signal(signal.SIGINT, signal.SIG_IGN)
  deadline = time.monotonic() + timeout
  while proc.poll() is None and time.monotonic() < deadline:
    try:
      with np.load(store) as saved:  # written atomically: whole or absent
        if len(saved["masks"]):
          break
    except (OSError, KeyError):
      pass
    time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  try:
    stdout, stderr = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:  # a run that ignores Ctrl-C fails the case, not the whole suite's budget
    proc.kill()
    stdout, stderr = proc.communicate()
  return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def shown_line(stderr: str, returncode: int, message: str) -> tuple[str, bool]:
  """The line a case shows (the last; with exit status 0 the first holding `message`, without absl's log prefix),
  and whether the model loaded before it."""
  lines = [line for line in stderr.splitlines() if line.strip()]
  at = len(lines) - 1
  if returncode == 0:
    at = next((i for i, line in enumerate(lines) if message in line), -1)
  if at < 0:
    return "", any(LOADED.search(line) for line in lines)
  return LOG_PREFIX.sub("", lines[at]), any(LOADED.search(line) for line in lines[:at])


def run_case(case: Case, ctx: Context) -> Outcome:
  if case.setup is not None:
    case.setup(ctx)
  args = [ctx.fill(a) for a in (LOCALIZE if case.command == "localize" else EVALUATE) + case.args]
  env = _env(**dict(case.env))
  try:
    if case.interrupt is not None:
      proc = interrupt_command(case.command, args, env, ctx.fill(case.interrupt))
      checked = True
    elif case.mount is None:
      proc = run_command(case.command, args, env)
      checked = case.check is None or subprocess.run(ctx.fill(case.check), shell=True, cwd=ROOT,
                                                     env=env).returncode == 0
    else:
      disk = os.path.join(ctx.tmp, "disk")
      os.makedirs(disk)
      # The command, then the check (exit 99 when it fails), inside one namespace: the tmpfs ends with it.
      script = (f'mount -t tmpfs -o {case.mount} none "$0" || exit 98; "$@"; status=$?; '
                f'{ctx.fill(case.check) if case.check else "true"} || exit 99; exit $status')
      proc = run_command(case.command, args, env, prefix=["unshare", "-rm", "sh", "-c", script, disk])
      checked = proc.returncode not in (98, 99)
  finally:
    for helper in ctx.helpers:
      helper.kill()
      helper.wait()
  return Outcome(case, proc.returncode, proc.stderr, *shown_line(proc.stderr, proc.returncode, ctx.fill(case.message)),
                 checked)


def make_base_run(tmp: str, model: str, task: str) -> str:
  """A finished float32 run of LOCALIZE that resume cases copy."""
  ctx = Context(tmp, model, task)
  done = run_command("localize", [ctx.fill(a) for a in LOCALIZE])
  assert done.returncode == 0, done.stderr[-3000:]
  return ctx.out


def command_shown(case: Case) -> str:
  """The case's command as the table shows it: its flags after the usual ones, paths as placeholders."""
  return " ".join([case.command, *case.args]).format(tmp="<tmp>", out="<tmp>/run", task="<task>")


def table(outcomes: list[Outcome], replacements: dict[str, str]) -> str:
  """The markdown table of the outcomes, paths and pids replaced by placeholders."""

  def shown(text: str) -> str:
    for old, new in sorted(replacements.items(), key=lambda kv: -len(kv[0])):
      text = text.replace(old, new)
    text = re.sub(r"pid \d+ on \S+\)", "pid <pid> on <host>)", text)
    return text.replace("|", "\\|")

  rows = ["| Bad input | Command (after the usual flags) | What the user sees (the one line on stderr; a warning "
          "without its log prefix) | Exit | Before the model loads |", "|---|---|---|---|---|"]
  for o in outcomes:
    rows.append(f"| {o.case.tried} | `{shown(command_shown(o.case))}` | `{shown(o.line)}` | {o.returncode} | "
                f"{'no' if o.loaded else 'yes'} |")
  return "\n".join(rows) + "\n"


def main(argv: list[str]) -> None:
  """Runs every case (those needing namespaces only where they work) and writes the table into the file argv[1]
  between its <!-- cases --> markers."""
  from jaxloc.models.loading import SMOLLM2_ALIAS, load_tokenizer, resolve
  from tests.tiny import save_tiny_hf

  path = argv[1]
  with tempfile.TemporaryDirectory() as root:
    model = save_tiny_hf(load_tokenizer(*resolve(SMOLLM2_ALIAS)), os.path.join(root, "model"))
    task = write_task(os.path.join(root, "capitals.jsonl"), CAPITALS)
    base = make_base_run(os.path.join(root, "base"), model, task)
    outcomes, mounts = [], namespaces_work()
    for case in CASES:
      if case.mount and not mounts:
        print(f"skipped {case.name}: no user namespaces here", file=sys.stderr)
        continue
      tmp = os.path.join(root, case.name)
      os.makedirs(tmp)
      outcome = run_case(case, Context(tmp, model, task, base))
      print(f"{case.name}: exit {outcome.returncode}, loaded {outcome.loaded}: {outcome.line}", file=sys.stderr)
      outcomes.append(outcome)
    rendered = table(outcomes, {os.path.join(root, c.name): "<tmp>" for c in CASES}
                     | {model: "<model>", task: "<task>", socket.gethostname(): "<host>"})
  with open(path) as f:
    text = f.read()
  start, end = text.index("<!-- cases -->\n") + len("<!-- cases -->\n"), text.index("<!-- /cases -->")
  with open(path, "w") as f:
    f.write(text[:start] + rendered + text[end:])


if __name__ == "__main__":
  main(sys.argv)
