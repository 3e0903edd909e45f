"""How far a measured figure would move on other prompts: 95% intervals by resampling samples.

Positions inside one answer are not independent draws: a draft that stumbles on code stumbles on
every position of a code answer. So the unit resampled is the sample (a prompt and its answer), a
cluster bootstrap. Every headline figure of `eyas eval` is a ratio of sums over samples (accepted
tokens over chain starts), so one resample is a weighted sum: W [B, S], how often each of the S
samples is drawn in each of B resamples, times the per-sample sums [S, m]. The interval is the
middle 95% of the B ratios (percentile bootstrap).

With few samples the percentile interval is too narrow: on simulated clustered data
(tests/test_intervals.py's) a 95% interval held the true ratio 93% of the time from 60 samples, 92%
from 20, 89% from 10 and 77% from 3. `FEW` is where reports say so.

Two drafts measured on the same samples are compared with the same W for both: the interval of
their difference. The prompts' own difficulty cancels in it, so it is far narrower than either
draft's interval, and it is what says whether a new draft beats the old one.
"""

from __future__ import annotations

import torch
from torch import Tensor

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0  # the same samples give the same interval on every run
FEW = 20  # fewer samples than this: the intervals are too narrow (see above)


def how_made(samples: int) -> dict:
    """What a report's ci95 says of its intervals: over how many samples, how many resamples, how, and
    whether they run too narrow (under `FEW` samples: what the text says beside them)."""
    return {"samples": samples, "resamples": RESAMPLES, "method": "percentile bootstrap over whole samples",
            "too_narrow": samples < FEW}


def resample_weights(samples: int, resamples: int = RESAMPLES, seed: int = SEED) -> Tensor:
    """W [resamples, samples] float64: how often each sample is drawn in each resample (rows sum to
    `samples`)."""
    g = torch.Generator().manual_seed(seed)
    drawn = torch.randint(samples, (resamples, samples), generator=g)
    return torch.zeros(resamples, samples, dtype=torch.float64).scatter_add_(
        1, drawn, torch.ones(resamples, samples, dtype=torch.float64))


def _ratios(W: Tensor, num: Tensor, den: Tensor) -> Tensor:
    """[B, m] = (W @ num) / (W @ den), nan where a resample drew no denominator."""
    n, d = W @ num.double(), W @ den.double()
    return torch.where(d > 0, n / d.clamp(min=1e-300), torch.full_like(n, float("nan")))


def ratio_intervals(num: Tensor, den: Tensor, against: tuple[Tensor, Tensor] | None = None, *,
                    relative: bool = False) -> Tensor:
    """[m, 2]: the 95% interval of each ratio sum(num[:, i]) / sum(den[:, i]) over resampled samples.

    num, den [S, m]: per-sample numerators and denominators. With `against` (num, den of a second
    draft or method on the same S samples, in the same order) the interval is of this ratio minus
    that one (`relative`: divided by it, as a speedup), both from the same resamples. nan where
    fewer than 2 samples or no resample defines the ratio.
    """
    S, m = num.shape
    if S < 2:
        return torch.full((m, 2), float("nan"), dtype=torch.float64)
    W = resample_weights(S)
    r = _ratios(W, num, den)
    if against is not None:
        other = _ratios(W, *against)
        r = r / other if relative else r - other
    tail = (1 - LEVEL) / 2
    q = torch.tensor([tail, 1 - tail], dtype=torch.float64)
    return torch.nanquantile(r, q, dim=0).T  # [m, 2]


def pooled(num: Tensor, den: Tensor) -> list[float]:
    """Each column's ratio of sums over the samples (nan where its denominator sums to 0)."""
    return [n / d if d else float("nan") for n, d in zip(num.sum(0).tolist(), den.sum(0).tolist())]


def shifted_intervals(num: Tensor, den: Tensor, plus: list[float]) -> list[list[float]]:
    """`ratio_intervals` as [lo, hi] lists, column i moved by plus[i] (a tau is 1 + its ratio)."""
    return [[p + lo, p + hi] for p, (lo, hi) in zip(plus, ratio_intervals(num, den).tolist())]


def paired_differences(num: Tensor, den: Tensor, num_b: Tensor, den_b: Tensor) -> list[dict]:
    """Per column: {"difference": this pooled ratio minus the other's, "ci95": its interval}, both
    read off one set of resamples (`ratio_intervals` with `against`). The other's samples are the
    same samples, in the same order."""
    bounds = ratio_intervals(num, den, against=(num_b, den_b)).tolist()
    return [{"difference": a - b, "ci95": ci} for a, b, ci in zip(pooled(num, den), pooled(num_b, den_b), bounds)]
