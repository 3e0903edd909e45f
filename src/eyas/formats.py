"""EAGLE-3 checkpoint formats on disk: read either into a `DraftContract`, write either out of one.

Two formats exist (reference: speculators-and-vllm §1-2, eagle-specforge-sglang §1.2, §3.2):

- "speculators": `config.json` with `speculators_model_type`, `speculators_config` and a nested
  `transformer_layer_config`; no top-level `model_type` (vLLM relies on that to detect it). Layer ids
  are top-level `eagle_aux_hidden_state_layer_ids`, already capture indices.
- "eagle": the flat `LlamaForCausalLMEagle3` config of SafeAILab/EAGLE, SpecForge and SGLang, with
  `draft_vocab_size`, optional `target_hidden_size` and an optional nested `eagle_config`. Its nested
  layer ids are ambiguous: "output of layer i" for SpecForge and legacy SGLang (+1 to capture),
  +1 only when the first id is 1 for SGLang since PR #25454, ignored by vLLM.

A folder may hold several config files (`config.json`, `config_speculators.json`,
`config_eagle.json`, as training pipelines export them): all are read and must agree.

Weights keep their names except the one EAGLE rename (`midlayer.` = `layers.0.`, in eyas.weights).
Nothing here imports or runs code from a checkpoint (`auto_map` is ignored).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eyas.contract import LAYER_TYPES, DraftContract, Verifier, default_capture_layers, expected_shapes
from eyas.errors import ContractError, EyasError, FormatError
from eyas.weights import (
    dtype_name,
    find_weights,
    from_canonical,
    fsync_file,
    read_tensors,
    to_canonical,
    weight_files,
    weight_naming,
    write_tensors,
)

FORMATS = ("speculators", "eagle")
CONFIG_NAMES = ("config.json", "config_speculators.json", "config_eagle.json")  # looked for, in order
LAYER_CONVENTIONS = ("input", "output")  # how nested eagle_config ids are read (None: current SGLang rule)
NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
EAGLE_ARCH = "LlamaForCausalLMEagle3"  # SGLang picks its draft class by this name
IDS = "eagle_aux_hidden_state_layer_ids"


@dataclass
class Checkpoint:
    """A draft checkpoint as read from disk: its contract, where each fact came from, its tensors."""

    path: Path
    contract: DraftContract
    files: dict[str, str]  # config file name -> "speculators" | "eagle"
    config_used: str  # the file the contract was taken from
    reason: str  # why that file
    origin: dict[str, str]  # contract field -> how it was derived
    tensors: dict[str, torch.Tensor]  # canonical names; empty when not loaded
    weight_files: list[str]
    warnings: list[str]
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # raw JSON, per file
    weight_naming: str | None = None  # "eagle" (midlayer.*) or "speculators" (layers.0.*) on disk
    tensors_loaded: bool = False  # False: config only, or load_tensors=False, or unreadable weights
    problems: list[dict[str, str]] = field(default_factory=list)  # strict=False only: what strict would raise


# --- small readers ------------------------------------------------------------------------------


def load_json(path: Path) -> dict[str, Any]:
    """A config file as a dict; malformed, empty or non-object JSON is a FormatError naming the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise FormatError(
            f"{path}: cannot read the file ({e})", "check the path and that it is a text JSON file"
        ) from None
    if not text.strip():
        raise FormatError(f"{path}: the file is empty, expected a JSON object", "export the config again")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(
            f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}",
            "fix the JSON syntax at that position (a trailing comma or a missing quote is typical)",
        ) from None
    if not isinstance(cfg, dict):
        raise FormatError(
            f"{path}: top level is a JSON {type(cfg).__name__}, expected an object",
            "a config file is one JSON object {...}",
        )
    return cfg


def detect_format(cfg: dict[str, Any]) -> str | None:
    """The format of a config dict: "speculators", "eagle", or None (neither, e.g. a target model's)."""
    if "speculators_model_type" in cfg or "speculators_config" in cfg:
        return "speculators"
    archs = cfg.get("architectures") or []
    if "draft_vocab_size" in cfg or "eagle_config" in cfg or any("eagle3" in str(a).lower() for a in archs):
        return "eagle"
    return None


