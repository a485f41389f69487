"""Activation patching over every head in one compiled call (`jaxloc.Model.patch`) against a PyTorch hook loop doing
the same (one forward per head, as TransformerLens and nnsight run it), on IOI-style prompt pairs; and one call
scoring many masks against one call per mask (by default, and with `exact=True`, whose scores are bit for bit those
of any other call).

Both sides run the shipped code: `Model.patch` and `Model.score` for jaxloc, `torch_reference.patched_heads_loop`
for PyTorch. Parity is the largest difference of the patched logits at the answer tokens, and of the logit
difference (indirect object minus subject) every head's patch gives; times are the best of `repeats` warm runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Callable

import numpy as np

from jaxloc import masks as masks_lib
from jaxloc.config import setting

# A `jaxloc.Model` (jaxloc/api, a floor above the benchmarks: `jaxloc.main.benchmark_patching` loads it).
Model = Any
from jaxloc.models.torch_reference import patched_heads_loop

# IOI prompts: the clean one names the subject again before the verb; the corrupted one names the indirect object
# there instead, which flips which name the model should say. Names of one token each keep a pair's lengths equal.
TEMPLATE = "When {io} and {s} went to the {place}, {subject} gave a {thing} to"
NAMES = ("Mary", "John", "Tom", "James", "Anna", "Paul", "Sarah", "David", "Emma", "Mark")
PLACES = ("store", "park", "school", "market")
THINGS = ("drink", "book", "ball", "gift")


@dataclasses.dataclass
class PatchingConfig:
  pairs: int = setting(8, "IOI-style clean/corrupted prompt pairs patched together.", lower=1)
  repeats: int = setting(3, "Warm runs of each side; the fastest is reported.", lower=1)
  score_masks: int = setting(100, "Masks scored in one call against one call per mask.", lower=1)
  exact_masks: int = setting(10, "Of those, masks also scored one per call with exact=True (bit-identical scores; "
                             "each call runs the full compiled size, so it costs a full call).", lower=0)
  torch_baseline: bool = setting(True, "Run the PyTorch hook loop (needs torch and transformers).")


def ioi_pairs(model: Model, count: int) -> tuple[list[str], list[str], list[tuple[int, int]]]:
  """`count` (clean, corrupted) prompts of one token length, and each pair's (indirect object, subject) answer
  token ids."""
  tok = model.tokenizer
  clean, corrupted, answers = [], [], []
  width = None
  for (io, s), place, thing in itertools.product(itertools.permutations(NAMES, 2), PLACES, THINGS):
    io_id, s_id = (tok(" " + n, add_special_tokens=False)["input_ids"] for n in (io, s))
    if len(io_id) != 1 or len(s_id) != 1:
      continue
    a = TEMPLATE.format(io=io, s=s, place=place, subject=s, thing=thing)
    b = TEMPLATE.format(io=io, s=s, place=place, subject=io, thing=thing)
    length = len(model.tokens([a])[0])
    if length != len(model.tokens([b])[0]) or (width is not None and length != width):
      continue
    width = length
    clean.append(a)
    corrupted.append(b)
    answers.append((io_id[0], s_id[0]))
    if len(clean) == count:
      return clean, corrupted, answers
  raise ValueError(f"only {len(clean)} IOI pairs of one token length from the names; ask for fewer")


def best_time(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
  """(fastest seconds of `repeats` runs, the last result)."""
  times, result = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    result = fn()
    times.append(time.perf_counter() - start)
  return min(times), result


def logit_difference(logits: np.ndarray, answers: list[tuple[int, int]], columns: list[int]) -> np.ndarray:
  """Indirect object minus subject logit [..., P] from logits [..., P, T] over `columns`."""
  where = {token: i for i, token in enumerate(columns)}
  io = np.array([where[a] for a, _ in answers])
  s = np.array([where[b] for _, b in answers])
  rows = np.arange(len(answers))
  return logits[..., rows, io] - logits[..., rows, s]


def patching(model: Model, config: PatchingConfig, torch_model: Any = None) -> dict[str, Any]:
  """Every head patched from the clean run: jaxloc in one call against the hook loop (when `torch_model`)."""
  clean, corrupted, answers = ioi_pairs(model, config.pairs)
  columns = sorted({t for pair in answers for t in pair})
  units = masks_lib.single_heads(model)
  model.patch(clean, corrupted, units, columns=columns)  # compiles
  seconds, patched = best_time(lambda: model.patch(clean, corrupted, units, columns=columns), config.repeats)
  diff = logit_difference(patched.logits, answers, columns)  # [heads, pairs]
  clean_diff = logit_difference(patched.clean, answers, columns)
  corrupted_diff = logit_difference(patched.corrupted, answers, columns)
  recovered = patched.recovered(diff.mean(1), clean_diff.mean(), corrupted_diff.mean())
  top = np.argsort(-np.abs(recovered))[:5]
  report: dict[str, Any] = {
      "model": model.loaded.name, "pairs": len(clean), "tokens": len(model.tokens(clean[:1])[0]),
      "heads": len(units), "jaxloc_seconds": seconds,
      "clean_logit_difference": float(clean_diff.mean()), "corrupted_logit_difference": float(corrupted_diff.mean()),
      "top_heads": {units.labels[i]: float(recovered[i]) for i in top}, "example": [clean[0], corrupted[0]]}
  if torch_model is not None:
    import torch

    heads = [(layer, h) for layer in range(model.config.num_layers) for h in range(model.config.num_heads)]
    clean_ids, corrupted_ids = (torch.tensor(model.tokens(p)) for p in (clean, corrupted))
    torch_seconds, reference = best_time(lambda: patched_heads_loop(torch_model, clean_ids, corrupted_ids, heads),
                                         config.repeats)
    reference = reference[..., columns]
    report.update({
        "torch_hook_loop_seconds": torch_seconds, "speedup": torch_seconds / seconds,
        "parity_max_abs_logit": float(np.abs(patched.logits - reference).max()),
        "parity_max_abs_logit_difference": float(np.abs(diff - logit_difference(reference, answers, columns)).max())})
  return report


def many_masks(model: Model, config: PatchingConfig) -> dict[str, Any]:
  """`score_masks` random masks scored in one call against one call per mask: equal, and the time of each."""
  prompts = ["The plural of mouse is", "The plural of child is", "The plural of goose is", "The plural of cat is"]
  answers = [" mice", " children", " geese", " cats"]
  masks = masks_lib.random(model, config.score_masks, 0.1, seed=0)
  # Warm-ups, twice: a second call may compile a smaller call size once the first has timed the full one
  # (`scorer.call_size`).
  for _ in range(2):
    model.score(prompts, answers, masks)
  one_seconds, together = best_time(lambda: model.score(prompts, answers, masks), config.repeats)
  for _ in range(2):
    model.score(prompts, answers, masks[0])
  start = time.perf_counter()
  separate = np.concatenate([model.score(prompts, answers, masks[i]) for i in range(len(masks))])
  separate_seconds = time.perf_counter() - start
  # exact=True: each mask's scores bit for bit whatever shares its call; one call per mask costs a full call.
  model.score(prompts, answers, masks, exact=True)  # compiles (the one call's shapes)
  exact_seconds, exact = best_time(lambda: model.score(prompts, answers, masks, exact=True), config.repeats)
  count = min(len(masks), config.exact_masks)
  start = time.perf_counter()
  exact_separate = [model.score(prompts, answers, masks[i], exact=True) for i in range(count)]
  exact_separate_seconds = time.perf_counter() - start
  exact_each = np.concatenate(exact_separate) if count else exact[:0]
  logits_masks = masks[:min(len(masks), 20)]
  in_one = model.logits(prompts, logits_masks, last=True)
  each = np.concatenate([model.logits(prompts, logits_masks[i], last=True) for i in range(len(logits_masks))])
  return {"masks": len(masks), "prompts": len(prompts), "one_call_seconds": one_seconds,
          "separate_calls_seconds": separate_seconds, "speedup": separate_seconds / one_seconds,
          "max_abs_score_difference": float(np.abs(together - separate).max()),
          "scores_identical": bool(np.array_equal(together, separate)),
          "exact_one_call_seconds": exact_seconds, "exact_masks": count,
          "exact_separate_seconds_per_call": exact_separate_seconds / max(count, 1),
          "exact_max_abs_score_difference": float(np.abs(exact[:count] - exact_each).max()) if count else 0.0,
          "exact_scores_identical": bool(np.array_equal(exact[:count], exact_each)),
          "exact_vs_default_max_abs": float(np.abs(exact - together).max()),
          "logits_masks": len(logits_masks), "max_abs_logit_difference": float(np.abs(in_one - each).max()),
          "logits_identical": bool(np.array_equal(in_one, each))}


def format_patching(p: dict[str, Any]) -> str:
  """The patching figures (`patching`) as text."""
  lines = [f"activation patching, {p['heads']} heads x {p['pairs']} IOI pairs ({p['tokens']} tokens), {p['model']}:",
           f"  jaxloc Model.patch, one compiled call: {p['jaxloc_seconds']:.2f} s"]
  if "torch_hook_loop_seconds" in p:
    lines += [f"  PyTorch hook loop, one forward per head: {p['torch_hook_loop_seconds']:.2f} s "
              f"(torch / jaxloc time: {p['speedup']:.2f})",
              f"  parity: max |patched logit difference| {p['parity_max_abs_logit']:.2e}, "
              f"max |IO-S logit difference| {p['parity_max_abs_logit_difference']:.2e}"]
  lines += [f"  logit difference clean {p['clean_logit_difference']:.3f}, corrupted "
            f"{p['corrupted_logit_difference']:.3f}; heads recovering most: "
            + ", ".join(f"{k} {v:+.2f}" for k, v in p["top_heads"].items())]
  return "\n".join(lines)


def format_many_masks(m: dict[str, Any]) -> str:
  """The many-masks figures (`many_masks`) as text."""
  lines = [f"{m['masks']} masks x {m['prompts']} prompts scored in one call: {m['one_call_seconds']:.2f} s; "
            f"in {m['masks']} calls: {m['separate_calls_seconds']:.2f} s ({m['speedup']:.1f}x); "
            f"max |score difference| {m['max_abs_score_difference']:.2e} (identical: {m['scores_identical']}); "
            f"logits of {m['logits_masks']} masks in one call vs one each: max |difference| "
            f"{m['max_abs_logit_difference']:.2e} (identical: {m['logits_identical']})",
           f"  exact=True: {m['masks']} masks in one call {m['exact_one_call_seconds']:.2f} s; "
            f"{m['exact_masks']} of them one per call {m['exact_separate_seconds_per_call']:.2f} s per call; "
            f"max |score difference| {m['exact_max_abs_score_difference']:.2e} "
            f"(identical: {m['exact_scores_identical']}); exact vs default max |difference| "
            f"{m['exact_vs_default_max_abs']:.2e}"]
  return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
  return format_patching(report["patching"]) + "\n" + format_many_masks(report["many_masks"])
