"""The settings of a training run: `TrainConfig`, its checks, and the command-line flags made from it.

Every field carries its help text (and, where the values are a fixed set, its choices) as dataclass
field metadata, so `eyas train --help` is generated from the one place that defines the knobs and
cannot drift from it. Field names are the flag names: `draft_vocab` is `--draft-vocab`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shlex
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from eyas.dtypes import choices, to_dtype
from eyas.errors import EyasError
from eyas.formats.schema import LAYER_CONVENTIONS
from eyas.formats.values import MAX_LAYERS

TRAIN_DTYPES = (torch.bfloat16, torch.float32)  # autocast of the forward, and the exported weights
DTYPE_CHOICES = choices(TRAIN_DTYPES)


def _knob(default: Any = dataclasses.MISSING, help: str = "", **extra: Any) -> Any:
    """A TrainConfig field whose metadata holds its help text (and `choices`, `metavar`)."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class TrainConfig:
    """Every knob of a training run; field names are the CLI flag names (`--draft-vocab`, ...)."""

    data: str = _knob(help="capture folder(s) written by `eyas capture`, joined by commas: they train as one "
                           "data set", metavar="SHARDS[,SHARDS]")
    out: str = _knob(help="run folder: checkpoints/, train_log.jsonl, train_curves.png and the exported draft/",
                     metavar="DIR")
    target: str | None = _knob(None, "the target the data was captured from: its model folder, or the config.json "
                                     "inside it (default: the embedded default); never downloaded",
                               metavar="DIR_OR_CONFIG")
    verifier_name: str | None = _knob(None, "the target's hub id, recorded as the exported draft's verifier (vLLM "
                                            "serves it; default: the target as --target names it, which eyas check "
                                            "calls not portable where it is a local folder)", metavar="ID")
    init: str | None = _knob(None, "start from this draft (a checkpoint folder eyas reads, or default: the draft eyas "
                                   "ships for the target) instead of random weights: "
                                   "its weights and vocab map are kept; data, optimiser and schedule are new. It must "
                                   "fit the target and the data's capture layers. Not with --resume",
                             metavar="DRAFT")
    layer_convention: str | None = _knob(None, "with --init: how to read its nested eagle_config layer ids: input = "
                                               "capture indices, output = output of layer i (+1); default: as current "
                                               "SGLang (+1 only when the first id is 1)", choices=LAYER_CONVENTIONS)
    draft_vocab: int | None = _knob(None, "draft vocab size: the most frequent answer tokens "
                                          "(default: the target's full vocab, no d2t/t2d)", metavar="N")
    ttt_steps: int = _knob(7, "draft steps unrolled per position in training-time test (as EAGLE and SpecForge); "
                              "at most the longest sample's draft positions are unrolled", metavar="N")
    step_decay: float = _knob(0.8, "weight of TTT step j's loss is step_decay**j (EAGLE, SpecForge)", metavar="X")
    lr: float = _knob(1e-4, "peak learning rate (SpecForge's default)")
    warmup: int | None = _knob(None, "linear warmup steps (default: 1.5% of the run, SpecForge's warmup_ratio)",
                               metavar="STEPS")
    epochs: int = _knob(1, "passes over the training samples", metavar="N")
    max_steps: int | None = _knob(None, "stop after this many optimizer steps (the schedule shortens to fit)",
                                  metavar="N")
    batch_tokens: int = _knob(2048, "tokens per optimizer step, all processes together (about: a batch takes "
                                    "whole samples)", metavar="N")
    max_len: int = _knob(2048, "longer samples are cut to this many draft positions", metavar="N")
    grad_clip: float = _knob(0.5, "max global gradient norm (EAGLE, SpecForge)", metavar="NORM")
    weight_decay: float = _knob(0.0, "AdamW decay of matrices; norm weights are never decayed (EAGLE: 0)",
                                metavar="X")
    seed: int = _knob(0, "seed of the initial weights, the held-out split and the data order", metavar="N")
    save_every: int = _knob(200, "write a checkpoint every N steps, and at the end (0: only at the end)",
                            metavar="N")
    eval_every: int | None = _knob(None, "held-out eval every N steps (default: at each checkpoint; 0: never "
                                         "during the run)", metavar="N")
    eval_fraction: float = _knob(0.05, "share of prompts held out for eval, chosen by the seed, with "
                                 "every answer captured to them (0: none)", metavar="F")
    resume: bool = _knob(False, "continue the run in --out from its latest checkpoint (same settings and data)")
    dtype: str = _knob("bf16", "autocast dtype of the forward; master weights are always fp32",
                       choices=DTYPE_CHOICES)
    export_dtype: str = _knob("fp32", "dtype of the exported draft's weights", choices=DTYPE_CHOICES)
    num_hidden_layers: int = _knob(1, "draft decoder layers (EAGLE-3: 1)", metavar="N")
    norm_before_residual: bool = _knob(False, "norm flag: the residual stream carries hidden_norm(h), not the raw "
                                              "h (the four norm flags default to EAGLE-3's: all off)")
    norm_before_fc: bool = _knob(False, "norm flag: one RMSNorm over the concatenated captured features before fc")
    fc_norm: bool = _knob(False, "norm flag: one RMSNorm per captured layer before fc (EAGLE-3.1)")
    norm_output: bool = _knob(False, "norm flag: the next step reads norm(out), not the pre-norm out (EAGLE-3.1)")
    keep_checkpoints: int = _knob(2, "checkpoints kept; older ones are deleted", metavar="N")
    device: str | None = _knob(None, "torch device (default: this rank's GPU when CUDA is available, else cpu)")
    progress: bool = _knob(True, "progress bar on stderr (rank 0 only)")


