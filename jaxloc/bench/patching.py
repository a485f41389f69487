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
from jaxloc.bench import peers
from jaxloc.config import setting
from jaxloc.models.metrics import LogitDiff

# A `jaxloc.Model` (jaxloc/api, a floor above the benchmarks: `jaxloc.main.benchmark_patching` loads it).
Model = Any
from jaxloc.models.torch_reference import patched_heads_loop

# IOI prompts: the clean one names the subject again before the verb; the corrupted one names the indirect object
# there instead, which flips which name the model should say. Names of one token each keep a pair's lengths equal.
TEMPLATE = "When {io} and {s} went to the {place}, {subject} gave a {thing} to"
# The same sentence lengthened to 20 tokens for SmolLM2 (the length the peer-library comparison, `bench/peers.py`, is
# run at).
LONG_TEMPLATE = "After a long day, when {io} and {s} went to the {place} together, {subject} gave a {thing} to"
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


def ioi_pairs(model: Model, count: int,
              template: str = TEMPLATE) -> tuple[list[str], list[str], list[tuple[int, int]]]:
  """`count` (clean, corrupted) prompts of one token length, and each pair's (indirect object, subject) answer
  token ids; `template` has the fields of `TEMPLATE`."""
  tok = model.tokenizer
  clean, corrupted, answers = [], [], []
  width = None
  for (io, s), place, thing in itertools.product(itertools.permutations(NAMES, 2), PLACES, THINGS):
    io_id, s_id = (tok(" " + n, add_special_tokens=False)["input_ids"] for n in (io, s))
    if len(io_id) != 1 or len(s_id) != 1:
      continue
    a = template.format(io=io, s=s, place=place, subject=s, thing=thing)
    b = template.format(io=io, s=s, place=place, subject=io, thing=thing)
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


PARITY_SITES = ("embed", "resid_pre", "q", "k", "v", "scores", "pattern", "z", "head_out", "attn_out", "resid_mid",
                "mlp_pre", "mlp_post", "mlp_out", "resid_post", "final", "logits")


@dataclasses.dataclass
class SweepConfig:
  peer_layers: int = setting(1, "Layers of the head x position sweep the peers run (each layer is H x S patches, one "
                             "forward each for TransformerLens): their time per patch is measured there.", lower=1)
  nnsight_invokes: int = setting(180, "Patches per nnsight trace (its fastest batched form).", lower=1)


