"""Offline acceptance: measure a draft standalone against the target's greedy choices.

Alignment (the one used everywhere in eyas, see `eyas.data.shift_for_draft`): at position t the
draft reads target features g_t (prefix x_0..x_t) and token x_{t+1}; its step j predicts the token
after x_{t+1+j}. The target's greedy choice there is y_{t+1+j} = argmax(logits_{t+1+j}).

Why one teacher-forced unroll is exact for greedy chains: a chain is accepted up to depth j only if
every drafted token before j equalled the target's choice. On self-distilled greedy data the stored
tokens ARE those choices, so along an accepted chain the draft's own inputs equal the teacher-forced
inputs and the free-running draft computes exactly what the teacher-forced unroll computes. Where
the stored token is not the target's greedy choice (prompt text, sampled data) the chain beyond it
is unknown and is not counted (`valid` is False there).
"""

from __future__ import annotations

import torch


def chain_truth(input_ids: torch.Tensor, greedy: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ground truth and validity for chains of `depth` draft tokens from every position.

    input_ids: [T] stored tokens x; greedy: [T] y_s = target argmax after x_0..x_s.
    Returns truth [T, depth] with truth[t, j] = y_{t+1+j}, and valid [T, depth]: the position
    exists and the target's answer at depth j is known. Depth 0 is always known (y_{t+1} is
    stored); depth j > 0 continues past the stored x_{t+1+j}, which the accepted draft token
    replaces, so that token must be the target's greedy choice (x_{t+1+j} == y_{t+j}).
    """
    T = input_ids.shape[0]
    idx = torch.arange(T).unsqueeze(1) + 1 + torch.arange(depth).unsqueeze(0)  # [T, depth]
    inside = idx < T
    idx_c = idx.clamp(max=T - 1)
    truth = greedy[idx_c]
    # x_s is "on the greedy path" when x_s == y_{s-1}
    on_path = torch.zeros(T, dtype=torch.bool)
    on_path[1:] = input_ids[1:] == greedy[:-1]
    known = on_path[idx_c]
    known[:, 0] = True
    valid = inside & torch.cummin(known.int(), dim=1).values.bool()  # a running AND along depth
    return truth, valid


def chain_acceptance(pred: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor) -> dict:
    """Per-depth conditional acceptance and greedy chain tau from teacher-forced predictions.

    pred/truth/valid: [N, K] (target-vocab ids; N chain starts; K depths). A chain start counts
    for depth j only if it is valid there. accepted[n, j] = all drafted tokens 0..j were right.
    Returns acceptance_by_depth (P(depth j right | depths < j right), depth 1 first), tau_chain
    ({"1": .., "K": ..}: 1 + expected accepted tokens with k drafted, the bonus token included)
    and the counts behind them.
    """
    K = pred.shape[1]
    correct = (pred == truth) & valid
    accepted = torch.cummin(correct.int(), dim=1).values.bool()  # [N, K]
    # conditional acceptance at depth j: among starts accepted through j-1 and valid at j
    reached = torch.ones_like(accepted)
    reached[:, 1:] = accepted[:, :-1]
    reached &= valid
    by_depth, counts = [], []
    for j in range(K):
        n = int(reached[:, j].sum())
        counts.append(n)
        by_depth.append(float(accepted[:, j][reached[:, j]].float().mean()) if n else float("nan"))
    # tau(k) = 1 + E[accepted tokens among the first k]; only starts valid through depth k count
    tau = {}
    for k in range(1, K + 1):
        rows = valid[:, k - 1]
        tau[str(k)] = float(1 + accepted[rows, :k].sum(1).float().mean()) if rows.any() else float("nan")
    return {"acceptance_by_depth": by_depth, "depth_counts": counts, "tau_chain": tau}


def tree_tau(topk_ids: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor, depth: int) -> float:
    """Tau of a top-k tree of `depth` levels, measured along the target's greedy path.

    topk_ids: [N, K, k] the draft's k best target-vocab ids at each depth, teacher-forced along the
    true path. The true token survives level j when it is among the k candidates of its parent at
    every level up to j. This is what a full top-k tree of that depth accepts; an EAGLE-2 dynamic
    tree with a smaller node budget accepts at most this (an upper bound for it).
    """
    hit = (topk_ids[:, :depth] == truth[:, :depth, None]).any(-1) & valid[:, :depth]
    accepted = torch.cummin(hit.int(), dim=1).values
    rows = valid[:, depth - 1]
    return float(1 + accepted[rows].sum(1).float().mean()) if rows.any() else float("nan")
