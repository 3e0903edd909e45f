"""A `DraftContract` written out as each format's config dict: every flag explicit, no auto_map.

Capture layers leave eyas's convention here and nowhere else: speculators' top-level ids and an
eagle config's top-level ids are capture indices (vLLM reads them); an eagle config's nested ids are
chosen so that current SGLang captures the same layers (`sglang_layer_ids`).
"""

from __future__ import annotations

import copy
from typing import Any

from eyas.contract import IDS, DraftContract
from eyas.formats.schema import EAGLE_ARCH, NORM_FLAGS


def _rope_fields(c: DraftContract) -> dict[str, Any]:
    """rope_theta + rope_scaling for transformers 4 readers and rope_parameters for transformers 5."""
    if c.rope_theta is None:
        return {"rope_scaling": c.rope_scaling} if c.rope_scaling else {}
    params = {"rope_type": "default"} if not c.rope_scaling else dict(c.rope_scaling)
    return {
        "rope_theta": c.rope_theta,
        "rope_scaling": c.rope_scaling,
        "rope_parameters": {**params, "rope_theta": c.rope_theta},
    }


def _layer_dims(c: DraftContract) -> dict[str, Any]:
    return {
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": c.num_hidden_layers,
        "hidden_act": c.hidden_act,
        "attention_bias": c.attention_bias,
        "rms_norm_eps": c.rms_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size,  # the TARGET's vocab (vLLM and speculators expect that here)
        **_rope_fields(c),
        **_window(c),
        "tie_word_embeddings": False,
    }


def _window(c: DraftContract) -> dict[str, Any]:
    """A sliding window as vLLM's Llama layer reads it (`layer_types`, `sliding_window`) and as
    transformers' configs spell it on (`use_sliding_window`); nothing for full attention."""
    if c.sliding_window is None:
        return {}
    return {"layer_types": ["sliding_attention"] * c.num_hidden_layers, "sliding_window": c.sliding_window,
            "use_sliding_window": True}


def _flags(c: DraftContract) -> dict[str, bool]:
    return {flag: getattr(c, flag) for flag in NORM_FLAGS}


def _trainer_fields(c: DraftContract) -> dict[str, Any]:
    """SpecForge's record of a scaled embedding, where the source had it (eyas.formats.specforge): top-level
    fields in either format, which the engines' readers ignore, so a re-read warns as the source did."""
    return ({"embed_scale": c.embed_scale} if c.embed_scale is not None else {}) | (
        {"target_model_type": c.verifier.model_type} if c.verifier.model_type else {})


# how many tokens a speculators config asks `vllm serve DIR` to draft per step, where no source states it
PROPOSALS = {
    "default_proposal_method": "greedy",
    "proposal_methods": [
        {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
    ],
}


def proposals_of(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """A speculators config's proposal settings (vLLM serves the first method's `speculative_tokens` per
    step), kept as written; None when it states none. They are serving settings, not the draft's
    contract: convert carries them over instead of writing eyas's own."""
    spec = cfg.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, dict) else None
    if not isinstance(methods, list) or not methods:
        return None
    return {k: spec[k] for k in PROPOSALS if k in spec}


def speculators_config(c: DraftContract, dtype: str | None = None,
                       proposals: dict[str, Any] | None = None) -> dict[str, Any]:
    """The speculators `config.json` for `c`: every flag explicit, no top-level model_type, no auto_map;
    `proposals` (proposals_of a source) replace eyas's PROPOSALS."""
    return {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "speculators_config": {
            "algorithm": "eagle3",
            **copy.deepcopy({**PROPOSALS, **(proposals or {})}),  # a config is the caller's to change
            "verifier": {"name_or_path": c.verifier.name_or_path, "architectures": list(c.verifier.architectures)},
        },
        # vLLM sizes fc from num_aux_hidden_states here, else 3 (it reads no ids in this object)
        "transformer_layer_config": {"model_type": c.layer_type, **_layer_dims(c),
                                     "num_aux_hidden_states": c.num_aux_layers},
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        IDS: None if c.capture_layers is None else list(c.capture_layers),
        **_flags(c),
        **_trainer_fields(c),
        "embed_requires_grad": False,
        "tie_word_embeddings": False,
        **({"dtype": dtype} if dtype else {}),
    }


def sglang_layer_ids(capture_layers: tuple[int, ...]) -> list[int]:
    """Nested eagle_config ids that make CURRENT SGLang (+1 iff the first id is 1) capture `capture_layers`.

    Capture starting at 2 is written in the output-of-layer convention (first id 1), which legacy
    SGLang and SpecForge read the same way. Anything else is written as capture indices, which only
    current SGLang reads right; capture starting at 1 cannot be written for SGLang at all (a first
    id of 1 means +1). `eyas.check.consumers` reports both cases.
    """
    ids = list(capture_layers)
    return [k - 1 for k in ids] if ids[0] == 2 else ids


def eagle_config(c: DraftContract, dtype: str | None = None) -> dict[str, Any]:
    """The flat LlamaForCausalLMEagle3 config for `c`.

    Top-level ids are capture indices (vLLM reads them); nested `eagle_config` ids are chosen so that
    current SGLang captures the same layers. A qwen3 layer keeps this flat schema with
    `model_type: "qwen3"` (eyas reads it back as qwen3; SGLang and the EAGLE code build Llama layers
    only, see `eyas.check.consumers`). The verifier is recorded in an extra `verifier` object.
    """
    nested: dict[str, Any] = {}
    if c.capture_layers is not None:
        nested[IDS] = sglang_layer_ids(c.capture_layers)
    cfg = {
        "architectures": [EAGLE_ARCH],
        "model_type": c.layer_type,
        **_layer_dims(c),
        # no draft_vocab_size: SGLang then loads the target's lm_head (what a draft without one reads)
        **({"draft_vocab_size": c.draft_vocab_size} if c.has_lm_head else {}),
        "target_hidden_size": c.target_hidden_size,
        **({IDS: list(c.capture_layers)} if c.capture_layers is not None else {}),
        **_flags(c),
        "eagle_config": {**nested, "use_aux_hidden_state": True, **_flags(c)},
        **_trainer_fields(c),
        **({"torch_dtype": dtype} if dtype else {}),
    }
    if c.verifier.name_or_path or c.verifier.architectures:
        cfg["verifier"] = {"name_or_path": c.verifier.name_or_path, "architectures": list(c.verifier.architectures)}
    return cfg


def verifier_config_of(c: DraftContract) -> dict[str, Any]:
    """The verifier facts of `c` as a target config dict, so a re-read derives the same verifier fields."""
    v = c.verifier
    return {
        "_name_or_path": v.name_or_path,
        "architectures": list(v.architectures),
        "hidden_size": v.hidden_size,
        "vocab_size": v.vocab_size,
        "num_hidden_layers": v.num_hidden_layers if c.capture_layers is not None else None,
    }