def autocast_dtype(config: TrainConfig) -> torch.dtype | None:
    """The forward's autocast dtype, None for plain fp32."""
    dtype = to_dtype(config.dtype, TRAIN_DTYPES)
    return None if dtype == torch.float32 else dtype


def export_dtype(config: TrainConfig) -> torch.dtype:
    return to_dtype(config.export_dtype, TRAIN_DTYPES)


def data_folders(config: TrainConfig) -> list[str]:
    """The capture folders of `config.data` (comma-separated: captures run in parallel, e.g. with
    `eyas capture --skip`, train as one data set)."""
    return [f for f in config.data.split(",") if f]


# the range of each float knob; every float knob must be finite too
_FLOAT_RANGES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "lr": ("> 0", lambda v: v > 0),
    "step_decay": ("> 0", lambda v: v > 0),
    "grad_clip": ("> 0", lambda v: v > 0),
    "weight_decay": (">= 0", lambda v: v >= 0),
    "eval_fraction": ("in [0, 1)", lambda v: 0 <= v < 1),
}


class _Namer:
    """How a problem names a setting: `max_steps=0` to a Python caller, `--max-steps 0` on the command line,
    so either reader sees the name they typed."""

    def __init__(self, c: TrainConfig, flags: bool):
        self.c, self.flags = c, flags

    def __call__(self, name: str) -> str:
        return "--" + name.replace("_", "-") if self.flags else name

    def value(self, name: str) -> str:
        value = getattr(self.c, name)
        return f"{self(name)} {shlex.quote(str(value))}" if self.flags else f"{name}={value!r}"


def _float_problems(c: TrainConfig, said: _Namer) -> list[str]:
    """Every float knob finite and in its range: an inf --lr, --weight-decay, --step-decay or --grad-clip
    passes `> 0`, trains without an error and exports a draft whose every weight is inf or nan."""
    bad = []
    for f in dataclasses.fields(TrainConfig):
        if _flag_type(f.name) is float:
            value, (rule, ok) = getattr(c, f.name), _FLOAT_RANGES[f.name]
            if not (math.isfinite(value) and ok(value)):
                bad.append(f"{said.value(f.name)} (must be finite and {rule})")
    return bad