def sweep(model: Model, config: SweepConfig, hf_model: Any = None) -> dict[str, Any]:
  """Activation patching of every head at every position of a 20-token IOI pair, every layer x position of the
  residual stream, attribution patching and a filtered cache, with jaxloc; the same with TransformerLens and nnsight
  (`jaxloc.bench.peers`) when `hf_model` is given and they are installed. Times are warm (each call run once first).
  """
  (clean,), (corrupted,), ((io, s),) = ioi_pairs(model, 1, LONG_TEMPLATE)
  clean_ids, corrupted_ids = (model.tokens(p)[0] for p in (clean, corrupted))
  metric = LogitDiff((io,), (s,))
  c = model.config
  report: dict[str, Any] = {"model": model.loaded.name, "tokens": len(clean_ids), "prompts": [clean, corrupted]}

  def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    fn()  # compiles
    return best_time(fn, 1)

  heads_seconds, heads = timed(lambda: model.patch_by_position(clean, corrupted, "z", columns=metric.columns))
  exact, clean_value, corrupted_value = heads.metric(metric)  # [L, S, H]
  every_seconds, every = timed(lambda: model.patch_by_position(clean, corrupted, "z", columns=metric.columns,
                                                               skip_unchanged=False))
  resid_seconds, resid = timed(lambda: model.patch_by_position(clean, corrupted, "resid_pre", columns=metric.columns))
  atp_seconds, (estimate, _) = timed(lambda: model.attribution_patch(clean, corrupted, metric))
  cache_seconds, cache = timed(lambda: model.run_with_cache(clean, names=["z", "pattern"]))
  report["jaxloc"] = {
      "head_position_patches": int(exact.size), "head_position_seconds": heads_seconds,
      "seconds_per_patch": heads_seconds / exact.size,
      "every_cell_run_seconds": every_seconds, "every_cell_run_seconds_per_patch": every_seconds / exact.size,
      "skip_vs_every_cell_max_abs": float(np.abs(every.metric(metric)[0] - exact).max()),
      "resid_pre_patches": int(resid.logits.shape[0]), "resid_pre_seconds": resid_seconds,
      "atp_seconds": atp_seconds,
      "atp_vs_exact_correlation": float(np.corrcoef(estimate.ravel(), (exact - corrupted_value).ravel())[0, 1]),
      "clean_metric": clean_value, "corrupted_metric": corrupted_value,
      "cache_entries": len(cache.keys()), "cache_mib": cache.nbytes / 2**20, "cache_seconds": cache_seconds}
  if hf_model is None:
    return report
  try:
    bridge = peers.tl_bridge(hf_model, model.tokenizer)
  except ImportError as e:
    report["peers"] = f"not installed ({e}): pip install -e '.[peers]'"
    return report
  layers = sorted({int(x) for x in np.linspace(0, c.num_layers - 1, config.peer_layers + 2)[1:-1].round()})
  tl_metric = peers.logit_difference(io, s)
  tl_heads, tl_seconds, tl_patches = peers.tl_head_position_patching(bridge, clean_ids, corrupted_ids, tl_metric,
                                                                     layers=layers)
  tl_resid, tl_resid_seconds, tl_resid_patches = peers.tl_resid_pre_patching(bridge, clean_ids, corrupted_ids,
                                                                             tl_metric, layers=layers)
  tl_atp, tl_atp_seconds = peers.tl_attribution_patching(bridge, clean_ids, corrupted_ids, tl_metric)
  nn_heads, nn_seconds, nn_patches = peers.nnsight_head_position_patching(
      hf_model, clean_ids, corrupted_ids, (io, s), layers=layers, invokes_per_trace=config.nnsight_invokes,
      tokenizer=model.tokenizer)
  resid_exact = resid.metric(metric)[0]
  tl_sites, tl_full = peers.tl_cache(bridge, clean_ids)
  ours = model.run_with_cache(clean, names=list(PARITY_SITES))
  parity, parity_relative = {}, {}
  for site in PARITY_SITES:
    if site not in tl_sites:
      continue
    mine = ours.get(site)
    theirs = tl_sites[site]
    if site == "scores":  # unseen keys: -inf here, float32's lowest there
      seen = np.isfinite(mine)
      mine, theirs = np.where(seen, mine, 0.0), np.where(seen, theirs, 0.0)
    parity[site] = float(np.abs(mine - theirs).max())
    parity_relative[site] = parity[site] / max(float(np.abs(theirs).max()), 1e-30)
  per_patch = heads_seconds / exact.size
  report["peers"] = {
      "layers": layers,
      "transformer_lens": {"patches": tl_patches, "seconds": tl_seconds, "seconds_per_patch": tl_seconds / tl_patches,
                           "projected_all_seconds": tl_seconds / tl_patches * exact.size,
                           "max_abs_vs_jaxloc": float(np.abs(tl_heads - exact[layers]).max()),
                           "resid_pre_seconds_per_patch": tl_resid_seconds / tl_resid_patches,
                           "resid_pre_max_abs_vs_jaxloc": float(np.abs(tl_resid - resid_exact[layers]).max()),
                           "atp_seconds": tl_atp_seconds,
                           "atp_max_abs_vs_jaxloc": float(np.abs(tl_atp - estimate).max()),
                           "full_cache_entries": tl_full["entries"], "full_cache_mib": tl_full["mib"]},
      "nnsight": {"patches": nn_patches, "invokes_per_trace": config.nnsight_invokes, "seconds": nn_seconds,
                  "seconds_per_patch": nn_seconds / nn_patches,
                  "projected_all_seconds": nn_seconds / nn_patches * exact.size,
                  "max_abs_vs_jaxloc": float(np.abs(nn_heads - exact[layers]).max())},
      "speedup_vs_transformer_lens": tl_seconds / tl_patches / per_patch,
      "speedup_vs_nnsight": nn_seconds / nn_patches / per_patch,
      "speedup_vs_transformer_lens_every_cell_run": tl_seconds / tl_patches / (every_seconds / exact.size),
      "speedup_vs_nnsight_every_cell_run": nn_seconds / nn_patches / (every_seconds / exact.size),
      "cache_parity_max_abs": parity, "cache_parity_relative_to_largest": parity_relative}
  return report


