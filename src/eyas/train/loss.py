"""The training-time test loss: the target's distributions as labels, the unrolled draft graded on them.

Label alignment, after `eyas.shift.shift_for_draft`: position t holds g_t and x_{t+1}; step j at t
predicts x_{t+j+2}, whose target distribution is p[t + j] (the target's logits from h_{t+j+1}). So
step j's labels are `p` shifted left by j inside the same packed document; positions whose t + j
lies past the end or in the next document have no label. The loss is
sum_j step_decay**j * soft cross-entropy of step j (EAGLE's traineagle3, SpecForge, speculators).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from eyas.drafter import Drafter
from eyas.logit_map import LogitMap
from eyas.shift import shift_left


@torch.no_grad()
def target_probs(
    target_hidden: Tensor,
    lm_head: Tensor,
    used: Tensor | None,
    where: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    logit_map: LogitMap = LogitMap(),
) -> tuple[Tensor, Tensor]:
    """The target's distribution over the draft vocab, and where its argmax is drafted at all.

    target_hidden [B, T, H] (final-normed), lm_head [V, H] (the target's), used [Vd] sorted target
    ids or None (full vocab), logit_map what the target's class does to lm_head's output (eyas.logit_map),
    where [B, T] bool: the positions that need labels (None: all; the
    full-vocab matmul is most of this function's cost, so the others are skipped: p 0, in_vocab
    False). Returns p [B, T, Vd] = softmax(logits[..., used]), renormalised over the draft vocab,
    and in_vocab [B, T] bool = argmax over the FULL vocab is a drafted token (EAGLE's position
    mask: a token the draft cannot emit is not a label). The matmul runs in `dtype` (training in
    bf16 computes its labels in bf16 too, the cheaper matmul), the softmax in fp32.
    """
    if where is None:
        where = torch.ones(target_hidden.shape[:-1], dtype=torch.bool, device=target_hidden.device)
    logits = logit_map((target_hidden[where].to(dtype) @ lm_head.to(dtype).T).float())  # [N, H] -> [N, V]
    Vd = logits.shape[-1] if used is None else used.shape[0]
    p = logits.new_zeros(*where.shape, Vd)
    in_vocab = torch.zeros_like(where)
    if used is None:
        p[where], in_vocab[where] = torch.softmax(logits, dim=-1), True
        return p, in_vocab
    t2d = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    t2d[used] = True
    p[where], in_vocab[where] = torch.softmax(logits[:, used], dim=-1), t2d[logits.argmax(-1)]
    return p, in_vocab


def step_labels(p: Tensor, valid: Tensor, document_ids: Tensor, j: int) -> tuple[Tensor, Tensor]:
    """Step j's labels for positions 0..T-j-1: p[t + j], usable where valid[t + j] and t + j is
    in the same document as t. p [B, T, Vd], valid/document_ids [B, T] -> ([B, T-j, Vd], [B, T-j]).

    Step j reads step 0's sequence moved left by j (`eyas.shift.shift_left`); p is sliced rather
    than shifted (positions T-j.. have no label, and a [B, T, Vd] copy per step is not free)."""
    T = p.shape[1]
    same_doc = shift_left(document_ids, j) == document_ids  # [B, T]: t + j lies in t's document
    return p[:, j:], (shift_left(valid, j) & same_doc)[:, : T - j]


def ttt_loss(
    step_outputs: list[Tensor],
    p: Tensor,
    valid: Tensor,
    document_ids: Tensor,
    step_decay: float,
    denom: float,
    head: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """sum_j step_decay**j * (soft cross-entropy of step j, summed over its labelled positions) / denom.

    step_outputs: per step [B, T, Vd] draft logits, or with `head` [B, T, H] hidden states that
    `head` turns into logits (`Drafter.head`: applied to the labelled rows only, which spares the
    lm_head and the log-softmax on prompt and unlabelled positions). p, valid, document_ids as in
    `step_labels`. `denom` is the number of loss positions in the GLOBAL batch, the same for every
    step and every process, so a batch split across processes sums to the single-process loss.
    Returns the loss and stats [3, steps] (summed loss, correct argmax, labelled positions).
    """
    total = p.new_zeros(())
    stats = p.new_zeros(3, len(step_outputs))
    for j, out in enumerate(step_outputs):
        T = out.shape[1]
        if j >= T:
            break
        p_j, mask_j = step_labels(p, valid, document_ids, j)
        rows = out[:, : T - j][mask_j]  # [N_j, Vd or H]: the labelled positions of step j
        log_q = F.log_softmax((head(rows) if head else rows).float(), dim=-1)  # [N_j, Vd]
        p_j = p_j[mask_j]
        loss_j = -(p_j * log_q).sum()
        total = total + step_decay**j * loss_j
        with torch.no_grad():
            correct = log_q.argmax(-1) == p_j.argmax(-1)
            stats[:, j] = torch.stack([loss_j.detach(), correct.sum().float(), mask_j.sum().float()])
    return total / denom, stats


class TTTUnroll(nn.Module):
    """The TTT unroll and its loss as a module `forward`, so DistributedDataParallel can wrap it
    (every parameter, lm_head included, is used inside `forward`). `masked` selects forward_ttt's
    reference attention (benchmarks compare the two; training uses the default)."""

    def __init__(self, drafter: Drafter, steps: int, step_decay: float, *, masked: bool = False):
        super().__init__()
        self.drafter, self.steps, self.step_decay, self.masked = drafter, steps, step_decay, masked

    def forward(self, batch: dict[str, Tensor], p: Tensor, valid: Tensor, denom: float) -> tuple[Tensor, Tensor]:
        """`ttt_loss` of the teacher-forced unroll on a packed batch: (loss, stats)."""
        hidden = self.drafter.forward_ttt(
            batch["features"], batch["input_ids"], self.steps, next_ids=batch["next_ids"],
            position_ids=batch["position_ids"], document_ids=batch["document_ids"], logits=False, masked=self.masked,
        )
        return ttt_loss(hidden, p, valid, batch["document_ids"], self.step_decay, denom, head=self.drafter.head)


def forward_backward(
    model: nn.Module,
    batch: dict[str, Tensor],
    lm_head: Tensor,
    used: Tensor | None,
    *,
    denom: float,
    autocast: torch.dtype | None,
    world_size: int = 1,
    logit_map: LogitMap = LogitMap(),
) -> Tensor:
    """Labels, TTT unroll, loss and backward on this rank's packed `batch` (from `pack_batch`).

    `model` is `TTTUnroll` (or DDP around it); lm_head [V, H] the target's, logit_map what its class does to
    lm_head's output; used the draft vocab's target ids (None: full vocab); autocast a dtype for the forward
    or None (fp32). Returns [1 + 3 * steps]: the loss, then `ttt_loss`'s stats, summed over all ranks.
    """
    p, in_vocab = target_probs(batch["target_hidden"], lm_head, used, where=batch["loss_mask"],
                               dtype=autocast or torch.float32, logit_map=logit_map)
    device_type = batch["input_ids"].device.type
    with torch.autocast(device_type, dtype=autocast) if autocast else contextlib.nullcontext():
        loss, stats = model(batch, p, batch["loss_mask"] & in_vocab, denom)
    (loss * world_size).backward()  # DDP averages gradients over ranks; the loss is a global sum
    report = torch.cat([loss.detach().reshape(1), stats.flatten()])
    if world_size > 1:  # each rank's loss is its share of the global sum: sum everything
        dist.all_reduce(report)
    return report
