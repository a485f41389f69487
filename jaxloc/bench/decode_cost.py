"""Bytes a decode step moves, by XLA's own graph, against the floor a decode step cannot go under.

A step of `generation_kernels.decode` feeds one token per row through the model: it must read the weights once (the LM
head included; an untied embedding only at the fed tokens), each mask slot's prefix keys/values once for all of its
rows, and each row's own cache up to the span its call reads (the blocks its rows have filled). That is the floor
(`floor_bytes`); the goal is a step within 1.5x of it.

XLA's `cost_analysis()` counts a loop's body once, and a decode step is a loop body (the decode `while_loop`; its
layers are unrolled, but any loop inside a step would be counted once too), so `hlo_bytes` walks the optimized HLO itself, counting what XLA's cost analysis counts per instruction (a
fusion's operands and outputs; a slice or an in-place update only over the part it touches) and multiplying each
loop body by its known trip count; with every trip count taken as one it reproduces XLA's own total, which checks
the walk. `step_cost` compiles the decode call for one step with abstract parameters (nothing is allocated) and
splits its bytes into the step (the decode loop's body) and the call's own (once per chunk of
`generation_kernels.CHUNK_STEPS` steps: the state's bookkeeping outside the loop, and laying every layer's weights
out where the job holds no laid-out copy, `generation_kernels.decode_layers`), with the largest instructions of the
step; `amortized_ratio` adds the call's own bytes spread over a chunk. Compiled for a GPU that is not here
(`deviceless.compiling_for`), the graph is XLA:GPU's; XLA gives no cost analysis there, and the walk stands alone.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxloc.bench import deviceless, memory
from jaxloc.engine import generation_kernels
from jaxloc.models.config import ModelConfig
from jaxloc.models.decoder import Transformer

_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([0-9,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([^\s=]+)\s*=\s*(.*)$")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%([^\s(]+)\s*\(.*\{\s*$")
# Instructions that move no data of their own.
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id",
         "opt-barrier", "iota"}


def type_bytes(text: str) -> int:
  """Bytes of an HLO type (an array, or a tuple of them)."""
  total = 0
  for dtype, dims in _ARRAY.findall(text):
    total += _ITEMSIZE[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
  return total


def _closing(text: str, start: int) -> int:
  """The index of the parenthesis that closes the one at `start`."""
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return i
  raise ValueError(f"unbalanced parentheses in {text[:200]!r}")


@dataclasses.dataclass
class Instruction:
  name: str
  type: str
  opcode: str
  operands: list[str]
  arguments: str  # the text between the opcode's parentheses (a parameter's number)
  attributes: str
  root: bool

  @property
  def bytes(self) -> int:
    return type_bytes(self.type)

  def called(self, key: str) -> list[str]:
    found = re.search(key + r"=\{?([^,}]+(?:,\s*%[^,}]+)*)\}?", self.attributes)
    return [] if not found else [n.strip().lstrip("%") for n in found.group(1).split(",")]

  @property
  def trip_count(self) -> int | None:
    found = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', self.attributes)
    return None if not found else int(found.group(1))

  @property
  def op_name(self) -> str:
    found = re.search(r'op_name="([^"]*)"', self.attributes)
    return "" if not found else found.group(1)


def parse_hlo(text: str) -> tuple[dict[str, dict[str, Instruction]], str]:
  """The computations of an HLO module's text (name -> instructions by name, in order) and the entry's name."""
  computations: dict[str, dict[str, Instruction]] = {}
  entry, current = "", None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      current = computations.setdefault(header.group(1), {})
      entry = header.group(1) if line.startswith("ENTRY") else entry
      continue
    found = _INSTRUCTION.match(line) if current is not None else None
    if not found:
      continue
    name, rest = found.groups()
    if rest.startswith("("):
      end = _closing(rest, 0)
      type_text, rest = rest[:end + 1], rest[end + 1:].lstrip()
    else:
      type_text, _, rest = rest.partition(" ")
    opcode, paren = rest[:rest.index("(")], rest.index("(")
    end = _closing(rest, paren)
    operands = re.findall(r"%([^\s,()]+)", rest[paren:end + 1])
    current[name] = Instruction(name, type_text, opcode, operands, rest[paren + 1:end], rest[end + 1:],
                                line.lstrip().startswith("ROOT"))
  return computations, entry


class HloBytes:
  """Bytes accessed by an optimized HLO module, per instruction as XLA's cost analysis counts them, loops multiplied
  by their known trip counts (`trip_counts=False`: every loop once, as `compiled.cost_analysis()`).

  touched: a gather counts the rows it reads and a scatter the entries it writes, as a GPU moves them (XLA's cost
  analysis counts a gather's whole operand, and a scatter's whole operand read and written: an embedding table per
  token, the whole decoding cache per written entry). Slices and in-place dynamic-update-slices count only what
  they touch either way, as XLA counts them."""

  def __init__(self, text: str, trip_counts: bool = True, touched: bool = True):
    self.computations, self.entry = parse_hlo(text)
    self.trip_counts = trip_counts
    self.slices = {"dynamic-slice", "slice"} | ({"gather"} if touched else set())
    self.in_place = {"dynamic-update-slice"} | ({"scatter"} if touched else set())

  def _source(self, computation: dict[str, Instruction], name: str) -> Instruction:
    """The instruction behind `name`, through bitcasts."""
    instr = computation[name]
    while instr.opcode == "bitcast":
      instr = computation[instr.operands[0]]
    return instr

  def fusion_bytes(self, instr: Instruction, outer: dict[str, Instruction]) -> int:
    """A fusion's operand reads (a parameter only sliced counts its slices; one updated in place, nothing) plus its
    output writes (an in-place update writes only the update)."""
    fused = self.computations[instr.called("calls")[0]]
    number = {p.name: int(p.arguments) for p in fused.values() if p.opcode == "parameter"}
    users = collections.defaultdict(list)
    for user in fused.values():
      for position, operand in enumerate(user.operands):
        users[operand].append((user, position))

    def reads(name: str) -> int | None:  # bytes read of value `name`; None: all of it
      total = 0
      for user, position in users[name]:
        if user.opcode == "bitcast":
          inner = reads(user.name)
          if inner is None:
            return None
          total += inner
        elif user.opcode in self.slices and position == 0:
          total += user.bytes
        elif user.opcode in self.in_place and position == 0:
          continue  # updated in place: the untouched part is not read
        else:
          return None
      return total

    total = 0
    for p_name, index in number.items():
      read = reads(p_name)
      total += outer[instr.operands[index]].bytes if read is None else read
    root = next(i for i in fused.values() if i.root)
    outputs = [self._source(fused, o) for o in (root.operands if root.opcode == "tuple" else [root.name])]
    for out in outputs:
      if out.opcode in self.in_place:
        update = fused[out.operands[1 if out.opcode == "dynamic-update-slice" else 2]]
        total += update.bytes
      else:
        total += out.bytes
    return total

  def instruction_bytes(self, instr: Instruction, computation: dict[str, Instruction]) -> int:
    """Bytes of one instruction outside a fusion (loops and calls excluded: `items` walks into them)."""
    if instr.opcode in _FREE:
      return 0
    if instr.opcode == "fusion":
      return self.fusion_bytes(instr, computation)
    if instr.opcode in self.slices:
      return 2 * instr.bytes
    if instr.opcode in self.in_place:
      return 2 * computation[instr.operands[1 if instr.opcode == "dynamic-update-slice" else 2]].bytes
    return instr.bytes + sum(computation[o].bytes for o in instr.operands if o in computation)

  def items(self, name: str | None = None, times: int = 1, path: tuple[str, ...] = ()):
    """(bytes, instruction, enclosing loops) of every instruction that moves data, loop bodies `times` their trips."""
    computation = self.computations[name or self.entry]
    for instr in computation.values():
      if instr.opcode == "while":
        trips = (instr.trip_count or 1) if self.trip_counts else 1
        for key in ("condition", "body"):
          yield from self.items(instr.called(key)[0], times * trips, path + (instr.name,))
      elif instr.opcode in ("call", "async-start"):
        for callee in instr.called("to_apply") or instr.called("calls"):
          yield from self.items(callee, times, path)
      elif instr.opcode == "conditional":  # the costliest branch
        branches = instr.called("branch_computations") or instr.called("true_computation") + instr.called(
            "false_computation")
        costs = [(sum(b for b, _, _ in self.items(c, times, path)), c) for c in branches]
        yield from self.items(max(costs)[1], times, path)
      else:
        size = self.instruction_bytes(instr, computation)
        if size:
          yield times * size, instr, path

  def total(self) -> int:
    return sum(size for size, _, _ in self.items())

  def kind(self, instr: Instruction) -> str:
    """What an instruction does, for a breakdown: a matmul ("dot"), a layout change ("copy"), a slice, an in-place
    update ("update"), or anything else ("elementwise")."""
    ops = {instr.opcode}
    if instr.opcode == "fusion":
      fused = self.computations[instr.called("calls")[0]]
      ops = {i.opcode for i in fused.values()}
      root = self._source(fused, next(i for i in fused.values() if i.root).name)
      if "dot" not in ops and "convolution" not in ops:
        ops = {root.opcode}
    if ops & {"dot", "convolution", "custom-call"}:
      return "dot"
    if ops & {"copy", "transpose"}:
      return "copy"
    if ops & {"dynamic-slice", "slice", "gather"}:
      return "slice"
    if ops & {"dynamic-update-slice", "scatter"}:
      return "update"
    return "elementwise"


def floor_bytes(config: ModelConfig, dtype, slots: int, rows: int, prefix: int, span: int) -> dict[str, int]:
  """What a decode step must read: the weights once (an untied embedding only at the fed tokens, so not counted), each
  mask slot's prefix keys/values once, each row's cache up to `span`."""
  c, itemsize = config, jnp.dtype(dtype).itemsize
  weights = memory.param_bytes(c, dtype)
  if not c.tie_word_embeddings:
    weights -= c.vocab_size * c.hidden_size * itemsize
  kv_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * itemsize
  floor = {"weights": weights, "prefix_kv": slots * prefix * kv_token, "cache": slots * rows * span * kv_token}
  floor["total"] = sum(floor.values())
  return floor


def compile_step(config: ModelConfig, dtype, slots: int, rows: int, prefix: int, cache: int, new: int,
                 blocks: int, compiler_options: dict | None = None, *, held_layers: bool) -> Any:
  """The decode call compiled for one step (`steps=1`) reading the first `blocks` blocks of each row's cache, with
  abstract parameters and state (for the active `deviceless` target, else the backend in use): layers laid out once
  per job (`held_layers`), or by the call itself, before its loop (the call's own bytes)."""
  c, sds, i32 = config, jax.ShapeDtypeStruct, jnp.int32
  module = Transformer(c, param_dtype=dtype)
  params = memory.decode_params(c, dtype) if held_layers else memory._params(c, dtype)  # noqa: SLF001
  state = generation_kernels.slot_shapes(c, dtype, slots=slots, rows=rows, prefix=prefix, cache=cache, new=new)
  decode = jax.jit(functools.partial(generation_kernels.decode, module, c, dtype=dtype),
                   static_argnames=("steps", "blocks"), donate_argnums=(1,))
  lowered = deviceless.lower(decode, params, state, sds((2,), i32), sds((c.vocab_size, 16), i32),
                             sds((c.vocab_size, 16), jnp.bool_), sds((), i32), steps=1, blocks=blocks)
  return deviceless.compile(lowered, compiler_options)


def step_cost(config: ModelConfig, dtype, slots: int, rows: int, prefix: int, cache: int, new: int,
              blocks: int | None = None, compiler_options: dict | None = None, top: int = 12, *,
              held_layers: bool) -> dict[str, Any]:
  """Bytes of one decode step at this layout by XLA's compiled graph (`HloBytes`), against `floor_bytes`.

  The decode call is compiled for one step reading the first `blocks` blocks of each row's cache (default all;
  `generation_kernels.cache_blocks`; their positions are the `span` the floor counts; `compile_step`).
  step_bytes: the decode loop's body, the layers `num_layers` times, each gather and scatter over what it touches;
  step_bytes_xla_rules: the same under XLA's own rules; call_bytes: the call's own work outside the loop (once per
  chunk). xla_cost_analysis: `compiled.cost_analysis()`'s figure (every loop once; None where compiled for a device
  not here), and hlo_check: the walk under XLA's rules with every loop once, which must match it. by_kind: the
  step's bytes by what moves them (`HloBytes.kind`); largest: its `top` instructions, loops multiplied out."""
  widths = generation_kernels.cache_blocks(cache)
  blocks = len(widths) if blocks is None else blocks
  span = sum(widths[:blocks])
  c = config
  compiled = compile_step(c, dtype, slots, rows, prefix, cache, new, blocks, compiler_options, held_layers=held_layers)
  text = compiled.as_text()
  cost = compiled.cost_analysis()
  cost = (cost[0] if isinstance(cost, (list, tuple)) else cost) or {}  # none where compiled for a target not here
  walk = HloBytes(text)
  entry = walk.computations[walk.entry]
  loops = [i.name for i in entry.values() if i.opcode == "while" and i.trip_count is None]
  if len(loops) != 1:
    raise ValueError(f"expected one decode loop of unknown trip count in the entry computation, found {loops}")
  items = list(walk.items())
  step = [(size, instr, path) for size, instr, path in items if path[:1] == (loops[0],)]
  step_bytes = sum(size for size, _, _ in step)
  total = sum(size for size, _, _ in items)
  xla_rules = HloBytes(text, touched=False)
  by_kind = collections.Counter()
  for size, instr, _ in step:
    by_kind[walk.kind(instr)] += size
  largest = sorted(step, key=lambda x: -x[0])[:top]
  floor = floor_bytes(c, dtype, slots, rows, prefix, span)
  return {
      "slots": slots, "rows": rows, "prefix": prefix, "cache": cache, "blocks": blocks, "span": span,
      "dtype": jnp.dtype(dtype).name,
      "floor": floor, "step_bytes": step_bytes, "ratio": step_bytes / floor["total"],
      "amortized_ratio": (step_bytes + (total - step_bytes) / generation_kernels.CHUNK_STEPS) / floor["total"],
      "step_bytes_xla_rules": sum(s for s, _, p in xla_rules.items() if p[:1] == (loops[0],)),
      "call_bytes": total - step_bytes,
      "xla_cost_analysis": float(cost["bytes accessed"]) if "bytes accessed" in cost else None,
      "hlo_check": HloBytes(text, trip_counts=False, touched=False).total(), "by_kind": dict(by_kind),
      "largest": [{"bytes": size, "times": _times(walk, path), "kind": walk.kind(instr), "name": instr.name,
                   "shape": _ARRAY.search(instr.type).group(0) if _ARRAY.search(instr.type) else instr.type,
                   "op": instr.op_name.split("/")[-1], "where": instr.op_name} for size, instr, path in largest]}


def _times(walk: HloBytes, path: tuple[str, ...]) -> int:
  """How many times an instruction inside the loops `path` (of the entry) runs per call."""
  times = 1
  for name in path:
    loop = next(c[name] for c in walk.computations.values() if name in c)
    times *= loop.trip_count or 1
  return times


def describe(cost: dict[str, Any]) -> str:
  """A decode step's bytes against its floor, as text."""
  gb = 1e9
  floor = cost["floor"]
  lines = [f"decode step at {cost['slots']} mask slots x {cost['rows']} rows, prefix {cost['prefix']}, span "
           f"{cost['span']} ({cost['blocks']} cache blocks, {cost['dtype']}): {cost['step_bytes'] / gb:.2f} GB per "
           f"step, floor "
           f"{floor['total'] / gb:.2f} GB (weights {floor['weights'] / gb:.2f}, prefix keys/values "
           f"{floor['prefix_kv'] / gb:.2f}, row caches {floor['cache'] / gb:.2f}): {cost['ratio']:.2f}x the floor; "
           f"{cost['amortized_ratio']:.2f}x with the call's own bytes spread over its "
           f"{generation_kernels.CHUNK_STEPS} steps",
           f"  under XLA's rules (whole operand of gathers and scatters): {cost['step_bytes_xla_rules'] / gb:.2f} GB "
           f"per step; the call's own, once per chunk: {cost['call_bytes'] / gb:.2f} GB",
           (f"  XLA's cost_analysis (every loop once): {cost['xla_cost_analysis'] / gb:.3f} GB; this walk under its "
            f"rules: {cost['hlo_check'] / gb:.3f} GB" if cost["xla_cost_analysis"] is not None else
            f"  XLA's cost_analysis: none where compiled for a device not here; this walk under its rules, every "
            f"loop once: {cost['hlo_check'] / gb:.3f} GB"),
           "  per step by kind: " + ", ".join(f"{k} {v / gb:.2f} GB" for k, v in
                                               sorted(cost["by_kind"].items(), key=lambda kv: -kv[1])),
           "  largest per step (GB over its runs, x runs per step):"]
  for item in cost["largest"]:
    lines.append(f"    {item['bytes'] / gb:7.3f} GB  x{item['times']:<3d} {item['kind']:11s} {item['shape']:32s} "
                 f"{item['op']}")
  return "\n".join(lines)


def dumps(cost: dict[str, Any]) -> str:
  return json.dumps(cost, indent=1)
