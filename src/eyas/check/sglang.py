"""SGLang as a consumer of EAGLE-3 drafts: current (since PR #25454) and legacy (before it).

SGLang cannot run EAGLE-3 on a CPU, so every statement here is read from its source, and every note
names the file (under `python/sglang/srt/`) and the commit or pull request it was read from:

- Draft class (`models/llama_eagle3.py`@03d5a777): `EntryClass = [LlamaForCausalLMEagle3]` is the
  only EAGLE-3 draft class in that file. `LlamaModel.__init__` builds `fc` for `3 * hidden_size_in`
  (`target_hidden_size` when given), one `midlayer` and `num_hidden_layers - 1` `additional_layers`;
  `LlamaForCausalLMEagle3.__init__` ties `lm_head` to `embed_tokens` when `tie_word_embeddings`, and
  loads the target's lm_head when `draft_vocab_size` is None; `load_weights` turns `d2t` into
  `hot_token_id`, skips `t2d`, and prefixes `model.` to names it does not hold (`layers.0.*` is then
  no parameter: it is skipped, not loaded).
- Class choice (`configs/model_config.py`@001adf56): `ModelConfig._config_draft_model` renames
  only NextN/MTP targets (DeepseekV3ForCausalLM -> DeepseekV3ForCausalLMNextN, Qwen3MoeForCausalLM ->
  Qwen3MoeForCausalLMMTP, ...). No Llama architecture is renamed: a draft whose architectures[0] is
  `LlamaForCausalLM` is built as SGLang's target Llama class (`models/llama.py`), which has no `fc`
  and no `midlayer` and reads the hidden width, not 2H, in q/k/v. `_derive_model_shapes` lists
  `Eagle3DeepseekV2ForCausalLM` among the latent-attention (MLA) architectures.
- Capture (`model_executor/model_runner.py`, `models/llama.py` `set_eagle3_layers_to_capture`): only
  `eagle_config.eagle_aux_hidden_state_layer_ids` is read; none -> `[2, N//2, N-3]`; ids -> `+1` on
  each (legacy) or `+1` only when the first id is 1 (PR #25454).
- Norm flags: read since PR #24663 (`norm_before_residual`, `fc_norm`, `norm_output`, aux count != 3)
  and PR #32334 (`norm_before_fc`); before them none is read.
- Embeddings (`speculative/eagle_worker.py`): the target's embed_tokens replace the draft's when the
  widths are equal.
- Rope (`layers/rotary_embedding/factory.py`@108c36c `get_rope`, `rope_variant.py`@0b1fd02): the draft
  config's rope_scaling as it is; `dynamic` with `alpha` turns at theta * alpha^(d/(d-2)), as eyas
  does; without `alpha` at theta * (f^2 - f + 1)^(d/(d-2)) for every position.
"""

from __future__ import annotations

from typing import Any

from eyas.check.view import (default_layers, default_note, embeddings, full_attention, identity_vocab, layer_ids,
                             new_view, refuse)
from eyas.codes import finding
from eyas.contract import IDS, LAYER_TYPES, DraftContract
from eyas.formats import EAGLE_ARCH, NORM_FLAGS
from eyas.formats.rope_config import rope_kind

HOLDS_FOR = ("read from SGLang's source, not run (SGLang cannot run EAGLE-3 on a CPU): models/llama_eagle3.py"
             "@03d5a777, configs/model_config.py@001adf56, PRs #25454 #24663 #32334")
CLASS = "[sglang models/llama_eagle3.py@03d5a777]"
CONFIG = "[sglang configs/model_config.py@001adf56]"
CAPTURE = "[sglang model_executor/model_runner.py + models/llama.py set_eagle3_layers_to_capture, PR #25454]"
NORMS = "[sglang PR #24663, PR #32334]"
EMBED = "[sglang speculative/eagle_worker.py]"
LLAMA = "[sglang models/llama.py@00239548, @bf7a0e23]"
ROPE = "[sglang layers/rotary_embedding/factory.py@108c36c, rope_variant.py@0b1fd02]"
MLA_CLASSES = ("Eagle3DeepseekV2ForCausalLM",)  # _derive_model_shapes treats it as an MLA draft
_OTHER_FLAGS = NORM_FLAGS[1:]


