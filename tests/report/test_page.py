"""The report page: self-contained, and in a real headless browser (chromium) it loads with no console error, shows
the top units, and a click on a unit shows its numbers."""

import os
import re
import shutil

import numpy as np
import pytest

from jaxloc.errors import UserError
from jaxloc.report.page import write_page
from tests.experiments.conftest import ROOT


@pytest.fixture
def default_run(tmp_path):
  run = tmp_path / "default_run"
  shutil.copytree(os.path.join(ROOT, "docs", "default_run"), run)
  return str(run)


def test_the_page_is_one_self_contained_file(default_run):
  page = open(write_page(default_run)).read()
  assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)  # nothing to fetch
  assert "fetch(" not in page and "XMLHttpRequest" not in page
  assert '"top_k": ["L8H1", "L20H5"' in page.replace("\\/", "/")


def test_a_directory_without_a_run_is_a_user_error(tmp_path):
  with pytest.raises(UserError, match="no heads.json or neurons.json"):
    write_page(str(tmp_path))


def test_the_default_run_page_in_a_real_browser(default_run, tmp_path):
  import json

  from matplotlib.image import imread

  from tests.report.browser import Browser

  path = write_page(default_run)
  heads = {h["name"]: h for h in json.load(open(os.path.join(default_run, "heads.json")))["heads"]}
  browser = Browser()
  try:
    browser.open(path)
    assert browser.evaluate("document.querySelectorAll('#heatmap rect.cell').length") == 270
    assert browser.evaluate("document.getElementById('top-units').textContent").endswith(
        "L8H1L20H5L12H8L1H6L12H5")
    browser.click('#heatmap rect[data-unit="L20H5"]')  # selected
    details = browser.evaluate("document.getElementById('details').innerText")
    h = heads["L20H5"]
    assert details.startswith("L20H5") and f"value {h['score']:.3f}" in details
    assert "selected: #2 of the top-5" in details
    assert f"selected in {100 * h['selection_frequency']:.1f}% of bootstrap resamples" in details
    for task, drop in h["held_out_single_head_drop"].items():
      assert re.search(rf"{task}\s.*{100 * drop:.1f}%", details), (task, details)
    assert browser.evaluate("document.querySelectorAll('#specificity-curve polyline').length") >= 2
    # Never measured (gradient_confirm ablated 60 of 270 heads alone): hatched, and no value.
    unmeasured = [n for n, u in heads.items() if all(v is None for v in u["estimated_relative_drop"].values())]
    assert len(unmeasured) == 210
    assert browser.evaluate("document.querySelectorAll('#heatmap rect.cell.unmeasured').length") == 210
    assert browser.evaluate("document.querySelector('#heatmap rect[data-unit=\"L0H0\"]').getAttribute('fill')") == (
        "url(#unmeasured)")
    browser.click('#heatmap rect[data-unit="L0H0"]')
    details = browser.evaluate("document.getElementById('details').innerText")
    assert details.startswith("L0H0") and "not measured" in details
    assert not re.search(r"value -?\d|interval|0\.000", details), details
    # Rejected by the confirmation: its reason, rounded.
    browser.click('#heatmap rect[data-unit="L14H1"]')
    details = browser.evaluate("document.getElementById('details').innerText")
    assert "rejected: ablated alone on the identification documents it drops arithmetic_1d_4shot 57%" in details
    browser.click('#heatmap rect[data-unit="L1H5"]')
    assert "universal: ablated alone (held-out) it drops plurals 88%" in browser.evaluate(
        "document.getElementById('details').innerText")
    # A colour legend and axis titles; the head table as CSV.
    assert browser.evaluate("document.querySelectorAll('#legend rect').length") > 10
    assert browser.evaluate("[...document.querySelectorAll('#heatmap .axis-title')].map(t => t.textContent)") == [
        "head", "layer"]
    csv = browser.evaluate("fetch(document.getElementById('download-csv').href).then(r => r.text())", wait=True)
    lines = csv.splitlines()
    assert lines[0].startswith("name,layer,head,measured,value") and len(lines) == 271
    assert next(line for line in lines if line.startswith("L0H0,")).startswith("L0H0,0,0,false,,")
    assert browser.evaluate("document.getElementById('examples')") is None  # the committed run predates examples
    browser.screenshot(str(tmp_path / "report.png"))
    image = imread(str(tmp_path / "report.png"))
    assert image.shape[0] > 600 and image.shape[1] > 800
    assert len(np.unique(image.reshape(-1, image.shape[-1])[::97], axis=0)) > 20  # a drawn page, not a blank one
    assert browser.errors == []
  finally:
    browser.close()


