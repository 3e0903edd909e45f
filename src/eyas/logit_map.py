"""What a target's class does to lm_head's output before its softmax: Gemma 2's softcapping, Granite's and
Cohere's scales.

eyas computes a target's logits from its final hidden state and lm_head: the decoder's output when it runs the
model (eyas.target, the lean forward), a cache's stored state with the head read alone (eyas.target_ref) or
the labels of training. The classes of a few families then change those logits, each its own way, from a
config field; the field alone does not say it (Granite divides by `logits_scaling`, HyperCLOVA X multiplies by
it, and LLaVA running a Granite language model applies nothing). So the class named by config.json's
`model_type` decides, as transformers' code does, each family probed in tests/test_logit_map.py.

Every map here increases, so a greedy verdict (the argmax) never depends on it, but a distribution does:
sampled decoding, `eval --temperature`, the doctor's log-probabilities and training's labels read logits
through it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from eyas.errors import FormatError

# outer model_type -> the config fields its class applies to lm_head's output, in order: "mul" multiplies,
# "div" divides, "cap" softcaps (cap * tanh(logits / cap)); the fields are read from the language model's
# config (MiniCPM3's `logits_scaling` is hidden_size / dim_model_base, a property of transformers' config).
# Every family whose transformers class maps its logits, but MuseGlimmer and Inkling (theirs are more than a
# map) and Falcon-H1 (eyas finds no final norm in it). Gemma 3's image-text class applies no softcapping,
# where its text class does
FAMILIES: dict[str, tuple[tuple[str, str], ...]] = {
    **{t: (("final_logit_softcapping", "cap"),) for t in (
        "gemma2", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text", "vaultgemma",
        "nanochat")},
    **{t: (("logits_scaling", "div"),) for t in (
        "granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "granite_swa", "granitemoe_swa",
        "granite4_vision", "minicpm3")},
    **{t: (("logits_scaling", "mul"),) for t in ("hyperclovax", "hyperclovax_vision_v2")},
    **{t: (("logit_scale", "mul"),) for t in (
        "cohere", "cohere2", "cohere2_moe", "cohere_compass", "cohere_compass_text")},
}


@dataclass(frozen=True)
class LogitMap:
    """logits -> softcap(logits * multiplier / divisor): what the target's class returns for lm_head's output,
    computed as it computes it (a division stays one: x / 3 and x * (1 / 3) differ in the last bit)."""

    multiplier: float = 1.0
    divisor: float = 1.0
    softcap: float | None = None

    def __call__(self, logits: Tensor) -> Tensor:
        if self.multiplier != 1.0:
            logits = logits * self.multiplier
        if self.divisor != 1.0:
            logits = logits / self.divisor
        if self.softcap is not None:
            logits = (logits / self.softcap).tanh() * self.softcap
        return logits

    @property
    def identity(self) -> bool:
        return self.multiplier == self.divisor == 1.0 and self.softcap is None


def logit_map(model_type: str | None, text_config: Any, where: str = "config.json") -> LogitMap:
    """The map the class of `model_type` (config.json's own, not its language model's) applies, its fields read
    from `text_config`: the language model's config (the config itself where it is flat), as transformers reads
    it where it can (its properties and defaults), else as a dict. A field set to a
    value the class would divide by zero with, or that would reverse the ranking (not positive), is refused
    in one line naming `where`."""
    multiplier, divisor, softcap = 1.0, 1.0, None
    for name, op in FAMILIES.get(model_type, ()) if isinstance(model_type, str) else ():
        value = text_config.get(name) if isinstance(text_config, dict) else getattr(text_config, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise FormatError(f"{where}: {name} is {value!r}; a {model_type} target's logits need it a positive "
                              "number", f"set {name} to the value the checkpoint was trained with, or remove it")
        if op == "cap":
            softcap = float(value)
        elif op == "mul":
            multiplier = float(value)
        else:
            divisor = float(value)
    return LogitMap(multiplier, divisor, softcap)
