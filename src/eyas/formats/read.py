"""Reading a draft checkpoint (folder or lone config file) into a `Checkpoint`: contract, provenance, tensors.

Unreadable input (a config that is not JSON or of neither format, weights that cannot be read)
always raises a FormatError. A readable checkpoint that contradicts itself (tensors against its
config, no weights) raises with `strict` and is listed in `Checkpoint.problems` without it. Config
files that disagree never raise: the contract comes from one of them (`config_used`, `reason`) and
each disagreement is a finding, a problem or a warning by what it changes (eyas.formats.compare).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from eyas.codes import finding, prefixed, text_of
from eyas.contract import DraftContract, Verifier, target_facts
from eyas.errors import ContractError, EyasError, FormatError
from eyas.formats.compare import agreement, choose_config, config_paths, disagreements
from eyas.formats.parse import load_json, parse_eagle, parse_speculators
from eyas.formats.parsed import Parsed
from eyas.formats.schema import LAYER_CONVENTIONS, detect_format
from eyas.formats.validate import complete_vocab_map, tensor_problems
from eyas.weights import (
    WRAPPER_PREFIX,
    aux_norm_spelled,
    find_weights,
    read_tensors,
    to_canonical,
    unwrap,
    weight_files,
    weight_layouts,
    weight_naming,
)


@dataclass
class Checkpoint:
    """A draft checkpoint as read from disk: its contract, where each fact came from, its tensors."""

    path: Path
    contract: DraftContract
    files: dict[str, str]  # config file name -> "speculators" | "eagle"
    config_used: str  # the file the contract was taken from
    reason: str  # why that file, and how the others relate to it
    origin: dict[str, str]  # contract field -> how it was derived
    assumed: frozenset[str]  # contract fields the config used leaves to a default (capture_layers: the engines')
    tensors: dict[str, torch.Tensor]  # canonical names; empty when not loaded
    weight_files: list[str]
    warnings: list[dict[str, str]]  # findings (eyas.codes), severity "warning"
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # raw JSON, per file
    weight_naming: str | None = None  # "eagle" (midlayer.*) or "speculators" (layers.0.*) on disk
    wrapped: int = 0  # how many names on disk carry the wrapping module's prefix `model.` (read through)
    aux_norm_names: int = 0  # fc_norm chunks stored under SpecForge's aux_norm_low/mid/high names (read as fc_norm)
    tensors_loaded: bool = False  # False: config only, load_tensors=False, or no weights (strict=False)
    # findings, severity "problem": the config files' disagreements that change the draft, plus (strict=False
    # only) what strict would raise
    problems: list[dict[str, str]] = field(default_factory=list)
    # the vocab map as the file stores it where eyas completed it (complete_vocab_map): name -> the stored
    # tensor, None when it is not in the file (t2d derived from d2t); `tensors` holds what eyas uses
    filled: dict[str, torch.Tensor | None] = field(default_factory=dict)

    @property
    def config_path(self) -> Path:
        """The config file the contract was taken from (what an error about the contract names)."""
        return self.path if self.path.is_file() else self.path / self.config_used

    @property
    def disagreements(self) -> list[dict[str, str]]:
        """Where the folder's config files state different values, problems first."""
        return [f for f in self.problems + self.warnings if f["code"].startswith("config_files_disagree")]


# the weight problems a disagreement of the config files can cause: the file read may be the wrong one
_EXPLAINS = {
    "config_files_disagree_dims": {"layers_missing", "layers_extra", "tensor_missing", "tensor_shape", "fc_shape",
                                   "lm_head_shape", "embed_tokens_shape", "feature_norm_shape"},
    "config_files_disagree_vocab": {"vocab_map_missing", "vocab_map_shape", "d2t_out_of_range", "t2d_count",
                                    "lm_head_shape", "embed_tokens_shape"},
    "config_files_disagree_capture_layers": {"fc_chunks", "fc_shape"},
    "config_files_disagree_norm_flags": {"flag_tensor_missing", "flag_tensor_unexpected", "feature_norm_missing",
                                         "feature_norm_unexpected"},
}


