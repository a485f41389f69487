"""`jaxloc.models.provenance.describe` never raises (a run records it before measuring): a file it cannot parse or
read is "unknown", a tensor type gguf does not name is its number; a file is hashed once per process."""

import struct

import numpy as np

from jaxloc.models import packaged, provenance


def _gguf(path, tensor_type: int) -> None:
  """A GGUF header with no metadata and one 1-D tensor of `tensor_type`."""
  name = b"t"
  with open(path, "wb") as f:
    f.write(packaged.GGUF_MAGIC + struct.pack("<IQQ", 3, 1, 0))
    f.write(struct.pack("<Q", len(name)) + name + struct.pack("<IQIQ", 1, 4, tensor_type, 0))


def test_an_unknown_tensor_type_is_its_number(tmp_path):
  path = tmp_path / "m.gguf"
  _gguf(path, 9999)
  facts = provenance.describe("m", str(path), np.float32)
  assert facts["format"] == "GGUF" and facts["tensor_types"] == {"9999": 1} and len(facts["sha256"]) == 64


def test_a_file_it_cannot_parse_or_that_is_no_gguf_is_unknown(tmp_path):
  broken = tmp_path / "m.gguf"
  broken.write_bytes(packaged.GGUF_MAGIC + b"\xff" * 40)
  assert provenance.describe("m", str(broken), np.float32)["quantization"] == "unknown"
  other = tmp_path / "weights.bin"
  other.write_bytes(b"weights")
  facts = provenance.describe("m", str(other), np.float32)
  assert facts["format"] == "unknown" and facts["file"] == "weights.bin" and len(facts["sha256"]) == 64


def test_a_file_is_hashed_once_per_process(tmp_path, monkeypatch):
  path = tmp_path / "w.safetensors"
  path.write_bytes(b"weights")
  first = provenance.sha256(str(path))
  def read_again(*args, **kwargs):
    raise AssertionError("read again")

  monkeypatch.setattr(provenance, "open", read_again, raising=False)
  assert provenance.sha256(str(path)) == first
  facts = provenance.describe("m", str(tmp_path), np.float32)
  assert facts["files"] == ["w.safetensors"]
