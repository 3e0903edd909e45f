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

from eyas.logit_map import LogitMap

# model types whose RMSNorm scales by (1 + weight), the weight stored zero-centred (Gemma's, Qwen3-Next's):
# transformers' own classes, each probed in tests/test_real_targets.py; every other family scales by weight
ZERO_CENTERED_NORM = frozenset({
    "gemma", "gemma2", "gemma3", "gemma3_text", "vaultgemma", "recurrent_gemma", "t5gemma", "qwen3_next", "qwen3_5",
    "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "minimax_m3_vl", "minimax_m3_vl_text"})
# a LayerNorm without bias: the mean taken out first; Cohere2-MoE's is one unless its config sets rms_norm_eps
MEAN_CENTERED_NORM = frozenset({"cohere", "cohere2", "cohere_compass", "cohere_compass_text"})
LAYER_NORM_UNLESS_RMS_EPS = frozenset({"cohere2_moe"})


def mean_centered(model_types: set[str], text: dict) -> bool:
    """Whether a target of these model types (its own and its language model's) with this language-model config
    has norms that take the mean out first."""
    return bool(model_types & MEAN_CENTERED_NORM) or bool(model_types & LAYER_NORM_UNLESS_RMS_EPS) \
        and text.get("rms_norm_eps") is None


@dataclass(frozen=True)
class TargetNorm:
    """One of the target's norms as its family computes it, in fp32: `offset` 1 where it scales by 1 + weight
    (ZERO_CENTERED_NORM), `centered` where it takes the mean out first (Cohere's LayerNorm: `mean_centered`).
    The final norm judges a cache stored before it (eyas.verdict); the doctor applies the final and input norms
    to the states a miswired engine would feed."""

    weight: Tensor  # [H]
    eps: float
    offset: float = 0.0
    centered: bool = False

    @classmethod
    def of(cls, weight: Tensor, model_types: set[str], text: dict) -> TargetNorm:
        """A norm of `weight` in the family of `model_types`, its eps read from the language model's config."""
        eps = float(text.get("rms_norm_eps") or text.get("layer_norm_eps") or 1e-6)
        return cls(weight, eps, 1.0 if model_types & ZERO_CENTERED_NORM else 0.0, mean_centered(model_types, text))

    def __call__(self, h: Tensor) -> Tensor:
        x = h.float()
        x = x - x.mean(-1, keepdim=True) if self.centered else x
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() + self.offset) * x


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
    norm: TargetNorm
    logit_map: LogitMap = LogitMap()

    def normalize(self, h: Tensor) -> Tensor:
        return self.norm(h)