class _Issues:
    """Problems that make a checkpoint unusable: raised at once (strict) or collected (for `eyas check`).
    Where the config files disagree on what a failing check reads (`disagree`), the error names that
    first: weights that fit the other file are the disagreement's symptom, and its fix is the one to make."""

    def __init__(self, strict: bool, disagree: list[dict[str, str]] = ()):
        self.strict, self.problems, self.disagree = strict, [], disagree

    def add(self, err: type[EyasError], problem: dict[str, str]) -> None:
        cause = next((d for d in self.disagree if problem["code"] in _EXPLAINS.get(d["code"], ())), None)
        if self.strict and cause is not None:
            raise err(f"{text_of(cause)}; and so {problem['problem']}", cause["fix"])
        if self.strict:
            raise err(problem["problem"], problem["fix"])
        self.problems.append(problem)


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
    layers) and verifier facts. `strict=False` collects problems that would otherwise raise (missing
    weights, tensors that contradict the config) in `Checkpoint.problems`; unreadable configs or
    weights always raise, disagreeing config files never do.
    """
    if layer_convention not in (None, *LAYER_CONVENTIONS):
        raise ValueError(f"layer_convention must be one of {LAYER_CONVENTIONS} or None, got {layer_convention!r}")
    path = Path(path)
    facts = target_facts(verifier_config) if verifier_config else {}
    parsed, files, configs = _parse_files(path, facts.get("num_hidden_layers"), layer_convention)
    used, why = choose_config(files)
    disagree = disagreements(parsed, used, layer_convention)
    issues = _Issues(strict, [d for d in disagree if "problem" in d])
    p = parsed[used]
    origin = dict(p.origin)
    warnings = [w for q in parsed.values() for w in q.warnings] + [d for d in disagree if "warning" in d]
    loaded = _load_tensors(path, issues) if path.is_dir() and load_tensors else None
    if path.is_file():
        warnings.append(
            finding(
                "tensors_not_checked",
                "weights",
                f"{path.name} is a config file: tensor checks skipped (pass the folder to check the weights)",
                "pass the draft folder instead of its config file",
            )
        )
    tensors, wfiles, naming, wrapped, aux_names = loaded or ({}, [], None, 0, 0)
    if loaded and len(layouts := weight_layouts(path)) > 1:
        warnings.append(
            finding(
                "weights_layouts_several",
                "weights",
                f"{path}: weights in {len(layouts)} layouts ({', '.join(layouts)}): eyas reads {layouts[0]}, other "
                "readers pick another (transformers model.safetensors first, EAGLE's EaModel pytorch_model.bin)",
                "keep one set of weights and delete the others (eyas convert writes one model.safetensors)",
            )
        )
    if loaded:
        origin["weight_naming"] = f"{wfiles[0]}: " + ("midlayer.*" if naming == "eagle" else "layers.0.*")
        origin["weight_naming"] += f", under {WRAPPER_PREFIX!r}" if wrapped else ""
    if wrapped:
        warnings.append(_wrapped_names(path / wfiles[0], wrapped, len(tensors)))
    if aux_names:
        warnings.append(_aux_norm_names(path / wfiles[0]))
    if loaded and p.class_layer is not None:
        warnings += _layer_by_weights(p, tensors, origin)
    contract = _build_contract(p, tensors if loaded else None, facts, origin, path / used if path.is_dir() else path)
    if loaded and not contract.has_lm_head:
        warnings.append(_shared_lm_head(path / wfiles[0]))
    filled: dict[str, torch.Tensor | None] = {}
    if loaded and p.foreign_layout:  # no tensor layout to check against: running it is refused instead
        warnings.append(
            finding(
                "tensors_not_checked",
                "weights",
                f"{path / wfiles[0]}: tensors not checked: eyas has no tensor layout for its "
                f"{'; '.join(p.foreign_layout)}",
                "check the weights with the engine that implements this layer",
            )
        )
    elif loaded:
        stored = tensors
        tensors, completed = complete_vocab_map(contract, tensors, f"{path / wfiles[0]}: ")
        warnings += completed
        filled = {n: stored.get(n) for n, t in tensors.items() if stored.get(n) is not t}
        against = f"{path / wfiles[0]} (checked against {used}): "  # either file may be the wrong one
        for prob in tensor_problems(contract, tensors):
            issues.add(ContractError, prefixed(prob, against))
    return Checkpoint(
        path=path,
        contract=contract,
        files=files,
        config_used=used,
        reason=why + agreement(files, used, disagree),
        origin=origin,
        assumed=frozenset(p.assumed),
        tensors=tensors,
        weight_files=wfiles,
        warnings=warnings,
        configs=configs,
        weight_naming=naming,
        wrapped=wrapped,
        aux_norm_names=aux_names,
        tensors_loaded=bool(loaded),
        problems=[d for d in disagree if "problem" in d] + issues.problems,
        filled=filled,
    )


# speculators' research trainer before 2992f3aa named the draft's vocab vocab_size and the target's
# target_vocab_size; engines read vocab_size as the target's (that commit renamed them to match)
_TRAINING_VOCAB = ("a training config (target_vocab_size): for serving write vocab_size = its target_vocab_size "
                   "and draft_vocab_size = its vocab_size")


def _parse_files(
    path: Path, n_target: int | None, conv: str | None
) -> tuple[dict[str, Parsed], dict[str, str], dict[str, dict[str, Any]]]:
    """Every config file at `path`: parsed, its format, its raw JSON (each keyed by file name)."""
    parsed, files, configs = {}, {}, {}
    for name, p in config_paths(path).items():
        cfg = load_json(p)
        fmt = detect_format(cfg)
        if fmt is None:
            raise FormatError(
                f"{p}: neither a speculators config (no 'speculators_model_type') nor an EAGLE-3 config "
                "(no 'draft_vocab_size', 'eagle_config' or Eagle3 architecture)",
                _TRAINING_VOCAB if "target_vocab_size" in cfg else
                "a target model's config goes to --target; a draft config needs one of those fields",
            )
        try:
            parsed[name] = (parse_speculators(cfg, name, n_target) if fmt == "speculators"
                            else parse_eagle(cfg, name, n_target, conv))
        except EyasError as e:  # the parsers name the file alone: say which draft's it is (two may be in play)
            said, hint = str(e), e.hint
            hint = hint[: -len(name)] + str(p) if hint and hint.endswith(f" {name}") else hint
            raise type(e)(f"{p}{said[len(name):]}" if said.startswith(f"{name}:") else said, hint) from None
        files[name], configs[name] = fmt, cfg
    return parsed, files, configs


def _load_tensors(path: Path, issues: _Issues) -> tuple[dict[str, torch.Tensor], list[str], str, int, int] | None:
    """(canonical tensors, weight files, on-disk naming, names under `model.`, names `aux_norm_*`), or None
    (an issue) when the folder has no weights.

    Weights that are there but cannot be read raise: that is unreadable input, not a finding.
    """
    if find_weights(path) is None:
        issues.add(
            FormatError,
            finding(
                "weights_missing",
                "weights",
                f"{path}: no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin)",
                "copy the weights next to the config, or pass the config .json alone to inspect the contract",
            ),
        )
        return None
    files = weight_files(path)
    raw, wrapped = unwrap(read_tensors(path), str(path / files[0]))
    naming = weight_naming(raw)
    return to_canonical(raw, naming, str(path / files[0])), files, naming, wrapped, aux_norm_spelled(raw)


def _aux_norm_names(weights: Path) -> dict[str, str]:
    """The warning on fc_norm stored under SpecForge's names: eyas reads them, vLLM 0.32 has no parameter of
    that name and refuses to load the draft (run here)."""
    return finding(
        "weights_aux_norm_names",
        "weights",
        f"{weights}: aux_norm_low/mid/high are SpecForge's names of fc_norm.0/1/2 (use_aux_norm): eyas reads "
        "them, vLLM has no parameter of that name and refuses to load the draft",
        "eyas convert DIR OUT writes them as fc_norm.* with fc_norm true",
    )


def _shared_lm_head(weights: Path) -> dict[str, str]:
    """A full-vocab draft without lm_head.weight: it was trained on the target's frozen head (engines
    share the target's with such a draft), or it lost its own (then it is missing)."""
    return finding(
        "lm_head_shared",
        "lm_head.weight",
        f"{weights}: no lm_head.weight in a full-vocab draft: eyas reads the target's lm_head, as engines that "
        "share it do",
        "nothing, if the draft was trained on the target's lm_head; else add the lm_head.weight it was trained with",
    )


