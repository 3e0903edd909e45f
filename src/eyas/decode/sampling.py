"""Choosing tokens from logits: greedy, or drawn from the distribution Hugging Face `generate` samples.

The same warp shapes the target's distribution (p) and a chain draft's (q); `eyas.decode.accept`
decides from them which draft tokens stand. Every random draw goes through `draw` and `uniform`,
so one seeded generator makes a whole generation reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn; temperature 0 means greedy (argmax, no randomness)."""

    temperature: float = 0.0
    top_p: float = 1.0  # nucleus: keep the most likely tokens whose mass reaches top_p
    top_k: int = 0  # 0: no top-k filter
    generator: torch.Generator | None = None  # None: torch's global RNG

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp_probs(logits: Tensor, s: Sampling) -> Tensor:
    """The distribution tokens are drawn from: [..., V] logits -> [..., V] fp32 probabilities.

    Temperature, then top-k, then top-p, in the order Hugging Face `generate` applies them. The same
    warp is applied to the target (p) and to a chain draft (q): speculative sampling is exact for
    any q, and a q shaped like p is accepted more often.
    """
    logits = logits.float() / s.temperature
    if s.top_k > 0:
        kth = logits.topk(min(s.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly likelier tokens
        drop = torch.zeros_like(mass_before, dtype=torch.bool).scatter(-1, order, mass_before >= s.top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def draw(probs: Tensor, s: Sampling) -> int:
    """One token id from a [V] distribution (not necessarily normalised)."""
    return int(torch.multinomial(probs, 1, generator=s.generator))


def uniform(s: Sampling, device: torch.device) -> float:
    """One draw from U[0, 1): the coin of an accept/reject decision."""
    return float(torch.rand((), generator=s.generator, device=device))


def choose(logits: Tensor, s: Sampling) -> int:
    """The next token from [V] logits with nothing drafted: argmax, or a draw from the warped p."""
    return int(logits.argmax()) if s.greedy else draw(warp_probs(logits, s), s)

