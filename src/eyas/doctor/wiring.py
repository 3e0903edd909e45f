"""A wiring: every choice that decides what a draft computes, beyond its weights.

Which target states feed it, in which order, normed or not, at which position, with which norm
flags, embeddings, vocab map and rope. The contract states one wiring; exporters and engines get
each choice wrong in known ways, and the doctor measures the alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eyas.contract import DraftContract, default_capture_layers
from eyas.formats import NORM_FLAGS


@dataclass(frozen=True)
class Wiring:
    """One way of running the draft: the features it is fed and the settings it runs with."""

    layers: tuple[int, ...]  # capture indices, in concatenation order
    normed: str  # "none"; "all": every chunk through the target's final norm; "last": the deepest chunk only
    shift: int  # position t is fed the states of position t + shift
    norm_before_residual: bool
    norm_before_fc: bool
    fc_norm: bool
    norm_output: bool
    embeddings: str  # "own" (the checkpoint's embed_tokens) or "target"
    vocab: str  # "stored" d2t, "identity", "recovered" (from lm_head rows), or "none" (full vocab, no map)
    rope_theta: float
    rope_scaled: bool = False  # the config's rope_scaling applies (False: plain rope at rope_theta)

    def drafter_key(self) -> tuple:
        """The settings that need another drafter (the rest only changes the features it is fed)."""
        return (self.norm_before_residual, self.norm_before_fc, self.fc_norm, self.norm_output, self.embeddings,
                self.vocab, self.rope_theta, self.rope_scaled)

    def describe(self) -> str:
        flags = [f for f in NORM_FLAGS if getattr(self, f)]
        parts = [f"capture layers {list(self.layers)}", "final-normed features" if self.normed == "all" else
                 "deepest chunk final-normed" if self.normed == "last" else "raw residual stream"]
        if self.shift:
            parts.append(f"features of position t{self.shift:+d}")
        parts += [f"norm flags {flags or 'none'}", "own embeddings" if self.embeddings == "own" else
                  "the target's embeddings", self.rope()]
        if self.vocab != "none":
            parts.append(f"{self.vocab} d2t")
        return ", ".join(parts)

    def rope(self) -> str:
        """The rope it turns, in words: the theta, and whether the config's scaling applies."""
        return f"rope theta {self.rope_theta:g}" + (" with the config's rope_scaling" if self.rope_scaled else "")


def stored_ids(tensors: dict[str, Tensor], c: DraftContract) -> Tensor | None:
    """Target id of each draft id as the checkpoint stores it (d2t offsets, else the t2d mask)."""
    if "d2t" in tensors and tuple(tensors["d2t"].shape) == (c.draft_vocab_size,):
        return torch.arange(c.draft_vocab_size) + tensors["d2t"].long()
    if "t2d" in tensors and int(tensors["t2d"].sum()) == c.draft_vocab_size:
        return tensors["t2d"].bool().nonzero().flatten()
    return None


def contract_wiring(c: DraftContract, tensors: dict[str, Tensor], num_layers: int) -> Wiring:
    """How the contract says the draft runs. No layer ids: the engines' default; a reduced vocab
    without d2t: the identity map, which is what vLLM and SGLang then use (silently)."""
    has_map = stored_ids(tensors, c) is not None
    return Wiring(
        layers=tuple(c.capture_layers or default_capture_layers(num_layers)), normed="none", shift=0,
        norm_before_residual=c.norm_before_residual, norm_before_fc=c.norm_before_fc, fc_norm=c.fc_norm,
        norm_output=c.norm_output, embeddings="own" if c.has_embeddings else "target",
        vocab="stored" if has_map else "identity" if c.reduced_vocab else "none", rope_theta=c.rope_base,
        rope_scaled=bool(c.rope_scaling),
    )
