"""The optimiser and its schedule: AdamW with EAGLE's betas, linear warmup, cosine decay to a floor."""

from __future__ import annotations

import math
from typing import Any

import torch

from eyas.drafter import Drafter

MIN_LR_RATIO = 0.1  # cosine decays to lr / 10 (nanoGPT's floor), not to zero
WARMUP_RATIO = 0.015  # SpecForge's default when no warmup is given
ADAM_BETAS = (0.9, 0.95)  # EAGLE's ds_config


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak lr after `step` optimizer steps: linear warmup, cosine to MIN_LR_RATIO."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


def param_groups(drafter: Drafter, weight_decay: float) -> list[dict[str, Any]]:
    """Matrices decay, norm weights and biases do not (nanoGPT's split)."""
    params = [p for p in drafter.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def make_optimizer(
    drafter: Drafter, *, lr: float, weight_decay: float, warmup: int | None, total: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the drafter's trainable weights and its schedule for a run of `total` steps
    (`warmup` None: WARMUP_RATIO of the run)."""
    warmup = warmup if warmup is not None else round(WARMUP_RATIO * total)
    optimizer = torch.optim.AdamW(param_groups(drafter, weight_decay), lr=lr, betas=ADAM_BETAS)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup, total))
