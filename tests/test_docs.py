"""The documentation holds together: every relative link and image in README.md, BUILD.md and docs/*.md resolves
(anchors included, by GitHub's heading slugs; a plot or page that `python -m experiments.report --all` draws counts),
every command in their code blocks names only flags its command defines, the README's printed summary is what the
code prints for the committed default run, and git holds docs/'s inputs, not what is drawn from them (under 2 MB)."""

import functools
import glob
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = sorted(["README.md", "BUILD.md"] + [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))])
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
COMMAND = re.compile(r"python -m (experiments\.\w+)((?:[ \t]+(?:\\\n)?[ \t]*[^\s#|`]+)*)")
# What git may hold under docs/: prose and the inputs plots are drawn from (issue 43: 13 MB, 12.4 of it drawn).
DOCS_BYTES = 2_000_000


def _read(page: str) -> str:
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    return f.read()


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: str) -> set[str]:
  text = re.sub(r"```.*?```", "", _read(page), flags=re.S)
  return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def _code(text: str) -> str:
  """The page's code: fenced blocks and 4-space indented lines."""
  fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
  indented = re.findall(r"(?:^    .*\n?)+", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.M)
  return "\n".join(fenced + indented)


@functools.lru_cache(maxsize=None)
def _drawn() -> frozenset[str]:
  """The files (relative to the root) `python -m experiments.report --all` draws from docs/'s committed inputs."""
  from jaxloc.report import regenerate

  return frozenset(os.path.relpath(p, ROOT) for p in regenerate.outputs(os.path.join(ROOT, "docs")))


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_and_image_resolves(page):
  broken = []
  for target in LINK.findall(re.sub(r"```.*?```", "", _read(page), flags=re.S)):
    if re.match(r"[a-z]+:", target):
      continue
    path, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
    if not os.path.exists(os.path.join(ROOT, resolved)) and resolved not in _drawn():
      broken.append(f"{target} (no {resolved})")
    elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
      broken.append(f"{target} (no heading #{anchor} in {resolved})")
  assert not broken, f"{page}: " + "; ".join(broken)


@functools.lru_cache(maxsize=None)
def _defined_flags(module: str) -> frozenset[str]:
  """The flags `python -m <module> --helpfull` lists (absl prints each as --name or --[no]name)."""
  out = subprocess.run([sys.executable, "-m", module, "--helpfull"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
  names = re.findall(r"^\s+--(?:\[no\])?([\w.-]+):", out.stdout, flags=re.M)
  assert names, f"{module} --helpfull listed no flags: {out.stderr[-500:]}"
  return frozenset(names)


def _commands() -> list[tuple[str, str, str]]:
  found = []
  for page in PAGES:
    for module, args in COMMAND.findall(_code(_read(page))):
      found.append((page, module, args))
  return found


@pytest.mark.heavy
def test_every_command_names_flags_that_exist():
  commands = _commands()
  assert any(module == "experiments.localize" for _, module, _ in commands)
  unknown = []
  for page, module, args in commands:
    if not os.path.exists(os.path.join(ROOT, *module.split(".")) + ".py"):
      unknown.append(f"{page}: no command {module}")
      continue
    defined = _defined_flags(module) | {"flagfile", "helpfull", "help"}
    for name in re.findall(r"(?:^|\s)--([\w.-]+)", args):
      if name not in defined and not (name.startswith("no") and name[2:] in defined):
        unknown.append(f"{page}: {module} has no flag --{name}")
  assert not unknown, "\n".join(unknown)


def test_the_readmes_summary_is_what_the_default_run_prints():
  from jaxloc.report.summary import summary_table

  block = re.search(r"<!-- default-run-summary[^>]*-->\n```text\n(.*?)```", _read("README.md"), flags=re.S)
  assert block, "README.md has no marked default-run summary"
  run = os.path.join(ROOT, "docs", "default_run")
  with open(os.path.join(run, "heads.json")) as f, open(os.path.join(run, "ablation.json")) as g:
    printed = summary_table(json.load(f), json.load(g))
  assert block.group(1).strip("\n") == printed.strip("\n")


def _git(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
  out = subprocess.run(["git", *args], cwd=ROOT, input=stdin, capture_output=True, text=True)
  if out.returncode not in (0, 1):  # 1: git check-ignore matched nothing
    pytest.skip(f"not a git checkout: {out.stderr.strip()}")
  return out


def test_git_holds_docs_under_2_mb():
  """What a commit of docs/ holds (tracked files, and new ones not ignored), as a fresh clone checks it out."""
  listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", "docs").stdout.split("\0")
  present = [p for p in set(listed) if p and os.path.isfile(os.path.join(ROOT, p))]  # a deletion not yet staged: gone
  sizes = {p: os.path.getsize(os.path.join(ROOT, p)) for p in present}
  largest = ", ".join(f"{p} {n:,}" for p, n in sorted(sizes.items(), key=lambda item: -item[1])[:5])
  assert sum(sizes.values()) < DOCS_BYTES, (f"docs/ in git is {sum(sizes.values()):,} bytes (limit {DOCS_BYTES:,}); "
                                            f"largest: {largest}")


def test_git_keeps_none_of_what_the_regeneration_draws():
  """docs/.gitignore names every file `experiments.report --all` writes, and none of them is tracked, so redrawing
  leaves `git status` clean."""
  drawn = sorted(_drawn())
  assert any(p.endswith(".png") for p in drawn) and any(p.endswith(".html") for p in drawn)
  ignored = set(_git("check-ignore", "--no-index", "--stdin", stdin="\n".join(drawn)).stdout.split("\n"))
  assert set(drawn) <= ignored, f"not in docs/.gitignore: {sorted(set(drawn) - ignored)}"
  tracked = set(_git("ls-files", "--cached", "docs").stdout.split("\n"))
  assert not tracked & set(drawn), f"tracked though drawn: {sorted(tracked & set(drawn))}"
