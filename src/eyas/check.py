"""Offline checks of a draft checkpoint, and what each serving engine will actually do with it.

`consumers(ckpt)` reads the config the engines read (`config.json`) with each engine's own rules
(reference: speculators-and-vllm §4.1-4.7, eagle-specforge-sglang §4.1-4.2, §5) and reports where
an engine would wire the draft differently from its contract. `check_checkpoint` lists every problem
it can name against the contract and, when given, the target's config. Nothing here prints or
downloads; everything returns data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eyas.contract import DraftContract, check_capture_layers, default_capture_layers
from eyas.formats import (
    EAGLE_ARCH,
    IDS,
    LAYER_CONVENTIONS,
    NORM_FLAGS,
    Checkpoint,
    load_json,
    problem,
    read_checkpoint,
    target_facts,
)

ENGINE_CONFIG = "config.json"  # the file every engine loads from a draft folder
_OTHER_FLAGS = NORM_FLAGS[1:]  # norm_before_fc, fc_norm, norm_output


# --- what each consumer does --------------------------------------------------------------------


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
        ids, nbr = _ids(cfg), bool(cfg.get("norm_before_residual", False))
        flags = {f: bool(cfg.get(f, ec.get(f, False))) for f in _OTHER_FLAGS}
        n_aux = cfg.get("num_aux_hidden_states") or len(_ids(ec) or []) or 3
        r["notes"].append('not auto-detected: pass --speculative-config \'{"method": "eagle3", "model": DIR, ...}\'')
        if ids is None and _ids(ec):
            r["notes"].append(f"ignores eagle_config.{IDS}; only a top-level {IDS} is read")
        if c.layer_type == "qwen3":
            r["loads"] = False
            r["notes"].append(
                f"{EAGLE_ARCH} resolves to vLLM's Llama draft, which has no q_norm/k_norm: convert --to speculators"
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
    if c.reduced_vocab and not c.has_vocab_map:
        r["mismatches"].append("no d2t: vLLM maps draft id i to target id i (acceptance collapses)")
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
            "convert DIR OUT --to eagle"
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
            r["notes"].append("loads midlayer.* weight names only; these weights use layers.0.*: convert --to eagle")
    else:
        nbr = bool(cfg.get("norm_before_residual", ec.get("norm_before_residual", False)))
        flags = {f: bool(cfg.get(f, ec.get(f, False))) for f in _OTHER_FLAGS}
    if c.num_hidden_layers > 1:
        r["notes"].append("SGLang names extra draft layers midlayers.{i}; eyas stores them as layers.{i}")
    if c.reduced_vocab and not c.has_vocab_map:
        r["mismatches"].append("no d2t: no hot_token_id map, draft ids are taken as target ids")
    r["norm_before_residual"], r["norm_flags"] = nbr, flags
    r["embeddings"] = _embeddings(c, replaces_own=True)
    return r


def _speculators(reads: str, fmt: str, cfg: dict, c: DraftContract) -> dict[str, Any]:
    r, n = _view(reads), c.verifier.num_hidden_layers
    if fmt != "speculators":
        r["loads"] = False
        r["notes"].append(
            f"{reads} has no speculators_model_type: speculators cannot load it without conversion (eyas "
            "convert DIR OUT --to speculators)"
        )
        return r
    tlc = cfg.get("transformer_layer_config") or {}
    if "model_type" not in tlc and c.layer_type != "qwen3":
        r["mismatches"].append(
            "transformer_layer_config has no model_type: speculators builds a qwen3 layer (adds q_norm/k_norm)"
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


def _mismatches(c: DraftContract, r: dict[str, Any]) -> list[str]:
    """Where a consumer that loads the draft wires it differently from the contract."""
    out = []
    if (
        r["capture_layers"] is not None
        and c.capture_layers is not None
        and list(c.capture_layers) != r["capture_layers"]
    ):
        out.append(f"captures {r['capture_layers']}, the contract says {list(c.capture_layers)}")
    elif r["capture_layers"] is None and c.capture_layers is not None:
        out.append(
            f"captures the target default (2, N//2, N-3), not necessarily the contract's {list(c.capture_layers)}"
        )
    if r["norm_before_residual"] != c.norm_before_residual:
        out.append(f"uses norm_before_residual={r['norm_before_residual']}, the contract says {c.norm_before_residual}")
    for f, v in r["norm_flags"].items():
        if v != getattr(c, f):
            out.append(f"uses {f}={v}, the contract says {getattr(c, f)}")
    if c.has_embeddings and r["embeddings"] == "shares target's":
        out.append("replaces the draft's own embed_tokens with the target's")
    return out


def consumers(ckpt: Checkpoint) -> dict[str, dict[str, Any]]:
    """What vLLM, SGLang (current and legacy) and speculators do with this checkpoint.

    Per consumer: `reads` (config file), `loads` (bool), `capture_layers` (list, or None when it
    depends on the unknown target depth or the consumer cannot load it), `norm_before_residual`,
    `norm_flags`, `embeddings` ("draft's own" / "shares target's" / ...), `notes` and `mismatches`
    (where a consumer that loads it wires the draft differently from its contract).
    """
    reads = ENGINE_CONFIG if ENGINE_CONFIG in ckpt.files else ckpt.config_used
    fmt, cfg, c = ckpt.files[reads], ckpt.configs[reads], ckpt.contract
    out = {
        "vllm": _vllm(reads, fmt, cfg, c),
        "sglang": _sglang(reads, fmt, cfg, c, ckpt.weight_naming, legacy=False),
        "sglang_legacy": _sglang(reads, fmt, cfg, c, ckpt.weight_naming, legacy=True),
        "speculators": _speculators(reads, fmt, cfg, c),
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
    for r in out.values():
        if r["loads"]:
            r["mismatches"] += _mismatches(c, r)
    return out


def consumer_warnings(cons: dict[str, dict[str, Any]]) -> list[str]:
    """One line per mismatch, prefixed by the consumer's name."""
    return [f"{name}: {m}" for name, r in cons.items() for m in r["mismatches"]]