def _class_notes(r: dict[str, Any], arch: str | None, c: DraftContract, legacy: bool) -> None:
    """Which class SGLang builds from architectures[0], and whether this draft fits it (a refusal by
    current SGLang is also a `check` warning; legacy SGLang's are notes only)."""
    field = None if legacy else "architectures"
    if arch in MLA_CLASSES:
        r["norm_before_residual"], r["norm_flags"] = None, {}
        r["notes"].append(f"{arch} is among SGLang's latent-attention architectures (ModelConfig._derive_model_shapes)"
                          f" {CONFIG}; its draft class was not read: loading and norm wiring are not established")
        return
    if arch != EAGLE_ARCH:
        if arch == "LlamaForCausalLM":
            what = ("builds SGLang's target LlamaForCausalLM (models/llama.py): no fc, no midlayer, q/k/v read the "
                    "hidden width, not 2H, so the draft's weights do not fit")
        elif arch and arch.endswith("NextN"):
            what = "is SGLang's NextN/MTP draft class, not its EAGLE-3 draft"
        else:  # not found where read, which is not certain enough for a check warning
            what, field = "is no draft class in the SGLang sources read", None
        refuse(r, f"architectures[0] {arch!r} {what}; ModelConfig._config_draft_model renames only NextN/MTP "
               f"targets {CONFIG} and {EAGLE_ARCH} is the EAGLE-3 draft class (EntryClass) {CLASS}: write "
               f"architectures [\"{EAGLE_ARCH}\"]", field)
        return
    if c.layer_type not in LAYER_TYPES:  # draft_not_runnable names it
        refuse(r, f"{EAGLE_ARCH} builds Llama decoder layers (LlamaDecoderLayer) {CLASS}: no place for this "
               f"draft's {c.unsupported}")
    elif c.layer_type == "qwen3":
        refuse(r, f"{EAGLE_ARCH} builds Llama decoder layers (LlamaDecoderLayer) {CLASS}: the qwen3 "
               "q_norm/k_norm weights have no place", field)


def _capture(r: dict[str, Any], cfg: dict, n: int | None, legacy: bool) -> None:
    ids = layer_ids(cfg.get("eagle_config") or {})
    if ids is None:
        r["capture_layers"] = default_layers(n)
        unread = f"; the top-level {IDS} is not read" if layer_ids(cfg) else ""
        r["notes"].append(f"no eagle_config ids: captures {default_note(n)}{unread} {CAPTURE}")
        return
    plus = legacy or ids[0] == 1
    r["capture_layers"] = [i + 1 for i in ids] if plus else ids
    rule = "+1 on every id" if legacy else "+1 only when the first id is 1"
    r["notes"].append(f"eagle_config.{IDS} {ids} ({rule}) -> captures {r['capture_layers']} {CAPTURE}")


