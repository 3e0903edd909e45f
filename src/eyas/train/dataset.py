"""The training data of a run: its captures opened and checked, samples cut to length, a held-out split.

Several capture folders (`--data A,B`: captures made in parallel) train as one data set when they
were made at the same capture layers from the same target. Training samples are shifted for the
draft here, once; held-out samples stay unshifted (`eyas.evaluate` shifts them itself).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from eyas.data import CapturedData, open_shards
from eyas.errors import ContractError, EyasError
from eyas.evaluate import draft_starts
from eyas.shift import shift_for_draft
from eyas.target import TargetRef
from eyas.train.config import TrainConfig, data_folders


@dataclass
class TrainingData:
    capture_layers: list[int]
    train_set: list[dict[str, Tensor]]  # shifted (eyas.shift.shift_for_draft)
    heldout: list[dict[str, Tensor]]  # unshifted, for eyas.evaluate
    data_id: dict[str, Any]  # what a resumed run must find again: fingerprints and sample count

    @property
    def lengths(self) -> list[int]:
        """Draft positions per training sample (what batches are cut by)."""
        return [s["input_ids"].shape[0] for s in self.train_set]


def load_training_data(config: TrainConfig, *, expect_capture_layers: list[int] | None = None) -> TrainingData:
    """Open `config.data` for training: refused when captured from another target, from the held-out
    evaluation prompts, or (`expect_capture_layers`, when resuming) at other layers than the draft's."""
    target = TargetRef.resolve(config.target, weights=False)
    captures = [open_shards(f, for_training=True, expect_target=target,
                            expect_capture_layers=expect_capture_layers) for f in data_folders(config)]
    refuse_repeats(captures)
    capture_layers = same_capture_layers(captures)
    samples = [s for data in captures for s in load_samples(data, config.max_len)]
    prompts = by_prompt(samples)
    data_id = {"fingerprint": ",".join(data.manifest["fingerprint"] for data in captures), "samples": len(samples)}
    if len(prompts) < len(samples):  # absent otherwise: a run resumes with the data_id it saved (see _Run.load_data)
        data_id["prompts"] = len(prompts)
    train_idx, heldout_idx = split(prompts, config.eval_fraction, config.seed)
    heldout = [samples[i] for i in heldout_idx]
    if heldout and not any(bool(draft_starts(s["loss_mask"]).any()) for s in heldout):  # refused at the first eval
        raise EyasError(f"--eval-fraction {config.eval_fraction}: the {len(heldout)} held-out samples, cut to "
                        f"--max-len {config.max_len}, have no answer the draft can be measured on (two answer tokens "
                        "in a row after the first)", "raise --max-len, hold out more (--eval-fraction), or pass "
                        "--eval-fraction 0")
    return TrainingData(capture_layers, [shift_for_draft(samples[i]) for i in train_idx], heldout, data_id)


def refuse_repeats(captures: list[CapturedData]) -> None:
    """Each capture once: one passed twice (or a copy of it: the same fingerprint) would train its
    samples twice and could put a copy of a held-out sample in the training set."""
    seen: dict[str, CapturedData] = {}
    for data in captures:
        first = seen.setdefault(data.manifest["fingerprint"], data)
        if first is not data:
            same = "is given twice" if first.folder == data.folder else f"holds the same capture as {first.folder}"
            raise EyasError(f"--data {data.folder} {same} (fingerprint {data.manifest['fingerprint']})",
                            "pass each capture once")


def same_capture_layers(captures: list[CapturedData]) -> list[int]:
    """The capture layers all folders share; folders captured at other layers are refused."""
    layers = captures[0].capture_layers
    for data in captures[1:]:
        if data.capture_layers != layers:
            raise ContractError(f"{data.folder}: captured at layers {data.capture_layers}, "
                                f"{captures[0].folder} at {layers}", "train on captures made at the same layers")
    return layers


def load_samples(data: CapturedData, max_len: int) -> list[dict[str, Tensor]]:
    """Unshifted samples cut to max_len + 1 tokens (max_len draft positions), with an answer left.

    None left is refused, saying whether the data has no answers or --max-len cut them all off (and
    the --max-len that keeps the earliest answer); some cut off are said (the --max-len that keeps them
    all): long first turns of real chats were dropped from training unsaid; so are samples with no
    answer to label (a loss_mask its trainer's template missed)."""
    samples, earliest, dropped, unlabelled = [], None, [], 0
    for s in data:
        answer = s["loss_mask"][2:].nonzero()  # draft labels x_{t+2} inside the answer
        if not len(answer):
            unlabelled += 1
            continue
        first = 2 + int(answer[0])  # kept when the cut (max_len + 1 tokens) reaches it
        earliest = first if earliest is None else min(earliest, first)
        if first <= max_len:
            samples.append({k: s[k][: max_len + 1] for k in ("input_ids", "loss_mask", "features", "last_hidden")})
        else:
            dropped.append(first)
    read = len(samples) + len(dropped) + unlabelled
    if samples and dropped:
        warnings.warn(f"{data.folder}: {len(dropped)} of {read} samples left out: their "
                      f"answers start past --max-len {max_len} (the latest at token {max(dropped)}; --max-len "
                      f"{max(dropped)} keeps them all)", stacklevel=2)
    if samples and unlabelled:
        warnings.warn(f"{data.folder}: {unlabelled} of {read} samples left out: "
                      "no answer token to label (an empty loss_mask, or answer tokens only among the first 2)",
                      stacklevel=2)
    if earliest is None:
        raise EyasError(f"{data.folder}: no sample has answer tokens to train on",
                        "capture data with responses (eyas capture)")
    if not samples:
        raise EyasError(f"{data.folder}: --max-len {max_len} cuts off every sample's answer (the earliest "
                        f"answer starts at token {earliest})", f"train with --max-len {earliest} or more")
    return samples


def by_prompt(samples: list[dict[str, Tensor]]) -> list[list[int]]:
    """Sample indices grouped by the prompt they answer (the tokens before the first answer token), in
    order of first appearance. Two captures of the same prompts (greedy and sampled answers, fp32 and
    bf16) hold each prompt twice: split sample by sample, a held-out prompt's other answer trained."""
    groups: dict[bytes, list[int]] = {}
    for i, s in enumerate(samples):
        answer = s["loss_mask"].nonzero()
        start = int(answer[0]) if len(answer) else len(s["loss_mask"])
        groups.setdefault(s["input_ids"][:start].numpy().tobytes(), []).append(i)
    return list(groups.values())


def split(prompts: list[list[int]], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) sample indices: a seeded permutation of the prompts, every sample of a prompt on
    one side; at least one prompt held out when asked for. Prompts answered once each split as samples
    did before prompts were grouped, so runs resume with the held-out set they started with."""
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed)).tolist()
    k = 0 if fraction == 0 else min(len(prompts) - 1, max(1, round(len(prompts) * fraction)))
    return (sorted(i for p in order[k:] for i in prompts[p]), sorted(i for p in order[:k] for i in prompts[p]))
