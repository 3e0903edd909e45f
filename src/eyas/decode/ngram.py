"""N-gram candidates (prompt lookup): text the answer is copying, proposed from the context itself.

Prompt-lookup decoding (Saxena 2023; transformers' `prompt_lookup_num_tokens`) matches the last n
tokens of the context (prompt + everything generated) against an earlier place in it and proposes
what followed there. eyas adds that continuation as one more branch of the round's draft tree, so a
single verify forward checks the drafter's candidates and the copied span together: on a rewrite or
an edit the tree accepts long copied runs, elsewhere the draft's branches still carry the round.
The branch is only a candidate: acceptance decides, so decoding stays lossless (for sampling, the
branch depends only on the prefix and earlier rounds, which `accept_tree_sampling` requires). Its
length follows its own recent acceptance (`BranchLength`).
"""

from __future__ import annotations

import torch

from eyas.decode.tree import DraftTree

MAX_N = 3  # the longest suffix matched; shorter ones are tried when it has no earlier occurrence


class NgramIndex:
    """Where each 1..MAX_N-gram of the context last occurred, updated as tokens are appended.

    An n-gram is indexed once a token follows it, so the context's own suffix never matches itself.
    """

    def __init__(self, tokens: list[int]):
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token that followed it
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for x in tokens:
            end = len(self.tokens)  # x goes here: every n-gram ending just before it is now followed
            for n in range(1, min(MAX_N, end) + 1):
                self.after[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(x)

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens that followed the latest earlier occurrence of the longest matching
        suffix (n = MAX_N down to 1); [] when none of them occurred before."""
        for n in range(min(MAX_N, len(self.tokens)), 0, -1):
            start = self.after.get(tuple(self.tokens[-n:]))
            if start is not None:
                return self.tokens[start : start + count]
        return []


class BranchLength:
    """How many copied tokens the next round proposes: as many as the last proposal got accepted plus
    one, doubled after a proposal accepted whole, between 1 and `cap`.

    Every proposed token is one more row in the verify forward, and on a CPU each row costs (more
    on AVX2 than with AVX-512), so a fixed length is a bet on the prompt: long pays on copying
    tasks, short on open-ended ones. Following the branch's own recent acceptance fits both. The
    length depends only on earlier rounds, so acceptance stays lossless (greedy and sampled alike).
    """

    def __init__(self, cap: int):
        self.cap = cap
        self.now = cap

    def update(self, proposed: list[int], accepted: list[int]) -> None:
        """After a round: `proposed` the branch's tokens, `accepted` the tokens the round accepted
        (the drafter's or the branch's; the bonus token excluded)."""
        if not proposed:
            return  # no earlier occurrence: nothing learned about copying
        run = next((i for i, (a, b) in enumerate(zip(proposed, accepted)) if a != b), min(len(proposed), len(accepted)))
        self.now = min(self.cap, 2 * self.now) if run == len(proposed) else max(1, min(self.cap, run + 1))


def add_branch(tree: DraftTree, branch: list[int]) -> tuple[DraftTree, int]:
    """The tree with `branch` (tokens following the root) merged in, and how many nodes were added.

    The branch follows existing nodes while their tokens agree, then continues as a chain of new
    nodes appended after the existing ones (parents keep coming first; siblings stay distinct).
    """
    assert tree.q is None, "a sampled chain is accepted by its q; it takes no other branch"
    tokens = tree.tokens.tolist()
    parents, depths = list(tree.parents), list(tree.depths)
    node = 0
    for i, x in enumerate(branch):
        same = next((c for c in tree.children(node) if tokens[c] == x), None)
        if same is None:
            fresh = branch[i:]
            for _ in fresh:
                parents.append(node)
                depths.append(depths[node] + 1)
                node = len(parents) - 1
            ids = torch.cat([tree.tokens, tree.tokens.new_tensor(fresh)])
            return DraftTree(ids, parents, depths, tree.q), len(fresh)
        node = same
    return tree, 0