def test_a_neuron_run_page_in_a_real_browser(tmp_path):
  from tests.report.browser import Browser

  run = tmp_path / "neurons"
  shutil.copytree(os.path.join(ROOT, "docs", "units", "smollm2_plurals_cnl"), run)
  browser = Browser()
  try:
    browser.open(write_page(str(run)))
    assert browser.evaluate("document.querySelectorAll('#layers rect.bar').length") == 30
    second = browser.evaluate("document.querySelectorAll('tr.clickable')[1].dataset.unit")
    browser.click(f'tr.clickable[data-unit="{second}"]')
    assert browser.evaluate("document.getElementById('details').innerText").startswith(second)
    assert browser.errors == []
  finally:
    browser.close()


def test_a_runs_examples_show_on_its_page(default_run):
  """examples.json (jaxloc.localize.examples) as the page shows it: per task, the prompt, target and both outputs."""
  import json

  from tests.report.browser import Browser

  record = {"k": 5, "heads": ["L8H1", "L20H5", "L12H8", "L12H5", "L3H7"], "per_task": 1, "max_new_tokens": 12,
            "tasks": {"plurals": {"metric": "accuracy", "examples": [
                {"prompt": "dog: dogs\nmouse:", "prompt_truncated": False, "target": " mice", "unablated": " mice",
                 "ablated": " mouses", "unablated_score": 1.0, "ablated_score": 0.0}]}}}
  with open(os.path.join(default_run, "examples.json"), "w") as f:
    json.dump(record, f)
  browser = Browser()
  try:
    browser.open(write_page(default_run))
    text = browser.evaluate("document.getElementById('examples').innerText")
    assert "L8H1, L20H5, L12H8, L12H5, L3H7 together" in text
    row = browser.evaluate("[...document.querySelectorAll('#examples tr')[1].cells].map(c => c.textContent)")
    assert row == ["dog: dogs\nmouse:", " mice", " mice", " mouses", "1.00 → 0.00"], row
    assert browser.errors == []
  finally:
    browser.close()


def test_a_runs_decisions_show_on_its_page(default_run):
  """The confirmation's decisions (`decisions.Judge.record`) and each general task's power to veto, as the page shows
  them: the summary's power lines, and a row per decision with every general task's drop, interval and verdict."""
  import json

  from jaxloc.localize import decisions
  from jaxloc.report.page import page_data
  from tests.report.browser import Browser

  path = os.path.join(default_run, "heads.json")
  heads = json.load(open(path))
  power = decisions.plan_power("counting", 0.97, 100, 800, 0.1, 0.05, 0.8).facts()
  heads["general_tasks"]["counting"]["power"] = power
  heads["confirmation"]["decision_rule"] = {"rule": "interval", "threshold": 0.1, "confidence": 0.95,
                                            "text": "the interval decides", "intervals": True}
  heads["confirmation"]["extra_documents"] = 140
  tasks = {"plurals": {"drop": 0.5, "interval": [0.4, 0.6], "docs": 100},
           "counting": {"drop": 0.12, "interval": [0.05, 0.19], "docs": 240, "verdict": "veto", "straddles": True},
           "induction": {"drop": 0.02, "interval": [-0.03, 0.07], "docs": 100, "verdict": "pass", "straddles": False}}
  heads["confirmation"]["decisions"] = [{"units": ["L8H1"], "together": False, "passed": False, "confidence": 0.7,
                                         "tasks": tasks}]
  json.dump(heads, open(path, "w"))
  # counting's power as set here, the other tasks' as the committed run recorded them, in the run's task order
  assert page_data(default_run)["power_lines"] == [decisions.describe_power(name, task["power"])
                                                   for name, task in heads["general_tasks"].items()]
  assert page_data(default_run)["power_lines"][0] == decisions.describe_power("counting", power)
  browser = Browser()
  try:
    browser.open(write_page(default_run))
    text = browser.evaluate("document.getElementById('decisions').innerText")
    assert "rule (interval): the interval decides" in text and "power to veto: counting: 100 documents" in text
    assert "140 more general-task documents" in text
    row = browser.evaluate("[...document.querySelectorAll('#decisions tr')[1].cells].map(c => c.textContent)")
    assert row == ["L8H1 alone", "vetoed", "70.0%", "12.0% [5.0%, 19.0%] on 240 (vetoes)",
                   "2.0% [-3.0%, 7.0%] on 100"], row
    assert browser.errors == []
  finally:
    browser.close()
