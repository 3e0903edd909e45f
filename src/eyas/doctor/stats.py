"""The statistics behind every verdict: per-position outcomes and paired tests on them.

Every wiring is scored on the same positions, so two wirings are compared position by position
instead of by their averages: a small but consistent gain is significant, a large but noisy one is
not. What decides is continuous: the draft's log-probability of the target's token and the
divergence of the draft's next-token distribution from the target's (Wilcoxon signed-rank on the
paired per-position differences). A fault that changes the draft's distribution without flipping
its argmax is invisible to 0/1 acceptance, and a weak draft flips few argmaxes; both measures see
it. Acceptance and tau stay the reported effect sizes, with their exact paired tests (McNemar on
depth-1 outcomes, a sign test on accepted chain length) beside them.

Positions of one answer are not independent draws (a wiring that helps on code helps on all of a
code answer); answers are. The signed-rank tests overstate the evidence of a preference held by a
few answers, so a measure that decides must also lean the same way across answers (`by_sample`, an
exact sign test over answers at ANSWERS_ALPHA). A preference significant over positions that the
answers do not share is `held_back`: not a fault yet, and the doctor measures more prompts.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

DEPTH = 5  # chains of k = 5 draft tokens: depth-1 acceptance and tau(5)
ALPHA = 0.01  # family-wise error rate: p * (number of tests in the round) must stay below it
FLOOR = -20.0  # log-probability floor, nats: a target token outside the draft vocabulary has none
MIN_GAIN_LOGPROB = 0.005  # a significant change must also be more than rounding: +0.005 nats of log-probability
MIN_DROP_KL = 0.005  # or 0.005 nats less divergence from the target
POWER = 0.8  # the power at which the report states the smallest fault it could detect
ACCEPTANCE_ALPHA = 0.05  # a wiring that loses acceptance at this one-sided level never wins
ANSWERS_ALPHA = 0.05  # the measure that decides must lean the same way on the answers: sign test p below this
# Fewer answers than this cannot reach ANSWERS_ALPHA even all agreeing (1/2^4 > 0.05): positions decide alone.
MIN_ANSWERS = 5
# A draft below this depth-1 acceptance under every wiring tried is trained for none of them: which wiring its
# weights measure better under is their own leaning (random weights lean somewhere), not a fault.
MIN_USABLE = 0.05


@dataclass
class Outcome:
    """Per-position results of one wiring: the same positions, in the same order, for every wiring.

    `logprob` and `kl` average over the depths of the chain whose target token is known (teacher
    forced), so faults that act only from depth 2 on (norm_output) move them too.
    """

    first: Tensor  # [P] bool: the depth-1 draft token is the target's
    accepted: Tensor  # [P] int: draft tokens accepted in a greedy chain of DEPTH
    logprob: Tensor  # [P] float: the draft's log-probability of the target's token, floored at FLOOR
    kl: Tensor  # [P] float: KL(target || draft) over the draft vocabulary, nats
    acceptance_by_depth: list[float]
    tau: float  # tau(k=DEPTH), eyas.evaluate's measuring stick
    error: str | None = None  # the wiring cannot run (e.g. a layer the target lacks): counted as all rejected
    samples: tuple[int, ...] = ()  # positions of each sample, in order (they sum to P)
    # the draft vocabulary `kl` is taken over (its size and a hash of its target ids); () for a wiring that
    # cannot run. The target's distribution is renormalised over it, so divergences over two vocabularies
    # are not comparable (an identity map onto ids the target rarely uses can lower it while every
    # target token loses probability)
    vocabulary: tuple = ()
    # what a uniform guess over the draft vocabulary scores on `logprob`'s terms: a draft no better than it
    # under any wiring has learned nothing a wiring could unlock (NaN for a wiring that cannot run)
    uniform_logprob: float = float("nan")

    @property
    def depth1(self) -> float:
        return _mean(self.first)

    @property
    def mean_accepted(self) -> float:
        return _mean(self.accepted)

    @property
    def mean_logprob(self) -> float:
        return _mean(self.logprob)

    @property
    def mean_kl(self) -> float:
        return _mean(self.kl)

    def summary(self) -> dict[str, Any]:
        out = {"acceptance_depth1": rounded(self.depth1), "tau5": rounded(self.tau),
               "acceptance_by_depth": [rounded(a) for a in self.acceptance_by_depth],
               "logprob": rounded(self.mean_logprob), "kl": rounded(self.mean_kl),
               "uniform_logprob": rounded(self.uniform_logprob)}
        return out | ({"error": self.error} if self.error else {})


def rejected(samples: list[int], why: str) -> Outcome:
    """The outcome of a wiring that cannot run, over samples of these many positions: nothing
    accepted, the floor log-probability, and the divergence of a draft that gives the target's
    token only the floor's probability."""
    P = sum(samples)
    return Outcome(torch.zeros(P, dtype=torch.bool), torch.zeros(P, dtype=torch.long), torch.full((P,), FLOOR),
                   torch.full((P,), -FLOOR), [0.0] * DEPTH, 1.0, why, tuple(samples))


