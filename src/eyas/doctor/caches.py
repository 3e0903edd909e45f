"""A trainer's feature cache handed to the doctor (`eyas doctor --features DIR`).

A cache (eyas.data.caches: SpecForge, speculators, eyas) is what the draft was trained on. With the
target at hand, its first sample is matched chunk by chunk against the target's own states, exactly
as an engine dump is (eyas.doctor.dumps): a cache taken one layer too deep is named as a
`capture_layers` fault. Without the target (a 671B target on another cluster: only its config and
the shards holding the final norm and lm_head here), the draft is measured on the cache as stored,
and the report says which layers the cache was assumed to hold and how to confirm it.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from eyas.data.dumps import MIN_POSITIONS
from eyas.drafter_loading import load_drafter_and_config
from eyas.errors import FormatError
from eyas.evaluate import evaluate_samples
from eyas.target_ref import TargetRef
from eyas.verdict import FROM_HEAD, FROM_TOKENS, check_cache_fits, describe, judged

if TYPE_CHECKING:
    from eyas.data.caches import CacheInfo, FeatureCache

# Acceptance on a cache as stored is `eyas eval --data`'s measurement: in its default dtype, which keeps
# a DeepSeek-V3-sized draft with the target's embeddings and lm_head under 10 GB.
EVAL_DTYPE = torch.bfloat16


def open_for(path: str | Path, data_format: str | None, ref: TargetRef) -> FeatureCache:
    """The cache at `path`, refused when its states are not the target's width."""
    from eyas.data.caches import open_cache  # the readers load only when a cache is given

    cache = open_cache(path, format=data_format, num_layers=ref.num_layers)
    check_cache_fits(cache.info, ref.hidden_size, ref.name)
    return cache


def cache_dump(cache: FeatureCache) -> tuple[Tensor, Tensor]:
    """The cache's first sample long enough to match, as a dump: (input_ids [T], features [T, W] fp32)."""
    for s in cache:
        if s["input_ids"].shape[0] >= MIN_POSITIONS:
            return s["input_ids"].long(), s["features"].float()
    raise FormatError(f"{cache.info.path}: no sample with {MIN_POSITIONS} or more positions",
                      "point --features at a cache of real conversations")


def cache_section(info: CacheInfo) -> dict[str, Any]:
    return {"format": info.format, "path": str(info.path), "layers": info.layers_note,
            "capture_layers": None if info.capture_layers is None else list(info.capture_layers),
            "layers_recorded": info.layers_recorded, "last_hidden": info.last_hidden, "answers": info.answers_note,
            "samples": info.num_samples}


def cache_notes(info: CacheInfo, at_hand: bool, layers: tuple[int, ...], draft: Path) -> list[str]:
    """What was assumed about the cache, and how to confirm it."""
    from eyas.data.caches.specforge import layers_for_draft

    notes = [f"feature cache ({info.format}): {info.layers_note}"]
    if info.layers_recorded:
        return notes
    named = layers_for_draft(draft) if info.format == "specforge" else None
    if named and info.capture_layers is not None and named[1] != tuple(info.capture_layers):
        notes.append(f"SpecForge takes its layers from the draft config it trained with: with {named[0]} it captured "
                     f"{list(named[1])} (its ids are outputs of layers), not the default {list(info.capture_layers)}")
    if at_hand:
        notes.append("the cache does not record its layers: its first sample was matched against the target's own "
                     "states (the dump section says which layer each chunk is)")
    else:
        notes.append(f"the cache does not record its layers; the draft reads capture {list(layers)}. To confirm "
                     "which layers it holds, run the doctor with the full target at hand: eyas doctor DRAFT "
                     f"--features {info.path} --target FULL_TARGET_FOLDER (it matches the cache against the "
                     "target's own states)")
    return notes


def measure_on_cache(drafter: Path, cache: FeatureCache, ref: TargetRef, layer_convention: str | None,
                     limit: int) -> dict[str, Any]:
    """The draft's acceptance on the cache as stored (no alternative wirings: those need the target's
    states at every layer), judged by the target's final norm and lm_head when the cache has the last state."""
    from eyas.data.caches import PRE_NORM

    model, _ = load_drafter_and_config(drafter, target=ref, layer_convention=layer_convention, dtype=EVAL_DTYPE)
    head = ref.head(EVAL_DTYPE) if cache.info.last_hidden else None
    samples = judged(itertools.islice(cache, limit), head, normed=cache.info.last_hidden != PRE_NORM,
                     device=ref.device, vocab_size=ref.vocab_size, where=cache.info.path)
    rep = evaluate_samples(model, samples, None if head is None else head.lm_head, depth=5, tree_top_k=4, tree_depth=5)
    verdict = FROM_HEAD if head is not None else FROM_TOKENS
    return {"samples": min(limit, len(cache)), "positions": rep["tokens"], "acceptance_by_depth": rep["acceptance_by_depth"],
            "tau_chain": rep["tau_chain"], "coverage": rep["coverage"], "verdict": verdict,
            "verdict_text": describe(verdict)}


def has_model(ref: TargetRef) -> bool:
    """Whether every weight of the target is here (its decoder layers, every shard its index names),
    not just the few tensors a cache's verdict needs."""
    from eyas.weights import find_weights, weight_files

    if ref.path.is_file() or find_weights(ref.folder) is None:
        return False
    if not all((ref.folder / f).is_file() for f in weight_files(ref.folder)):
        return False
    last = f"model.layers.{ref.num_layers - 1}."
    return any(n.startswith(last) for n in ref.tensor_names())
