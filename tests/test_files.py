"""`files.write_json`'s layout: the same JSON `json.dumps` writes, one key of an object a line and one object of a list
of objects a line (a run's head, whole, on one line: greppable and diffable)."""

import json
import math

import numpy as np

from jaxloc import files


def test_write_json_keeps_the_content_and_puts_each_record_on_one_line(tmp_path):
  payload = {"model": "m", "heads": [{"name": "L0H1", "score": np.float32(-1.5), "drops": {"plurals": 0.25}},
                                     {"name": "L2H3", "score": np.int64(2), "drops": {}}],
             "coefficients": np.arange(3, dtype=np.float32), 7: None, True: [[0.1, 0.2]], "empty": [], "none": {},
             "interval": [float("nan"), 1.0]}
  path = str(tmp_path / "heads.json")
  files.write_json(path, payload)
  text = open(path).read()
  assert text.endswith("}\n")
  assert json.dumps(json.loads(text)) == json.dumps(payload, default=files._jsonable)
  lines = text.splitlines()
  assert '    {"name": "L0H1", "score": -1.5, "drops": {"plurals": 0.25}},' in lines
  assert '  "coefficients": [0.0, 1.0, 2.0],' in lines and '  "7": null,' in lines and '  "true": [[0.1, 0.2]],' in lines
  assert math.isnan(json.loads(text)["interval"][0])
  assert files.json_text([]) == "[]" and files.json_text({}) == "{}" and files.json_text("s") == '"s"'
