"""Stable machine codes for every problem and warning eyas reports.

A finding is a dict: {"code", "field", "problem" (or "warning"), "fix"}. The English text may be
reworded at any time; the code may not. `eyas check --json`, `eyas inspect --json` and the doctor
carry the code, and the doctor ranks findings by the code's fault slug, never by matching text.

Each code has one rule, written once (in eyas.formats.parse / compare / read / validate, eyas.check
or eyas.contract), and this table says what kind of fault it is: `severity` says whether it is a
problem (check exits 1) or a warning (a consumer's warning is a problem under `check --engine` for that
engine: `as_problem`); `slug` names the doctor's fault it points at (None: it does
not change what the draft computes, or it only says that a default was assumed, which the doctor
measures). A warning with a slug is a fault in some reader only (an engine that wires the draft
otherwise, a field one transformers version reads and another ignores), not in eyas's reading.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    severity: str  # "problem" or "warning"
    slug: str | None  # the doctor fault it points at, None if it does not change the draft's output
    meaning: str  # one line, for docs and `--json` readers


def _problem(slug: str | None, meaning: str) -> Code:
    return Code("problem", slug, meaning)


def _warning(slug: str | None, meaning: str) -> Code:
    return Code("warning", slug, meaning)


CODES: dict[str, Code] = {
    # --- one config file, as it is read (eyas.formats.parse) ---
    "layer_ids_absent": _warning(None, "the config names no capture layers: engines use (2, N//2, N-3) of the target"),
    "layer_ids_convention_assumed": _warning(
        None, "only nested eagle_config ids: read by current SGLang's rule, not legacy SGLang's or SpecForge's"
    ),
    "layer_ids_first_is_one": _warning(
        "capture_layers", "capture layers that start at 1: no nested eagle_config ids name them for SGLang"
    ),
    "layer_ids_top_nested_differ": _warning(
        "capture_layers", "top-level ids and nested eagle_config ids name different layers"
    ),
    "layer_type_absent": _warning("config_file", "speculators config without a layer model_type (readers differ)"),
    "layer_type_unknown": _warning(None, "a model_type eyas does not know: the layer is read from architectures"),
    "draft_not_runnable": _warning(None, "a draft layer eyas reads but cannot run (MoE, latent attention, ...)"),
    "dtype_conflict": _warning(None, "dtype and torch_dtype name different dtypes"),
    "tie_word_embeddings": _warning(None, "tie_word_embeddings is true: a reader that honours it ties lm_head"),
    "norm_before_residual_absent": _warning(
        "norm_flags", "speculators config without norm_before_residual: readers default differently"
    ),
    "fc_skipped": _warning("fc_skipped", "eagle_config.use_aux_hidden_state is false: a reader honouring it skips fc"),
    "rope_theta_conflict": _warning("rope", "rope_theta and rope_parameters.rope_theta differ (transformers 4 vs 5)"),
    "rope_scaling_conflict": _warning(
        "rope", "rope_scaling and rope_parameters name different rope types (transformers 4 vs 5)"
    ),
    "rope_alpha": _warning("rope", "NTK-alpha rope: engines raise the base by alpha, transformers' Llama does not"),
    "tensors_not_checked": _warning(None, "a lone config file was read: the weights were not checked"),
    "embed_scale_ignored": _warning(
        None, "the draft's trainer scaled its token embeddings (SpecForge, Gemma targets); engines do not"
    ),
    # --- a folder's config files against each other (eyas.formats.compare) ---
    "config_files_disagree_capture_layers": _problem("config_file", "the config files name different capture layers"),
    "config_files_disagree_norm_flags": _problem("config_file", "the config files set a norm flag differently"),
    "config_files_disagree_dims": _problem(
        "config_file", "the config files state different layer dimensions, layer type, activation or bias"
    ),
    "config_files_disagree_vocab": _problem("config_file", "the config files state different vocab sizes"),
    "config_files_disagree_rope": _problem("config_file", "the config files state different rope theta or scaling"),
    "config_files_disagree_eps": _problem("config_file", "the config files state different rms_norm_eps"),
    "config_files_disagree_eps_rounding": _warning(
        None, "the config files' rms_norm_eps agree to 6 significant digits (printed differently)"
    ),
    "config_files_disagree_context": _warning(None, "the config files state different max_position_embeddings"),
    "config_files_disagree_verifier": _warning(None, "the config files name different verifiers"),
    "config_files_disagree_embed_scale": _warning(
        None, "the config files state different trainer embedding scales (no engine applies one)"
    ),
    # --- weights and tensors against the contract (eyas.formats.read, eyas.formats.validate) ---
    "weights_missing": _problem(None, "the folder holds no weights file"),
    "weights_layouts_several": _warning(None, "weights in more than one layout: readers load different ones"),
    "lm_head_shared": _warning(None, "a full-vocab draft ships no lm_head.weight: the target's lm_head is read"),
    "weights_aux_norm_names": _warning(None, "fc_norm stored under SpecForge's aux_norm_* names: vLLM refuses them"),
    "weights_prefixed": _warning(None, "tensor names carry a whole-model export's 'model.' prefix: vLLM refuses them"),
    "layers_missing": _problem(None, "num_hidden_layers counts a decoder layer that is not stored"),
    "layers_extra": _problem(None, "a decoder layer is stored beyond num_hidden_layers"),
    "tensor_missing": _problem(None, "a tensor every draft has is missing"),
    "tensor_unknown": _problem(None, "a tensor no EAGLE-3 loader has"),
    "tensor_shape": _problem(None, "a decoder tensor's shape disagrees with the config's dimensions"),
    "tensor_dtype": _problem(None, "a weight is stored as integers or booleans, not floating point"),
    "tensor_not_finite": _problem(None, "a weight holds nan or inf values (corrupt, or training diverged)"),
    "flag_tensor_missing": _problem(None, "a tensor the layer type or attention_bias adds is missing"),
    "flag_tensor_unexpected": _problem(None, "a tensor stored although the layer type or attention_bias excludes it"),
    "feature_norm_missing": _problem("norm_flags", "input_norm / fc_norm is missing although its flag is set"),
    "feature_norm_unexpected": _problem("norm_flags", "input_norm / fc_norm is stored but its flag is not set"),
    "feature_norm_shape": _problem("norm_flags", "input_norm / fc_norm has the wrong width"),
    "fc_chunks": _problem("capture_layers", "fc.weight reads another number of target states than the layer ids name"),
    "fc_shape": _problem("capture_layers", "fc.weight's shape fits no count of target states"),
    "lm_head_shape": _problem(None, "lm_head.weight's shape disagrees with draft_vocab_size or hidden_size"),
    "embed_tokens_shape": _problem("embeddings", "embed_tokens.weight's shape disagrees with vocab_size/hidden_size"),
    "target_embeddings_unshareable": _problem(
        "embeddings", "the draft and target widths differ (its config, or the target's) and it ships no embed_tokens"
    ),
    # --- the vocab map (eyas.formats.validate.vocab_map_problems, the one rule) ---
    "vocab_map_missing": _problem("vocab_map", "a reduced draft vocab without d2t/t2d: engines map id i to id i"),
    "d2t_missing": _problem("vocab_map", "t2d is stored without d2t"),
    "t2d_missing": _problem("vocab_map", "d2t is stored without t2d"),
    "vocab_map_shape": _problem("vocab_map", "d2t is not [draft_vocab_size] or t2d not [vocab_size]"),
    "d2t_dtype": _problem("vocab_map", "d2t is not int64 offsets"),
    "t2d_dtype": _problem("vocab_map", "t2d is not a bool mask"),
    "d2t_out_of_range": _problem("vocab_map", "arange + d2t leaves the target vocab (target ids stored, not offsets)"),
    "d2t_not_increasing": _problem("vocab_map", "arange + d2t is not strictly increasing: t2d cannot describe it"),
    "t2d_count": _problem("vocab_map", "t2d marks another number of target ids than draft_vocab_size"),
    "t2d_disagrees": _problem("vocab_map", "t2d does not mark the target ids d2t maps to"),
    "t2d_derived": _warning("vocab_map", "a valid d2t stored without t2d: t2d is derived from it"),
    "d2t_cast": _warning("vocab_map", "a valid d2t stored as another integer type: read as int64"),
    "t2d_cast": _warning("vocab_map", "a t2d mask stored as integers 0 and 1: read as bool"),
    # --- the contract against a target (eyas.contract, eyas.check.rules) ---
    "capture_layers_not_recorded": _problem(None, "no capture layers recorded: engines fall back to (2, N//2, N-3)"),
    "capture_layers_out_of_range": _problem("capture_layers", "a capture layer beyond the target's depth"),
    "capture_layers_not_increasing": _problem("capture_layers", "capture layers not strictly increasing"),
    "target_vocab_size": _problem(None, "the draft's vocab_size is not the target's"),
    "target_draft_vocab_size": _problem(None, "the draft vocab is larger than the target's"),
    "target_hidden_size": _problem(None, "the draft reads target states of another width"),
    "target_context_longer": _problem(None, "the draft's max_position_embeddings is shorter than the target's"),
    "target_architectures": _problem(None, "the draft names another verifier architecture"),
    "target_not_given": _warning(None, "no target given: nothing was checked against one"),
    # --- what a conversion cannot carry over (eyas.formats.write) ---
    "proposals_not_kept": _warning(
        None, "the source's speculative_tokens (vllm serve's draft length) has no field in an eagle config"
    ),
    # --- the contract on its own (eyas.check.rules) ---
    "verifier_name_missing": _problem(None, "a speculators config without a verifier name: vllm serve cannot find it"),
    "verifier_not_portable": _problem(None, "the verifier is recorded as a local path"),
    "rope_theta_absent": _warning(None, "no rope_theta: every engine builds theta 10000"),
    # --- what a serving engine does differently from the contract (eyas.check.consumers) ---
    "consumer_capture_layers": _warning("capture_layers", "an engine captures other layers than the contract's"),
    "consumer_capture_default": _warning("capture_layers", "an engine reads no ids and captures its default layers"),
    "consumer_norm_flags": _warning("norm_flags", "an engine uses another norm flag than the contract's"),
    "consumer_replaces_embeddings": _warning("embeddings", "an engine feeds the target's embeddings, not the draft's"),
    "consumer_no_vocab_map": _warning("vocab_map", "an engine maps draft ids to target ids as the identity"),
    "consumer_builds_qwen3": _warning(
        "config_file", "an engine builds a qwen3 layer for a llama draft (speculators: no model_type is named; vLLM: "
        "architectures name Eagle3Qwen3ForCausalLM)"),
    "consumer_lm_head_unloaded": _warning(None, "an engine builds the draft's lm_head and loads no weights into it"),
    "consumer_lm_head_replaced": _warning(None, "an engine serves the target's lm_head over the draft's own"),
    "consumer_rope": _warning("rope", "an engine turns the draft's rope at another base than the contract's"),
    "consumer_ties_lm_head": _warning(None, "an engine uses the embedding table as lm_head (tie_word_embeddings)"),
    "consumer_cannot_load": _warning(None, "vLLM, SGLang for an eagle config, or speculators for its own, "
                                            "refuses the draft"),
    "consumer_full_attention": _warning(None, "an engine attends over every token where the draft's layer has a "
                                              "sliding window (llama.cpp, SGLang)"),
}


def finding(code: str, field: str, text: str, fix: str) -> dict[str, str]:
    """A problem or warning record; `code` must be registered (an unknown code is a bug in eyas)."""
    c = CODES[code]
    return {"code": code, "field": field, c.severity: text, "fix": fix}


def _severity(f: dict[str, str]) -> str:
    """The finding's severity: its code's, unless `as_problem` made it a problem."""
    return "problem" if "problem" in f else CODES[f["code"]].severity


def text_of(f: dict[str, str]) -> str:
    """What a finding says, whichever its severity."""
    return f[_severity(f)]


def prefixed(f: dict[str, str], prefix: str) -> dict[str, str]:
    """The same finding with its text prefixed (a file, a consumer's name): codes and fixes unchanged."""
    key = _severity(f)
    return {**f, key: prefix + f[key]}


def as_problem(f: dict[str, str]) -> dict[str, str]:
    """A warning graded as a problem where the caller says it decides the outcome (`eyas check --engine`:
    the mismatches of the engine that will serve the draft); its code stays."""
    return {"code": f["code"], "field": f["field"], "problem": text_of(f), "fix": f["fix"]}


def slug_of(code: str) -> str | None:
    return CODES[code].slug
