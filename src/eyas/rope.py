"""Rotary position embedding frequencies for a draft's contract, rope scaling included.

The same formulas as transformers' `ROPE_INIT_FUNCTIONS` (`modeling_rope_utils.py`; tested against
them), written out so the drafter needs no transformers config object: the contract's `rope_base`,
`head_dim`, `max_position_embeddings` and `rope_scaling` are all they read. The drafter applies the
rotation (`eyas.drafter.rotate_half`); this module only says how fast each pair of dims turns.

`dynamic` is read as serving engines build it, statically (vLLM 0.32's `get_rope`; SGLang's
differs without `alpha`, its view says so): with Hunyuan's `alpha` the base becomes
theta * alpha^(d/(d-2)) at every position (vLLM's and SGLang's DynamicNTKAlphaRotaryEmbedding, and
transformers' HunYuan rope); without it the frequencies are the default ones (vLLM 0.32's
DynamicNTKScalingRotaryEmbedding at its trained length, and transformers' within
max_position_embeddings, the only positions a draft is trained and served at).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from eyas.contract import ROPE_TYPES, DraftContract
from eyas.errors import ContractError


def _rope_param(scaling: dict, key: str, rope_type: str):
    if scaling.get(key) is None:
        raise ContractError(
            f"rope_scaling of type {rope_type!r} has no {key!r}",
            f"add {key!r} to rope_scaling in the draft config (copy it from the target's config)",
        )
    return scaling[key]


def alpha_base(theta: float, alpha: float, head_dim: int) -> float:
    """The rope base NTK-alpha scaling turns at: theta * alpha^(d/(d-2)), d the rotated head width."""
    return theta * alpha ** (head_dim / (head_dim - 2))


def rope_parameters(c: DraftContract) -> tuple[Tensor, float]:
    """Inverse frequencies [head_dim / 2] (fp32) and the cos/sin scale for the contract's rope type.

    Same formulas as transformers' `ROPE_INIT_FUNCTIONS` (tested against them): `linear` divides
    every frequency by `factor`; `llama3` divides only long wavelengths and blends the middle band;
    `yarn` blends interpolated and original frequencies over a ramp and scales cos/sin; `dynamic`
    raises the base by `alpha` where it is given and is the default rope otherwise (module docstring).
    """
    scaling = dict(c.rope_scaling or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ContractError(
            f"rope_scaling type {rope_type!r} is not supported by the eyas drafter",
            f"supported: {', '.join(ROPE_TYPES)}",
        )
    if scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ContractError(
            f"rope_scaling partial_rotary_factor {scaling['partial_rotary_factor']} is not supported",
            "EAGLE-3 drafts rotate the whole head; remove partial_rotary_factor or use a different runner",
        )
    base, dim = c.rope_base, c.head_dim
    if rope_type == "dynamic" and scaling.get("alpha") is not None:
        base = alpha_base(base, float(scaling["alpha"]), dim)
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim)
    if rope_type in ("default", "dynamic"):
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / _rope_param(scaling, "factor", rope_type), 1.0
    original_len = scaling.get("original_max_position_embeddings") or c.max_position_embeddings
    if rope_type == "llama3":
        factor = _rope_param(scaling, "factor", rope_type)
        low = _rope_param(scaling, "low_freq_factor", rope_type)
        high = _rope_param(scaling, "high_freq_factor", rope_type)
        wavelen = 2 * math.pi / inv_freq
        # wavelength > original_len / low: interpolate fully; < original_len / high: keep; between: blend
        scaled = torch.where(wavelen > original_len / low, inv_freq / factor, inv_freq)
        smooth = (original_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        medium = (wavelen >= original_len / high) & (wavelen <= original_len / low)
        return torch.where(medium, blended, scaled), 1.0
    # yarn
    factor = scaling.get("factor") or c.max_position_embeddings / original_len

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:  # the dim index that turns `rotations` times
        return dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(scaling.get("beta_fast") or 32), correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = torch.arange(dim // 2, dtype=torch.float32, device="cpu")
    ramp = ((ramp - low) / ((high - low) or 1e-3)).clamp(0, 1)
    # ramp 0: high frequency, keep (extrapolate); ramp 1: low frequency, interpolate by `factor`
    return inv_freq * (1 - ramp) + inv_freq / factor * ramp, float(attention_factor)
