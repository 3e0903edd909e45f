"""The acceptance figures of teacher-forced predictions: counts per sample, ratios, and their intervals.

Every figure `eyas eval` reports is a ratio of counts that add up over chain starts: accepted chains
over chains tried at a depth, accepted tokens over chain starts, answer tokens inside the draft vocab
over answer tokens. So each sample is reduced to its counts (`sample_counts`), the report is made
from their sums (`figures`), and the same per-sample counts give each headline figure's 95% interval
over resampled samples (`eyas.intervals`), alone or as the difference from a second draft measured
on the same samples (`difference`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from eyas.intervals import how_made, paired_differences, shifted_intervals


def top_ids(scores: Tensor, k: int) -> Tensor:
    """[..., k] the ids of the k largest scores, largest first, ties to the lower id as `argmax` breaks
    them (decoding's greedy draft; its trees pick their candidates with this too): `topk` breaks ties by k,
    so in bf16, where ties are common, the chain's first token would change with the tree's top-k.

    The first k of a stable descending sort, without sorting the vocabulary (that took 6x the head's
    own product over a 32000-token draft vocab, bf16 on a 2-core AMX Xeon): the top m scores, m past the k-th place and every
    score tied with it (k + 1 unless ties straddle it, then doubled until none does), taken in id
    order, then sorted stably by score."""
    V = scores.shape[-1]
    k = min(k, V)
    if scores.numel() == 0 or k == 0:
        return scores.new_zeros((*scores.shape[:-1], k), dtype=torch.long)
    m = min(k + 1, V)
    while True:
        values, ids = scores.topk(m, dim=-1)
        if m == V or not bool((values[..., -1] == values[..., k - 1]).any()):
            break  # every score tied with the k-th largest is among the top m
        m = min(2 * m, V)
    ids = ids.sort(dim=-1).values  # the candidates in id order: a stable sort then breaks ties by id
    order = scores.gather(-1, ids).sort(dim=-1, descending=True, stable=True).indices[..., :k]
    return ids.gather(-1, order)


def accepted_chains(pred: Tensor, truth: Tensor, valid: Tensor) -> Tensor:
    """[N, K] bool: every drafted token 0..j of the chain from start n was right (and known)."""
    return torch.cummin(((pred == truth) & valid).int(), dim=1).values.bool()


def chain_counts(pred: Tensor, truth: Tensor, valid: Tensor, ended: Tensor) -> dict[str, Tensor]:
    """The counts behind `chain_acceptance` (additive over starts, so over samples): hit [K], the
    starts accepted through depth j; reached [K], those accepted through j - 1 and valid at j; run
    [K], accepted tokens within the first k, over every start; starts, how many there are; cut, the
    chains still accepted where their truth turns unknown (neither valid nor `ended`)."""
    accepted = accepted_chains(pred, truth, valid)
    alive = torch.ones_like(accepted)
    alive[:, 1:] = accepted[:, :-1]  # accepted through depth j - 1: hit[j] counts inside reached[j]
    return {"hit": accepted.sum(0), "reached": (alive & valid).sum(0), "run": accepted.sum(0).cumsum(0),
            "starts": torch.tensor(accepted.shape[0]), "cut": (alive & ~valid & ~ended).any(1).sum()}


def chain_acceptance(pred: Tensor, truth: Tensor, valid: Tensor, ended: Tensor) -> dict:
    """Per-depth conditional acceptance and greedy chain tau from teacher-forced predictions.

    pred/truth/valid/ended: [N, K] (target-vocab ids; N chain starts; K depths; `valid`: the target's
    token at that depth is known; `ended`: the depth drafts past the answer's end). accepted[n, j] = all
    drafted tokens 0..j were right and known. Returns acceptance_by_depth (P(depth j right | depths < j
    right), depth 1 first), tau_chain ({"1": .., "K": ..}: 1 + expected accepted tokens with k drafted,
    the bonus token included), chain_starts, chains_cut and the counts behind them.

    Every tau_chain[k] is over every chain start, each chain cut where its answer ends, as decoding cuts
    it, and where the stored answer leaves the target's greedy path (beyond that the target's tokens are
    unknown: a sampled answer, or a near-tie rounded otherwise than the verdict): what a start adds to
    tau(k) depends on its first k depths only. So tau(1) is 1 + depth-1 acceptance, tau never falls as k
    grows, and tau(k) is one figure at any depth measured >= k: eval (--depth 8), the doctor and
    training's held-out report (depth 5) agree. A set of starts known through the deepest depth made
    all three move with the depth (tau(5) 2.40 at depth 5, 2.61 at depth 8 on three 24-token answers with
    three near-ties). The chains cut where the truth turns unknown (`chains_cut`) count the tokens they
    accepted up to there: a lower bound for their start.
    """
    return _chain_report(chain_counts(pred, truth, valid, ended))


def _ratio(num: float, den: float, plus: float = 0.0) -> float:
    return plus + num / den if den else float("nan")


def _chain_report(c: dict[str, Tensor]) -> dict:
    hit, reached, run, n = c["hit"].tolist(), c["reached"].tolist(), c["run"].tolist(), int(c["starts"])
    return {"acceptance_by_depth": [_ratio(h, r) for h, r in zip(hit, reached)], "depth_counts": reached,
            "tau_chain": {str(k): _ratio(run[k - 1], n, 1.0) for k in range(1, len(run) + 1)}, "chain_starts": n,
            "chains_cut": int(c["cut"])}


def tree_counts(topk_ids: Tensor, truth: Tensor, valid: Tensor, depth: int) -> Tensor:
    """[2]: the tokens a top-k tree of `depth` levels accepts along the target's greedy path, summed
    over every start (cut as `chain_acceptance` cuts chains), and how many starts there are (`tree_tau`)."""
    hit = (topk_ids[:, :depth] == truth[:, :depth, None]).any(-1) & valid[:, :depth]
    accepted = torch.cummin(hit.int(), dim=1).values
    return torch.stack([accepted.sum(), torch.tensor(accepted.shape[0])])


def tree_tau(topk_ids: Tensor, truth: Tensor, valid: Tensor, depth: int) -> float:
    """Tau of a top-k tree of `depth` levels, measured along the target's greedy path.

    topk_ids: [N, K, k] the draft's k best target-vocab ids at each depth, teacher-forced along the
    true path. The true token survives level j when it is among the k candidates of its parent at
    every level up to j. This is what a full top-k tree of that depth accepts; an EAGLE-2 dynamic
    tree with a smaller node budget accepts at most this (an upper bound for it).
    """
    accepted, starts = tree_counts(topk_ids, truth, valid, depth).tolist()
    return _ratio(accepted, starts, 1.0)


def sample_counts(part: dict[str, Tensor], tree_depth: int) -> dict[str, Tensor]:
    """One sample's counts from `eyas.evaluate.sample_predictions`' output: `chain_counts`, the tree's
    (`tree_counts`: tree_hit, tree_starts) and the draft vocab's (in_vocab, positions)."""
    tree = tree_counts(part["topk"], part["truth"], part["valid"], tree_depth)
    chain = chain_counts(part["pred"], part["truth"], part["valid"], part["ended"])
    return chain | {"tree_hit": tree[0], "tree_starts": tree[1], "in_vocab": part["in_vocab"].sum(),
                    "positions": torch.tensor(part["truth"].shape[0])}


def stacked(counts: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    """Per-sample counts as one [S, ...] tensor per name."""
    return {k: torch.stack([c[k] for c in counts]) for k in counts[0]}


def figures(counts: dict[str, Tensor], tree_top_k: int, tree_depth: int) -> dict:
    """The report's figures from `stacked` counts: tokens, acceptance_by_depth, depth_counts,
    tau_chain, tau_tree and coverage, and ci95, their 95% intervals over resampled samples."""
    total = {k: v.sum(0) for k, v in counts.items()}
    tree_hit, tree_starts = int(total["tree_hit"]), int(total["tree_starts"])
    return {"tokens": int(total["positions"]), **_chain_report(total),
            "tau_tree": {"top_k": tree_top_k, "depth": tree_depth, "tau": _ratio(tree_hit, tree_starts, 1.0)},
            "coverage": _ratio(int(total["in_vocab"]), int(total["positions"])),
            "ci95": _intervals(counts)}


def _headline(c: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """num, den [S, 2 + K]: depth-1 acceptance, tree tau - 1 and chain tau(k) - 1 for k = 1..K."""
    S, K = c["run"].shape
    num = torch.cat([c["hit"][:, :1], c["tree_hit"][:, None], c["run"]], dim=1)
    den = torch.cat([c["reached"][:, :1], c["tree_starts"][:, None], c["starts"][:, None].expand(S, K)], dim=1)
    return num, den


def _named(values: list) -> dict:
    """Values in `_headline`'s order (one per figure) under the report's names."""
    return {"acceptance_depth1": values[0], "tau_tree": values[1],
            "tau_chain": {str(k): values[1 + k] for k in range(1, len(values) - 1)}}


def _intervals(c: dict[str, Tensor]) -> dict:
    """The report's ci95: the headline figures' 95% intervals, with how they were made."""
    num, den = _headline(c)
    bounds = shifted_intervals(num, den, [0.0] + [1.0] * (num.shape[1] - 1))  # tau = 1 + the ratio
    return how_made(c["positions"].shape[0]) | _named(bounds)


def difference(counts: dict[str, Tensor], other: dict[str, Tensor]) -> dict:
    """The headline figures of `counts` minus those of `other` (`stacked` counts of a second draft on
    the same samples, in the same order), each with the 95% interval of the difference, both drafts
    read off one set of resamples."""
    return _named(paired_differences(*_headline(counts), *_headline(other)))
