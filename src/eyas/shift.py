"""The label shift: the one place where target positions become draft positions.

Captured samples are stored UNSHIFTED: features[t] and last_hidden[t] are the target's states at
token input_ids[t] (they have read x_0..x_t). EAGLE-3 step 0 at draft position t reads g_t and the
NEXT token x_{t+1}, and predicts x_{t+2}. Step j of the training-time test at t predicts x_{t+j+2}:
everything it needs is step 0's sequence moved left by j (`shift_left`). Training, evaluation, the
doctor and the drafter's unroll all go through these three functions.

SpecForge shipped a bug (PR #308) where the offline dataset shifted and the train step shifted
again, pairing g_t with x_{t+2}; storing unshifted data and shifting in one tested place makes that
impossible.
"""

from __future__ import annotations

import torch
from torch import Tensor


def shift_for_draft(sample: dict[str, Tensor]) -> dict[str, Tensor]:
    """Turn an unshifted sample into draft-aligned tensors of length T-1.

    For t = 0..T-2:

        features[t]      = g_t                       stored features[t]
        input_ids[t]     = x_{t+1}                   stored input_ids[t + 1]
        target_hidden[t] = h_{t+1}                   stored last_hidden[t + 1] (label: x_{t+2})
        loss_mask[t]     = x_{t+2} is a response token   stored loss_mask[t + 2]; 0 at t = T-2,
                                                        whose label lies past the sequence end
        position_ids[t]  = t

    (EAGLE and SpecForge use the unshifted loss_mask[t] here, off by two at the span edges.)
    Works on one sample ([T], [T, D]) or a batch ([B, T], [B, T, D]); time is the axis after
    the batch axis. Calling it on an already shifted sample raises: there is no `last_hidden`.
    """
    if "target_hidden" in sample or "last_hidden" not in sample:
        raise ValueError("shift_for_draft needs an unshifted sample (keys input_ids, loss_mask, features, last_hidden)")
    ids, mask = sample["input_ids"], sample["loss_mask"]  # [..., T]
    T = ids.shape[-1]
    return {
        "features": sample["features"][..., : T - 1, :],  # [..., T, A*H] -> [..., T-1, A*H]
        "input_ids": ids[..., 1:],  # [..., T-1]
        "target_hidden": sample["last_hidden"][..., 1:, :],  # [..., T-1, H]
        "loss_mask": shift_left(mask[..., 1:], 1),  # [..., T-1]
        "position_ids": torch.arange(T - 1, device=ids.device).expand(ids[..., 1:].shape),
    }


def shift_left(x: Tensor, j: int) -> Tensor:
    """x moved j places left along time (the last axis), zero-filled at the end: out[t] = x[t + j]."""
    if j == 0:
        return x
    return torch.cat([x[..., j:], x.new_zeros(*x.shape[:-1], min(j, x.shape[-1]))], dim=-1)


def label_ids(input_ids: Tensor) -> Tensor:
    """Teacher-forcing ids of a SHIFTED sequence: next_ids[t] = x_{t+2} = input_ids[t+1], 0 at the end.

    They are step 0's labels and the tokens later TTT steps read: step j+1 at t reads next_ids[t+j].
    """
    return shift_left(input_ids, 1)