def target_facts(cfg: dict[str, Any]) -> dict[str, Any]:
    """What a target (verifier) config.json says about itself; multimodal configs nest it in `text_config`."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}

    def pick(key: str) -> Any:
        return cfg[key] if cfg.get(key) is not None else text.get(key)

    rope = pick("rope_parameters") if isinstance(pick("rope_parameters"), dict) else {}
    return {
        "name_or_path": cfg.get("_name_or_path") or None,
        "architectures": tuple(cfg.get("architectures") or ()),
        "num_hidden_layers": pick("num_hidden_layers"),
        "hidden_size": pick("hidden_size"),
        "vocab_size": pick("vocab_size"),
        "max_position_embeddings": pick("max_position_embeddings"),
        "rope_theta": pick("rope_theta") if pick("rope_theta") is not None else rope.get("rope_theta"),
    }


_REQUIRED = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "an object"}


@dataclass
class _Parsed:
    """One config file read into DraftContract keywords, with provenance."""

    file: str
    fields: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    assumed: set[str] = field(default_factory=set)  # fields the file does not state
    warnings: list[str] = field(default_factory=list)

    def read(self, src: dict, key: str, kind: type, *, where: str = "", default: Any = _REQUIRED) -> Any:
        """src[key] checked against `kind`, stored as contract field `key` with its origin."""
        to, value = key, src.get(key)
        if value is None:
            if default is _REQUIRED:
                raise FormatError(f"{self.file}: field '{where}{key}' is missing", f"add {where}{key} to {self.file}")
            self.fields[to], self.origin[to] = default, f"default {default!r} ({where}{key} not in {self.file})"
            self.assumed.add(to)
            return default
        ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise FormatError(
                f"{self.file}: field '{where}{key}' is {value!r}, expected {_KINDS[kind]}",
                f"fix {where}{key} in {self.file}",
            )
        self.fields[to], self.origin[to] = value, f"{self.file}: {where}{key}"
        self.assumed.discard(to)
        return value

    def set(self, to: str, value: Any, origin: str, *, assumed: bool = False) -> None:
        self.fields[to], self.origin[to] = value, origin
        if assumed:
            self.assumed.add(to)
        else:
            self.assumed.discard(to)


def _layer_ids(p: _Parsed, src: dict, where: str) -> list[int] | None:
    """A non-empty list of layer ids, or None when absent/empty."""
    ids = src.get(IDS)
    if ids is None or ids == []:
        return None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise FormatError(
            f"{p.file}: field '{where}{IDS}' is {ids!r}, expected a list of layer numbers",
            f"fix {where}{IDS} in {p.file}",
        )
    return ids


def _read_dims(p: _Parsed, src: dict, where: str) -> None:
    """The decoder layer's dims and rope, shared by both formats (top level or transformer_layer_config)."""
    hidden = p.read(src, "hidden_size", int, where=where)
    heads = p.read(src, "num_attention_heads", int, where=where)
    p.read(src, "num_key_value_heads", int, where=where, default=heads)
    p.read(src, "head_dim", int, where=where, default=hidden // heads)
    p.read(src, "intermediate_size", int, where=where)
    p.read(src, "vocab_size", int, where=where)
    p.read(src, "num_hidden_layers", int, where=where, default=1)
    p.read(src, "rms_norm_eps", float, where=where, default=1e-6)
    p.read(src, "max_position_embeddings", int, where=where, default=2048)
    p.read(src, "hidden_act", str, where=where, default="silu")
    p.read(src, "attention_bias", bool, where=where, default=False)
    _read_rope(p, src, where)


def _read_rope(p: _Parsed, src: dict, where: str) -> None:
    """rope_theta / rope_scaling (transformers 4) or rope_parameters (transformers 5); None when absent."""
    params = src.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise FormatError(
            f"{p.file}: field '{where}rope_parameters' is {params!r}, expected an object", f"fix {where}rope_parameters"
        )
    params = params or {}
    p_scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    p_type = p_scaling.get("rope_type", p_scaling.get("type", "default"))
    if p_type == "default" and set(p_scaling) <= {"rope_type", "type"}:
        p_scaling = {}  # plain rope: no scaling
    theta = p.read(src, "rope_theta", float, where=where, default=None)
    if theta is None and params.get("rope_theta") is not None:
        theta = float(params["rope_theta"])
        p.set("rope_theta", theta, f"{p.file}: {where}rope_parameters.rope_theta")
    elif theta is not None and params.get("rope_theta") not in (None, theta):
        p.warnings.append(
            f"{p.file}: {where}rope_theta {theta} and rope_parameters.rope_theta {params['rope_theta']} differ; "
            "eyas uses rope_theta"
        )
    scaling = src.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise FormatError(
            f"{p.file}: field '{where}rope_scaling' is {scaling!r}, expected an object or null",
            f"fix {where}rope_scaling",
        )
    if scaling:
        p.set("rope_scaling", scaling, f"{p.file}: {where}rope_scaling")
    elif p_scaling:
        p.set("rope_scaling", p_scaling, f"{p.file}: {where}rope_parameters")
    else:
        p.set(
            "rope_scaling", None, f"none ({where}rope_scaling absent)", assumed="rope_scaling" not in src and not params
        )


def _default_capture(p: _Parsed, n_target: int | None, where: str) -> None:
    """No layer ids in the file: engines fall back to (2, N//2, N-3) of the target they serve."""
    if n_target is not None:
        ids = list(default_capture_layers(n_target))
        p.set(
            "capture_layers",
            ids,
            f"assumed: engines' default (2, N//2, N-3) for a {n_target}-layer target",
            assumed=True,
        )
        p.warnings.append(
            f"{p.file}: names no capture layers ({where}{IDS}); assuming the engines' default {ids} for a "
            f"{n_target}-layer target"
        )
    else:
        p.set("capture_layers", None, "not recorded", assumed=True)
        p.warnings.append(
            f"{p.file}: names no capture layers ({where}{IDS}); engines will use (2, N//2, N-3) of whatever "
            "target they serve"
            " (pass --verifier-config or --target to resolve N)"
        )


def _parse_speculators(cfg: dict, file: str, n_target: int | None) -> _Parsed:
    p = _Parsed(file)
    if cfg.get("speculators_model_type") != "eagle3":
        raise FormatError(
            f"{file}: field 'speculators_model_type' is {cfg.get('speculators_model_type')!r}, expected 'eagle3'",
            "eyas reads EAGLE-3 speculators only (not mtp, dflash, ...)",
        )
    tlc = cfg.get("transformer_layer_config")
    if not isinstance(tlc, dict):
        raise FormatError(
            f"{file}: field 'transformer_layer_config' is missing or not an object",
            "a speculators config nests the draft layer's HF config there",
        )
    where = "transformer_layer_config."
    mt = tlc.get("model_type")
    if mt is None:
        p.set("layer_type", "llama", f"assumed llama ({where}model_type absent)", assumed=True)
        p.warnings.append(
            f"{file}: {where}model_type is absent; eyas (and vLLM) read a llama layer, but speculators itself "
            "parses it as qwen3: write model_type"
        )
    elif mt in LAYER_TYPES:
        p.set("layer_type", mt, f"{file}: {where}model_type")
    else:
        raise FormatError(
            f"{file}: field '{where}model_type' is {mt!r}, expected one of {list(LAYER_TYPES)}",
            "eyas reads drafts with one llama or qwen3 layer type",
        )
    _read_dims(p, tlc, where)
    p.read(cfg, "draft_vocab_size", int, default=32000)  # speculators' own default
    p.read(cfg, "target_hidden_size", int, default=p.fields["hidden_size"])
    ids = _layer_ids(p, cfg, "")
    if ids is None:
        _default_capture(p, n_target, "")
    else:
        p.set("capture_layers", ids, f"{file}: {IDS} (capture indices)")
    for flag in NORM_FLAGS:
        p.read(cfg, flag, bool, default=False)
    if "norm_before_residual" not in cfg:
        p.warnings.append(
            f"{file}: norm_before_residual is absent; speculators reads False but vLLM's speculators path uses "
            "True: write it"
        )
    sc = cfg.get("speculators_config")
    ver = sc.get("verifier") if isinstance(sc, dict) else None
    if not isinstance(ver, dict):
        raise FormatError(
            f"{file}: field 'speculators_config.verifier' is missing or not an object",
            'add "verifier": {"name_or_path": ..., "architectures": [...]}',
        )
    p.set("verifier_name", ver.get("name_or_path"), f"{file}: speculators_config.verifier.name_or_path")
    p.set(
        "verifier_architectures",
        tuple(ver.get("architectures") or ()),
        f"{file}: speculators_config.verifier.architectures",
    )
    return p


def _parse_eagle(cfg: dict, file: str, n_target: int | None, layer_convention: str | None) -> _Parsed:
    p = _Parsed(file)
    mt = cfg.get("model_type", "llama")
    if mt not in LAYER_TYPES:
        raise FormatError(
            f"{file}: field 'model_type' is {mt!r}, expected one of {list(LAYER_TYPES)}",
            "eyas reads drafts with one llama or qwen3 layer type",
        )
    p.set(
        "layer_type",
        mt,
        f"{file}: model_type" if "model_type" in cfg else "assumed llama (model_type absent)",
        assumed="model_type" not in cfg,
    )
    _read_dims(p, cfg, "")
    p.read(cfg, "draft_vocab_size", int, default=p.fields["vocab_size"])
    p.read(cfg, "target_hidden_size", int, default=p.fields["hidden_size"])
    ec = cfg.get("eagle_config") or {}
    if not isinstance(ec, dict):
        raise FormatError(f"{file}: field 'eagle_config' is {ec!r}, expected an object", "fix eagle_config")
    for flag in NORM_FLAGS:
        top, nested = cfg.get(flag), ec.get(flag)
        if top is not None and nested is not None and top != nested:
            raise FormatError(
                f"{file}: field '{flag}' is {top} but 'eagle_config.{flag}' is {nested}",
                f"make {flag} agree in both places",
            )
        p.read(
            cfg if top is not None else ec,
            flag,
            bool,
            where="" if top is not None or nested is None else "eagle_config.",
            default=False,
        )
    if ec.get("use_aux_hidden_state") is False:
        p.warnings.append(
            f"{file}: eagle_config.use_aux_hidden_state is false: vLLM then skips fc and feeds the target's last "
            "hidden state, not an EAGLE-3 draft's input; set it to true"
        )
    _eagle_capture(p, cfg, ec, n_target, layer_convention)
    ver = cfg.get("verifier")  # written by eyas; not part of the EAGLE schema
    if isinstance(ver, dict):
        p.set("verifier_name", ver.get("name_or_path"), f"{file}: verifier.name_or_path")
        p.set("verifier_architectures", tuple(ver.get("architectures") or ()), f"{file}: verifier.architectures")
    else:
        p.set("verifier_name", None, "not recorded", assumed=True)
        p.set("verifier_architectures", (), "not recorded", assumed=True)
    return p


def _eagle_capture(p: _Parsed, cfg: dict, ec: dict, n_target: int | None, conv: str | None) -> None:
    """Capture layers of an eagle config: top-level ids are capture indices; nested ones are ambiguous."""
    top, nested = _layer_ids(p, cfg, ""), _layer_ids(p, ec, "eagle_config.")
    if nested is not None:
        if conv == "input":
            read, how = nested, "read as capture indices (--layer-convention input)"
        elif conv == "output":
            read, how = [i + 1 for i in nested], "read as output-of-layer ids, +1 (--layer-convention output)"
        else:
            read = [i + 1 for i in nested] if nested[0] == 1 else nested
            how = "read as current SGLang does (+1 only when the first id is 1)"
    if top is not None:
        p.set("capture_layers", top, f"{p.file}: {IDS} (top level, capture indices as vLLM reads them)")
        if nested is not None and read != top:
            p.warnings.append(
                f"{p.file}: top-level {IDS} {top} (vLLM) and eagle_config.{IDS} {nested} ({how}: {read}; SGLang) "
                "name different layers; eyas uses the top-level ones"
            )
    elif nested is not None:
        p.set("capture_layers", read, f"{p.file}: eagle_config.{IDS} {nested} {how}")
        if conv is None:
            p.warnings.append(
                f"{p.file}: eagle_config.{IDS} {nested} {how} -> capture {read}; legacy SGLang and SpecForge "
                "add 1 always, "
                "vLLM ignores these ids; pass --layer-convention input|output to override"
            )
    else:
        _default_capture(p, n_target, "eagle_config.")


# --- reading a checkpoint -----------------------------------------------------------------------


class _Issues:
    """Problems that make a checkpoint unusable: raised at once (strict) or collected (for `eyas check`)."""

    def __init__(self, strict: bool):
        self.strict, self.problems = strict, []

    def add(self, err: type[EyasError], field_: str, problem: str, fix: str) -> None:
        if self.strict:
            raise err(problem, fix)
        self.problems.append({"field": field_, "problem": problem, "fix": fix})


def _config_paths(path: Path) -> dict[str, Path]:
    if path.is_file():
        return {path.name: path}
    if not path.is_dir():
        raise FormatError(f"{path}: no such file or folder", "pass a draft folder or a draft config .json file")
    found = {n: path / n for n in CONFIG_NAMES if (path / n).is_file()}
    if not found:
        raise FormatError(
            f"{path}: no config file (looked for {', '.join(CONFIG_NAMES)})",
            "a draft folder needs its config.json next to the weights",
        )
    return found


def _choose(files: dict[str, str]) -> tuple[str, str]:
    """Which config file defines the contract when a folder holds several."""
    if len(files) == 1:
        name = next(iter(files))
        return name, "the only config file"
    spec = [n for n in files if files[n] == "speculators"]
    name = spec[0] if spec else "config.json" if "config.json" in files else next(iter(files))
    others = ", ".join(n for n in files if n != name)
    why = "speculators format (its layer ids are unambiguous)" if spec else "what engines read"
    return name, f"{why}; agrees with {others}"


def _compare(parsed: dict[str, _Parsed], used: str, issues: _Issues, conv: str | None) -> None:
    """Every config file must state the same contract where both state a value."""
    ref = parsed[used]
    for name, p in parsed.items():
        if name == used:
            continue
        for key in sorted(set(p.fields) & set(ref.fields)):
            if key in p.assumed or key in ref.assumed or p.fields[key] == ref.fields[key]:
                continue
            a, b = p.fields[key], ref.fields[key]
            if key in ("verifier_name", "verifier_architectures") and not (a and b):
                continue
            hint = f"fix the wrong file, or delete it (eyas prefers {used})"
            if key == "capture_layers" and conv is None:
                hint += "; if the eagle ids use another convention, pass --layer-convention input|output"
            issues.add(
                FormatError,
                key,
                f"{name} and {used} disagree on {key}: {a!r} ({p.origin[key]}) vs {b!r} ({ref.origin[key]})",
                hint,
            )


def read_checkpoint(
    path: str | Path,
    *,
    layer_convention: str | None = None,
    verifier_config: dict | None = None,
    load_tensors: bool = True,
    strict: bool = True,
) -> Checkpoint:
    """Read a draft folder (or a single config .json) into a Checkpoint.

    `verifier_config`: the target's config.json contents, used for the target depth (default capture
    layers) and verifier facts. `strict=False` collects problems that would otherwise raise (config
    files that disagree, missing or corrupt weights, tensors that contradict the config) in
    `Checkpoint.problems`; unreadable or unidentifiable configs always raise.
    """
    if layer_convention not in (None, *LAYER_CONVENTIONS):
        raise ValueError(f"layer_convention must be one of {LAYER_CONVENTIONS} or None, got {layer_convention!r}")
    path = Path(path)
    facts = target_facts(verifier_config) if verifier_config else {}
    n_target = facts.get("num_hidden_layers")
    parsed, files, configs = {}, {}, {}
    for name, p in _config_paths(path).items():
        cfg = load_json(p)
        fmt = detect_format(cfg)
        if fmt is None:
            raise FormatError(
                f"{p}: neither a speculators config (no 'speculators_model_type') nor an EAGLE-3 config "
                "(no 'draft_vocab_size', 'eagle_config' or Eagle3 architecture)",
                "a target model's config goes to --target / --verifier-config; a draft config needs one of "
                "those fields",
            )
        parsed[name] = (
            _parse_speculators(cfg, name, n_target)
            if fmt == "speculators"
            else _parse_eagle(cfg, name, n_target, layer_convention)
        )
        files[name], configs[name] = fmt, cfg
    used, reason = _choose(files)
    issues = _Issues(strict)
    _compare(parsed, used, issues, layer_convention)
    p = parsed[used]
    origin, warnings = dict(p.origin), [w for q in parsed.values() for w in q.warnings]
    loaded = _load_tensors(path, issues) if path.is_dir() and load_tensors else None
    if path.is_file():
        warnings.append(f"{path.name} is a config file: tensor checks skipped (pass the folder to check the weights)")
    tensors, wfiles, naming = loaded or ({}, [], None)
    if loaded:
        origin["weight_naming"] = f"{wfiles[0]}: " + ("midlayer.*" if naming == "eagle" else "layers.0.*")
    contract = _build_contract(p, tensors if loaded else None, facts, origin)
    if loaded:
        for prob in tensor_problems(contract, tensors):
            issues.add(ContractError, prob["field"], f"{path / wfiles[0]}: {prob['problem']}", prob["fix"])
    return Checkpoint(
        path=path,
        contract=contract,
        files=files,
        config_used=used,
        reason=reason,
        origin=origin,
        tensors=tensors,
        weight_files=wfiles,
        warnings=warnings,
        configs=configs,
        weight_naming=naming,
        tensors_loaded=bool(loaded),
        problems=issues.problems,
    )


def _load_tensors(path: Path, issues: _Issues) -> tuple[dict[str, torch.Tensor], list[str], str] | None:
    """(canonical tensors, weight files, on-disk naming), or None (recorded as an issue) when unreadable."""
    if find_weights(path) is None:
        issues.add(
            FormatError,
            "weights",
            f"{path}: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)",
            "copy the weights next to the config, or pass the config .json alone to inspect the contract",
        )
        return None
    try:
        files = weight_files(path)
        raw = read_tensors(path)
        naming = weight_naming(raw)
        return to_canonical(raw, naming), files, naming
    except FormatError as e:
        issues.add(FormatError, "weights", str(e), e.hint or "")
        return None


def _build_contract(p: _Parsed, tensors: dict | None, facts: dict, origin: dict[str, str]) -> DraftContract:
    """Config fields + what only the tensors say (embeddings, vocab map, fc width) + verifier facts.

    `tensors` None: not read; embeddings are then assumed absent and a reduced vocab assumed mapped.
    """
    f = {k: v for k, v in p.fields.items() if not k.startswith("verifier_")}
    for k in ("verifier_name", "verifier_architectures"):
        origin.pop(k, None)
    if tensors is not None:
        f["has_embeddings"] = "embed_tokens.weight" in tensors
        f["has_vocab_map"] = "d2t" in tensors or "t2d" in tensors
        origin["has_embeddings"] = "tensors: embed_tokens.weight " + ("present" if f["has_embeddings"] else "absent")
        origin["has_vocab_map"] = "tensors: d2t/t2d " + ("present" if f["has_vocab_map"] else "absent")
        fc, ht = tensors.get("fc.weight"), f["target_hidden_size"]
        if f["capture_layers"] is None and fc is not None and fc.ndim == 2 and fc.shape[1] % ht == 0:
            f["num_aux_layers"] = fc.shape[1] // ht
            origin["num_aux_layers"] = "tensors: fc.weight width / target_hidden_size"
    else:
        f["has_embeddings"] = False
        f["has_vocab_map"] = f["draft_vocab_size"] < f["vocab_size"]
        origin["has_embeddings"] = "assumed absent (tensors not read)"
        mapped = "present: reduced vocab" if f["has_vocab_map"] else "absent: full vocab"
        origin["has_vocab_map"] = f"assumed {mapped} (tensors not read)"
    origin.setdefault("num_aux_layers", "len(capture_layers)" if f["capture_layers"] is not None else "default 3")
    origin["verifier"] = p.file + (" + verifier config" if facts else "")
    verifier = Verifier(
        name_or_path=p.fields.get("verifier_name") or facts.get("name_or_path"),
        architectures=tuple(p.fields.get("verifier_architectures") or facts.get("architectures") or ()),
        num_hidden_layers=facts.get("num_hidden_layers"),
        hidden_size=facts.get("hidden_size"),
        vocab_size=facts.get("vocab_size"),
    )
    try:
        return DraftContract(**f, verifier=verifier)
    except ContractError as e:
        raise ContractError(f"{p.file}: {e}", e.hint) from None


# --- tensors against the contract ---------------------------------------------------------------


def problem(field_: str, text: str, fix: str) -> dict[str, str]:
    """One finding, as `eyas check` lists it: the field (or tensor), what is wrong, how to fix it."""
    return {"field": field_, "problem": text, "fix": fix}


def _shape(shape: torch.Size | tuple[int, ...]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "layers" and len(parts) > 2 and parts[1].isdigit() else None


def _flag_for(name: str) -> tuple[str, str] | None:
    """The config setting that decides whether an optional tensor exists: (setting, value that adds it)."""
    if name == "input_norm.weight":
        return "norm_before_fc", "true"
    if name.startswith("fc_norm."):
        return "fc_norm", "true"
    if name.endswith(("self_attn.q_norm.weight", "self_attn.k_norm.weight")):
        return "layer type (model_type)", "qwen3"
    if name.endswith("_proj.bias") and ".self_attn." in name:
        return "attention_bias", "true"
    return None


def tensor_problems(c: DraftContract, tensors: dict[str, torch.Tensor]) -> list[dict[str, str]]:
    """Every way `tensors` (canonical names) contradict `c`: missing, unexpected, misshapen, bad vocab map."""
    expected = expected_shapes(c)
    stored_layers = {_layer_index(n) for n in tensors}
    out: list[dict[str, str]] = []
    for i in sorted({_layer_index(n) for n in expected} - stored_layers - {None, 0}):
        out.append(
            problem(
                f"layers.{i}",
                f"num_hidden_layers is {c.num_hidden_layers} but no layers.{i}.* are stored",
                "set num_hidden_layers to the number of stored layers",
            )
        )
    for i in sorted(i for i in stored_layers - {None} if i >= c.num_hidden_layers):
        out.append(
            problem(
                f"layers.{i}",
                f"layers.{i}.* are stored but num_hidden_layers is {c.num_hidden_layers}",
                "set num_hidden_layers to the number of stored layers",
            )
        )
    for name, shape in expected.items():
        t, flag = tensors.get(name), _flag_for(name)
        if t is not None:
            if tuple(t.shape) != shape:
                out.append(_wrong_shape(c, name, t, shape))
        elif name in ("d2t", "t2d"):
            other = "t2d" if name == "d2t" else "d2t"
            out.append(
                problem(
                    name,
                    f"{name} is missing ({other} is present)",
                    "store both: t2d[j] is true exactly for j in arange(draft_vocab_size) + d2t",
                )
            )
        elif _layer_index(name) in stored_layers or _layer_index(name) is None:
            why = f" ({flag[0]} is {flag[1]})" if flag else ""
            fix = f"set {flag[0]} correctly, or add the trained {name}" if flag else "the checkpoint is incomplete"
            out.append(problem(name, f"{name} is missing{why}", fix))
    for name in tensors.keys() - expected.keys():
        i, flag = _layer_index(name), _flag_for(name)
        if i is not None and i >= c.num_hidden_layers:
            continue  # reported per layer above
        if flag:
            out.append(
                problem(
                    name,
                    f"{name} is present but {flag[0]} is not {flag[1]}",
                    f"set {flag[0]} to {flag[1]} (engines ignore or reject the tensor otherwise)",
                )
            )
        else:
            out.append(
                problem(name, f"{name} is not an EAGLE-3 tensor", "remove it: no EAGLE-3 loader has such a parameter")
            )
    return out + vocab_map_problems(c, tensors)


def _wrong_shape(c: DraftContract, name: str, t: torch.Tensor, shape: tuple[int, ...]) -> dict[str, str]:
    """A misshapen tensor, explained by the config field that most likely disagrees with it."""
    got, want, ht = _shape(t.shape), _shape(shape), c.target_hidden_size
    same_rows = t.ndim == 2 and t.shape[0] == shape[0]
    same_cols = t.ndim == 2 and t.shape[1] == shape[1]
    if name == "fc.weight" and same_rows and t.shape[1] % ht == 0:
        a = t.shape[1] // ht
        ids = (
            "no layer ids"
            if c.capture_layers is None
            else f"{c.num_aux_layers} capture layers {list(c.capture_layers)}"
        )
        return problem(
            name,
            f"fc.weight is {got} = {a} chunks of target_hidden_size {ht}, but the config names {ids} ({IDS})",
            f"set {IDS} to the {a} target layers the draft was trained on",
        )
    if name == "fc.weight" and same_rows:
        return problem(
            name,
            f"fc.weight is {got}: width {t.shape[1]} is not a multiple of target_hidden_size {ht}",
            "set target_hidden_size to the target's hidden size",
        )
    if name == "lm_head.weight" and same_cols:
        return problem(
            name,
            f"lm_head.weight is {got}, expected {want} (draft_vocab_size {c.draft_vocab_size})",
            f"set draft_vocab_size to {t.shape[0]}",
        )
    if name == "embed_tokens.weight" and same_cols:
        return problem(
            name,
            f"embed_tokens.weight is {got}, expected {want} (vocab_size {c.vocab_size})",
            f"vocab_size is the TARGET's vocab: set it to {t.shape[0]}",
        )
    if name in ("d2t", "t2d"):
        size = "draft_vocab_size" if name == "d2t" else "vocab_size"
        return problem(name, f"{name} is {got}, expected {want} ({size})", f"set {size} to match, or rebuild the map")
    if name.startswith("layers.0.self_attn.") and name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
        return problem(
            name,
            f"{name} is {got}, expected {want} (layer 0 reads cat(embedding, hidden): 2 x hidden_size {c.hidden_size})",
            "check hidden_size, num_attention_heads, num_key_value_heads and head_dim",
        )
    return problem(
        name,
        f"{name} is {got}, expected {want}",
        "the config's dims (hidden_size, heads, head_dim, intermediate_size) disagree with the weights",
    )


def vocab_map_problems(c: DraftContract, tensors: dict[str, torch.Tensor]) -> list[dict[str, str]]:
    """d2t: int64 offsets, arange+d2t strictly increasing inside [0, V); t2d: bool [V], Vd true, same set."""
    V, Vd = c.vocab_size, c.draft_vocab_size
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if c.reduced_vocab and d2t is None and t2d is None:
        return [
            problem(
                "d2t",
                f"draft_vocab_size {Vd} < vocab_size {V} but there is no d2t/t2d: engines would take draft id i "
                "as target id i",
                "add the d2t/t2d vocab map from the training run",
            )
        ]
    out, targets = [], None
    if d2t is not None and tuple(d2t.shape) == (Vd,):
        if d2t.dtype != torch.int64:
            out.append(problem("d2t", f"d2t is {d2t.dtype}, expected torch.int64", "store d2t as int64 offsets"))
        targets = torch.arange(Vd) + d2t.long()  # target_id = draft_id + d2t[draft_id]
        outside = ((targets < 0) | (targets >= V)).nonzero().flatten()
        rising = bool((targets[1:] > targets[:-1]).all())
        if len(outside):
            i = int(outside[0])
            out.append(
                problem(
                    "d2t",
                    f"d2t maps draft id {i} to target id {int(targets[i])}, outside [0, {V})",
                    "d2t holds offsets: d2t[i] = target_id[i] - i",
                )
            )
        elif not rising:
            i = int((targets[1:] <= targets[:-1]).nonzero()[0]) + 1
            out.append(
                problem(
                    "d2t",
                    f"arange + d2t is not strictly increasing at draft id {i} (target ids "
                    f"{int(targets[i - 1])}, {int(targets[i])})",
                    "d2t holds offsets to target ids sorted ascending: d2t[i] = sorted_ids[i] - i",
                )
            )
        if len(outside) or not rising:
            targets = None
    if t2d is not None and tuple(t2d.shape) == (V,):
        if t2d.dtype != torch.bool:
            out.append(
                problem(
                    "t2d", f"t2d is {t2d.dtype}, expected torch.bool", "store t2d as a bool mask over the target vocab"
                )
            )
        mask = t2d.bool()
        count = int(mask.sum())
        if count != Vd:
            out.append(
                problem(
                    "t2d",
                    f"t2d marks {count} target ids, expected draft_vocab_size {Vd}",
                    "rebuild t2d: t2d[j] is true exactly for j in arange(Vd) + d2t",
                )
            )
        elif targets is not None and not bool(mask[targets].all()):
            j = int(targets[~mask[targets]][0])
            out.append(
                problem(
                    "t2d",
                    f"t2d disagrees with d2t: target id {j} is a draft token but t2d[{j}] is false",
                    "rebuild t2d from d2t",
                )
            )
    return out


# --- writing ------------------------------------------------------------------------------------


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
        "tie_word_embeddings": False,
    }


def _flags(c: DraftContract) -> dict[str, bool]:
    return {flag: getattr(c, flag) for flag in NORM_FLAGS}


def speculators_config(c: DraftContract, dtype: str | None = None) -> dict[str, Any]:
    """The speculators `config.json` for `c`: every flag explicit, no top-level model_type, no auto_map."""
    return {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "verifier": {"name_or_path": c.verifier.name_or_path, "architectures": list(c.verifier.architectures)},
        },
        "transformer_layer_config": {"model_type": c.layer_type, **_layer_dims(c)},
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        IDS: None if c.capture_layers is None else list(c.capture_layers),
        **_flags(c),
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
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        **({IDS: list(c.capture_layers)} if c.capture_layers is not None else {}),
        **_flags(c),
        "eagle_config": {**nested, "use_aux_hidden_state": True, **_flags(c)},
        **({"torch_dtype": dtype} if dtype else {}),
    }
    if c.verifier.name_or_path or c.verifier.architectures:
        cfg["verifier"] = {"name_or_path": c.verifier.name_or_path, "architectures": list(c.verifier.architectures)}
    return cfg


