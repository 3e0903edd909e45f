"""A trainer's feature cache handed to the doctor (`eyas doctor --features DIR`).

A cache (eyas.data.caches: SpecForge, speculators, eyas) is what the draft was trained on. With the
target at hand, the doctor measures every wiring on the target's own states for the tokens of the
cache's first `--limit` samples (`CacheFeed`, taking more where answers disagree, as with prompts),
and matches the first sample chunk by chunk against those states, exactly as an engine dump is
(eyas.doctor.dumps): a cache taken one layer too deep is named as a `capture_layers` fault. Without
the target (a 671B target on another cluster: only its config and the shards holding the final norm
and lm_head here), the draft is measured on the cache as stored, and the report says which layers
the cache was assumed to hold and how to confirm it.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor
from tqdm import tqdm

from eyas.data.dumps import MIN_POSITIONS
from eyas.doctor.capture import states_on
from eyas.drafter_loading import load_drafter_and_config
from eyas.data.values import check_ids
from eyas.errors import FormatError
from eyas.evaluate import check_slots, eval_dtype, evaluate_samples
from eyas.shift import shift_left
from eyas.target_ref import TargetRef
from eyas.verdict import FROM_HEAD, FROM_TOKENS, check_cache_source, describe, judged

if TYPE_CHECKING:
    from eyas.data.caches import CacheInfo, FeatureCache
    from eyas.target import Target



def open_for(path: str | Path, data_format: str | None, ref: TargetRef) -> FeatureCache:
    """The cache at `path`, refused when it is from another model (eyas.verdict.check_cache_source)."""
    from eyas.data.caches import open_cache  # the readers load only when a cache is given

    cache = open_cache(path, format=data_format, num_layers=ref.num_layers, vocab_size=ref.vocab_size)
    check_cache_source(cache, ref)
    return cache


class CacheFeed:
    """A cache's samples as the doctor's sequences (eyas.doctor.capture.Feed): the target's own states
    on each sample's tokens, measured at its loss-mask positions. A sample is cut after its first
    `answer_tokens` of them: the states of a prefix are the same as in the whole sequence, and a
    conversation of thousands of tokens then costs what one answer to a prompt does (at an 8B target
    a full 4096-token sample would hold 2 GB of fp32 states). The cache is read once, front to back,
    however often more samples are taken; the cut samples are kept (their stored features are 3 of
    the target's N+1 states)."""

    unit = "samples of the cache"

    def __init__(self, cache: FeatureCache, answer_tokens: int) -> None:
        self.cache, self.answer_tokens = cache, answer_tokens
        self._unread = self._cut()
        self._cut_so_far: list[dict[str, Tensor]] = []

    def windows(self, start: int, stop: int) -> list[dict[str, Tensor]]:
        """Samples start..stop-1 of those with a position to measure, cut as the class says."""
        self._cut_so_far += itertools.islice(self._unread, max(0, stop - len(self._cut_so_far)))
        return self._cut_so_far[start:stop]

    def _cut(self) -> Iterator[dict[str, Tensor]]:
        for s in self.cache:
            answer = s["loss_mask"].nonzero()[:, 0]
            if answer.numel() < 3:  # a chain start needs x_{t+1} and x_{t+2} in the answer
                continue
            end = max(int(answer[min(self.answer_tokens, answer.numel()) - 1]) + 1, MIN_POSITIONS)
            cut = {k: s[k][:end] for k in ("input_ids", "loss_mask", "features")}
            if bool((cut["loss_mask"][1:] & shift_left(cut["loss_mask"][1:], 1)).any()):
                yield cut

    def first(self) -> tuple[Tensor, Tensor]:
        """The first sample the doctor measures, as a dump to match: (input_ids [T], features [T, W] fp32)."""
        found = self.windows(0, 1)
        if not found:
            raise FormatError(f"{self.cache.info.path}: no sample with two consecutive loss-mask positions to "
                              "measure", "point --features at a cache of real conversations")
        return found[0]["input_ids"].long(), found[0]["features"].float()

    def take(self, tgt: Target, start: int, stop: int, progress: bool) -> list[dict[str, Tensor]]:
        out = []
        for w in tqdm(self.windows(start, stop), desc="doctor: the target on the cache", unit="sample",
                      file=sys.stderr, disable=not progress):
            check_ids(w["input_ids"], tgt.vocab_size, file=self.cache.info.path, key="input_ids",
                      hint="the cache holds another tokenizer's ids: pass the --target it was captured from")
            out.append(states_on(tgt, w["input_ids"].long(), w["loss_mask"]))
        return out

    def describe(self, n: int) -> str:
        return (f"{n} sample{'s' * (n != 1)} of feature cache {self.cache.info.path} "
                f"(up to {self.answer_tokens} answer tokens each)")

    def more(self, n: int) -> str:
        return f"measured {n} more sample{'s' * (n != 1)} of the cache"


def cache_section(info: CacheInfo) -> dict[str, Any]:
    return {"format": info.format, "path": str(info.path), "layers": info.layers_note,
            "capture_layers": None if info.capture_layers is None else list(info.capture_layers),
            "layers_recorded": info.layers_recorded, "last_hidden": info.last_hidden, "answers": info.answers_note,
            "samples": info.num_samples, "layers_found": None}


def cache_notes(info: CacheInfo, at_hand: bool, layers: tuple[int, ...], draft: Path) -> list[str]:
    """What was assumed about the cache, and how to confirm it."""
    from eyas.data.caches.specforge import trained_reading

    notes = [f"feature cache ({info.format}): {info.layers_note}{trained_reading(draft, info, layers)}"]
    if info.layers_recorded:
        return notes
    if at_hand:
        notes.append("the cache does not record its layers: its first sample was matched against the target's own "
                     "states (the dump section says which layer each chunk is)")
    else:
        notes.append(f"the cache does not record its layers; the draft reads capture {list(layers)}. To confirm "
                     "which layers it holds, run the doctor with the full target at hand: eyas doctor DRAFT "
                     f"--features {info.path} --target FULL_TARGET_FOLDER (it matches the cache against the "
                     "target's own states)")
    return notes


def layers_found(info: CacheInfo, chunks: list[dict[str, Any]]) -> tuple[list[int] | None, list[str]]:
    """The layers whose states the cache's first sample holds (None unless every chunk was identified),
    and a note setting them beside what the reader assumed or read: a finding says what is wrong, this
    says what is there (normed or shifted states are named by the dump section and the findings)."""
    if not chunks or not all(c["identified"] for c in chunks):
        return None, []
    found = [c["layer"] for c in chunks]
    assumed = None if info.capture_layers is None else list(info.capture_layers)
    said = "recorded" if info.layers_recorded else "assumed"
    exactly = all(c["state"] == "raw" and not c["shift"] for c in chunks)
    how = "" if exactly else " (not all raw and in place: the dump section says how each was taken)"
    if assumed is None:  # a count the reader has no default for (SpecForge's default is 3 layers)
        than = "where the reader could assume no layers"
    else:
        than = f"as {said}" if found == assumed else f"not the {said} {assumed}"
    return found, [f"the cache's first sample holds capture {found}, {than}{how}"]


def measure_on_cache(drafter: Path, cache: FeatureCache, ref: TargetRef, layer_convention: str | None,
                     limit: int) -> dict[str, Any]:
    """The draft's acceptance on the cache as stored (no alternative wirings: those need the target's
    states at every layer), judged by the target's final norm and lm_head when the cache has the last state."""
    from eyas.data.caches import NORMED, PRE_NORM, LongerThanContext

    dtype = eval_dtype("auto", ref.device)  # `eyas eval --data`'s measurement, in its default dtype for this machine
    model, config = load_drafter_and_config(drafter, target=ref, layer_convention=layer_convention, dtype=dtype)
    check_slots(cache.info, model.contract.num_aux_layers, config, model.contract.capture_layers)
    head = ref.head(dtype, normed=cache.info.last_hidden == NORMED) if cache.info.last_hidden else None
    longer = LongerThanContext(ref.text_config.get("max_position_embeddings"))  # measured whole, as eval does
    samples = judged(longer.passing(itertools.islice(cache, limit)), head, normed=cache.info.last_hidden != PRE_NORM,
                     device=ref.device, vocab_size=ref.vocab_size, where=cache.info.path)
    rep = evaluate_samples(model, samples, None if head is None else head.lm_head, depth=5, tree_top_k=4, tree_depth=5,
                           where=cache.info.path)
    longer.warn(cache.info.path)
    verdict = FROM_HEAD if head is not None else FROM_TOKENS
    return {"samples": min(limit, len(cache)), "positions": rep["tokens"], "longer_than_context": len(longer.lengths),
            "acceptance_by_depth": rep["acceptance_by_depth"], "tau_chain": rep["tau_chain"],
            "coverage": rep["coverage"], "verdict": verdict,
            "verdict_text": describe(verdict, cache.info.last_hidden == NORMED)}
