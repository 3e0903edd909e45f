"""One draft config file read into `DraftContract` keywords, with where each value came from.

Each format has its own reader: `parse_speculators`, `parse_eagle` (eyas.formats.schema.detect_format
says which applies).
What a file leaves unsaid is assumed (and marked so, for comparing files); what it says in a way
some consumer reads differently is a warning finding. Nothing here imports or runs code from a
checkpoint (`auto_map` is ignored).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from eyas.activations import ACTIVATIONS
from eyas.contract import IDS, default_capture_layers
from eyas.errors import FormatError
from eyas.formats.layer import DraftLayer, draft_layer
from eyas.formats.parsed import Parsed
from eyas.formats.rope_config import read_rope
from eyas.formats.schema import NORM_FLAGS
from eyas.formats.specforge import SCALED_FIX, embed_scale, use_aux_norm
from eyas.formats.values import (
    flag,
    layer_count,
    layer_ids,
    positive,
    refuse,
    show,
    size,
    text,
    texts,
)



def load_json(path: Path) -> dict[str, Any]:
    """A config file as a dict; malformed, empty or non-object JSON is a FormatError naming the file."""
    path = Path(path)
    try:
        content = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        weights = path.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf")
        raise FormatError(
            f"{path}: cannot read the file ({e})",
            f"pass the draft's folder ({path.parent}), not its weight file" if weights else
            "check the path and that it is a text JSON file",
        ) from None
    if not content.strip():
        raise FormatError(f"{path}: the file is empty, expected a JSON object", "export the config again")
    try:
        cfg = json.loads(content)
    except json.JSONDecodeError as e:
        fix = ("remove the UTF-8 byte-order mark the file starts with (transformers and SpecForge refuse it too)"
               if content.startswith("\ufeff") else
               "fix the JSON syntax at that position (a trailing comma or a missing quote is typical)")
        raise FormatError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}", fix) from None
    except (ValueError, RecursionError) as e:  # JSON Python will not hold: a 5000-digit integer, deep nesting
        raise FormatError(f"{path}: unreadable JSON ({type(e).__name__}: {str(e)[:100]})",
                          "a config holds plain numbers and shallow objects: export it again") from None
    if not isinstance(cfg, dict):
        raise FormatError(
            f"{path}: top level is a JSON {type(cfg).__name__}, expected an object",
            "a config file is one JSON object {...}",
        )
    return cfg


def _layer_ids(p: Parsed, src: dict, where: str) -> list[int] | None:
    """A non-empty list of layer ids, or None when absent/empty."""
    ids = src.get(IDS)
    if ids is None or ids == []:
        return None
    return layer_ids(p.file, where + IDS, ids)


def _read_dims(p: Parsed, src: dict, where: str) -> None:
    """The decoder layer's dims and rope, shared by both formats (top level or transformer_layer_config)."""
    hidden = p.read(src, "hidden_size", size, where=where)
    heads = p.read(src, "num_attention_heads", size, where=where)
    kv = p.read(src, "num_key_value_heads", size, where=where, default=heads)
    if heads % kv:  # each key/value head serves a whole group of query heads
        raise refuse(p.file, f"{where}num_key_value_heads", kv, f"a divisor of num_attention_heads {heads}")
    if src.get("head_dim") is None and heads > hidden:  # the default head_dim would be 0
        raise refuse(p.file, f"{where}num_attention_heads", heads, f"at most hidden_size {hidden}, or a head_dim")
    p.read(src, "head_dim", size, where=where, default=hidden // heads)
    p.read(src, "intermediate_size", size, where=where)
    p.read(src, "vocab_size", size, where=where)
    p.read(src, "num_hidden_layers", layer_count, where=where, default=1)
    p.read(src, "rms_norm_eps", positive, where=where, default=1e-6)
    p.read(src, "max_position_embeddings", size, where=where, default=2048)
    act = p.read(src, "hidden_act", text, where=where, default="silu")
    if act not in ACTIVATIONS:
        p.unrunnable.append(f"hidden_act {act!r} (the drafter runs {', '.join(ACTIVATIONS)})")
    p.read(src, "attention_bias", flag, where=where, default=False)
    _read_window(p, src, where)
    read_rope(p, src, where)
    _read_multipliers(p, src, where)


_ATTENTION_KINDS = ("full_attention", "sliding_attention")


def _read_window(p: Parsed, src: dict, where: str) -> None:
    """The draft layer's attention window (contract `sliding_window`). `layer_types` decides, as in vLLM
    0.32's Llama layer (models/llama.py, a draft's own index into it): "sliding_attention" attends over
    the last `sliding_window` tokens, and so does eyas's drafter (`eyas.ttt_attention.in_window`). Without
    `layer_types` every layer attends over the whole context, whatever `sliding_window` a trainer copied
    from its target beside `use_sliding_window: false`. Draft layer i reads entry i, so entries past the
    draft's layers (a list copied from its target) are read by no one."""
    kinds = src.get("layer_types")
    if kinds is None:
        p.set("sliding_window", None, f"full attention ({where}layer_types not in {p.file})")
        return
    kinds, n = texts(p.file, where + "layer_types", kinds), p.fields["num_hidden_layers"]
    if len(kinds) < n:
        raise refuse(p.file, where + "layer_types", list(kinds), f"one kind per layer ({n})")
    kinds = kinds[:n]  # layer i reads entry i: a list copied from the target holds one per target layer
    other = sorted(set(kinds) - set(_ATTENTION_KINDS))
    if other or len(set(kinds)) > 1:
        p.unrunnable.append(f"attention kinds {list(kinds)} ({where}layer_types; eyas runs one of "
                            f"{', '.join(_ATTENTION_KINDS)} in every layer)")
    if "sliding_attention" not in kinds:
        p.set("sliding_window", None, f"{p.file}: {where}layer_types (full attention)")
        return
    p.read(src, "sliding_window", size, where=where)


def _read_multipliers(p: Parsed, src: dict, where: str) -> None:
    """Granite's scalings (embeddings, attention scores, each residual add, logits): a draft layer with
    any but Llama's values computes something no EAGLE-3 draft class of vLLM or eyas computes."""
    llama = {"embedding_multiplier": 1.0, "attention_multiplier": p.fields["head_dim"] ** -0.5,
             "residual_multiplier": 1.0, "logits_scaling": 1.0}
    other = [f"{where}{k} {show(src[k])}" for k, v in llama.items()
             if src.get(k) is not None and not math.isclose(positive(p.file, where + k, src[k]), v)]
    if other:
        p.unrunnable.append(f"Granite-style scaling ({', '.join(other)})")




def _default_capture(p: Parsed, n_target: int | None, where: str) -> None:
    """No layer ids in the file: engines fall back to (2, N//2, N-3) of the target they serve."""
    fix = f"write {where}{IDS}: the layers the draft was trained on"
    if n_target is not None:
        ids = list(default_capture_layers(n_target))
        p.set(
            "capture_layers",
            ids,
            f"assumed: engines' default (2, N//2, N-3) for a {n_target}-layer target",
            assumed=True,
        )
        text = (
            f"{p.file}: names no capture layers ({where}{IDS}); assuming the engines' default {ids} for a "
            f"{n_target}-layer target"
        )
    else:
        p.set("capture_layers", None, "not recorded", assumed=True)
        text = (
            f"{p.file}: names no capture layers ({where}{IDS}); engines will use (2, N//2, N-3) of whatever "
            "target they serve (pass --target to resolve N)"
        )
    p.warn("layer_ids_absent", f"{where}{IDS}", text, fix)


def parse_speculators(cfg: dict, file: str, n_target: int | None) -> Parsed:
    """A speculators config: the layer in `transformer_layer_config`, ids and flags at the top level."""
    p = Parsed(file)
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
    layer = _read_layer(p, tlc, _read_architectures(p, cfg), where)
    if layer.assumed:
        p.warn(
            "layer_type_absent",
            f"{where}model_type",
            f"{file}: {where}model_type is absent; eyas reads a llama layer, readers that default otherwise build "
            "another (see consumers): write model_type",
            f'add "model_type": "llama" to {where[:-1]} (eyas convert DIR OUT --format speculators writes it)',
        )
    _read_dims(p, tlc, where)
    _read_common(p, cfg, tlc, where)
    p.read(cfg, "draft_vocab_size", size, default=32000)  # speculators' own default
    p.read(cfg, "target_hidden_size", size, default=p.fields["hidden_size"])
    ids = _layer_ids(p, cfg, "")
    if ids is None:
        _default_capture(p, n_target, "")
    else:
        p.set("capture_layers", ids, f"{file}: {IDS} (capture indices)")
    for norm in NORM_FLAGS:
        p.read(cfg, norm, flag, default=False)
    if "norm_before_residual" not in cfg:
        p.warn(
            "norm_before_residual_absent",
            "norm_before_residual",
            f"{file}: norm_before_residual is absent; eyas reads False, readers default differently (see "
            "consumers): write it",
            "write norm_before_residual explicitly (eyas convert writes every norm flag)",
        )
    _speculators_verifier(p, cfg)
    _read_embedding_scale(p, cfg)
    return _finish(p)


def _finish(p: Parsed) -> Parsed:
    """Record what eyas cannot run (contract `unsupported`), and say so once."""
    parts = "; ".join(p.unrunnable) or None
    p.set("unsupported", parts, f"{p.file}: the draft layer's fields" if parts else "every part runs in eyas")
    if parts:
        p.warn(
            "draft_not_runnable",
            "architectures",
            f"{p.file}: eyas reads this draft but has no code for its {parts}: the verbs that run it (eval, "
            "generate, bench, doctor, serve-check, train --init) refuse it; convert refuses it where its formats "
            "cannot state the part",
            "run it in an engine that implements this layer (see consumers); inspect and check still read it",
        )
    return p


def _layer_source(cfg: dict) -> tuple[dict, str]:
    """Where a flat config keeps its layer fields: the top level, or `text_config` (multimodal exports)."""
    tc = cfg.get("text_config")
    if cfg.get("hidden_size") is None and isinstance(tc, dict) and tc.get("hidden_size") is not None:
        return tc, "text_config."
    return cfg, ""


def _read_embedding_scale(p: Parsed, cfg: dict) -> None:
    """SpecForge's `embed_scale` and `target_model_type` (eyas.formats.specforge), read from either format
    (eyas writes them into both): kept in the contract, and a scaled embedding warned."""
    p.read(cfg, "embed_scale", positive, default=None)
    target_type = cfg.get("target_model_type")
    if target_type is not None:  # "" names no type: read as absent, as it is written back
        target_type = text(p.file, "target_model_type", target_type) or None
    p.set("verifier_model_type", target_type, f"{p.file}: target_model_type" if target_type else "not recorded",
          assumed=target_type is None)
    if (scaled := embed_scale(p.fields["embed_scale"], target_type, p.fields["hidden_size"])) is not None:
        p.warn("embed_scale_ignored", scaled[0], f"{p.file}: {scaled[1]}", SCALED_FIX)


def _read_specforge_fields(p: Parsed, cfg: dict) -> None:
    """A SpecForge branch's own fields (eyas.formats.specforge): use_aux_norm is fc_norm under another
    name."""
    aux = use_aux_norm(p.file, cfg)
    if aux is not None and "fc_norm" in p.assumed:
        p.set("fc_norm", aux, f"{p.file}: use_aux_norm (SpecForge's earlier name of fc_norm)")
    elif aux is not None and p.fields["fc_norm"] != aux:
        raise FormatError(
            f"{p.file}: field 'fc_norm' is {str(p.fields['fc_norm']).lower()} but 'use_aux_norm' is {str(aux).lower()}",
            "make them agree (use_aux_norm is SpecForge's earlier name of fc_norm)",
        )


# ModelOpt's eagle_config layout keys: EAGLE-3's own values, and the part a draft lacks or adds otherwise
_MODELOPT_LAYOUT = {
    "use_input_layernorm_in_first_layer": (True, "missing input_layernorm on the token embeddings"),
    "use_last_layernorm": (True, "missing final norm before lm_head"),
    "use_mtp_layernorm": (False, "MTP-style extra layernorms"),
}


def _read_modelopt_layout(p: Parsed, ec: dict) -> None:
    """ModelOpt-style eagle_config layout flags: read as flags; a value other than EAGLE-3's names a part."""
    for key, (eagle3, part) in _MODELOPT_LAYOUT.items():
        if ec.get(key) is not None and flag(p.file, f"eagle_config.{key}", ec[key]) != eagle3:
            p.unrunnable.append(f"{part} (eagle_config.{key} {str(ec[key]).lower()})")
            p.foreign_layout.append(p.unrunnable[-1])


def _speculators_verifier(p: Parsed, cfg: dict) -> None:
    sc = cfg.get("speculators_config")
    ver = sc.get("verifier") if isinstance(sc, dict) else None
    if not isinstance(ver, dict):
        raise FormatError(
            f"{p.file}: field 'speculators_config.verifier' is missing or not an object",
            'add "verifier": {"name_or_path": ..., "architectures": [...]}',
        )
    _read_verifier(p, ver, "speculators_config.verifier.")


def _read_architectures(p: Parsed, cfg: dict) -> tuple[str, ...]:
    """The config's own `architectures` (engines pick a draft class by it): a list of names, when present."""
    if cfg.get("architectures") is None:
        return ()
    return texts(p.file, "architectures", cfg["architectures"])


def _read_layer(p: Parsed, src: dict, archs: tuple[str, ...], where: str) -> DraftLayer:
    """layer_type from architectures and the layer's fields (eyas.formats.layer); what eyas cannot run, named."""
    if src.get("model_type") is not None:
        text(p.file, f"{where}model_type", src["model_type"])
    layer = draft_layer(src, archs, p.file, where)
    p.set("layer_type", layer.layer_type, layer.origin, assumed=layer.assumed)
    p.class_layer = layer.class_layer
    if layer.unknown_model_type is not None:
        p.warn(
            "layer_type_unknown",
            f"{where}model_type",
            f"{p.file}: {where}model_type {layer.unknown_model_type!r} is not a draft layer type eyas knows; "
            f"read as a {layer.layer_type} layer ({layer.origin.split(': ', 1)[-1]})",
            f"write model_type {layer.layer_type!r} if the draft is a {layer.layer_type} layer",
        )
    if layer.unsupported is not None:
        p.unrunnable.append(layer.unsupported)
        p.foreign_layout.append(layer.unsupported)
    return layer


def _read_common(p: Parsed, cfg: dict, layer_src: dict, where: str) -> None:
    """Fields both formats may carry: the saved dtype and tie_word_embeddings (checked, not used to run)."""
    sources = ((cfg, ""),) if layer_src is cfg else ((cfg, ""), (layer_src, where))  # a flat config: once
    named = {}
    for src, at in sources:
        for key in ("dtype", "torch_dtype"):
            if src.get(key) is not None:
                named[f"{at}{key}"] = text(p.file, f"{at}{key}", src[key])
    if len(set(named.values())) > 1:
        p.warn(
            "dtype_conflict",
            "dtype",
            f"{p.file}: {', '.join(f'{k} {v!r}' for k, v in named.items())} differ (transformers 5 writes dtype, "
            "transformers 4 torch_dtype); the weights' own dtype is what eyas loads",
            "make them agree, or keep one",
        )
    tied = [f"{at}tie_word_embeddings" for src, at in sources
            if src.get("tie_word_embeddings") is not None
            and flag(p.file, f"{at}tie_word_embeddings", src["tie_word_embeddings"])]
    if tied:
        p.warn(
            "tie_word_embeddings",
            tied[0],
            f"{p.file}: {tied[0]} is true: a reader that honours it uses the embedding table (vocab_size rows) as "
            "lm_head instead of the draft's lm_head.weight (draft_vocab_size rows); eyas runs the draft's lm_head, "
            "or where it ships none the target's, as engines serve it",
            f"set {tied[0]} to false unless the draft was trained with lm_head tied to embed_tokens",
        )


def _read_verifier(p: Parsed, ver: dict, where: str) -> None:
    """The recorded verifier: a name (hub id or path) and its architectures, each optional."""
    name, archs = ver.get("name_or_path"), ver.get("architectures")
    p.set("verifier_name", None if name is None else text(p.file, f"{where}name_or_path", name),
          f"{p.file}: {where}name_or_path")
    p.set("verifier_architectures", () if archs is None else texts(p.file, f"{where}architectures", archs),
          f"{p.file}: {where}architectures")


def parse_eagle(cfg: dict, file: str, n_target: int | None, layer_convention: str | None) -> Parsed:
    """A flat LlamaForCausalLMEagle3 config: flags at the top level or in `eagle_config` (never both, differing)."""
    p = Parsed(file)
    src, where = _layer_source(cfg)
    _read_layer(p, src, _read_architectures(p, cfg), where)
    _read_dims(p, src, where)
    _read_common(p, cfg, src, where)
    p.read(cfg, "draft_vocab_size", size, default=p.fields["vocab_size"])
    p.read(cfg, "target_hidden_size", size, default=p.fields["hidden_size"])
    ec = cfg.get("eagle_config")
    if ec is None:
        ec = {}
    elif not isinstance(ec, dict):
        raise refuse(file, "eagle_config", ec, "an object")
    for norm in NORM_FLAGS:
        top, nested = cfg.get(norm), ec.get(norm)
        if top is not None and nested is not None:  # each a flag first: "false" is no flag, not a disagreement
            top, nested = flag(file, norm, top), flag(file, f"eagle_config.{norm}", nested)
        if top is not None and nested is not None and top != nested:
            raise FormatError(
                f"{file}: field '{norm}' is {show(top)} but 'eagle_config.{norm}' is {show(nested)}",
                f"make {norm} agree in both places",
            )
        p.read(
            cfg if top is not None else ec,
            norm,
            flag,
            where="" if top is not None or nested is None else "eagle_config.",
            default=False,
        )
    if ec.get("use_aux_hidden_state") is not None:
        flag(file, "eagle_config.use_aux_hidden_state", ec["use_aux_hidden_state"])
    if ec.get("use_aux_hidden_state") is False:
        p.warn(
            "fc_skipped",
            "eagle_config.use_aux_hidden_state",
            f"{file}: eagle_config.use_aux_hidden_state is false: a reader that honours it skips fc and feeds the "
            "target's last hidden state, not an EAGLE-3 draft's input (see consumers); set it to true",
            f"in {file} set eagle_config.use_aux_hidden_state = true",
        )
    _read_modelopt_layout(p, ec)
    _read_specforge_fields(p, cfg)
    _read_embedding_scale(p, cfg)
    _eagle_capture(p, cfg, ec, n_target, layer_convention)
    ver = cfg.get("verifier")  # written by eyas; not part of the EAGLE schema
    if ver is None:
        p.set("verifier_name", None, "not recorded", assumed=True)
        p.set("verifier_architectures", (), "not recorded", assumed=True)
    elif not isinstance(ver, dict):
        raise refuse(file, "verifier", ver, 'an object {"name_or_path": ..., "architectures": [...]}')
    else:
        _read_verifier(p, ver, "verifier.")
    return _finish(p)


def _nested_reading(nested: list[int], conv: str | None) -> tuple[list[int], str]:
    """Capture indices of nested eagle_config ids under a convention (None: current SGLang's rule), and how."""
    if conv == "input":
        return nested, "read as capture indices (--layer-convention input)"
    if conv == "output":
        return [i + 1 for i in nested], "read as output-of-layer ids, +1 (--layer-convention output)"
    read = [i + 1 for i in nested] if nested[0] == 1 else nested
    return read, "read as capture indices, +1 only when the first id is 1"


def _eagle_capture(p: Parsed, cfg: dict, ec: dict, n_target: int | None, conv: str | None) -> None:
    """Capture layers of an eagle config: top-level ids are capture indices; nested ones are ambiguous."""
    top, nested = _layer_ids(p, cfg, ""), _layer_ids(p, ec, "eagle_config.")
    read, how = _nested_reading(nested, conv) if nested is not None else (None, "")
    if top is not None:
        p.set("capture_layers", top, f"{p.file}: {IDS} (top level, capture indices)")
        if conv is None and nested == top and top[0] == 1:  # as eyas writes them: SGLang reads the nested + 1
            p.warn(
                "layer_ids_first_is_one",
                f"eagle_config.{IDS}",
                f"{p.file}: the capture layers {top} start at 1, which no eagle_config ids name for SGLang: it adds 1 "
                f"to every nested id when the first is 1, and would capture {read}; vLLM, speculators and llama.cpp "
                "read the top-level ids",
                "to serve with SGLang, train a draft whose first capture layer is not 1 (eyas init --capture-layers)",
            )
        elif nested is not None and read != top:
            p.warn(
                "layer_ids_top_nested_differ",
                f"eagle_config.{IDS}",
                f"{p.file}: top-level {IDS} {top} and eagle_config.{IDS} {nested} ({how}: {read}) name different "
                "layers; eyas uses the top-level ones, readers of the nested ids capture others (see consumers)",
                "write the layers the draft was trained on in both places (eyas convert DIR OUT --format eagle)",
            )
    elif nested is not None:
        p.set("capture_layers", read, f"{p.file}: eagle_config.{IDS} {nested} {how}")
        if conv is None:
            p.warn(
                "layer_ids_convention_assumed",
                f"eagle_config.{IDS}",
                f"{p.file}: eagle_config.{IDS} {nested} {how} -> capture {read}; readers of these ids differ "
                "(what each engine captures is under consumers); pass --layer-convention input|output to override",
                f"write the capture indices as a top-level {IDS} too (eyas convert does)",
            )
    else:
        _default_capture(p, n_target, "eagle_config.")