def check_config(c: TrainConfig, flags: bool = False) -> None:
    """Refuse impossible settings before anything is read or written, naming every one (as its command-line
    flag where `flags`, else as the TrainConfig field)."""
    said, bad = _Namer(c, flags), []
    for name in ("ttt_steps", "epochs", "batch_tokens", "num_hidden_layers", "keep_checkpoints"):
        if getattr(c, name) < 1:
            bad.append(f"{said.value(name)} (must be >= 1)")
    if c.num_hidden_layers > MAX_LAYERS:  # its export would be a draft no reader takes (eyas's own included)
        bad.append(f"{said.value('num_hidden_layers')} (must be <= {MAX_LAYERS})")
    if c.max_len < 2:
        bad.append(f"{said.value('max_len')} (must be >= 2)")
    for name in ("max_steps", "draft_vocab"):
        if getattr(c, name) is not None and getattr(c, name) < 1:
            bad.append(f"{said.value(name)} (must be >= 1)")
    bad += _float_problems(c, said)
    for name in ("save_every", "eval_every", "warmup"):
        if getattr(c, name) is not None and getattr(c, name) < 0:
            bad.append(f"{said.value(name)} (must be >= 0)")
    if not data_folders(c) or "" in [f.strip() for f in c.data.split(",")]:  # `A,$UNSET` trained on A alone
        bad.append(f"{said.value('data')} (a capture folder, or several joined by commas, none empty)")
    try:
        autocast_dtype(c), export_dtype(c)
    except EyasError:
        bad.append(f"{said.value('dtype')}, {said.value('export_dtype')} (each bf16 or fp32)")
    if c.verifier_name is not None and not c.verifier_name.strip():
        bad.append(f"{said.value('verifier_name')} (the target's hub id, e.g. HuggingFaceTB/SmolLM2-135M-Instruct)")
    if c.init and c.resume:
        bad.append(f"{said.value('init')} with {said('resume')} (a resumed run continues from its checkpoint; "
                   "pass one of them)")
    if c.layer_convention and not c.init:
        bad.append(f"{said.value('layer_convention')} without {said('init')} (it says how to read the warm "
                   "start's layer ids)")
    if bad:
        raise EyasError("invalid training settings: " + "; ".join(bad),
                        "fix the settings named above" if flags else
                        "fix the settings named above: each is the flag of that name with dashes (max_steps is "
                        "--max-steps)")


# --- the command line ----------------------------------------------------------------------------


def _flag_type(name: str) -> type:
    """int | None -> int, etc.: the non-None type of a TrainConfig field."""
    hint = typing.get_type_hints(TrainConfig)[name]
    if isinstance(hint, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per TrainConfig field (`--draft-vocab` for draft_vocab), with the field's help and
    choices; booleans are switches (`--no-progress` for a field that defaults to True)."""
    for f in dataclasses.fields(TrainConfig):
        flag, kind = "--" + f.name.replace("_", "-"), _flag_type(f.name)
        help_ = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        extra = {k: f.metadata[k] for k in ("choices", "metavar") if k in f.metadata}
        if "choices" in extra and kind is str:
            kind = str.lower  # the choices are lower case: BF16 is bf16, as eyas.dtypes reads any case
        if f.default is dataclasses.MISSING:
            p.add_argument(flag, dest=f.name, type=kind, required=True, help=help_, **extra)
        elif kind is bool and f.default:
            p.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false", help=f"no {help_}")
        elif kind is bool:
            p.add_argument(flag, dest=f.name, action="store_true", help=help_)
        else:
            shown = "" if f.default is None or "default:" in help_ else f" (default: {f.default})"
            p.add_argument(flag, dest=f.name, type=kind, default=f.default, help=help_ + shown, **extra)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed `add_arguments` flags."""
    return TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
