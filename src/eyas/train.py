"""Train an EAGLE-3 draft on captured target features with training-time test (TTT).

`train(TrainConfig(data=..., out=...))` is the one entry point (`eyas train` and
`python -m eyas.train`, also under `torchrun`). It reads top to bottom:

    open_shards(data, for_training=True, expect_target=..)   refuses another target's features
    draft vocab: the `draft_vocab` most frequent answer tokens  (EAGLE `scandata`, SpecForge §3.7)
    contract_for_target + the data's capture layers            the draft mirrors the target's layer
    drafter: embeddings shared from the target (frozen, not saved), lm_head = the target's rows
    per step:  global batch of ~batch_tokens tokens -> this rank's share -> packed rows
               target_probs: softmax of the target's logits over the draft vocab (recomputed from
               the stored final hidden state with the target's lm_head; never stored)
               forward_ttt (teacher forced), ttt_loss = sum_j step_decay**j * soft CE of step j
               AdamW, warmup + cosine, grad clip; bf16 autocast
    checkpoints (atomic), held-out eval (tau at k=5), JSONL log + PNG curves, final export

Label alignment, after `shift_for_draft` (the one label shift): position t holds g_t and x_{t+1};
step j at t predicts x_{t+j+2}, whose target distribution is p[t + j] (the target's logits from
h_{t+j+1}). So step j's labels are `p` shifted left by j inside the same packed document; positions
whose t + j lies past the end or in the next document have no label. References: EAGLE
traineagle3 (reference doc eagle3-eagle-specforge-sglang §1.7), SpecForge (§3.6), speculators (§3.3).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import sys
import tempfile
import time
import types
import typing
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from eyas.contract import contract_for_target
from eyas.data import open_shards, shift_for_draft
from eyas.drafter import Drafter
from eyas.errors import ContractError, EyasError
from eyas.evaluate import evaluate_samples
from eyas.formats import write_checkpoint
from eyas.target import check_fits, target_config, target_name, target_tensors
from eyas.weights import fsync_file

STATE_FORMAT = "eyas-train-state"
EVAL_DEPTH = 5  # held-out tau is reported at k = 5 drafted tokens
MIN_LR_RATIO = 0.1  # cosine decays to lr / 10 (nanoGPT's floor), not to zero
WARMUP_RATIO = 0.015  # SpecForge's default when no warmup is given
ADAM_BETAS = (0.9, 0.95)  # EAGLE's ds_config
# Fields a resumed run may change: they do not affect the weights it produces.
# (`data` may move: the capture itself is compared by its manifest fingerprint and sample count.)
RESUME_MAY_CHANGE = ("data", "out", "resume", "progress", "save_every", "eval_every", "export_dtype",
                     "keep_checkpoints", "device")
AUTOCAST = {"bf16": torch.bfloat16, "fp32": None}
EXPORT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class TrainConfig:
    """Every knob of a training run; field names are the CLI flag names (`--draft-vocab`, ...)."""

    data: str  # a capture folder written by `eyas capture`, or several joined by commas
    out: str  # run folder: checkpoints/, train_log.jsonl, train_curves.png, draft/
    target: str | None = None  # the target the data was captured from; None = embedded default
    draft_vocab: int | None = None  # draft vocab size; None = the target's full vocab (no d2t/t2d)
    ttt_steps: int = 7  # unrolled draft steps per position (EAGLE and SpecForge: 7)
    step_decay: float = 0.8  # step j's loss weight is step_decay**j (EAGLE, SpecForge)
    lr: float = 1e-4  # peak learning rate (SpecForge's default)
    warmup: int | None = None  # warmup steps; None = 1.5% of the run (SpecForge's warmup_ratio)
    epochs: int = 1
    max_steps: int | None = None  # stop after this many optimizer steps (also shortens the schedule)
    batch_tokens: int = 2048  # tokens per optimizer step, all processes together (about: whole samples)
    max_len: int = 2048  # longer samples are cut to this many draft positions
    grad_clip: float = 0.5  # max global grad norm (EAGLE, SpecForge)
    weight_decay: float = 0.0  # AdamW decay of matrices (norm weights are never decayed); EAGLE: 0
    seed: int = 0  # weights, held-out split and data order all follow from it
    save_every: int = 200  # checkpoint every N steps (and at the end); 0 = only at the end
    eval_every: int | None = None  # held-out eval every N steps; None = at each checkpoint
    eval_fraction: float = 0.05  # share of samples held out (deterministic by seed); 0 = none
    resume: bool = False  # continue from the latest checkpoint in out/checkpoints
    dtype: str = "bf16"  # autocast dtype of the forward: bf16 or fp32 (master weights are fp32)
    export_dtype: str = "fp32"  # weights of the exported draft: fp32 or bf16
    num_hidden_layers: int = 1  # draft decoder layers (EAGLE-3: 1)
    norm_before_residual: bool = False  # the four norm flags: EAGLE-3's defaults (all off)
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    keep_checkpoints: int = 2  # older checkpoints are deleted
    device: str | None = None  # None: cuda (this rank's GPU) when available, else cpu
    progress: bool = True  # progress bar on stderr (rank 0)


# --- the draft vocabulary ------------------------------------------------------------------------


def token_counts(samples: list[dict[str, Tensor]], vocab_size: int) -> Tensor:
    """How often each target token is a label under the loss mask, over shifted samples: [V] int64.

    The label of draft position t is x_{t+2} = next_ids[t] (see `label_ids`), counted where
    loss_mask[t]: exactly the tokens the draft is trained to predict.
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


