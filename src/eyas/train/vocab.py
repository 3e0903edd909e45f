"""The draft vocabulary: the target tokens the draft can emit, chosen by how often they are labels.

A reduced draft vocab (`--draft-vocab`) keeps the `draft_vocab` most frequent answer tokens of the
training data (EAGLE's `scandata`, SpecForge's vocab mapping): the lm_head shrinks from V rows to
Vd, and `d2t` / `t2d` map between draft and target ids.
"""

from __future__ import annotations

import torch
from torch import Tensor

from eyas.shift import label_ids


def token_counts(samples: list[dict[str, Tensor]], vocab_size: int) -> Tensor:
    """How often each target token is a label under the loss mask, over shifted samples: [V] int64.

    The label of draft position t is x_{t+2} = next_ids[t] (see `eyas.shift.label_ids`), counted
    where loss_mask[t]: exactly the tokens the draft is trained to predict.
    """
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for s in samples:
        counts += torch.bincount(label_ids(s["input_ids"])[s["loss_mask"]], minlength=vocab_size)
    return counts


def build_vocab_map(counts: Tensor, draft_vocab: int) -> tuple[Tensor, Tensor, Tensor]:
    """The `draft_vocab` most frequent tokens -> (used ids ascending [Vd], d2t int64 [Vd], t2d bool [V]).

    Ties are broken by the lower id; with fewer distinct tokens than `draft_vocab`, the lowest unused
    ids fill the rest (the stable sort puts count-0 ids after the rest, in id order). EAGLE and
    SpecForge build the same map: sort ascending, d2t = used - arange (target = draft + d2t[draft]).
    """
    order = torch.sort(-counts, stable=True).indices  # by count descending, then by id
    used = order[:draft_vocab].sort().values
    d2t = used - torch.arange(draft_vocab)
    t2d = torch.zeros(counts.shape[0], dtype=torch.bool)
    t2d[used] = True
    return used, d2t, t2d


def vocab_coverage(counts: Tensor, t2d: Tensor | None) -> float:
    """Share of loss-masked label tokens inside the draft vocab (1.0 without a map)."""
    total = int(counts.sum())
    if t2d is None or total == 0:
        return 1.0
    return int(counts[t2d].sum()) / total
