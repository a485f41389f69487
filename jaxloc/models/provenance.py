"""Where a run's weights came from, recorded in its run file (`heads.json`/`neurons.json` "model_provenance") and
shown on its report page: the file format, its quantization and what jaxloc computed in, the package or path it came
from, and the SHA-256 of the file(s).

The packaged models are quantized GGUF files (SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-0.5B-Instruct and Gemma 3
270M Q4_K_M) that jaxloc dequantizes to the engine's dtype (float32 on CPU): their logits are those of the
dequantized weights, not of the original bfloat16 checkpoints.
"""

from __future__ import annotations

import collections
import hashlib
import importlib.metadata
import os
import struct
from typing import Any

import numpy as np

from jaxloc.models import packaged


UNKNOWN = "unknown"  # what the run file says of a fact that could not be read

# (absolute path, size, mtime) -> hex SHA-256: a file is hashed once per process, however many runs read it.
_HASHED: dict[tuple[str, int, int], str] = {}


def sha256(path: str) -> str:
  """The hex SHA-256 of a file (16 MB at a time), remembered for the process by (path, size, mtime): a second run
  on the same unchanged weights does not read them again."""
  stat = os.stat(path)
  key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
  if key not in _HASHED:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
      while block := f.read(16 << 20):
        digest.update(block)
    _HASHED[key] = digest.hexdigest()
  return _HASHED[key]


def _sha256_or_unknown(path: str) -> str:
  try:
    return sha256(path)
  except OSError:
    return UNKNOWN


# GGUF metadata value types: struct format of the fixed-size ones (8 = string, 9 = array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _read_header(path: str) -> tuple[int | None, list[int]]:
  """A GGUF file's `general.file_type` (None when absent) and every tensor's storage type, read from its header
  alone (gguf's GGUFReader maps and parses the whole file: tens of seconds for a 500 MB one on a busy machine)."""
  with open(path, "rb") as f:
    def take(fmt: str):
      size = struct.calcsize("<" + fmt)
      return struct.unpack("<" + fmt, f.read(size))[0]

    def string() -> bytes:
      return f.read(take("Q"))

    def skip(kind: int) -> None:
      if kind == 8:
        f.seek(take("Q"), 1)
      elif kind == 9:
        element, count = take("I"), take("Q")
        if element in _SCALARS:
          f.seek(struct.calcsize("<" + _SCALARS[element]) * count, 1)
        else:
          for _ in range(count):
            skip(element)
      else:
        f.seek(struct.calcsize("<" + _SCALARS[kind]), 1)

    if f.read(4) != packaged.GGUF_MAGIC:
      raise ValueError(f"{path} is not a GGUF file")
    take("I")  # version
    tensors, keys = take("Q"), take("Q")
    file_type = None
    for _ in range(keys):
      key, kind = string(), take("I")
      if key == b"general.file_type" and kind in _SCALARS:
        file_type = int(take(_SCALARS[kind]))
      else:
        skip(kind)
    types = []
    for _ in range(tensors):
      string()
      f.seek(8 * take("I"), 1)  # dimensions
      types.append(take("I"))
      take("Q")  # offset
  return file_type, types


def _name(enum, value: int, prefix: str = "") -> str:
  """A gguf enum member's name, else the number as text (a type newer than the installed gguf, or no gguf)."""
  try:
    return enum(value).name.removeprefix(prefix)
  except (TypeError, ValueError):
    return str(value)


def gguf_quantization(path: str) -> dict[str, Any]:
  """A GGUF file's declared file type ("Q4_1", "Q4_K_M", ...) and how many tensors each storage type holds; a type
  gguf does not name is its number as text. Raises for a file it cannot read or parse."""
  try:
    from gguf import GGMLQuantizationType, LlamaFileType
  except ImportError:
    GGMLQuantizationType = LlamaFileType = None  # noqa: N806 (the numbers as text)

  file_type, types = _read_header(path)
  declared = None if file_type is None else _name(LlamaFileType, file_type, "MOSTLY_")
  tensors = collections.Counter(_name(GGMLQuantizationType, t) for t in types)
  return {"quantization": declared, "tensor_types": dict(sorted(tensors.items()))}


def _package_versions(model: packaged.PackagedModel) -> dict[str, str | None]:
  parts = (*((model.checksums,) if model.checksums else ()), *model.parts)
  versions: dict[str, str | None] = {}
  for part in parts:
    try:
      versions[part.distribution] = importlib.metadata.version(part.distribution)
    except importlib.metadata.PackageNotFoundError:
      versions[part.distribution] = None
  return versions


def describe(spec: str, source: str, dtype) -> dict[str, Any]:
  """The provenance of a model loaded from `spec` (alias, .gguf, HF directory, hub id, random preset) whose weights
  were read from `source` (`LoadedModel.source`) and computed in `dtype`. Never raises (a run computes it before
  measuring and must not end over it): a fact it cannot read is "unknown", a file it cannot read is left out."""
  computed = np.dtype(dtype).name
  if not os.path.exists(source):
    return {"format": source, "computed_in": computed, "source": spec}
  if os.path.isfile(source):
    return _file(spec, source, computed)
  try:
    weights = sorted(f for f in os.listdir(source) if f.endswith(".safetensors"))
  except OSError:
    weights = []
  combined = hashlib.sha256()
  hashed = []
  for name in weights:
    digest = _sha256_or_unknown(os.path.join(source, name))
    if digest != UNKNOWN:
      combined.update(f"{digest}  {name}\n".encode())
      hashed.append(name)
  return {"format": "safetensors (Hugging Face directory)", "quantization": None, "computed_in": computed,
          "source": spec if spec != source else os.path.abspath(source), "files": hashed,
          "sha256": combined.hexdigest() if hashed else UNKNOWN,
          "sha256_of": "the sha256sum lines of the .safetensors files, in name order"}


def _file(spec: str, source: str, computed: str) -> dict[str, Any]:
  """`describe` of weights read from one file: a GGUF file's quantization, else the format "unknown"."""
  if source.endswith(".gguf"):
    try:
      quantization = gguf_quantization(source)
    except Exception:  # noqa: BLE001 (a header it cannot parse, however malformed: the run goes on)
      quantization = {"quantization": UNKNOWN, "tensor_types": {}}
    facts: dict[str, Any] = {"format": "GGUF", **quantization, "dequantized_to": computed}
  else:
    facts = {"format": UNKNOWN, "quantization": UNKNOWN, "computed_in": computed}
  facts.update(file=os.path.basename(source), sha256=_sha256_or_unknown(source))
  model = packaged.PACKAGED.get(spec)
  if model is not None:
    facts["source"] = (f"PyPI package{'s' if len(model.parts) > 1 else ''} "
                       + ", ".join(p.distribution for p in model.parts) + f" ({model.install})")
    facts["packages"] = _package_versions(model)
  else:
    facts["source"] = os.path.abspath(source)
  return facts
