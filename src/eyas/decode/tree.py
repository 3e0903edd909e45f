"""The draft of one round: a tree of candidate tokens under the current token (a chain is the tree
with one child per node), and the attention mask that lets the target verify all of it at once."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class DraftTree:
    """Tokens to verify in one round: node 0 is the root (x_n), every other node a draft token.

    A chain is the tree in which node i's parent is i-1. Nodes are ordered parents first, so node
    i's ancestors all have smaller indices.
    """

    tokens: Tensor  # [N+1] target-vocab ids; tokens[0] is the root x_n
    parents: list[int]  # parents[0] = -1
    depths: list[int]  # depths[0] = 0; node i is the token at sequence position n + depths[i]
    q: Tensor | None = None  # [N+1, V] sampled chains only: q[i] = the draft distribution node i was drawn from

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, i: int) -> list[int]:
        return [c for c, p in enumerate(self.parents) if p == i]


def chain_tree(tokens: Tensor, q: Tensor | None = None) -> DraftTree:
    """The chain tokens[0] (the root) -> tokens[1] -> ...: node i's parent is i - 1."""
    n = len(tokens)
    return DraftTree(tokens, list(range(-1, n - 1)), list(range(n)), q)


def root_only(token: int, device: torch.device) -> DraftTree:
    """An empty draft: the round verifies x_n alone and yields one token (the target-only step)."""
    return DraftTree(torch.tensor([token], device=device), [-1], [0])


def tree_ancestors(tree: DraftTree) -> Tensor:
    """Bool [N+1, N+1]: row i marks node i's ancestors, itself included (for a chain: causal)."""
    N1 = len(tree.parents)
    ancestors = torch.eye(N1, dtype=torch.bool)  # [N+1, N+1]
    for i in range(1, N1):  # parents come first, so their rows are complete
        ancestors[i] |= ancestors[tree.parents[i]]
    return ancestors


def tree_attention_mask(tree: DraftTree, n: int, dtype: torch.dtype, device: torch.device,
                        window: int | None = None, chunk: int | None = None) -> Tensor:
    """Additive mask [1, 1, N+1, n+N+1]: node i sees the n cached positions and its ancestors (itself
    included); -inf (dtype min) elsewhere. The verify forward's queries are the tree nodes. With a sliding
    `window`, a node at position p sees only keys at positions past p - window (transformers' overlay); with a
    `chunk` (Llama 4's chunked attention), only keys of p's own chunk, from p // chunk * chunk on."""
    ancestors = tree_ancestors(tree)
    allowed = torch.cat([torch.ones(len(tree.parents), n, dtype=torch.bool), ancestors], dim=1)
    queries = n + torch.tensor(tree.depths)
    keys = torch.cat([torch.arange(n), queries])
    if window is not None:
        allowed &= keys[None, :] > queries[:, None] - window
    if chunk is not None:
        allowed &= keys[None, :] >= queries[:, None] // chunk * chunk
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)
