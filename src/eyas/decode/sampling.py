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
    any q, and a q shaped like p is accepted more often. Every temperature > 0 and top_p in (0, 1]
    gives a distribution: see `scaled` and the top-p step, which always keeps the likeliest token.
    """
    logits = scaled(logits.float(), s.temperature)
    if s.top_k > 0:
        kth = logits.topk(min(s.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly likelier tokens
        beyond = mass_before >= s.top_p  # a top_p below fp32's smallest number compares as 0: all would go
        beyond[..., 0] = False  # the likeliest token always stays, as in Hugging Face (min_tokens_to_keep=1)
        drop = torch.zeros_like(mass_before, dtype=torch.bool).scatter(-1, order, beyond)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def scaled(logits: Tensor, temperature: float) -> Tensor:
    """fp32 `logits / temperature`, or, in a row where that overflows, its limit as temperature -> 0.

    A temperature small enough (1e-40, or one that rounds to 0 in fp32) sends the largest logit to
    inf or NaN, and the softmax to NaN. Such a row becomes the limit the temperature approaches:
    every bit of mass on the largest logit, shared among exact ties (0 there, -inf elsewhere).
    Ordinary temperatures never overflow, so their values are the plain quotient, bit for bit.
    """
    out = logits / temperature
    top = logits.amax(dim=-1, keepdim=True)
    overflowed = ~(top / temperature).isfinite() & top.isfinite()  # a row's largest quotient is its top's
    if not bool(overflowed.any()):  # every ordinary temperature: one small check, no [R, V] work
        return out
    limit = torch.zeros_like(logits).masked_fill(logits < top, float("-inf"))
    return torch.where(overflowed, limit, out)


def draw(probs: Tensor, s: Sampling) -> int:
    """One token id from a [V] distribution (not necessarily normalised)."""
    return int(torch.multinomial(probs, 1, generator=s.generator))


def uniform(s: Sampling, device: torch.device) -> float:
    """One draw from U[0, 1): the coin of an accept/reject decision."""
    return float(torch.rand((), generator=s.generator, device=device))


def choose(logits: Tensor, s: Sampling) -> int:
    """The next token from [V] logits with nothing drafted: argmax, or a draw from the warped p."""
    return int(logits.argmax()) if s.greedy else draw(warp_probs(logits, s), s)