def _wrapped_names(weights: Path, wrapped: int, total: int) -> dict[str, str]:
    """The warning on names saved under the wrapping module's prefix: eyas and SGLang read through it
    (SGLang adds `model.` only where it is missing), vLLM 0.32 adds it to every name but lm_head's and
    refuses to load (`There is no module or parameter named 'model' in LlamaModel`, run here)."""
    return finding(
        "weights_prefixed",
        "weights",
        f"{weights}: {wrapped} of {total} tensor names carry the prefix {WRAPPER_PREFIX!r} (a whole-model export): "
        f"eyas and SGLang read through it, vLLM prefixes them again and refuses to load the draft",
        "eyas convert DIR OUT writes the names without it",
    )


def _layer_by_weights(p: Parsed, tensors: dict, origin: dict[str, str]) -> list[dict[str, str]]:
    """A dense class beside model_type qwen3 (eyas.formats.layer): weights without q_norm/k_norm are the layer
    the class builds, which every engine serves (the config was refused for tensors it never needed). Beside a
    class that builds a qwen3 layer, such weights stay the llama layer they are: vLLM's view says it misbuilds
    them (eyas.check.consumers)."""
    if any(".self_attn.q_norm." in n or ".self_attn.k_norm." in n for n in tensors) or p.class_layer == "qwen3":
        return []
    said = p.fields["layer_type"]
    p.set("layer_type", p.class_layer, f"{p.file}: architectures (its weights have no q_norm/k_norm)")
    origin["layer_type"] = p.origin["layer_type"]
    return [finding("layer_type_unknown", "model_type",
                    f"{p.file}: model_type {said!r} beside a class that builds a {p.class_layer} layer, and weights "
                    f"without q_norm/k_norm: read as {p.class_layer}, as engines build it (trainers copy the "
                    "target's model_type)", f"write model_type {p.class_layer!r}")]


