"""The target's states, recorded once per diagnosis and sliced for every wiring the doctor measures.

`collect` answers prompts greedily and records the residual stream at every index 0..N plus the
final-normed state, so every alternative wiring is a slice, permutation, norm or shift of the same
tensors, scored on the same positions.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from eyas.data import Prompt, capture, open_shards, read_prompts
from eyas.shift import shift_left
from eyas.target import Target

DEFAULT_PROMPTS = "mtbench"
# 8 MT-bench prompts x 64 tokens: about 500 measured positions, enough for a fault worth +5 points of
# depth-1 acceptance to reach significance; each round that finds a fault re-measures the remaining wirings.
# Where positions and answers disagree the doctor answers the next prompts too (`Capture.extended`).
DEFAULT_LIMIT = 8  # prompts
DEFAULT_MAX_NEW_TOKENS = 64


class Feed(Protocol):
    """Where a capture's sequences come from, so that it can take the next ones: prompts to answer
    (`PromptFeed`) or a trainer's cache (eyas.doctor.caches.CacheFeed)."""

    unit: str  # what its items are called in the report ("prompts")

    def take(self, tgt: Target, start: int, stop: int, progress: bool) -> list[dict[str, Tensor]]:
        """The capture samples of items start..stop-1 (fewer, or none, where the source ends)."""
        ...

    def describe(self, n: int) -> str:
        """What n of its samples are, for the report."""
        ...

    def more(self, n: int) -> str:
        """What taking n more items did, for the report."""
        ...


@dataclass(frozen=True)
class PromptFeed:
    """Prompts the target answers greedily."""

    prompts: str | Path
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    unit = "prompts"

    def take(self, tgt: Target, start: int, stop: int, progress: bool) -> list[dict[str, Tensor]]:
        found = read_prompts(self.prompts, limit=stop)[start:]
        return _answer(tgt, found, self.max_new_tokens, progress) if found else []

    def describe(self, n: int) -> str:
        return f"{n} prompt{'s' * (n != 1)} ({self.prompts}) x {self.max_new_tokens} greedy tokens"

    def more(self, n: int) -> str:
        return f"answered {n} more prompt{'s' * (n != 1)}"


@dataclass
class Capture:
    """The target's states for some token sequences, recorded once and sliced for every hypothesis.

    Each sample: `input_ids` [T], `loss_mask` [T] (the positions measured), `states` [T, N+1, H]
    (index k = the residual stream entering decoder layer k, index N = the last layer's output
    before the final norm) and `last_hidden` [T, H] (final-normed, what lm_head reads). A capture
    that knows where its sequences came from (`feed`, `used` items of it) can be `extended` by the next ones.
    """

    target: Target
    samples: list[dict[str, Tensor]]
    source: str  # what the sequences are, for the report
    seconds: float
    feed: Feed | None = None  # None: given tokens, nothing more to take
    used: int = 0  # how many items of the feed, from the first
    _more: Capture | None = field(default=None, repr=False, compare=False)

    @property
    def sample_positions(self) -> list[int]:
        """Chain starts measured in each sample, counted as `eyas.evaluate.sample_predictions` does:
        the draft reads x_{t+1} and its first label is x_{t+2}, both answer tokens."""
        return [int((m[1:] & shift_left(m[1:], 1)).sum()) for m in (s["loss_mask"].bool() for s in self.samples)]

    @property
    def positions(self) -> int:
        """Chain starts measured in all samples."""
        return sum(self.sample_positions)

    @property
    def unit(self) -> str:
        """What its sequences are called in the report: its feed's items, or given sequences."""
        return self.feed.unit if self.feed is not None else "sequences"

    def extended(self, progress: bool = True) -> Capture | None:
        """This capture and as many more of its feed's items (twice the samples), or None where there
        are no more (given tokens, a prompt file or cache used up). Kept: a capture that several
        diagnoses share is extended once."""
        if self._more is None and self.feed is not None:
            t0 = time.perf_counter()
            samples = self.feed.take(self.target, self.used, 2 * self.used, progress)
            if samples:
                total = self.samples + samples
                self._more = Capture(self.target, total, self.feed.describe(len(total)),
                                     self.seconds + time.perf_counter() - t0, self.feed, self.used + len(samples))
        return self._more


def collect(target: Target | str | Path | None = None, prompts: str | Path | None = None, *,
            limit: int = DEFAULT_LIMIT, max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
            progress: bool = True) -> Capture:
    """Greedy answers to `limit` prompts (default: MT-bench) and every state of the target on them."""
    tgt = target if isinstance(target, Target) else Target.load(target, dtype=torch.float32)
    return collect_from(tgt, PromptFeed(prompts or DEFAULT_PROMPTS, max_new_tokens), limit, progress)


def collect_from(tgt: Target, feed: Feed, limit: int, progress: bool = True) -> Capture:
    """The target's states on the first `limit` items of `feed`."""
    t0 = time.perf_counter()
    samples = feed.take(tgt, 0, limit, progress)
    return Capture(tgt, samples, feed.describe(len(samples)), time.perf_counter() - t0, feed, len(samples))


def _answer(tgt: Target, prompts: list[Prompt], max_new_tokens: int, progress: bool) -> list[dict[str, Tensor]]:
    """One `eyas.data.capture` at ALL indices 0..N (fp32, in a temporary folder): generation and the
    forward pass are what eyas capture does, so the features are exactly those a draft trained with
    eyas saw."""
    N, H = tgt.num_layers, tgt.hidden_size
    with tempfile.TemporaryDirectory(prefix="eyas-doctor-") as tmp:
        capture(tgt, prompts, range(N + 1), tmp, max_new_tokens=max_new_tokens, dtype=torch.float32,
                progress=progress)
        return [{"input_ids": s["input_ids"], "loss_mask": s["loss_mask"], "last_hidden": s["last_hidden"],
                 "states": s["features"].view(-1, N + 1, H)}  # [T, (N+1)*H] -> [T, N+1, H]
                for s in open_shards(tmp)]


def states_on(tgt: Target, input_ids: Tensor, loss_mask: Tensor) -> dict[str, Tensor]:
    """A capture sample of given tokens: every state of the target on them, `loss_mask` the positions measured."""
    with torch.inference_mode():
        out = tgt.forward(input_ids[None].to(tgt.model.device), range(tgt.num_layers + 1), with_logits=False)
    T = input_ids.shape[0]
    return {"input_ids": input_ids, "loss_mask": loss_mask.bool(),
            "last_hidden": out.last_hidden[0].cpu(),  # measured on the CPU, wherever the target ran
            "states": out.features[0].view(T, tgt.num_layers + 1, tgt.hidden_size).cpu()}


def capture_tokens(tgt: Target, input_ids: Tensor, source: str) -> Capture:
    """Every state of the target on one given token sequence (an engine dump's); all positions measured."""
    t0 = time.perf_counter()
    sample = states_on(tgt, input_ids, torch.ones(input_ids.shape[0], dtype=torch.bool))
    return Capture(tgt, [sample], source, time.perf_counter() - t0)
