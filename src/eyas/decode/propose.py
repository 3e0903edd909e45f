"""Drafting: the drafter reads the target's new features, then proposes a chain or an EAGLE-2 tree.

`Drafting` is the drafter's side of one generation (its cache, the features it has not read yet);
`draft_step0`, `propose_chain` and `propose_tree` are the steps it runs each round.

Positions (see eyas.decode): the draft entry at position t pairs the target feature g_t with the
token x_{t+1} and predicts x_{t+2}; a draft node at depth d is x_{n+d}, read by the draft at rope
position n+d-1. Every entry a proposal adds to the draft cache is speculative: the loop crops the
cache back to the verified positions after each round.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eyas.acceptance import top_ids
from eyas.decode.sampling import Sampling, draw, warp_probs
from eyas.decode.static_cache import StaticKV
from eyas.decode.tree import DraftTree, chain_tree
from eyas.drafter import DraftCache, Drafter
from eyas.ttt_attention import in_window


def draft_cache(drafter: Drafter, max_len: int) -> StaticKV:
    """The draft's KV cache for one generation (decoding needs no gradients, so a static one)."""
    c = drafter.contract
    return StaticKV(c.num_hidden_layers, c.num_key_value_heads, c.head_dim, max_len, drafter.norm.weight.device)


def draft_step0(
    drafter: Drafter, cache: DraftCache | StaticKV, features: Tensor, next_ids: Tensor, n: int
) -> tuple[Tensor, Tensor]:
    """The draft reads the positions it has not seen: t = n-P .. n-1, each g_t with x_{t+1}.

    features [1, P, A*H_t], next_ids [1, P]. Their step-0 entries stay in the cache for all later
    rounds. Returns the output at position n-1, which predicts x_{n+1}: logits [1, 1, Vd] and
    hidden [1, 1, H] (the input hidden of the next draft step).
    """
    P = next_ids.shape[1]
    assert cache.length == n - P, "the draft cache must hold exactly the positions before the new ones"
    dtype = drafter.norm.weight.dtype  # not fc's: decoding swaps the linears for packed ones
    hidden = drafter.combine(features.to(dtype))  # [1, P, A*H_t] -> [1, P, H]
    positions = torch.arange(n - P, n, device=next_ids.device)[None]  # [1, P]
    logits, hidden = drafter(hidden, next_ids, positions, cache=cache)  # causal over cache + new
    return logits[:, -1:], hidden[:, -1:]


def propose_chain(
    drafter: Drafter, cache: DraftCache | StaticKV, logits: Tensor, hidden: Tensor, root: Tensor, n: int, k: int,
    s: Sampling, vocab_map: Tensor, vocab_size: int,
) -> DraftTree:
    """k draft tokens, one draft step each; step j reads d_j = x_{n+j} at rope position n+j-1.

    logits [1, 1, Vd] / hidden [1, 1, H]: the step-0 output at n-1 (predicts d_1). Greedy: d_j =
    argmax. Sampling: d_j ~ q_j = warp(draft logits), recorded over the TARGET vocab (zero outside
    the draft vocab) for the acceptance test. Each step attends causally to the cache, which is
    exactly the training-time-test pattern: step-0 entries up to n-1, then the chain's own entries.
    """
    tokens, qs = [root], []
    for j in range(1, k + 1):
        if s.greedy:
            d = logits[0, -1].argmax()
        else:
            q = warp_probs(logits[0, -1], s)  # [Vd]
            d = torch.tensor(draw(q, s), device=q.device)
            qs.append(q.new_zeros(vocab_size).index_copy_(0, vocab_map, q))  # [Vd] -> [V]
        x = drafter.to_target_ids(d).view(1, 1)  # [1, 1] target id of d_j
        tokens.append(x.view(1))
        if j < k:  # the last draft token is only verified, never read by the draft
            position = torch.full((1, 1), n + j - 1, device=x.device)
            logits, hidden = drafter(hidden, x, position, cache=cache)
    q = None if s.greedy else torch.stack([torch.zeros_like(qs[0])] + qs)  # row 0: the root, not drafted
    return chain_tree(torch.cat(tokens), q)