def _build_contract(p: Parsed, tensors: dict | None, facts: dict, origin: dict[str, str],
                    file: Path) -> DraftContract:
    """Config fields + what only the tensors say (embeddings, vocab map, fc width) + verifier facts.

    `tensors` None: not read; embeddings are then assumed absent and a reduced vocab assumed mapped.
    """
    f = {k: v for k, v in p.fields.items() if not k.startswith("verifier_")}
    for k in ("verifier_name", "verifier_architectures", "verifier_model_type"):
        origin.pop(k, None)
    if tensors is not None:
        f["has_embeddings"] = "embed_tokens.weight" in tensors
        f["has_vocab_map"] = "d2t" in tensors or "t2d" in tensors
        origin["has_embeddings"] = "tensors: embed_tokens.weight " + ("present" if f["has_embeddings"] else "absent")
        origin["has_vocab_map"] = "tensors: " + (", ".join(f"{n} {'present' if n in tensors else 'absent'}" for n in
                                                          ("d2t", "t2d")) if f["has_vocab_map"] else "d2t/t2d absent")
        # no lm_head of its own: a full-vocab draft reads the target's (a reduced one is missing a tensor)
        f["has_lm_head"] = "lm_head.weight" in tensors or f["has_vocab_map"] or f["draft_vocab_size"] < f["vocab_size"]
        state = "present" if "lm_head.weight" in tensors else "absent" + ("" if not f["has_lm_head"] else " (required)")
        origin["has_lm_head"] = f"tensors: lm_head.weight {state}"
        fc, ht = tensors.get("fc.weight"), f["target_hidden_size"]
        if f["capture_layers"] is None and fc is not None and fc.ndim == 2 and fc.shape[1] % ht == 0:
            f["num_aux_layers"] = fc.shape[1] // ht
            origin["num_aux_layers"] = "tensors: fc.weight width / target_hidden_size"
    else:
        f["has_embeddings"] = False
        f["has_vocab_map"] = f["draft_vocab_size"] < f["vocab_size"]
        origin["has_embeddings"] = "assumed absent (tensors not read)"
        origin["has_lm_head"] = "assumed present (tensors not read)"
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
        model_type=p.fields.get("verifier_model_type"),  # the checkpoint's word only: a Gemma type warns
    )
    try:
        return DraftContract(**f, verifier=verifier)
    except ContractError as e:  # named with the file's path, as the parsers' errors are (eyas.formats.read)
        if str(e).startswith("draft_vocab_size") and "draft_vocab_size" in p.assumed:  # a default, not the file's
            raise ContractError(f"{file}: no draft_vocab_size, and the {p.origin['draft_vocab_size'].split(' (')[0]} "
                                f"exceeds the target vocab {f['vocab_size']}",
                                f"add draft_vocab_size (the rows of lm_head.weight) to {file}") from None
        raise ContractError(f"{file}: {e}", e.hint) from None