def _mean(x: Tensor) -> float:
    return float(x.double().mean()) if len(x) else float("nan")


def rounded(x: float | None, n: int = 4) -> float | None:
    """JSON-ready: rounded, None for a missing or undefined (NaN) number."""
    return None if x is None or math.isnan(x) else round(float(x), n)


def score(out: Outcome) -> tuple[float, float]:
    """What "measured better" means where wirings that passed the test are ranked: more draft tokens
    accepted per chain (what the doctor is for: the continuous measures can favour a smoothed input
    to an overfit draft, see `loses_acceptance`), then the log-probability of the target's tokens,
    which orders wirings of equal acceptance."""
    return out.mean_accepted, out.mean_logprob


def binomial_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exact (Python integers)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def signed_rank(d: Tensor) -> float:
    """One-sided Wilcoxon signed-rank p-value that the paired differences `d` lean positive.

    Zero differences are dropped, tied magnitudes get their average rank (and the variance its tie
    correction); the normal approximation with a continuity correction is within a few percent of
    the exact test from about 20 nonzero pairs, and the doctor pairs hundreds.
    """
    d = d.double()[d != 0]
    n = d.numel()
    if n == 0:
        return 1.0
    magnitude, order = d.abs().sort()
    _, group, counts = torch.unique_consecutive(magnitude, return_inverse=True, return_counts=True)
    average_rank = counts.cumsum(0).double() - (counts.double() - 1) / 2  # ranks are 1-based
    ranks = torch.empty(n, dtype=torch.float64)
    ranks[order] = average_rank[group]
    w = float(ranks[d > 0].sum())
    var = n * (n + 1) * (2 * n + 1) / 24 - float((counts.double() ** 3 - counts).sum()) / 48
    z = (w - n * (n + 1) / 4 - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


def paired_test(base: Outcome, alt: Outcome) -> dict[str, Any]:
    """Does `alt` beat `base` on the same positions?

    Deciding (`beats`): signed-rank tests on the per-position gain in log-probability of the
    target's token and on the per-position drop in divergence (only where both divergences are over
    one draft vocabulary: `kl_compared`). Reported beside them: the exact
    one-sided McNemar test on depth-1 outcomes (`alt` wins b and loses c of the discordant
    positions; p = P(X >= b), X ~ Bin(b + c, 1/2)) and the same sign test on accepted chain length,
    each also in the other direction (`p_depth1_worse`, `p_chain_worse`: does `alt` lose?).
    """
    b = int((alt.first & ~base.first).sum())
    c = int((base.first & ~alt.first).sum())
    wins, losses = int((alt.accepted > base.accepted).sum()), int((alt.accepted < base.accepted).sum())
    gain, drop = (alt.logprob - base.logprob).double(), (base.kl - alt.kl).double()
    kl_compared = not (base.vocabulary and alt.vocabulary) or base.vocabulary == alt.vocabulary
    return {
        "positions": int(base.first.numel()),
        "gain_logprob": _mean(gain),
        "p_logprob": signed_rank(gain),
        "sd_logprob": float(gain.std()) if gain.numel() > 1 else float("nan"),
        "kl_compared": kl_compared,  # else the divergences decide nothing (Outcome.vocabulary)
        "drop_kl": _mean(drop) if kl_compared else float("nan"),
        "p_kl": signed_rank(drop) if kl_compared else 1.0,
        "depth1_wins_losses": [b, c],
        "p_depth1": binomial_tail(b, b + c),
        "chain_wins_losses": [wins, losses],
        "p_chain": binomial_tail(wins, wins + losses),
        "p_depth1_worse": binomial_tail(c, b + c),
        "p_chain_worse": binomial_tail(losses, wins + losses),
        "gain_depth1": alt.depth1 - base.depth1,
        "gain_accepted": alt.mean_accepted - base.mean_accepted,
        **by_sample(gain, base.samples),
        **by_sample(drop, base.samples, "_kl"),
    }


def by_sample(gain: Tensor, samples: tuple[int, ...], suffix: str = "") -> dict[str, Any]:
    """How many samples (answers) gain on average, of those measured, and the exact one-sided sign
    test over them: `samples_favouring{suffix}` [k, n] and `p_samples{suffix}`. Positions of one
    answer are not independent draws, answers are: this is the evidence at that level. It cannot
    reach the Bonferroni level of a round (8 answers: p >= 1/256), so it confirms the signed-rank
    tests' verdict (`answers_agree`) rather than making it."""
    means = []
    if samples and sum(samples) == gain.numel():  # else the outcome does not say its samples
        means = [float(c.mean()) for c in torch.split(gain, list(samples)) if c.numel()]
    better = sum(m > 0 for m in means)
    return {f"samples_favouring{suffix}": [better, len(means)],
            f"p_samples{suffix}": binomial_tail(better, len(means))}


def p_value(test: dict[str, Any]) -> float:
    """The smaller p-value of the two deciding tests (uncorrected)."""
    return min(test["p_logprob"], test["p_kl"])


def loses_acceptance(test: dict[str, Any]) -> bool:
    """The alternative accepts fewer draft tokens, measurably (an exact one-sided test at
    ACCEPTANCE_ALPHA, depth 1 or chain length). An overfit draft can fit a smoothed input better
    (a neighbouring capture layer, say): the target's tokens get more probability on average and the
    divergence drops, yet fewer of its argmaxes are right. Such a wiring is not the one it was trained
    with, and no fix that costs acceptance is recommended."""
    return min(test["p_depth1_worse"], test["p_chain_worse"]) < ACCEPTANCE_ALPHA


def answers_agree(test: dict[str, Any], suffix: str = "") -> bool:
    """The answers lean the way the positions do (`by_sample`'s sign test below ANSWERS_ALPHA), or
    are too few to say (under MIN_ANSWERS: `--limit 4`, a cache of 4 samples)."""
    _, n = test[f"samples_favouring{suffix}"]
    return n < MIN_ANSWERS or test[f"p_samples{suffix}"] < ANSWERS_ALPHA


def _over_positions(test: dict[str, Any], tests: int) -> tuple[bool, bool]:
    """Significant after Bonferroni over `tests` tests (p * tests < ALPHA) AND large enough to matter,
    over positions: (on the log-probability of the target's token, on the divergence from the target)."""
    return (test["p_logprob"] * tests < ALPHA and test["gain_logprob"] >= MIN_GAIN_LOGPROB,
            test["p_kl"] * tests < ALPHA and test["drop_kl"] >= MIN_DROP_KL)


def beats(test: dict[str, Any], tests: int) -> bool:
    """A measure significant over positions (`_over_positions`) whose answers agree (`answers_agree`),
    and no measurable loss of acceptance (`loses_acceptance`)."""
    if loses_acceptance(test):
        return False
    logprob, kl = _over_positions(test, tests)
    return (logprob and answers_agree(test)) or (kl and answers_agree(test, "_kl"))


def held_back(test: dict[str, Any], tests: int) -> bool:
    """Significant over positions, but not on the answers: more answers would settle it."""
    return not loses_acceptance(test) and any(_over_positions(test, tests)) and not beats(test, tests)


def smallest_p(n: int) -> float:
    """The smallest p-value `signed_rank` can give on `n` paired positions (every one favouring, no ties)."""
    return signed_rank(torch.arange(1, n + 1, dtype=torch.float64)) if n > 0 else 1.0


def decidable(positions: int, tests: int) -> bool:
    """Whether any wiring can be named a fault at all: on 15 positions the signed-rank test gives p >= 3.6e-4,
    which x 46 tests never passes ALPHA, so a wiring 4.8 nats better was no finding and the doctor said ok."""
    return smallest_p(positions) * max(tests, 1) < ALPHA


def detectable(sds: list[float], positions: int, tests: int) -> float | None:
    """The smallest mean change in log-probability (nats) the paired test would detect with
    probability POWER at this many positions and tests: (z_(1-ALPHA/tests) + z_POWER) x sd / sqrt(P),
    with sd the median spread of the paired differences measured, widened by sqrt(pi/3) for the
    signed-rank test's efficiency relative to the t test. None when nothing was measured, or when no
    change of any size could pass (`decidable`: the normal approximation does not hold that far out)."""
    sds = [s for s in sds if math.isfinite(s) and s > 0]
    if not sds or positions < 2 or not decidable(positions, tests):
        return None
    z = statistics.NormalDist().inv_cdf
    return (z(1 - ALPHA / max(tests, 1)) + z(POWER)) * statistics.median(sds) / math.sqrt(positions) * math.sqrt(
        math.pi / 3)
