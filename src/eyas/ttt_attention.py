"""Training-time-test attention as EAGLE computes it: step-0 keys up to t, plus t's own later steps.

In the TTT unroll (`Drafter.forward_ttt`) step j at position t attends to the step-0 keys of the
positions <= t in its document, and to the keys of the SAME position t at steps 1..j: each of those
drafted a token that only the chain at t contains. Written as one boolean mask over every step's keys
(`eyas.drafter.ttt_mask`), step j scores (j + 1) * T keys per query, of which only t + 1 + j can be
attended: the unroll costs steps^2 * T^2. EAGLE (`cnets.py`, its `cache_hidden`) and SpecForge score
the step-0 keys under the causal mask and each later step's keys on the diagonal only (one column per
step), and take one softmax over both: steps * T^2, and no steps * T^2 mask.

The scores are computed a block of queries at a time, each block against the step-0 keys from the
first one any of its queries may see (its earliest document start) up to its last query: the causal
upper triangle and earlier documents are never computed, and a block's scores stay small enough to
be cached between the softmax and the matmuls around it (a whole [T, T] score matrix is not).

`TTTCache` keeps the keys that way; it takes `DraftCache`'s place in `Drafter.forward` during the
unroll, and `Attention` hands it the step's queries (`attend`) instead of appending to a cache.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

QUERY_BLOCK = 256  # queries scored together; the block's [heads, 256, keys] fp32 scores stay cache-sized


class TTTCache:
    """The rotated keys and values of one TTT unroll, per layer and step: step 0's, then each later step's.

    `mask` bool [B or 1, T, T] is the step-0 mask (causal, per document): position t may see key s.
    With a sliding `window`, step j at t (rope position t + j) sees only the step-0 keys s with
    t + j - s < window, as a chain drafted at t sees its context when served.
    """

    def __init__(self, num_layers: int, mask: Tensor, window: int | None = None):
        self.k: list[list[Tensor]] = [[] for _ in range(num_layers)]
        self.v: list[list[Tensor]] = [[] for _ in range(num_layers)]
        self.mask, self.window = mask, window
        self.blocks = [(a, b, lo, b) for a, b, lo in query_blocks(mask, QUERY_BLOCK)]
        self.later = (mask, self.blocks)  # steps 1..: their queries' step-0 mask rows and blocks
        self.rows = torch.arange(mask.shape[-2], device=mask.device)  # the queries' positions
        self.length = 0  # positions processed, all steps together (Drafter.forward advances it)

    def select_rows(self, rows: Tensor, within: Tensor | None = None) -> None:
        """From the next step on, queries (and their own keys) are the positions `rows` [R]
        (increasing) only: each is scored against the same step-0 keys, in the same key range, as in
        the full unroll, so its attention is computed exactly as there. `within` (bool over the rows
        selected before) narrows an earlier selection: the later steps' keys kept are those rows'."""
        bounds = torch.searchsorted(rows, torch.tensor([a for a, *_ in self.blocks] + [self.mask.shape[-2]],
                                                       device=rows.device)).tolist()
        blocks = [(ra, rb, lo, hi) for (_, _, lo, hi), ra, rb in zip(self.blocks, bounds, bounds[1:]) if rb > ra]
        self.later, self.rows = (self.mask[:, rows], blocks), rows
        if within is not None:
            for ks, vs in zip(self.k, self.v):
                ks[1:] = [k[:, :, within] for k in ks[1:]]
                vs[1:] = [v[:, :, within] for v in vs[1:]]

    def attend(self, layer_idx: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store this step's k/v [B, n_kv, T, D] for `layer_idx`, then `ttt_attention` for its queries."""
        self.k[layer_idx].append(k)
        self.v[layer_idx].append(v)
        ks, vs = self.k[layer_idx], self.v[layer_idx]
        step = len(ks) - 1
        mask, blocks = (self.mask, self.blocks) if step == 0 else self.later
        if self.window is not None:  # step j at t is at t + j: its step-0 keys and its own steps s (at t + s)
            keys = torch.arange(self.mask.shape[-1], device=mask.device)
            mask = mask & in_window((self.rows if step else keys) + step, keys, self.window)
            near = [s for s in range(1, step + 1) if step - s < self.window]
            ks, vs = [ks[0], *(ks[s] for s in near)], [vs[0], *(vs[s] for s in near)]
        return ttt_attention(q, ks, vs, mask, blocks)


def in_window(queries: Tensor, keys: Tensor, window: int | None) -> Tensor | bool:
    """bool [..., Q, K]: key position k is within a sliding `window` of query position q, q - k < window
    (the query itself and the window - 1 positions before it, as Hugging Face's sliding-window masks
    and vLLM's attention count it); True without a window. Every mask of the draft (decoding's causal
    and tree masks, the TTT unroll's) takes its window from here. queries [..., Q], keys [..., K]."""
    if window is None:
        return True
    return queries[..., :, None] - keys[..., None, :] < window


def query_blocks(mask: Tensor, size: int) -> list[tuple[int, int, int]]:
    """(first query, end query, first key) per block of `size` queries: keys before the first key
    are masked for every query of the block (every row sees at least itself, so argmax finds it)."""
    T = mask.shape[-2]
    first_key = mask.to(torch.uint8).argmax(-1).amin(0)  # [T]: the earliest key position t may see
    starts = list(range(0, T, size))
    lows = [first_key[a : a + size].min() for a in starts]
    return [(a, min(T, a + size), int(lo)) for a, lo in zip(starts, torch.stack(lows).tolist())]


def ttt_attention(q: Tensor, ks: list[Tensor], vs: list[Tensor], mask: Tensor,
                  blocks: list[tuple[int, int, int, int]]) -> Tensor:
    """Step j's attention: q [B, nh, T, D]; ks/vs the keys/values of steps 0..j, step 0's [B, n_kv, S, D],
    later steps' [B, n_kv, T, D] (the queries' own); mask bool [B or 1, T, S] over the step-0 keys;
    blocks (first query, end query, first key, end key) -> [B, nh, T, D].

    softmax(cat(q k_0^T masked, q_t . k_s[t] for s = 1..j) / sqrt(D)), in fp32, over the keys each
    block needs. Query heads are grouped by their kv head (`repeat_kv`'s order: head h reads kv head
    h // n_rep), so keys and values are never copied per query head.
    """
    B, nh, T, D = q.shape
    n_kv = ks[0].shape[1]
    qg = (q / math.sqrt(D)).reshape(B, n_kv, nh // n_kv, T, D)  # [B, n_kv, n_rep, T, D]
    k0, v0 = ks[0][:, :, None], vs[0][:, :, None]  # [B, n_kv, 1, T, D]
    diagonal = [(qg.float() * k[:, :, None].float()).sum(-1, keepdim=True) for k in ks[1:]]  # j x [.., T, 1]
    out = []
    for a, b, lo, hi in blocks:
        scores = (qg[..., a:b, :] @ k0[..., lo:hi, :].transpose(-1, -2)).float()  # [.., b - a, hi - lo]
        scores = scores.masked_fill(~mask[:, None, None, a:b, lo:hi], float("-inf"))
        probs = torch.softmax(torch.cat([scores, *(d[..., a:b, :] for d in diagonal)], dim=-1), dim=-1)
        y = probs[..., : hi - lo].to(v0.dtype) @ v0[..., lo:hi, :]
        for s, v in enumerate(vs[1:]):
            y = y + probs[..., hi - lo + s, None].to(v.dtype) * v[:, :, None, a:b]
        out.append(y)
    return torch.cat(out, dim=-2).reshape(B, nh, T, D)