# --- checking -----------------------------------------------------------------------------------


@dataclass
class CheckReport:
    """Result of `check_checkpoint`: problems ({"field", "problem", "fix"}) make `eyas check` exit 1."""

    path: Path
    checkpoint: Checkpoint
    problems: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    target: dict[str, Any] | None = None  # target_facts of the target config, when given

    @property
    def ok(self) -> bool:
        return not self.problems


def _target_config(spec: str | Path) -> dict[str, Any]:
    """The target's config.json contents: a config .json file, a target folder, or "default" (the
    embedded default, see eyas.target.resolve_target)."""
    p = Path(spec)
    if p.is_file():
        return load_json(p)
    from eyas.target import target_config  # target imports formats; keep check importable without it

    return target_config(spec)


_PORTABLE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # a hub id: name or owner/name


def target_problems(c: DraftContract, tgt: dict[str, Any]) -> list[dict[str, str]]:
    """The contract against a target's facts (`formats.target_facts`): vocab, width, depth, context, identity."""
    out = []
    V, H, N = tgt.get("vocab_size"), tgt.get("hidden_size"), tgt.get("num_hidden_layers")
    if V is not None and c.vocab_size != V:
        out.append(
            problem(
                "vocab_size",
                f"draft vocab_size {c.vocab_size} != target vocab_size {V}",
                "vocab_size is the TARGET's vocabulary: the draft was made for another target, or the config is wrong",
            )
        )
    if V is not None and c.draft_vocab_size > V:
        out.append(
            problem(
                "draft_vocab_size",
                f"draft_vocab_size {c.draft_vocab_size} exceeds the target vocab {V}",
                "use a draft made for this target",
            )
        )
    if H is not None and c.target_hidden_size != H:
        out.append(
            problem(
                "target_hidden_size",
                f"the draft reads target states of width {c.target_hidden_size}, the target's hidden_size is {H}",
                "use a draft made for this target",
            )
        )
    if H is not None and c.hidden_size != H and not c.has_embeddings:
        out.append(
            problem(
                "embed_tokens.weight",
                f"draft hidden {c.hidden_size} != target hidden {H} and the draft has no embed_tokens: nothing "
                "can be shared",
                "export the draft's own embed_tokens",
            )
        )
    if N is not None:
        out += [
            problem(IDS, p, "record the layers the draft was trained on (eyas convert writes them explicitly)")
            for p in check_capture_layers(c, N)
        ]
    mp = tgt.get("max_position_embeddings")
    if mp is not None and c.max_position_embeddings < mp:
        out.append(
            problem(
                "max_position_embeddings",
                f"draft max_position_embeddings {c.max_position_embeddings} < the target's {mp}: "
                "engines size the draft's rope cache by it and fail or degrade on longer contexts",
                f"set max_position_embeddings to {mp} (rope extrapolates; acceptance past the training length "
                "may drop)",
            )
        )
    archs = tgt.get("architectures")
    if archs and c.verifier.architectures and set(archs) != set(c.verifier.architectures):
        out.append(
            problem(
                "verifier.architectures",
                f"the draft was made for {list(c.verifier.architectures)}, the target is {list(archs)}",
                "use a draft made for this target, or fix speculators_config.verifier",
            )
        )
    return out