def propose_tree(
    drafter: Drafter, cache: DraftCache | StaticKV, logits: Tensor, hidden: Tensor, root: Tensor, n: int,
    depth: int, top_k: int, budget: int,
) -> DraftTree:
    """EAGLE-2 dynamic tree: expand the best nodes of each level, verify the best `budget` nodes.

    Score of a node = cumulative draft log-prob of its path (sum of log q along it). Level 1 = the
    top_k tokens after the root. For each further level the current frontier (top_k nodes) is read
    by the draft in ONE step; every frontier node gets its top_k children as candidates, and the
    top_k candidates by score form the next frontier. Finally the `budget` best candidates of all
    levels are kept. Scores never increase along a path (log q <= 0), and ties are broken by
    creation order (parents are created first), so the kept set contains every kept node's parent.
    Candidates are chosen deterministically: `accept_tree_sampling` relies on that.
    """
    dev = logits.device
    K = min(top_k, logits.shape[-1])
    logq = logits[0, -1].float().log_softmax(-1)  # [Vd]
    ids = top_ids(logq, K)  # level 1: [K], ties to the lower id as the chain's argmax and eval's tree take them
    score = logq[ids]
    cand_ids, cand_score = [ids], [score]  # draft ids and scores of every candidate, level by level
    cand_parent = [torch.full((K,), -1, device=dev)]  # candidate index of the parent; -1 = the root
    cand_depth = [torch.full((K,), 1, device=dev)]
    frontier = torch.arange(K, device=dev)  # candidate indices of the nodes to expand
    front_hidden = hidden.expand(1, K, -1)  # [1, K, H]: every level-1 node's parent is the root
    front_slots = torch.zeros(K, 0, dtype=torch.bool, device=dev)  # [K, S]: ancestors' draft-cache tree slots
    eye = torch.eye(K, dtype=torch.bool, device=dev)
    for level in range(2, depth + 1):
        # the frontier is at depth level-1: token x_{n+level-1}, read at rope position n+level-2
        x = drafter.to_target_ids(torch.cat(cand_ids)[frontier])[None]  # [1, K]
        positions = torch.full((1, K), n + level - 2, device=dev)
        # each frontier node sees the step-0 entries (< n), its ancestors' tree entries, and itself
        assert cache.length == n + front_slots.shape[1]
        mask = torch.cat([torch.ones(K, n, dtype=torch.bool, device=dev), front_slots, eye], dim=1)
        if drafter.contract.sliding_window is not None:  # tree slots: K per level, read at n, n + 1, ...
            keys = torch.cat([torch.arange(n, device=dev), n + torch.arange(front_slots.shape[1] + K, device=dev) // K])
            mask = mask & in_window(positions[0], keys, drafter.contract.sliding_window)
        logits, h = drafter(front_hidden, x, positions, cache=cache, attn_mask=mask[None])
        logq = logits[0].float().log_softmax(-1)  # [K, Vd]
        child_ids = top_ids(logq, K)  # [K, K]: top_k children of each frontier node
        child_logq = logq.gather(-1, child_ids)
        child_score = torch.cat(cand_score)[frontier][:, None] + child_logq  # [K, K]
        n_cand = sum(len(c) for c in cand_ids)
        cand_ids.append(child_ids.flatten())
        cand_score.append(child_score.flatten())
        cand_parent.append(frontier.repeat_interleave(K))  # row r holds the children of frontier[r]
        cand_depth.append(torch.full((K * K,), level, device=dev))
        best = child_score.flatten().topk(K).indices  # [K]: the next frontier
        rows = best // K  # their parents' rows in this level
        front_hidden = h[:, rows]  # a child reads its parent's next hidden
        front_slots = torch.cat([front_slots, eye], dim=1)[rows]  # the parent's ancestors + the parent
        frontier = n_cand + best
    # keep the `budget` best: a stable sort on -score keeps creation order among equal scores
    keep = torch.sort(-torch.cat(cand_score), stable=True).indices[:budget]
    keep = keep.sort().values.tolist()  # creation order: parents before children
    node_of = {c: i + 1 for i, c in enumerate(keep)}  # candidate index -> tree node (root = 0)
    all_parents = torch.cat(cand_parent).tolist()
    parents = [-1] + [0 if all_parents[c] == -1 else node_of[all_parents[c]] for c in keep]
    keep_t = torch.tensor(keep, device=dev)
    tokens = drafter.to_target_ids(torch.cat(cand_ids)[keep_t])  # [N]
    depths = [0] + torch.cat(cand_depth)[keep_t].tolist()
    return DraftTree(torch.cat([root, tokens]), parents, depths)



class Drafting:
    """The drafter's side of one generation: its cache, what it has not read yet, each round's draft.

    `pending_features` / `pending_ids` hold the features g_t and tokens x_{t+1} the draft has not read
    (t from the cache's length to n-1): at first the whole prompt, later each round's accepted path.
    """

    def __init__(self, drafter: Drafter, prompt: Tensor, features: Tensor, first_token: int, max_len: int,
                 tree_shape: tuple[int, int, int] | None, s: Sampling, vocab_size: int):
        self.drafter, self.tree_shape, self.s, self.vocab_size = drafter, tree_shape, s, vocab_size
        self.vocab_map = drafter.to_target_ids(torch.arange(drafter.contract.draft_vocab_size, device=prompt.device))
        self.cache = draft_cache(drafter, max_len)
        self.pending_features = features  # [1, T, A*H_t]
        self.pending_ids = torch.cat([prompt[:, 1:], prompt.new_tensor([[first_token]])], dim=1)  # x_1 .. x_T

    def propose(self, root: Tensor, n: int, depth: int) -> DraftTree:
        """The round's draft under `root` (x_n, [1]), at most `depth` tokens deep."""
        logits, hidden = draft_step0(self.drafter, self.cache, self.pending_features, self.pending_ids, n)
        self.pending_features, self.pending_ids = self.pending_features[:, :0], self.pending_ids[:, :0]
        if self.tree_shape is None:
            tree = propose_chain(self.drafter, self.cache, logits, hidden, root, n, depth, self.s, self.vocab_map,
                                 self.vocab_size)
        else:
            tree = propose_tree(self.drafter, self.cache, logits, hidden, root, n, depth, *self.tree_shape[1:])
        self.cache.crop(n)  # drop the speculative entries; only verified positions stay
        return tree

    def commit(self, features: Tensor, accepted: list[int]) -> None:
        """The accepted path's features g_n .. g_{n+a} [1, a+1, A*H_t] and tokens x_{n+1} .. x_{n+a+1}."""
        self.pending_features = torch.cat([self.pending_features, features], dim=1)
        self.pending_ids = torch.cat([self.pending_ids, self.pending_ids.new_tensor([accepted])], dim=1)
