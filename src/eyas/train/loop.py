"""`train(config)`: one training run, from the data to the exported draft, on one process or under torchrun.

The run in steps (each a method of `_Run`):

    setup      the run folder; with --resume its latest checkpoint (refused when written by other
               settings), without it a folder that already holds a run is refused
    data       the captures, refused when from another target, from the evaluation prompts or (resuming)
               at other layers; samples shifted once, a seeded held-out split
    model      a fresh draft, a warm start from --init, or the resumed checkpoint's draft; its TTT unroll
               (--ttt-steps, cut to the longest sample: no later step has a label)
    optimiser  AdamW, warmup + cosine over the planned steps; a resumed run restores both and the RNGs
    step loop  global batch of ~batch_tokens -> this rank's share -> packed rows -> TTT loss, backward,
               grad clip, step; a JSONL record per step; held-out eval and checkpoints on schedule; a loss,
               gradient or weight that is not finite stops the run (one without a checkpoint leaves nothing)
    export     the draft in both formats (embeddings not saved), curves, the summary

Under `torchrun --nproc_per_node=N -m eyas train ...` every process runs this; the process group comes
from torchrun's environment, and only rank 0 writes files and returns the summary.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from eyas.devices import parse_device
from eyas.errors import EyasError
from eyas.formats import write_checkpoint
from eyas.formats.validate import not_finite
from eyas.interrupt import on_signals
from eyas.machine import runs_on
from eyas.target import target_config
from eyas.train.batches import pack_batch, plan_epoch, rank_share
from eyas.train.checkpoint import (
    RunFiles,
    append_log,
    checkpoint_path,
    config_dict,
    forget_run,
    latest_checkpoint,
    load_state,
    plot_curves,
    prepare,
    read_log,
    refuse_old_run,
    resumable,
    save_state,
    set_rng_state,
)
from eyas.train.config import TrainConfig, autocast_dtype, check_config, export_dtype
from eyas.train.dataset import TrainingData, load_training_data
from eyas.train.draft import TrainDraft, fresh_draft, resumed_draft, warm_start
from eyas.train.heldout import heldout_eval
from eyas.train.loss import TTTUnroll, forward_backward
from eyas.train.schedule import make_optimizer


def train(config: TrainConfig) -> dict[str, Any] | None:
    """Train a draft as `config` says. Returns a JSON-ready summary on rank 0 (None on other ranks)."""
    check_config(config)
    rank, world_size, started = _init_distributed()
    try:
        return _Run(config, rank, world_size).run()
    finally:
        if started:
            # whatever still holds the process group (a DDP wrapper in a reference cycle) must let go of it
            # now: freed later, at interpreter exit, gloo's threads abort the process
            gc.collect()
            dist.destroy_process_group()


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
        return parse_device(config.device)  # as every verb reads --device: "CPU", " cuda:0 "
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


class _Run:
    """One training run; the methods are its steps, in order."""

    def __init__(self, config: TrainConfig, rank: int, world_size: int):
        self.config, self.rank, self.world_size = config, rank, world_size
        self.main = rank == 0
        self.t_start = time.perf_counter()

    def run(self) -> dict[str, Any] | None:
        try:
            with on_signals(self.resume_note) as self.guard, warnings.catch_warnings():  # Ctrl-C / SIGTERM
                if not self.main:  # every rank reads the data; rank 0 says what it found, once
                    warnings.simplefilter("ignore")
                self.setup()
                self.load_data()
                self.build_model()
                self.build_optimiser()
                self.step_loop()
                return self.export() if self.main else None
        except BaseException:  # a full disk, a crash or Ctrl-C before the first checkpoint: nothing to resume,
            # the folder as it was (a run that saved one keeps it, and its log, to resume from)
            if self.main and getattr(self, "good_checkpoint", None) is None and hasattr(self, "made"):
                forget_run(self.files, self.made)
            raise
        finally:
            # the guard holds self.resume_note: broken, this cycle no longer keeps the run, and the DDP
            # wrapper that holds the process group, alive until a later garbage collection (train())
            self.guard = None

    def resume_note(self) -> str:
        """What an interrupted run left, and how to resume it."""
        files = getattr(self, "files", None)
        found = latest_checkpoint(files.checkpoints) if files else None
        if found is None:
            return (f"{self.config.out} holds no checkpoint yet: rerun the same `eyas train` command (without "
                    "--resume) to start again")
        c = self.config
        warm = [flag for flag, given in (("--init", c.init), ("--layer-convention", c.layer_convention)) if given]
        without = f", without {' and '.join(warm)} (the checkpoint holds the warm start)" if warm else ""
        return (f"{c.out} resumes from checkpoint {found.name}: rerun the same `eyas train` command with "
                f"--resume{without}")

    def stop_here(self) -> None:
        """A signal was held during the step just finished: save this step (rank 0), then stop."""
        if self.main and self.good_checkpoint != checkpoint_path(self.files.checkpoints, self.step):  # not saved yet
            self.good_checkpoint = self.save()
        raise self.guard.stop()

    # --- setup, data, model, optimiser -----------------------------------------------------------

    def setup(self) -> None:
        c = self.config
        self.files = RunFiles.of(c.out)
        self.device = _device(c)
        # what each step's seconds ran on: learning curves count processor-hours (eyas.train.curve)
        self.hardware = {"device": self.device.type, "procs": self.world_size, "threads": torch.get_num_threads(),
                         "runs_on": runs_on(self.device)}  # the CPU's kind or the GPU's name, for every speed
        self.resumed_from = resumable(self.files) if c.resume else None
        if not c.resume:
            refuse_old_run(self.files)
        self.state = load_state(self.resumed_from, c, self.world_size) if self.resumed_from else None

    def load_data(self) -> None:
        """Refused before anything is built when the capture is from another target or (resuming) at
        other capture layers than the draft reads."""
        self.tcfg = target_config(self.config.target)
        layers = self.state["contract"]["capture_layers"] if self.state else None
        self.data: TrainingData = load_training_data(self.config, expect_capture_layers=layers)
        saved, now = (self.state["data"] if self.state else self.data.data_id), self.data.data_id
        split_by_sample = "prompts" in now and saved == {k: v for k, v in now.items() if k != "prompts"}
        if split_by_sample:
            raise EyasError(f"{self.resumed_from} was split sample by sample by an earlier eyas, and "
                            f"{now['samples'] - now['prompts']} of its samples answer a prompt another sample "
                            "answers: its held-out set shares prompts with training (its held-out tau overstates "
                            "the draft); eyas now holds out whole prompts", "train into a new --out")
        if saved != now:
            raise EyasError(f"{self.config.data} is not the capture {self.resumed_from} was trained on "
                            f"({saved} there, {now} now)", "resume with the same data, or train into a new --out")
        if len(self.data.train_set) < self.world_size:
            raise EyasError(f"{len(self.data.train_set)} training samples for {self.world_size} processes",
                            "capture more data or use fewer processes")

    def build_model(self) -> None:
        c, d = self.config, self.data
        if self.state:
            draft = resumed_draft(c, self.state, d.train_set)
        elif c.init:
            draft = warm_start(c, self.tcfg, d.capture_layers, d.train_set)
        else:
            draft = fresh_draft(c, self.tcfg, d.capture_layers, d.train_set)
        self.draft: TrainDraft = draft.to(self.device)
        self.autocast = autocast_dtype(c)
        self.label_head = self.draft.lm_head.to(self.autocast or torch.float32)  # labels' matmul: training dtype
        model: nn.Module = TTTUnroll(self.draft.drafter, self.unrolled_steps(), c.step_decay)
        if self.world_size > 1:  # buffers (d2t, t2d, shared embeddings) never change: no per-step broadcast
            with warnings.catch_warnings():  # torch 2.13 renames broadcast_buffers; torch 2.9 has only this name
                warnings.simplefilter("ignore", FutureWarning)
                model = nn.parallel.DistributedDataParallel(
                    model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                    broadcast_buffers=False,
                )
        self.model = model

    def unrolled_steps(self) -> int:
        """--ttt-steps, cut (with a note on stderr) to the longest training sample's draft positions.

        Step j at position t is graded on the label j positions on in the same sample, so no step
        past the longest sample has a label: it changes neither the loss nor the gradient, yet each
        one still holds a whole step's activations (1000 steps on 14-token samples took 4.4 GB).
        """
        steps, longest = self.config.ttt_steps, max(self.data.lengths)
        if steps > longest and self.main:
            print(f"note: --ttt-steps {steps} unrolls {longest} steps: no step past the longest training sample "
                  f"({longest} draft positions, --max-len {self.config.max_len}) has a label", file=sys.stderr)
        return min(steps, longest)

    def build_optimiser(self) -> None:
        c = self.config
        self.plans, self.total = [], 0
        for e in range(c.epochs):  # the epochs --max-steps reaches, not every one --epochs names
            self.plans.append(plan_epoch(self.data.lengths, c.batch_tokens, c.seed, e, self.world_size))
            self.total += len(self.plans[-1])
            if c.max_steps is not None and self.total >= c.max_steps:
                break
        if c.max_steps is not None:
            self.total = min(self.total, c.max_steps)
        self.optimizer, self.scheduler = make_optimizer(self.draft.drafter, lr=c.lr, weight_decay=c.weight_decay,
                                                        warmup=c.warmup, total=self.total)
        self.step, self.epoch, self.batch_at = 0, 0, 0
        if self.state:
            self.optimizer.load_state_dict(self.state["optimizer"])
            self.scheduler.load_state_dict(self.state["scheduler"])
            set_rng_state(self.state["rng"])
            self.step, self.epoch, self.batch_at = self.state["step"], self.state["epoch"], self.state["batch"]

    # --- the step loop ---------------------------------------------------------------------------

    def step_loop(self) -> None:
        c = self.config
        self.made = prepare(self.files, self.step if self.state else None) if self.main else []
        eval_every = c.save_every if c.eval_every is None else c.eval_every
        bar = tqdm(total=self.total, initial=self.step, unit="step", desc="train", file=sys.stderr,
                   disable=not (c.progress and self.main))
        self.last: dict[str, Any] = {"loss": None, "acc_by_step": None, "eval": None}
        if self.main and self.state and self.step >= self.total:
            self.recall_last()
        self.good_checkpoint = self.resumed_from
        self.guard.hold(self.world_size == 1)  # one process: a signal waits for the end of the step
        while self.step < self.total:
            if self.batch_at >= len(self.plans[self.epoch]):
                self.epoch, self.batch_at = self.epoch + 1, 0
                continue
            record = self.train_step(self.plans[self.epoch][self.batch_at])
            if self.main:
                append_log(self.files.log, record)
                acc = "/".join(f"{a:.2f}" for a in record["acc_by_step"][:4])
                bar.set_postfix(loss=f"{record['loss']:.3f}", acc=acc)
            bar.update(1)
            at_end = self.step == self.total
            if self.main and self.data.heldout and eval_every and (self.step % eval_every == 0 or at_end):
                self.held_out_eval()
            if self.main and ((c.save_every and self.step % c.save_every == 0) or at_end):
                self.good_checkpoint = self.save()
                plot_curves(self.files.log, self.files.curves)
            if self.guard.pending:
                self.stop_here()
        self.guard.hold(False)
        bar.close()

    def recall_last(self) -> None:
        """A run resumed after its last step takes none: its last loss and held-out eval are the log's
        records of that step (measured again, a second eval record was appended to the log)."""
        for record in read_log(self.files.log) if self.files.log.is_file() else []:
            if record.get("step") == self.step and record.get("kind") == "train":
                self.last.update(loss=record["loss"], acc_by_step=record["acc_by_step"])
            elif record.get("step") == self.step and record.get("kind") == "eval":
                self.last["eval"] = record

    def train_step(self, batch_ids: list[int]) -> dict[str, Any]:
        """One optimizer step on a global batch; returns its log record."""
        t0 = time.perf_counter()
        train_set, lengths = self.data.train_set, self.data.lengths
        mine = [train_set[i] for i in rank_share(batch_ids, lengths, self.rank, self.world_size)]
        denom = float(sum(int(train_set[i]["loss_mask"].sum()) for i in batch_ids))
        batch = {k: v.to(self.device) for k, v in pack_batch(mine, self.config.max_len).items()}
        report = forward_backward(self.model, batch, self.label_head, self.draft.used, denom=denom,
                                  autocast=self.autocast, world_size=self.world_size, logit_map=self.draft.logit_map)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.draft.drafter.parameters(), self.config.grad_clip))
        loss = float(report[0])
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            self.diverged(self.step + 1, f"loss {loss}, grad norm {grad_norm}")
        lr = self.scheduler.get_last_lr()[0]  # the rate this step takes (the scheduler then sets the next one's)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step, self.batch_at = self.step + 1, self.batch_at + 1
        s = report[1:].reshape(3, -1).cpu()
        acc = (s[1] / s[2].clamp(min=1)).tolist()
        self.last.update(loss=loss, acc_by_step=acc)
        tokens = sum(lengths[i] for i in batch_ids)
        return {"kind": "train", "step": self.step, "epoch": self.epoch, "lr": lr,
                "loss": loss, "loss_by_step": (s[0] / s[2].clamp(min=1)).tolist(), "acc_by_step": acc,
                "positions_by_step": s[2].int().tolist(), "grad_norm": grad_norm, "tokens": tokens,
                "tokens_per_s": tokens / (time.perf_counter() - t0), **self.hardware}

    def diverged(self, step: int, what: str) -> NoReturn:
        """Stop a run whose loss, gradient or weights are no longer finite. One that wrote no checkpoint
        leaves nothing behind (`forget_run`): there is nothing to resume, and its folder would refuse a rerun."""
        good = self.good_checkpoint
        if good is None and self.main:
            forget_run(self.files, self.made)
        where = f"last good checkpoint: {good}" if good else f"no checkpoint was written; {self.files.out} is as before"
        raise EyasError(f"training diverged at step {step}: {what} ({where})",  # --resume keeps the run's --lr
                        "train again with a lower --lr (or more --warmup), or check the data")

    def check_weights(self) -> None:
        """Weights an update made inf or nan (an --lr of 1e308) after a finite loss: the run stops as
        diverged rather than write them to a checkpoint, or (the last save precedes it) the draft."""
        for name, weight in self.draft.drafter.named_parameters():
            bad = not_finite(name, weight.detach())
            if bad:
                self.diverged(self.step, f"after the update, {bad['problem']}")

    def held_out_eval(self) -> None:
        self.last["eval"] = heldout_eval(self.draft.drafter, self.data.heldout, self.draft.lm_head, self.step)
        append_log(self.files.log, self.last["eval"])

    def save(self) -> Path:
        self.check_weights()
        drafter = self.draft.drafter
        return save_state(self.files.checkpoints, self.step, {
            "epoch": self.epoch, "batch": self.batch_at, "world_size": self.world_size,
            "config": config_dict(self.config), "data": self.data.data_id, "contract": drafter.contract.to_dict(),
            "model": drafter.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }, self.config.keep_checkpoints)

    # --- export ----------------------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """Rank 0: the final eval when none ran at the last step, the draft, the curves; the summary."""
        contract, files = self.draft.drafter.contract.verifier_named(self.config.verifier_name), self.files
        if self.data.heldout and self.last["eval"] is None:
            self.held_out_eval()
        dtype = export_dtype(self.config)
        tensors = {k: v.detach().cpu().to(dtype) if v.is_floating_point() else v.cpu()
                   for k, v in self.draft.drafter.state_dict().items()}
        draft = write_checkpoint(files.draft, contract, tensors, "both", force=True)
        if files.log.exists():
            plot_curves(files.log, files.curves)
        return {
            "out": str(files.out), "steps": self.step, "epochs": self.config.epochs,
            "epochs_run": round(self.epoch + self.batch_at / len(self.plans[self.epoch]), 3),  # --max-steps may stop
            "world_size": self.world_size,
            "init": self.config.init, "capture_layers": list(contract.capture_layers),
            "draft_vocab_size": contract.draft_vocab_size, "coverage": self.draft.coverage,
            "train_samples": len(self.data.train_set), "heldout_samples": len(self.data.heldout),
            "loss": self.last["loss"], "acc_by_step": self.last["acc_by_step"],
            "draft": str(draft), "checkpoint": str(latest_checkpoint(files.checkpoints)), "log": str(files.log),
            "curves": str(files.curves), "eval": self.last["eval"],
            "elapsed_s": round(time.perf_counter() - self.t_start, 2), "runs_on": self.hardware["runs_on"],
        }