def contract_problems(ckpt: Checkpoint) -> tuple[list[dict[str, str]], list[str]]:
    """Target-independent findings: verifier portability (problems), rope and layer ids (warnings)."""
    c, problems, warnings = ckpt.contract, [], []
    name = c.verifier.name_or_path
    spec_files = [f for f, fmt in ckpt.files.items() if fmt == "speculators"]
    if spec_files and not name:
        problems.append(
            problem(
                "speculators_config.verifier.name_or_path",
                f"{spec_files[0]}: no verifier name: `vllm serve DIR` cannot find the target",
                "record the target's hub id: eyas convert SRC DST --to speculators --verifier-name ORG/MODEL",
            )
        )
    elif name and not _PORTABLE.match(name):
        problems.append(
            problem(
                "speculators_config.verifier.name_or_path",
                f"verifier {name!r} is a local path: the checkpoint is not portable "
                "(vLLM serves the verifier it names; speculators downloads from it)",
                "record the target's hub id: eyas convert SRC DST --to speculators --verifier-name ORG/MODEL",
            )
        )
    if c.rope_theta is None:
        warnings.append(
            "the config names no rope_theta: every engine builds theta 10000 (right for drafts trained so, as "
            "the original EAGLE-3 drafts were; wrong if the draft was trained with the target's rope)"
        )
    return problems, warnings


def check_checkpoint(
    path: str | Path, *, target: str | Path | None = None, layer_convention: str | None = None
) -> CheckReport:
    """Every problem with the draft at `path` (folder or config .json), against `target` when given.

    Raises FormatError only when the input cannot be read at all (no config, malformed JSON, a config
    of neither format, an unreadable target); everything else is a problem in the report.
    """
    if layer_convention not in (None, *LAYER_CONVENTIONS):
        raise ValueError(f"layer_convention must be one of {LAYER_CONVENTIONS} or None")
    tgt_cfg = _target_config(target) if target is not None else None
    ckpt = read_checkpoint(path, layer_convention=layer_convention, verifier_config=tgt_cfg, strict=False)
    report = CheckReport(path=Path(path), checkpoint=ckpt, problems=list(ckpt.problems), warnings=list(ckpt.warnings))
    problems, warnings = contract_problems(ckpt)
    report.problems += problems
    report.warnings += warnings
    if tgt_cfg is not None:
        report.target = target_facts(tgt_cfg)
        report.problems += target_problems(ckpt.contract, report.target)
    else:
        report.warnings.append("no --target: vocab, width, depth and context were not checked against a target")
    report.warnings += consumer_warnings(consumers(ckpt))
    return report