def format_sweep(r: dict[str, Any]) -> str:
  """The sweep's figures (`sweep`) as text."""
  j = r["jaxloc"]
  lines = [f"every head x position of a {r['tokens']}-token IOI pair ({j['head_position_patches']} patches), "
           f"{r['model']}:",
           f"  jaxloc patch_by_position: {j['head_position_seconds']:.2f} s ({j['seconds_per_patch'] * 1e3:.2f} ms a "
           f"patch; cells equal in both runs not run); every cell run: {j['every_cell_run_seconds']:.2f} s "
           f"({j['every_cell_run_seconds_per_patch'] * 1e3:.2f} ms a patch, max |diff| "
           f"{j['skip_vs_every_cell_max_abs']:.1e}); resid_pre x position ({j['resid_pre_patches']} patches) "
           f"{j['resid_pre_seconds']:.2f} s",
           f"  jaxloc attribution patching: {j['atp_seconds']:.2f} s; correlation with the exact patches "
           f"{j['atp_vs_exact_correlation']:.4f}",
           f"  jaxloc run_with_cache(names=['z', 'pattern']): {j['cache_entries']} entries, {j['cache_mib']:.2f} MiB"]
  p = r.get("peers")
  if isinstance(p, str):
    lines.append(f"  peers: {p}")
  elif p:
    t, n = p["transformer_lens"], p["nnsight"]
    lines += [f"  TransformerLens get_act_patch_attn_head_out_by_pos, layers {p['layers']}: {t['seconds_per_patch']:.3f} "
              f"s a patch (all {j['head_position_patches']}: {t['projected_all_seconds']:.0f} s projected); "
              f"jaxloc {p['speedup_vs_transformer_lens']:.0f}x ({p['speedup_vs_transformer_lens_every_cell_run']:.0f}x "
              f"running every cell); max |diff| vs jaxloc {t['max_abs_vs_jaxloc']:.1e}",
              f"  nnsight, {n['invokes_per_trace']} invokes a trace: {n['seconds_per_patch']:.3f} s a patch "
              f"(all: {n['projected_all_seconds']:.0f} s projected); jaxloc {p['speedup_vs_nnsight']:.0f}x "
              f"({p['speedup_vs_nnsight_every_cell_run']:.0f}x running every cell); max |diff| "
              f"vs jaxloc {n['max_abs_vs_jaxloc']:.1e}",
              f"  TransformerLens resid_pre: {t['resid_pre_seconds_per_patch']:.3f} s a patch, max |diff| "
              f"{t['resid_pre_max_abs_vs_jaxloc']:.1e}; AtP {t['atp_seconds']:.2f} s, max |diff| vs jaxloc "
              f"{t['atp_max_abs_vs_jaxloc']:.1e}; full cache {t['full_cache_entries']} entries, "
              f"{t['full_cache_mib']:.1f} MiB",
              "  cache parity, max |jaxloc - TransformerLens| per site: "
              + ", ".join(f"{k} {v:.1e}" for k, v in p["cache_parity_max_abs"].items())]
  return "\n".join(lines)
