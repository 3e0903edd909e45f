"""Batches: which samples form each optimizer step, which of them each process takes, and how they pack.

`plan_epoch` cuts a seeded shuffle into global batches of about `batch_tokens` tokens (the plan
depends only on its arguments, so a resumed run finds its place by epoch and batch index);
`rank_share` splits a global batch over the DDP processes by length; `pack_batch` packs a process's
shifted samples into rows with document ids, so attention and labels never cross two samples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eyas.shift import label_ids


def plan_epoch(lengths: list[int], batch_tokens: int, seed: int, epoch: int, min_samples: int = 1) -> list[list[int]]:
    """Global batches of one epoch: sample indices in a seeded shuffle, cut every ~batch_tokens.

    A batch takes whole samples while they fit in `batch_tokens` (a longer sample is a batch of
    its own) and at least `min_samples` (the number of processes, so every rank gets one).
    A short last batch is merged into the one before. The plan depends only on the arguments, so a
    resumed run finds its place by (epoch, batch index). The epoch's seed is taken modulo 2**63, so
    every --seed up to 2**63 - 1 works and a small one shuffles as it always did.
    """
    g = torch.Generator().manual_seed((seed * 100_003 + epoch) % 2**63)
    batches: list[list[int]] = []
    current, tokens = [], 0
    for i in torch.randperm(len(lengths), generator=g).tolist():
        if current and tokens + lengths[i] > batch_tokens and len(current) >= min_samples:
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += lengths[i]
    if current:
        if len(current) < min_samples and batches:
            batches[-1] += current
        else:
            batches.append(current)
    return batches


def rank_share(batch: list[int], lengths: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's samples of a global batch: longest first, each to the least loaded rank."""
    loads, parts = [0] * world_size, [[] for _ in range(world_size)]
    for i in sorted(batch, key=lambda i: (-lengths[i], i)):
        r = min(range(world_size), key=lambda r: (loads[r], r))
        parts[r].append(i)
        loads[r] += lengths[i]
    return parts[rank]


def pack_batch(samples: list[dict[str, Tensor]], row_len: int) -> dict[str, Tensor]:
    """Pack shifted samples into rows of at most `row_len` positions (first fit, in the given order).

    Returns [B, T] tensors (T = the longest row) and features [B, T, A*H] / target_hidden [B, T, H]
    in fp32. `document_ids` numbers the samples of a row (padding: -1), which makes the TTT
    attention block-diagonal and stops labels from crossing into the next sample.
    """
    rows: list[list[int]] = []
    fill: list[int] = []
    for k, s in enumerate(samples):
        n = s["input_ids"].shape[0]
        r = next((r for r, used in enumerate(fill) if used + n <= row_len), None)
        if r is None:
            rows.append([])
            fill.append(0)
            r = len(rows) - 1
        rows[r].append(k)
        fill[r] += n
    B, T = len(rows), max(fill)
    ref = samples[0]
    out = {
        "features": torch.zeros(B, T, ref["features"].shape[-1]),
        "target_hidden": torch.zeros(B, T, ref["target_hidden"].shape[-1]),
        "input_ids": torch.zeros(B, T, dtype=torch.long),
        "next_ids": torch.zeros(B, T, dtype=torch.long),
        "position_ids": torch.zeros(B, T, dtype=torch.long),
        "loss_mask": torch.zeros(B, T, dtype=torch.bool),
        "document_ids": torch.full((B, T), -1, dtype=torch.long),
    }
    for b, row in enumerate(rows):
        at = 0
        for doc, k in enumerate(row):
            s = samples[k]
            n = s["input_ids"].shape[0]
            span = slice(at, at + n)
            out["features"][b, span] = s["features"].float()
            out["target_hidden"][b, span] = s["target_hidden"].float()
            out["input_ids"][b, span] = s["input_ids"]
            out["next_ids"][b, span] = label_ids(s["input_ids"])
            out["position_ids"][b, span] = s["position_ids"]
            out["loss_mask"][b, span] = s["loss_mask"]
            out["document_ids"][b, span] = doc
            at += n
    return out
