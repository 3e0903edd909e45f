"""The statistics behind every verdict: per-position outcomes and paired exact sign tests.

Every wiring is scored on the same positions, so two wirings are compared position by position
(McNemar on depth-1 outcomes, a sign test on accepted chain length) instead of by their averages:
a small but consistent gain is significant, a large but noisy one is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

DEPTH = 5  # chains of k = 5 draft tokens: depth-1 acceptance and tau(5)
ALPHA = 0.01  # family-wise error rate: p * (number of tests in the round) must stay below it
MIN_GAIN_DEPTH1 = 0.05  # a significant change must also matter: +5 points of depth-1 acceptance,
MIN_GAIN_ACCEPTED = 0.1  # or +0.1 accepted tokens per chain of 5


@dataclass
class Outcome:
    """Per-position results of one wiring: the same positions, in the same order, for every wiring."""

    first: Tensor  # [P] bool: the depth-1 draft token is the target's
    accepted: Tensor  # [P] int: draft tokens accepted in a greedy chain of DEPTH
    acceptance_by_depth: list[float]
    tau: float  # tau(k=DEPTH), eyas.evaluate's measuring stick
    error: str | None = None  # the wiring cannot run (e.g. a layer the target lacks): counted as all rejected

    @property
    def depth1(self) -> float:
        return float(self.first.float().mean()) if len(self.first) else float("nan")

    @property
    def mean_accepted(self) -> float:
        return float(self.accepted.float().mean()) if len(self.accepted) else float("nan")

    def summary(self) -> dict[str, Any]:
        out = {"acceptance_depth1": rounded(self.depth1), "tau5": rounded(self.tau),
               "acceptance_by_depth": [rounded(a) for a in self.acceptance_by_depth]}
        return out | ({"error": self.error} if self.error else {})


def rounded(x: float | None, n: int = 4) -> float | None:
    """JSON-ready: rounded, None for a missing or undefined (NaN) number."""
    return None if x is None or math.isnan(x) else round(float(x), n)


def score(out: Outcome) -> tuple[float, float]:
    """What "measured better" means wherever wirings are ranked: more draft tokens accepted per
    chain, then a higher depth-1 acceptance."""
    return out.mean_accepted, out.depth1


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exact (Python integers)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def paired_test(base: Outcome, alt: Outcome) -> dict[str, Any]:
    """Does `alt` beat `base` on the same positions? Two exact one-sided sign tests.

    Depth 1 (exact McNemar): among positions where exactly one wiring's first draft token is right,
    `alt` wins b and loses c; p = P(X >= b), X ~ Bin(b + c, 1/2). Chains: the same test on the
    accepted length of a chain of DEPTH tokens (wins = longer), which also sees faults that act only
    from depth 2 on (norm_output).
    """
    b = int((alt.first & ~base.first).sum())
    c = int((base.first & ~alt.first).sum())
    wins, losses = int((alt.accepted > base.accepted).sum()), int((alt.accepted < base.accepted).sum())
    return {
        "positions": int(base.first.numel()),
        "depth1_wins_losses": [b, c],
        "p_depth1": binomial_tail(b, b + c),
        "chain_wins_losses": [wins, losses],
        "p_chain": binomial_tail(wins, wins + losses),
        "gain_depth1": alt.depth1 - base.depth1,
        "gain_accepted": alt.mean_accepted - base.mean_accepted,
    }


def beats(test: dict[str, Any], tests: int) -> bool:
    """Significant after Bonferroni over `tests` tests (p * tests < ALPHA) AND large enough to matter."""
    return (test["p_depth1"] * tests < ALPHA and test["gain_depth1"] >= MIN_GAIN_DEPTH1) or (
        test["p_chain"] * tests < ALPHA and test["gain_accepted"] >= MIN_GAIN_ACCEPTED)