def _check_destination(dst: Path, force: bool) -> None:
    if dst.exists() and not dst.is_dir():
        raise FormatError(f"{dst}: exists and is not a folder", "choose a folder path for DST")
    if dst.is_dir() and any(dst.iterdir()) and not force:
        raise FormatError(f"{dst}: folder is not empty", "choose an empty or new DST, or pass --force to replace it")


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")
    fsync_file(path)


def _ordinary_modes(folder: Path) -> None:
    """mkdtemp and safetensors make private files; a checkpoint folder is ordinary output (umask applies)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def _install(tmp: Path, dst: Path) -> None:
    """Move the finished temp folder to dst; a replaced folder is moved aside first, then removed."""
    old = None
    if dst.is_dir() and any(dst.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.replace(dst, old / dst.name)
    try:
        os.replace(tmp, dst)  # replaces an empty folder too
    except OSError:
        if old is not None:  # put the replaced folder back
            os.replace(old / dst.name, dst)
            old.rmdir()
        raise
    fd = os.open(dst.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _verifier_config_of(c: DraftContract) -> dict[str, Any]:
    """The verifier facts of `c` as a config dict, so a re-read derives the same verifier fields."""
    v = c.verifier
    return {
        "_name_or_path": v.name_or_path,
        "architectures": list(v.architectures),
        "hidden_size": v.hidden_size,
        "vocab_size": v.vocab_size,
        "num_hidden_layers": v.num_hidden_layers if c.capture_layers is not None else None,
    }


def _write(
    dst: str | Path, contract: DraftContract, tensors: dict[str, torch.Tensor], fmt: str, force: bool
) -> Checkpoint:
    if fmt not in (*FORMATS, "both"):
        raise ValueError(f"fmt must be speculators, eagle or both, got {fmt!r}")
    dst = Path(dst).absolute()
    _check_destination(dst, force)
    problems = tensor_problems(contract, tensors)
    if problems:
        raise ContractError(problems[0]["problem"], problems[0]["fix"])
    dtype = dtype_name(tensors)
    configs = {"config.json": speculators_config(contract, dtype) if fmt != "eagle" else eagle_config(contract, dtype)}
    if fmt == "both":
        configs["config_eagle.json"] = eagle_config(contract, dtype)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    try:
        for name, cfg in configs.items():
            _write_json(tmp / name, cfg)
        write_tensors(tmp, from_canonical(tensors, "eagle" if fmt == "eagle" else "speculators"))
        back = read_checkpoint(tmp, verifier_config=_verifier_config_of(contract))
        _assert_same(contract, tensors, back)
        _ordinary_modes(tmp)
        _install(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    back.path = dst
    return back


def _assert_same(contract: DraftContract, tensors: dict[str, torch.Tensor], back: Checkpoint) -> None:
    """A written checkpoint reads back as the same contract and bit-identical tensors (an invariant)."""
    if back.contract != contract:
        diff = {
            k: (v, back.contract.to_dict()[k]) for k, v in contract.to_dict().items() if back.contract.to_dict()[k] != v
        }
        raise AssertionError(f"written checkpoint reads back differently: {diff}")
    if set(back.tensors) != set(tensors) or not all(
        back.tensors[n].dtype == t.dtype and torch.equal(back.tensors[n], t) for n, t in tensors.items()
    ):
        raise AssertionError("written tensors read back differently")


def write_checkpoint(
    dst: str | Path, contract: DraftContract, tensors: dict[str, torch.Tensor], fmt: str, *, force: bool = False
) -> Path:
    """Write `contract` + canonical `tensors` as `fmt` ("speculators", "eagle" or "both") into folder `dst`.

    "both" writes `config.json` (speculators) and `config_eagle.json` (eagle) next to one
    `model.safetensors` in speculators naming. The folder is built in a temp dir beside dst, read back
    and compared (contract and tensors), then renamed into place: on any failure nothing is left.
    A non-empty dst is refused unless `force`.
    """
    return _write(dst, contract, tensors, fmt, force).path


def convert_checkpoint(
    src: str | Path,
    dst: str | Path,
    to: str,
    *,
    force: bool = False,
    layer_convention: str | None = None,
    verifier_config: dict | None = None,
    verifier_name: str | None = None,
) -> tuple[Checkpoint, Checkpoint]:
    """Read `src`, write it losslessly as `to` into `dst`; returns (source, written) checkpoints.

    `verifier_name` replaces the recorded verifier id (what `vllm serve DIR` will load); nothing else
    about the draft changes.
    """
    src_p, dst_p = Path(src).resolve(), Path(dst).resolve()
    if not src_p.is_dir():
        raise FormatError(f"{src}: not a checkpoint folder", "convert needs a folder with a config and weights")
    if dst_p == src_p or dst_p.is_relative_to(src_p):
        raise FormatError(f"{dst}: DST is inside SRC {src}", "write the converted checkpoint outside the source folder")
    if src_p.is_relative_to(dst_p):
        raise FormatError(f"{dst}: DST contains SRC {src}", "choose a DST that does not hold the source")
    source = read_checkpoint(src_p, layer_convention=layer_convention, verifier_config=verifier_config)
    contract = source.contract
    if verifier_name:
        contract = contract.replace(verifier=dataclasses.replace(contract.verifier, name_or_path=verifier_name))
    return source, _write(dst_p, contract, source.tensors, to, force)