# --- batches: plan, share, pack --------------------------------------------------------------------


def label_ids(input_ids: Tensor) -> Tensor:
    """Teacher-forcing ids of a shifted sequence: next_ids[t] = x_{t+2} = input_ids[t+1], 0 at the end."""
    return torch.cat([input_ids[..., 1:], input_ids.new_zeros(*input_ids.shape[:-1], 1)], dim=-1)


def plan_epoch(lengths: list[int], batch_tokens: int, seed: int, epoch: int, min_samples: int = 1) -> list[list[int]]:
    """Global batches of one epoch: sample indices in a seeded shuffle, cut every ~batch_tokens.

    A batch takes whole samples while they fit in `batch_tokens` (a longer sample is a batch of
    its own) and at least `min_samples` (the number of processes, so every rank gets one).
    A short last batch is merged into the one before. The plan depends only on the arguments, so a
    resumed run finds its place by (epoch, batch index).
    """
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
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


# --- the loss ------------------------------------------------------------------------------------


@torch.no_grad()
def target_probs(
    target_hidden: Tensor,
    lm_head: Tensor,
    used: Tensor | None,
    where: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """The target's distribution over the draft vocab, and where its argmax is drafted at all.

    target_hidden [B, T, H] (final-normed), lm_head [V, H] (the target's), used [Vd] sorted target
    ids or None (full vocab), where [B, T] bool: the positions that need labels (None: all; the
    full-vocab matmul is most of this function's cost, so the others are skipped: p 0, in_vocab
    False). Returns p [B, T, Vd] = softmax(logits[..., used]), renormalised over the draft vocab,
    and in_vocab [B, T] bool = argmax over the FULL vocab is a drafted token (EAGLE's position
    mask: a token the draft cannot emit is not a label). The matmul runs in `dtype` (training in
    bf16 computes its labels in bf16 too: 2.5x faster on CPU), the softmax in fp32.
    """
    if where is None:
        where = torch.ones(target_hidden.shape[:-1], dtype=torch.bool, device=target_hidden.device)
    logits = (target_hidden[where].to(dtype) @ lm_head.to(dtype).T).float()  # [N, H] -> [N, V]
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
    in the same document as t. p [B, T, Vd], valid/document_ids [B, T] -> ([B, T-j, Vd], [B, T-j])."""
    T = p.shape[1]
    same_doc = document_ids[:, j:] == document_ids[:, : T - j]
    return p[:, j:], valid[:, j:] & same_doc


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
    (every parameter, lm_head included, is used inside `forward`)."""

    def __init__(self, drafter: Drafter, steps: int, step_decay: float):
        super().__init__()
        self.drafter, self.steps, self.step_decay = drafter, steps, step_decay

    def forward(self, batch: dict[str, Tensor], p: Tensor, valid: Tensor, denom: float) -> tuple[Tensor, Tensor]:
        """`ttt_loss` of the teacher-forced unroll on a packed batch: (loss, stats)."""
        hidden = self.drafter.forward_ttt(
            batch["features"], batch["input_ids"], self.steps, next_ids=batch["next_ids"],
            position_ids=batch["position_ids"], document_ids=batch["document_ids"], logits=False,
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
) -> Tensor:
    """Labels, TTT unroll, loss and backward on this rank's packed `batch` (from `pack_batch`).

    `model` is `TTTUnroll` (or DDP around it); lm_head [V, H] the target's; used the draft vocab's
    target ids (None: full vocab); autocast a dtype for the forward or None (fp32). Returns
    [1 + 3 * steps]: the loss, then `ttt_loss`'s stats, summed over all ranks.
    """
    p, in_vocab = target_probs(batch["target_hidden"], lm_head, used, where=batch["loss_mask"],
                               dtype=autocast or torch.float32)
    device_type = batch["input_ids"].device.type
    with torch.autocast(device_type, dtype=autocast) if autocast else contextlib.nullcontext():
        loss, stats = model(batch, p, batch["loss_mask"] & in_vocab, denom)
    (loss * world_size).backward()  # DDP averages gradients over ranks; the loss is a global sum
    report = torch.cat([loss.detach().reshape(1), stats.flatten()])
    if world_size > 1:  # each rank's loss is its share of the global sum: sum everything
        dist.all_reduce(report)
    return report


# --- the schedule --------------------------------------------------------------------------------


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak lr after `step` optimizer steps: linear warmup, cosine to MIN_LR_RATIO."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * progress))


# --- checkpoints and logs --------------------------------------------------------------------------


def _atomic_write(path: Path, write) -> None:
    """write(file) into a temp file beside `path`, fsync, rename: a kill leaves the old file or the new."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes it private; these are ordinary output files
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_file(path.parent)  # the rename itself survives a crash
    finally:
        Path(tmp).unlink(missing_ok=True)


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:08d}.pt"


def latest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint with the highest step (temp files of an interrupted write are ignored)."""
    found = sorted(folder.glob("step_*.pt")) if folder.is_dir() else []
    return found[-1] if found else None


def _config_dict(config: TrainConfig) -> dict[str, Any]:
    d = dataclasses.asdict(config)
    d["data"] = ",".join(str(Path(f).resolve()) for f in data_folders(config))
    d["out"] = str(Path(config.out).resolve())
    d["target"] = target_name(config.target)
    return d


def _load_state(path: Path, config: TrainConfig, world_size: int) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a file that is not a training state at all
        raise EyasError(f"{path}: not a readable training checkpoint ({e})",
                        "delete it to resume from the one before") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise EyasError(f"{path}: not an eyas training checkpoint", "point --out at a folder written by eyas train")
    now = _config_dict(config)
    differ = [k for k in now if k not in RESUME_MAY_CHANGE and state["config"].get(k) != now[k]]
    if differ:
        changes = "; ".join(f"{k}: {state['config'].get(k)!r} there, {now[k]!r} now" for k in differ)
        raise EyasError(f"{path} was written by a different run ({changes})",
                        "resume with the same settings, or train into a new --out")
    if state["world_size"] != world_size:
        raise EyasError(f"{path} was written by {state['world_size']} processes, resuming with {world_size}",
                        f"resume with --nproc_per_node={state['world_size']} (the batch split depends on it)")
    return state


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _truncate_log(log: Path, step: int) -> None:
    """Drop log records past `step` (written by a run killed after its last checkpoint)."""
    if not log.is_file():
        return
    keep = [line for line in log.read_text().splitlines() if line and json.loads(line)["step"] <= step]
    _atomic_write(log, lambda f: f.write("".join(line + "\n" for line in keep).encode()))


def plot_curves(log: Path, png: Path) -> None:
    """Loss, per-step accuracy and held-out tau vs optimizer step, from the JSONL log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in log.read_text().splitlines() if line]
    train_recs = [r for r in records if r["kind"] == "train"]
    eval_recs = [r for r in records if r["kind"] == "eval"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.6))
    steps = [r["step"] for r in train_recs]
    a.plot(steps, [r["loss"] for r in train_recs])
    a.set(xlabel="step", ylabel="loss", title="TTT loss (weighted sum over steps)")
    for j in range(len(train_recs[0]["acc_by_step"]) if train_recs else 0):
        b.plot(steps, [r["acc_by_step"][j] for r in train_recs], label=f"step {j}")
    b.set(xlabel="step", ylabel="argmax accuracy", ylim=(0, 1), title="accuracy per TTT step")
    if train_recs:
        b.legend(fontsize=7)
    if eval_recs:
        c.plot([r["step"] for r in eval_recs], [r["tau"] for r in eval_recs], marker="o", label=f"tau (k={EVAL_DEPTH})")
        c.plot([r["step"] for r in eval_recs], [1 + r["accept_depth1"] for r in eval_recs], marker="x",
               label="1 + depth-1 acceptance")
        c.legend(fontsize=7)
    c.set(xlabel="step", ylabel="tokens per target pass", title="held-out greedy chain")
    fig.tight_layout()
    _atomic_write(png, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


# --- setup helpers -------------------------------------------------------------------------------


def _check_config(c: TrainConfig) -> None:
    bad = []
    for name in ("ttt_steps", "epochs", "batch_tokens", "num_hidden_layers", "keep_checkpoints"):
        if getattr(c, name) < 1:
            bad.append(f"{name}={getattr(c, name)} (must be >= 1)")
    if c.max_len < 2:
        bad.append(f"max_len={c.max_len} (must be >= 2)")
    if c.max_steps is not None and c.max_steps < 1:
        bad.append(f"max_steps={c.max_steps} (must be >= 1)")
    if c.draft_vocab is not None and c.draft_vocab < 1:
        bad.append(f"draft_vocab={c.draft_vocab} (must be >= 1)")
    if not (c.lr > 0 and c.step_decay > 0 and c.grad_clip > 0 and c.weight_decay >= 0):
        bad.append(f"lr={c.lr}, step_decay={c.step_decay}, grad_clip={c.grad_clip} must be > 0, "
                   f"weight_decay={c.weight_decay} >= 0")
    if not 0 <= c.eval_fraction < 1:
        bad.append(f"eval_fraction={c.eval_fraction} (must be in [0, 1))")
    if c.save_every < 0 or (c.eval_every is not None and c.eval_every < 0) or (c.warmup is not None and c.warmup < 0):
        bad.append("save_every, eval_every and warmup must be >= 0")
    if not data_folders(c):
        bad.append(f"data={c.data!r} (a capture folder, or several joined by commas)")
    if c.dtype not in AUTOCAST or c.export_dtype not in EXPORT_DTYPES:
        bad.append(f"dtype={c.dtype!r}, export_dtype={c.export_dtype!r} (each bf16 or fp32)")
    if bad:
        raise EyasError("invalid training settings: " + "; ".join(bad), "fix the flags named above")


def data_folders(config: TrainConfig) -> list[str]:
    """The capture folders of `config.data` (comma-separated: captures run in parallel, e.g. with
    `eyas capture --skip`, train as one data set)."""
    return [f for f in config.data.split(",") if f]


def _same_capture_layers(captures: list) -> list[int]:
    """The capture layers all folders share; folders captured at other layers are refused."""
    layers = captures[0].capture_layers
    for data in captures[1:]:
        if data.capture_layers != layers:
            raise ContractError(f"{data.folder}: captured at layers {data.capture_layers}, "
                                f"{captures[0].folder} at {layers}", "train on captures made at the same layers")
    return layers


def _load_samples(data, max_len: int) -> list[dict[str, Tensor]]:
    """Unshifted samples cut to max_len + 1 tokens (max_len draft positions), with an answer left."""
    samples = []
    for s in data:
        s = {k: s[k][: max_len + 1] for k in ("input_ids", "loss_mask", "features", "last_hidden")}
        if s["loss_mask"][2:].any():  # a draft label x_{t+2} inside the answer
            samples.append(s)
    if len(samples) < 1:
        raise EyasError(f"{data.folder}: no sample has answer tokens to train on",
                        "capture data with responses (eyas capture)")
    return samples


def _split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) sample indices, a seeded permutation; held-out is at least 1 when asked for."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    k = 0 if fraction == 0 else min(n - 1, max(1, round(n * fraction)))
    return sorted(order[k:]), sorted(order[:k])


def _param_groups(drafter: Drafter, weight_decay: float) -> list[dict[str, Any]]:
    """Matrices decay, norm weights and biases do not (nanoGPT's split)."""
    params = [p for p in drafter.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def _init_distributed() -> tuple[int, int, bool]:
    """(rank, world size, whether this call started the process group) from torchrun's env."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1, False
    started = not dist.is_initialized()
    if started:
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), world_size, started


def _device(config: TrainConfig) -> torch.device:
    if config.device:
        return torch.device(config.device)
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _refuse_old_run(out: Path) -> None:
    found = [p.name for p in (out / "checkpoints", out / "draft", out / "train_log.jsonl") if p.exists()]
    if found:
        raise EyasError(f"{out} already holds a training run ({', '.join(found)})",
                        "pass --resume to continue it, or choose a new --out")


def build_draft(
    config: TrainConfig, tcfg: dict, capture_layers: list[int], train_set: list[dict[str, Tensor]]
) -> tuple[Drafter, Tensor, Tensor | None, float]:
    """A fresh draft for `config.target` reading `capture_layers`, with its vocab from `train_set`.

    The layer mirrors the target's (contract_for_target); embeddings are the target's, shared
    (frozen, not saved); lm_head starts as the target's rows of the draft vocab, so the draft
    starts out predicting through the target's own output matrix. Returns (drafter, the target's
    lm_head [V, H] fp32, draft-vocab target ids or None for the full vocab, coverage).
    """
    name = target_name(config.target)
    base = contract_for_target(tcfg, capture_layers=tuple(capture_layers), name=name)
    V = base.vocab_size
    vd = config.draft_vocab or V
    if vd > V:
        raise ContractError(f"draft_vocab {vd} exceeds the vocab of target {name} ({V})", f"use --draft-vocab <= {V}")
    counts = token_counts(train_set, V)
    used, d2t, t2d = build_vocab_map(counts, vd) if vd < V else (None, None, None)
    contract = base.replace(
        draft_vocab_size=vd, has_vocab_map=vd < V, num_hidden_layers=config.num_hidden_layers,
        norm_before_residual=config.norm_before_residual, norm_before_fc=config.norm_before_fc,
        fc_norm=config.fc_norm, norm_output=config.norm_output,
    )
    check_fits(contract, tcfg)
    t = target_tensors(config.target, ["embed_tokens.weight", "lm_head.weight"])
    lm_head = t["lm_head.weight"].float()  # [V, H]
    drafter = Drafter(contract, embed_tokens=t["embed_tokens.weight"].float()).init_weights(config.seed)
    with torch.no_grad():
        drafter.lm_head.weight.copy_(lm_head if used is None else lm_head[used])  # [Vd, H]
    if used is not None:
        drafter.set_vocab_map(d2t, t2d)
    return drafter, lm_head, used, vocab_coverage(counts, t2d)


# --- the run -------------------------------------------------------------------------------------


def train(config: TrainConfig) -> dict[str, Any]:
    """Train a draft as `config` says; returns a JSON-ready summary. See the module docstring."""
    _check_config(config)
    rank, world_size, started = _init_distributed()
    try:
        return _run(config, rank, world_size)
    finally:
        if started:
            dist.destroy_process_group()


def _run(config: TrainConfig, rank: int, world_size: int) -> dict[str, Any]:
    t_start = time.perf_counter()
    out = Path(config.out).absolute()
    ckpt_dir, log_path, png_path = out / "checkpoints", out / "train_log.jsonl", out / "train_curves.png"
    device = _device(config)
    latest = latest_checkpoint(ckpt_dir) if config.resume else None
    if not config.resume:
        _refuse_old_run(out)
    state = _load_state(latest, config, world_size) if latest else None

    # Data and target: refused before anything is built when the capture is from another target
    # or (resuming) at other capture layers than the draft reads.
    tcfg = target_config(config.target)
    expect_layers = state["contract"]["capture_layers"] if state else None
    captures = [open_shards(f, for_training=True, expect_target=target_name(config.target),
                            expect_capture_layers=expect_layers) for f in data_folders(config)]
    capture_layers = _same_capture_layers(captures)
    samples = [s for data in captures for s in _load_samples(data, config.max_len)]
    data_id = {"fingerprint": ",".join(data.manifest["fingerprint"] for data in captures), "samples": len(samples)}
    if state and state["data"] != data_id:
        raise EyasError(f"{config.data} is not the capture {latest} was trained on ({state['data']} there, "
                        f"{data_id} now)", "resume with the same data, or train into a new --out")
    train_idx, heldout_idx = _split(len(samples), config.eval_fraction, config.seed)
    train_set = [shift_for_draft(samples[i]) for i in train_idx]
    heldout = [samples[i] for i in heldout_idx]
    if len(train_set) < world_size:
        raise EyasError(f"{len(train_set)} training samples for {world_size} processes",
                        "capture more data or use fewer processes")

    drafter, lm_head, used, coverage = build_draft(config, tcfg, capture_layers, train_set)
    contract = drafter.to(device).contract
    lm_head, used = lm_head.to(device), None if used is None else used.to(device)
    autocast = AUTOCAST[config.dtype]
    label_head = lm_head.to(autocast or torch.float32)  # the labels' matmul runs in the training dtype

    lengths = [s["input_ids"].shape[0] for s in train_set]
    plans = [plan_epoch(lengths, config.batch_tokens, config.seed, e, world_size) for e in range(config.epochs)]
    total = sum(len(p) for p in plans)
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    warmup = config.warmup if config.warmup is not None else round(WARMUP_RATIO * total)
    optimizer = torch.optim.AdamW(_param_groups(drafter, config.weight_decay), lr=config.lr, betas=ADAM_BETAS)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup, total))

    step, epoch, batch_at = 0, 0, 0
    if state:
        drafter.load_state_dict(state["model"], strict=True)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        _set_rng_state(state["rng"])
        step, epoch, batch_at = state["step"], state["epoch"], state["batch"]
    model: nn.Module = TTTUnroll(drafter, config.ttt_steps, config.step_decay)
    if world_size > 1:  # buffers (d2t, t2d, shared embeddings) never change: no per-step broadcast
        with warnings.catch_warnings():  # torch 2.13 renames broadcast_buffers; torch 2.9 has only this name
            warnings.simplefilter("ignore", FutureWarning)
            model = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
            )

    main_rank = rank == 0
    if main_rank:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        for tmp in ckpt_dir.glob(".step_*.tmp"):  # a checkpoint write that was killed
            tmp.unlink()
        if state:
            _truncate_log(log_path, step)
        elif log_path.exists():
            log_path.unlink()
    eval_every = config.save_every if config.eval_every is None else config.eval_every
    bar = tqdm(total=total, initial=step, unit="step", desc="train", file=sys.stderr,
               disable=not (config.progress and main_rank))
    last = {"loss": None, "acc_by_step": None, "eval": None}
    good_ckpt = latest

    def save(step: int, epoch: int, batch_at: int) -> Path:
        path = checkpoint_path(ckpt_dir, step)
        state = {"format": STATE_FORMAT, "step": step, "epoch": epoch, "batch": batch_at,
                 "world_size": world_size, "config": _config_dict(config), "data": data_id,
                 "contract": contract.to_dict(),
                 "model": drafter.state_dict(), "optimizer": optimizer.state_dict(),
                 "scheduler": scheduler.state_dict(), "rng": _rng_state()}
        _atomic_write(path, lambda f: torch.save(state, f))
        for old in sorted(ckpt_dir.glob("step_*.pt"))[: -config.keep_checkpoints]:
            old.unlink()
        return path

    def log(record: dict) -> None:
        with open(log_path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def held_out_eval(step: int) -> dict:
        cpu = drafter if device.type == "cpu" else _cpu_copy(drafter)
        rep = evaluate_samples(cpu, heldout, lm_head.cpu(), depth=EVAL_DEPTH, tree_depth=EVAL_DEPTH)
        rec = {"kind": "eval", "step": step, "tau": rep["tau_chain"][str(EVAL_DEPTH)],
               "accept_depth1": rep["acceptance_by_depth"][0], "tau_chain": rep["tau_chain"],
               "acceptance_by_depth": rep["acceptance_by_depth"], "coverage": rep["coverage"],
               "tokens": rep["tokens"]}
        log(rec)
        return rec

    while step < total:
        if batch_at >= len(plans[epoch]):
            epoch, batch_at = epoch + 1, 0
            continue
        t0 = time.perf_counter()
        batch_ids = plans[epoch][batch_at]
        mine = [train_set[i] for i in rank_share(batch_ids, lengths, rank, world_size)]
        denom = float(sum(int(train_set[i]["loss_mask"].sum()) for i in batch_ids))
        batch = {k: v.to(device) for k, v in pack_batch(mine, config.max_len).items()}
        report = forward_backward(model, batch, label_head, used, denom=denom,
                                  autocast=autocast, world_size=world_size)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(drafter.parameters(), config.grad_clip))
        loss_value = float(report[0])
        if not (math.isfinite(loss_value) and math.isfinite(grad_norm)):
            where = f"last good checkpoint: {good_ckpt}" if good_ckpt else "no checkpoint was written yet"
            raise EyasError(f"training diverged at step {step + 1}: loss {loss_value}, grad norm {grad_norm} ({where})",
                            "resume from that checkpoint with a lower --lr (or more --warmup), or check the data")
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step, batch_at = step + 1, batch_at + 1

        s = report[1:].reshape(3, -1).cpu()
        acc = (s[1] / s[2].clamp(min=1)).tolist()
        tokens = sum(lengths[i] for i in batch_ids)
        last.update(loss=loss_value, acc_by_step=acc)
        if main_rank:
            log({"kind": "train", "step": step, "epoch": epoch, "lr": scheduler.get_last_lr()[0], "loss": loss_value,
                 "loss_by_step": (s[0] / s[2].clamp(min=1)).tolist(), "acc_by_step": acc,
                 "positions_by_step": s[2].int().tolist(), "grad_norm": grad_norm, "tokens": tokens,
                 "tokens_per_s": tokens / (time.perf_counter() - t0)})
            bar.set_postfix(loss=f"{loss_value:.3f}", acc="/".join(f"{a:.2f}" for a in acc[:4]))
        bar.update(1)
        if main_rank and heldout and eval_every and (step % eval_every == 0 or step == total):
            last["eval"] = held_out_eval(step)
        if main_rank and ((config.save_every and step % config.save_every == 0) or step == total):
            good_ckpt = save(step, epoch, batch_at)
            plot_curves(log_path, png_path)
    bar.close()

    summary: dict[str, Any] = {
        "out": str(out), "steps": step, "epochs": config.epochs, "world_size": world_size,
        "capture_layers": list(contract.capture_layers), "draft_vocab_size": contract.draft_vocab_size,
        "coverage": coverage, "train_samples": len(train_set), "heldout_samples": len(heldout),
        "loss": last["loss"], "acc_by_step": last["acc_by_step"],
    }
    if main_rank:
        if heldout and last["eval"] is None:
            last["eval"] = held_out_eval(step)
        export = EXPORT_DTYPES[config.export_dtype]
        tensors = {k: v.detach().cpu().to(export) if v.is_floating_point() else v.cpu()
                   for k, v in drafter.state_dict().items()}
        draft = write_checkpoint(out / "draft", contract, tensors, "both", force=True)
        if log_path.exists():
            plot_curves(log_path, png_path)
        summary.update(draft=str(draft), checkpoint=str(latest_checkpoint(ckpt_dir)), log=str(log_path),
                       curves=str(png_path), eval=last["eval"])
    summary["elapsed_s"] = round(time.perf_counter() - t_start, 2)
    return summary


def _cpu_copy(drafter: Drafter) -> Drafter:
    """The drafter on the CPU for evaluation (eyas.evaluate builds its index tensors there)."""
    tensors = {k: v.detach().cpu() for k, v in drafter.state_dict().items()}
    return Drafter.from_tensors(drafter.contract, tensors, embed_tokens=drafter.embed_tokens.weight.cpu())


# --- `python -m eyas.train` (what torchrun launches) ------------------------------------------------


def _flag_type(annotation: str) -> type:
    """int | None -> int, etc.: the non-None type of a TrainConfig field."""
    hint = typing.get_type_hints(TrainConfig)[annotation]
    if isinstance(hint, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (`--draft-vocab` for draft_vocab); booleans are switches."""
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = _flag_type(f.name)
        if f.default is dataclasses.MISSING:
            p.add_argument(flag, dest=f.name, type=kind, required=True)
        elif kind is bool and f.default:
            p.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false")
        elif kind is bool:
            p.add_argument(flag, dest=f.name, action="store_true")
        else:
            p.add_argument(flag, dest=f.name, type=kind, default=f.default)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})


if __name__ == "__main__":  # `torchrun --nproc_per_node=N -m eyas.train ARGS` = `eyas train ARGS` per process
    from eyas.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
