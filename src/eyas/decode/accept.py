"""Acceptance: which draft tokens stand after the target has scored them, and the next token.

Greedy acceptance reproduces the target's own greedy decoding; the two sampling rules leave the
target's sampling distribution exactly as it is (lossless), for any draft.
"""

from __future__ import annotations

from torch import Tensor

from eyas.decode.sampling import Sampling, draw, uniform
from eyas.decode.tree import DraftTree


def accept_greedy(tree: DraftTree, logits: Tensor) -> tuple[list[int], int]:
    """Greedy verification: follow the child equal to the target's argmax while there is one.

    logits [N+1, V]. Returns (accepted nodes, root excluded; the next token = argmax at the last
    accepted node). The output is the target's own greedy continuation, token for token.
    """
    best = logits.argmax(dim=-1).tolist()  # [N+1]: the target's choice after each node
    tokens = tree.tokens.tolist()
    path, node = [], 0
    while True:
        match = [c for c in tree.children(node) if tokens[c] == best[node]]
        if not match:
            return path, best[node]
        node = match[0]
        path.append(node)


def accept_chain_sampling(tree: DraftTree, p: Tensor, s: Sampling) -> tuple[list[int], int]:
    """Speculative sampling (Leviathan et al. 2023, Theorem 1): the output is distributed as p.

    p [k+1, V]: target distributions after the root and after each draft token; tree.q[j] [V]: the
    draft distribution d_j was drawn from. For j = 1..k: accept d_j w.p. min(1, p_{j-1}(d_j) /
    q_j(d_j)) (q >= p: accept w.p. p/q; q < p: always). At the first rejection the next token is
    drawn from normalize(max(p_{j-1} - q_j, 0)); if all k are accepted, a bonus token from p_k.
    """
    assert tree.q is not None and tree.is_chain
    tokens = tree.tokens.tolist()
    path = []
    for j in range(1, len(tokens)):
        x = tokens[j]
        if uniform(s, p.device) < float(p[j - 1, x] / tree.q[j, x]):
            path.append(j)
            continue
        residual = (p[j - 1] - tree.q[j]).clamp(min=0)  # [V]
        if float(residual.sum()) <= 0.0:
            # Only reachable through rounding: p(x) < q(x) implies positive residual mass elsewhere.
            residual = p[j - 1]
        return path, draw(residual, s)
    return path, draw(p[len(tokens) - 1], s)


def accept_tree_sampling(tree: DraftTree, p: Tensor, s: Sampling) -> tuple[list[int], int]:
    """Lossless sampling over a tree of deterministically chosen candidates (EAGLE-2).

    p [N+1, V]: target distribution after each node. At the current node, with residual r = p:
    try each child c (distinct tokens) in turn: accept w.p. r(c) / sum(r); on rejection r(c) = 0.
    Accepted: move to c and start over with r = p_c. No child accepted (or a leaf): the next token
    is drawn from r / sum(r).

    Why this is exact: it is speculative sampling with q = a point mass on the candidate. At a
    node, P(emit c_1) = p(c_1). Given c_1 rejected (prob 1 - p(c_1)), r is p without c_1,
    renormalised, so P(emit c_2) = (1 - p(c_1)) * p(c_2) / (1 - p(c_1)) = p(c_2), and so on; a token
    y that is no candidate is emitted w.p. (1 - sum_j p(c_j)) * p(y) / (1 - sum_j p(c_j)) = p(y).
    So every emitted token is drawn from p given the tokens before it, with fresh randomness, as in
    plain sampling; the candidates depend only on the prefix, never on these draws. By induction
    over depth the whole sequence is distributed as under plain sampling. (sum(r) is computed from
    r itself, so the last candidate holding all remaining mass is accepted with probability 1.)
    """
    tokens = tree.tokens.tolist()
    path, node = [], 0
    while True:
        r = p[node].clone()  # [V]
        for c in tree.children(node):
            x = tokens[c]
            if uniform(s, p.device) < float(r[x] / r.sum()):
                break
            r[x] = 0.0
        else:
            return path, draw(r, s)
        node = c
        path.append(node)

