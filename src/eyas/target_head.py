"""What turns a target's last hidden state into its verdict, read from its weights alone: the final norm as its
family computes it, lm_head, and the map its class applies to lm_head's output (eyas.logit_map).

Caches store the last state either after the final norm (SpecForge, ModelOpt, eyas) or before it
(speculators/vLLM): judging the latter needs the norm, and a norm computed with another family's formula
(Llama's RMSNorm for Gemma's 1 + weight, or for Cohere's LayerNorm) gives a verdict that disagrees with the
target's own. The doctor applies the same norms to the states a miswired engine would feed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eyas.errors import FormatError
from eyas.logit_map import LogitMap

# model types whose norms scale by (1 + weight), the weight stored zero-centred (Gemma's, Qwen3-Next's RMSNorm,
# Nemotron's LayerNorm1P): transformers' own classes, each probed in tests/test_real_targets.py; every other
# family scales by weight
ZERO_CENTERED_NORM = frozenset({
    "gemma", "gemma2", "gemma3", "gemma3_text", "vaultgemma", "recurrent_gemma", "t5gemma", "qwen3_next", "qwen3_5",
    "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "minimax_m3_vl", "minimax_m3_vl_text", "nemotron"})
# a LayerNorm without bias (OLMo's has no weight either): the mean taken out first (a LayerNorm with one,
# StarCoder2's, StableLM's, Phi-3.5-MoE's, says so by its bias); Cohere2-MoE's is one unless its config sets
# rms_norm_eps
MEAN_CENTERED_NORM = frozenset({"cohere", "cohere2", "cohere_compass", "cohere_compass_text", "olmo"})
EPS_FIELDS = ("rms_norm_eps", "layer_norm_eps", "norm_epsilon", "layer_norm_epsilon", "norm_eps")  # by family
FIXED_EPS = {"olmo": 1e-5}  # set by the class, not read from config.json (OLMo's LayerNorm)
# families whose norms have no weight at all (OLMo's LayerNorm, nanochat's RMSNorm): their files hold no
# model.norm.weight, and the norm is read as ones (`TargetNorm.unweighted`)
WEIGHTLESS_NORM = frozenset({"olmo", "nanochat"})
LAYER_NORM_UNLESS_RMS_EPS = frozenset({"cohere2_moe"})


def mean_centered(model_types: set[str], text: dict) -> bool:
    """Whether a target of these model types (its own and its language model's) with this language-model config
    has norms that take the mean out first."""
    unless_rms = bool(model_types & LAYER_NORM_UNLESS_RMS_EPS) and text.get("rms_norm_eps") is None
    return bool(model_types & MEAN_CENTERED_NORM) or unless_rms


@dataclass(frozen=True)
class TargetNorm:
    """One of the target's norms as its family computes it, in fp32: `offset` 1 where it scales by 1 + weight
    (ZERO_CENTERED_NORM), `centered` where it takes the mean out first (a LayerNorm: Cohere's, `mean_centered`,
    or one with a `bias`, added last). The final norm judges a cache stored before it (eyas.verdict); the doctor
    applies the final and input norms to the states a miswired engine would feed."""

    weight: Tensor  # [H]
    eps: float
    offset: float = 0.0
    centered: bool = False
    bias: Tensor | None = None  # [H]

    @classmethod
    def of(cls, weight: Tensor, model_types: set[str], text: dict, bias: Tensor | None = None) -> TargetNorm:
        """A norm of `weight` (and `bias`) in the family of `model_types`, its eps read from the language model's
        config under its family's name for it."""
        fixed = [FIXED_EPS[t] for t in model_types if t in FIXED_EPS]
        eps = fixed[0] if fixed else float(next((text[k] for k in EPS_FIELDS if text.get(k)), 1e-6))
        return cls(weight, eps, 1.0 if model_types & ZERO_CENTERED_NORM else 0.0,
                   mean_centered(model_types, text) or bias is not None, bias)

    @classmethod
    def unweighted(cls, hidden_size: int, model_types: set[str], text: dict, device: torch.device | None = None
                   ) -> TargetNorm:
        """The norm of a family whose norms have no weight (WEIGHTLESS_NORM): weight ones."""
        return cls.of(torch.ones(hidden_size, device=device), model_types, text)

    def __call__(self, h: Tensor) -> Tensor:
        x = h.float()
        x = x - x.mean(-1, keepdim=True) if self.centered else x
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        x = (self.weight.float() + self.offset) * x
        return x if self.bias is None else x + self.bias.float()


@dataclass(frozen=True)
class TargetHead:
    """What turns the target's last hidden state into its verdict: the final norm and lm_head.

    Caches store the last state either after the final norm (SpecForge, ModelOpt, eyas) or before it
    (speculators/vLLM); `normalize` applies the norm as the target's family does (TargetNorm) (eyas.verdict),
    and `eyas.evaluate.target_greedy` takes the argmax of lm_head over the normed state. `logit_map` is what
    the target's class does to lm_head's output (Gemma 2's softcapping; eyas.logit_map): the argmax keeps, a
    distribution reads it.
    """

    lm_head: Tensor  # [V, H]
    norm: TargetNorm | None  # None: read for states stored after the final norm, which need none
    logit_map: LogitMap = LogitMap()

    def normalize(self, h: Tensor) -> Tensor:
        if self.norm is None:
            raise ValueError("this head was read without its final norm (for states stored after it)")
        return self.norm(h)


def refuse_head_bias(biased: bool, where: str) -> None:
    """eyas's verdicts read lm_head.weight alone (a cache's, the doctor's, serve-check's): the lm_head of a
    target that adds a bias (Phi-3.5-MoE's `lm_head_bias`) would be judged without it, silently."""
    if biased:
        raise FormatError(f"{where}: the target's lm_head adds a bias (lm_head.bias, Phi-3.5-MoE's lm_head_bias), "
                          "which eyas's verdicts from lm_head.weight leave out",
                          "generate and bench run such a target whole; eval, the doctor and serve-check cannot "
                          "judge a draft for it")