def sglang_view(reads: str, fmt: str, cfg: dict, c: DraftContract, naming: str | None, legacy: bool) -> dict[str, Any]:
    """What SGLang (current, or `legacy`: before PRs #25454/#24663) does with the config `cfg` read from `reads`."""
    r, n = new_view(reads), c.verifier.num_hidden_layers
    r["notes"].append(
        "SGLang before PR #25454 (+1 on every eagle_config id) and #24663 (norm flags, aux count != 3)"
        if legacy else "SGLang since PR #25454: +1 on eagle_config ids only when the first id is 1"
    )
    if fmt == "speculators":
        refuse(r, f"{reads} is speculators format: its architectures ({cfg.get('architectures')}) name no "
               f"SGLang draft class and its ids are top-level, where SGLang does not read {CLASS}: eyas "
               "convert DIR OUT --format eagle")
        return r
    archs = cfg.get("architectures") or []
    _class_notes(r, archs[0] if archs else None, c, legacy)
    if not r["loads"]:
        return r  # the reason stays the last note: nothing below happens in an engine that cannot build it
    _capture(r, cfg, n, legacy)
    refusals = []
    after_last = n is not None and max(r["capture_layers"] or [0]) >= n
    if after_last and legacy:
        refusals.append(f"capture point {max(r['capture_layers'])} is at or past the state after the target's last "
                        f"layer ({n}): the model loop captures before layer i for i < {n} only, so fc gets fewer "
                        f"states than it reads and fails (issue #32226, fixed by PR #32334) {CAPTURE}")
    elif after_last:
        r["notes"].append(f"capture point {n} is the state after the target's last layer: captured only since PR "
                          f"#32334; SGLang before it stores one state fewer and fails (issue #32226)")
    if legacy:
        r["norm_before_residual"], r["norm_flags"] = False, {f: False for f in _OTHER_FLAGS}
        if c.num_aux_layers != 3:
            refusals.append(f"fc is built for 3 target states (LlamaModel.__init__); this draft reads "
                            f"{c.num_aux_layers} {CLASS}")
        if naming == "speculators":
            refusals.append(f"holds midlayer.* only; load_weights skips these layers.0.* names {CLASS}: eyas "
                            "convert DIR OUT --format eagle")
    elif r["norm_flags"] is None:
        ec = cfg.get("eagle_config") or {}
        r["norm_before_residual"] = bool(cfg.get("norm_before_residual", ec.get("norm_before_residual", False)))
        r["norm_flags"] = {f: bool(cfg.get(f, ec.get(f, False))) for f in _OTHER_FLAGS}
        r["notes"].append(f"norm flags read from the top level, else eagle_config {NORMS}")
    if c.num_hidden_layers > 1:
        r["notes"].append(f"builds num_hidden_layers - 1 additional_layers (parameters additional_layers.{{i-1}}.*); "
                          f"eyas stores them as layers.{{i}} {CLASS}")
    if cfg.get("draft_vocab_size") is None:
        r["notes"].append(f"no draft_vocab_size: loads the target's lm_head (load_lm_head_from_target) {CLASS}")
    for why in refusals:  # legacy SGLang's only: notes, no check warning
        refuse(r, why)
    if refusals:
        return r
    r["mismatches"] += identity_vocab(c, f"hot_token_id stays None, draft ids are taken as target ids {CLASS}")
    if cfg.get("tie_word_embeddings") is True:
        r["mismatches"].append(finding(
            "consumer_ties_lm_head", "tie_word_embeddings",
            f"tie_word_embeddings is true: lm_head is embed_tokens (vocab_size rows), not the draft's lm_head.weight "
            f"(LlamaForCausalLMEagle3.__init__) {CLASS}",
            "set tie_word_embeddings to false (eyas convert writes it so)"))
    r["mismatches"] += _rope(c)
    r["mismatches"] += full_attention(c, f"LlamaAttention builds RadixAttention with no sliding_window_size, whatever "
                                         f"layer_types says {LLAMA}")
    if not c.has_lm_head and cfg.get("draft_vocab_size") is not None:
        r["mismatches"].append(finding(
            "consumer_lm_head_unloaded", "draft_vocab_size",
            f"no lm_head.weight, but draft_vocab_size is set: lm_head is built for it and nothing loads it "
            f"(load_lm_head_from_target only without draft_vocab_size; load_weights loads the names it is given) "
            f"{CLASS}", "remove draft_vocab_size from config.json: SGLang then loads the target's lm_head "
            "(eyas convert DIR OUT --format eagle writes it so)"))
    if c.has_lm_head and cfg.get("draft_vocab_size") is None and cfg.get("tie_word_embeddings") is not True:
        r["mismatches"].append(finding(
            "consumer_lm_head_replaced", "draft_vocab_size",
            f"no draft_vocab_size: the target's lm_head replaces the draft's own lm_head.weight "
            f"(load_lm_head_from_target {CLASS}; set_embed_and_head {EMBED})",
            f"write draft_vocab_size = {c.draft_vocab_size} in config.json: SGLang then serves the draft's lm_head "
            "(eyas convert DIR OUT --format eagle writes it)"))
    r["embeddings"] = embeddings(c, replaces_own=True)
    r["notes"].append(f"embeddings: {r['embeddings']} {EMBED}")
    return r


def _rope(c: DraftContract) -> list[dict[str, str]]:
    """SGLang's `dynamic` rope without alpha (DynamicNTKScalingRotaryEmbedding) raises the base for
    every position, as if at factor x max_position_embeddings; the contract's dynamic rope is the
    default one within max_position_embeddings."""
    scaling = c.rope_scaling or {}
    factor = scaling.get("factor") or 1.0
    if rope_kind(scaling) != "dynamic" or scaling.get("alpha") is not None or factor == 1.0:
        return []
    d = c.head_dim
    base = c.rope_base * (factor * factor - factor + 1) ** (d / (d - 2)) if d > 2 else c.rope_base
    return [finding(
        "consumer_rope", "rope_scaling",
        f"rope type dynamic with factor {factor:g} and no alpha: DynamicNTKScalingRotaryEmbedding turns at base "
        f"theta*(f^2-f+1)^(d/(d-2)) = {base:.4g} at every position, not at theta {c.rope_base:g} {ROPE}",
        "remove rope_scaling if the draft was trained on plain rope (a Llama dynamic rope is plain within "
        "max_position_embeddings)")]
