"""eyas.codes: every finding eyas reports has a registered, stable code, and every registered code is
produced by some input here (one scenario per rule, run through the function that applies it)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import TINY_TARGET_LAYERS, random_tensors, tiny_contract
from test_vocab_map import vocab_map_cases
from eyas.check import check_checkpoint, consumers, contract_problems, target_problems
from eyas.codes import CODES, finding, prefixed, slug_of, text_of
from eyas.contract import Verifier, capture_layer_problems
from eyas.formats import (
    IDS,
    eagle_config,
    read_checkpoint,
    speculators_config,
    tensor_problems,
    vocab_map_problems,
    write_checkpoint,
)
from eyas.formats.compare import DISAGREEMENT_CODES
from eyas.formats.parse import parse_eagle, parse_speculators
from eyas.weights import from_canonical

SLUGS = {
    "capture_layers",
    "concat_order",
    "normalized_features",
    "fc_skipped",
    "embeddings",
    "vocab_map",
    "rope",
    "norm_flags",
    "config_file",
    "position_shift",
}
TARGET = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": TINY_TARGET_LAYERS, "hidden_size": 64,
          "vocab_size": 256, "max_position_embeddings": 512}


def _codes(findings) -> set[str]:
    return {f["code"] for f in findings}


def _folder(path, configs: dict[str, dict], tensors):
    path.mkdir(parents=True, exist_ok=True)
    for name, cfg in configs.items():
        (path / name).write_text(json.dumps(cfg))
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _read(path, **kw):
    ck = read_checkpoint(path, strict=False, **kw)
    return _codes(ck.problems + ck.warnings)


def _eagle(c, **edit):
    cfg = eagle_config(c)
    for key, value in edit.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    return cfg


# --- one config file (eyas.formats.parse) ---------------------------------------------------------


def _nested_only(tmp_path, **kw):
    c = tiny_contract(capture_layers=(2, 3, 5))
    cfg = _eagle(c, **{IDS: None})
    cfg["eagle_config"][IDS] = [2, 3, 5]
    return _folder(tmp_path / "nested", {"config.json": cfg}, from_canonical(random_tensors(c), "eagle"))


def parse_no_ids(tmp_path):
    c = tiny_contract(capture_layers=None)
    cfg = _eagle(c)
    return _read(_folder(tmp_path / "d", {"config.json": cfg}, random_tensors(c)))


def parse_nested_only(tmp_path):
    return _read(_nested_only(tmp_path))


def parse_first_is_one(tmp_path):
    """Capture indices written in both places (as eyas writes them), the first 1: SGLang reads the nested +1."""
    c = tiny_contract(capture_layers=(1, 3, 5))
    cfg = _eagle(c)
    cfg["eagle_config"][IDS] = [1, 3, 5]
    return _read(_folder(tmp_path / "d", {"config.json": cfg}, random_tensors(c)))


def parse_top_nested_differ(tmp_path):
    c = tiny_contract(capture_layers=(2, 3, 5))
    cfg = _eagle(c)
    cfg["eagle_config"][IDS] = [2, 3, 5]
    return _read(_folder(tmp_path / "d", {"config.json": cfg}, random_tensors(c)), layer_convention="output")


def parse_speculators_quirks(tmp_path):
    c = tiny_contract()
    cfg = speculators_config(c)
    del cfg["norm_before_residual"], cfg["transformer_layer_config"]["model_type"]
    cfg["transformer_layer_config"]["rope_parameters"].update(rope_theta=5e5, rope_type="dynamic", factor=2.0)
    cfg["transformer_layer_config"]["rope_scaling"] = {"type": "linear", "factor": 2.0}
    return _read(_folder(tmp_path / "d", {"config.json": cfg}, random_tensors(c)))


def parse_fc_skipped(tmp_path):
    c = tiny_contract()
    cfg = _eagle(c)
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    return _read(_folder(tmp_path / "d", {"config.json": cfg}, random_tensors(c)))


def parse_published_quirks(tmp_path):
    """What real published configs carry: a target's model_type, both dtype keys, tied embeddings, a sliding
    window (speculators issue 1065), a MoE layer."""
    c = tiny_contract()
    cfg = _eagle(c)
    cfg.update(model_type="phi3", dtype="bfloat16", torch_dtype="float16", tie_word_embeddings=True,
               target_model_type="gemma3_text",  # SpecForge at ceefdebd scaled a Gemma draft's embeddings
               layer_types=["sliding_attention"], sliding_window=2048)
    found = _read(_folder(tmp_path / "d", {"config.json": cfg}, random_tensors(c)))
    found |= _mismatches(tmp_path / "d")  # SGLang ties lm_head to embed_tokens
    moe = dict(cfg, model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLMEagle3"], num_experts=8)
    return found | _read(_folder(tmp_path / "m", {"config.json": moe}, random_tensors(c)))


def parse_rope_kinds(tmp_path):
    """NTK-alpha (AngelSlim's hunyuan drafts), and a dynamic rope without alpha, which SGLang scales."""
    c = tiny_contract()
    alpha = _eagle(c, rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0})
    found = _read(_folder(tmp_path / "a", {"config.json": alpha}, random_tensors(c)))
    dynamic = _eagle(c, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    return found | _mismatches(_folder(tmp_path / "d", {"config.json": dynamic}, random_tensors(c)))


def shared_lm_head(tmp_path):
    """A full-vocab draft without lm_head.weight whose config keeps draft_vocab_size (SGLang loads none)."""
    c = tiny_contract(draft_vocab_size=256)
    tensors = {k: v for k, v in random_tensors(c).items() if k != "lm_head.weight"}
    folder = _folder(tmp_path / "s", {"config.json": _eagle(c)}, tensors)
    # and one with its own lm_head but no draft_vocab_size: SGLang serves the target's head instead
    own = _folder(tmp_path / "o", {"config.json": _eagle(c, draft_vocab_size=None)}, random_tensors(c))
    return _read(folder) | _mismatches(folder) | _mismatches(own)


def parse_config_alone(tmp_path):
    path = tmp_path / "draft.json"
    path.write_text(json.dumps(speculators_config(tiny_contract())))
    return _read(path)


# --- config files against each other (eyas.formats.compare) -----------------------------------


DISAGREE = {  # code: an edit of the flat config.json beside an unchanged config_speculators.json
    "config_files_disagree_capture_layers": {IDS: [1, 2, 3]},
    "config_files_disagree_norm_flags": {"norm_output": True},
    "config_files_disagree_dims": {"intermediate_size": 96},
    "config_files_disagree_vocab": {"draft_vocab_size": 32},
    "config_files_disagree_rope": {"rope_theta": 5e5, "rope_parameters": None},
    "config_files_disagree_eps": {"rms_norm_eps": 1e-5},
    "config_files_disagree_eps_rounding": {"rms_norm_eps": 1.0000001e-6},
    "config_files_disagree_context": {"max_position_embeddings": 2048},
    "config_files_disagree_verifier": {"verifier": {"name_or_path": "other/model", "architectures": []}},
    "config_files_disagree_embed_scale": {"embed_scale": 8.0},  # a reader that honoured it would scale
}


@pytest.mark.parametrize("code", DISAGREE)
def test_each_disagreement_has_its_code_and_grade(tmp_path, code):
    c = tiny_contract()
    flat = _eagle(c, **DISAGREE[code])
    if code == "config_files_disagree_norm_flags":
        flat["eagle_config"]["norm_output"] = True
    path = _folder(tmp_path / "d", {"config.json": flat, "config_speculators.json": speculators_config(c)},
                   random_tensors(c))
    ck = read_checkpoint(path)  # never refused
    assert [d["code"] for d in ck.disagreements] == [code]
    assert ck.contract == c.replace(verifier=ck.contract.verifier)  # taken from config_speculators.json
    graded = ck.problems if CODES[code].severity == "problem" else ck.warnings
    assert [d["code"] for d in graded if d["code"].startswith("config_files_disagree")] == [code]
    rep = check_checkpoint(path)
    assert rep.ok == (CODES[code].severity == "warning")


def test_every_parsed_field_has_a_disagreement_grade(tmp_path):
    c = tiny_contract()
    fields = set(parse_speculators(speculators_config(c), "a", None).fields) | set(
        parse_eagle(eagle_config(c), "b", None, None).fields
    )
    assert fields == set(DISAGREEMENT_CODES)


# --- tensors against the contract (eyas.formats.validate) -------------------------------------


def _t(c=None, **changes):
    t = random_tensors(c or tiny_contract())
    for k, v in changes.items():
        if v is None:
            del t[k]
        else:
            t[k] = v
    return t


def tensors_wrong(tmp_path):
    c, fc_normed, embedded = tiny_contract(), tiny_contract(norm_before_fc=True), tiny_contract(has_embeddings=True)
    cases = [
        (tiny_contract(num_hidden_layers=2), _t()),  # layers_missing
        (c, _t(tiny_contract(num_hidden_layers=2))),  # layers_extra
        (c, _t(**{"norm.weight": None})),  # tensor_missing
        (c, _t(**{"extra.weight": torch.ones(2)})),  # tensor_unknown
        (c, _t(**{"layers.0.mlp.up_proj.weight": torch.ones(3, 64)})),  # tensor_shape
        (c, _t(**{"norm.weight": torch.ones(64, dtype=torch.int32)})),  # tensor_dtype
        (c, _t(**{"fc.weight": _t()["fc.weight"].index_fill(1, torch.tensor([3]), float("nan"))})),  # tensor_not_finite
        (tiny_contract(layer_type="qwen3"), _t()),  # flag_tensor_missing
        (c, _t(tiny_contract(layer_type="qwen3"))),  # flag_tensor_unexpected
        (tiny_contract(norm_before_fc=True), _t()),  # feature_norm_missing
        (c, _t(tiny_contract(fc_norm=True))),  # feature_norm_unexpected
        (fc_normed, _t(fc_normed, **{"input_norm.weight": torch.ones(5)})),  # feature_norm_shape
        (c, _t(**{"fc.weight": torch.zeros(64, 256)})),  # fc_chunks
        (c, _t(**{"fc.weight": torch.zeros(64, 100)})),  # fc_shape: not a multiple
        (c, _t(**{"fc.weight": torch.zeros(32, 192)})),  # fc_shape: rows
        (c, _t(**{"lm_head.weight": torch.zeros(60, 64)})),  # lm_head_shape
        (embedded, _t(embedded, **{"embed_tokens.weight": torch.zeros(9, 64)})),  # embed_tokens_shape
    ]
    return set().union(*(_codes(tensor_problems(cc, t)) for cc, t in cases))


def vocab_maps(tmp_path):
    c = tiny_contract()
    return set().union(*(_codes(vocab_map_problems(c, m)) for m in vocab_map_cases().values()))


# --- the contract against a target, on its own, and in each engine ----------------------------


def contract_rules(tmp_path):
    c = tiny_contract(
        capture_layers=(5, 9, 3),
        vocab_size=300,
        draft_vocab_size=300,
        hidden_size=32,
        target_hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        verifier=Verifier(architectures=("MistralForCausalLM",)),
    )
    tgt = dict(TARGET, vocab_size=256, hidden_size=48)
    found = _codes(target_problems(c, tgt)) | _codes(capture_layer_problems(tiny_contract(capture_layers=None), 6))
    for verifier, rope in ((Verifier(), None), (Verifier(name_or_path="/local/model"), 1e4)):
        c = tiny_contract(verifier=verifier, rope_theta=rope)
        path = tmp_path / f"v{rope}"
        write_checkpoint(path, c, random_tensors(c), "speculators")
        problems, warnings = contract_problems(read_checkpoint(path))
        found |= _codes(problems + warnings)
    return found


def check_folder(tmp_path):
    c = tiny_contract()
    path = _folder(tmp_path / "d", {"config.json": speculators_config(c)}, random_tensors(c))
    shutil.copy(path / "model.safetensors", path / "pytorch_model.bin")  # read as the first layout: never loaded
    found = _codes(check_checkpoint(path).warnings)
    tensors = load_file(path / "model.safetensors")
    save_file({"model." + n: x for n, x in tensors.items()}, path / "model.safetensors")
    found |= _codes(check_checkpoint(path).warnings)
    save_file({**tensors, "aux_norm_low.weight": torch.ones(c.target_hidden_size)}, path / "model.safetensors")
    found |= _codes(check_checkpoint(path).warnings)
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").unlink()
    return found | _codes(check_checkpoint(path).problems + check_checkpoint(path).warnings)


def _mismatches(path, **kw) -> set[str]:
    return {m["code"] for r in consumers(read_checkpoint(path, strict=False, **kw)).values() for m in r["mismatches"]}


def consumer_views(tmp_path):
    found = _mismatches(_nested_only(tmp_path))  # vLLM: default capture; legacy SGLang: +1
    c = tiny_contract(capture_layers=(2, 3, 5), norm_before_residual=True, has_embeddings=True)
    write_checkpoint(tmp_path / "e", c, random_tensors(c), "eagle")
    found |= _mismatches(tmp_path / "e")  # legacy SGLang: norm flag; SGLang: the target's embeddings
    c = tiny_contract()
    spec = speculators_config(c)
    del spec["transformer_layer_config"]["model_type"]
    found |= _mismatches(_folder(tmp_path / "s", {"config.json": spec}, _t(c, d2t=None, t2d=None)))
    c = tiny_contract(sliding_window=4)
    write_checkpoint(tmp_path / "w", c, random_tensors(c), "speculators")
    return found | _mismatches(tmp_path / "w")  # llama.cpp: full attention


def vocab_map_completed(tmp_path):
    """A valid d2t stored as int32 and without t2d, and beside a t2d of uint8 0s and 1s: served by engines
    (they read d2t alone), completed on read."""
    c = tiny_contract()
    t = _t(c, t2d=None)
    t["d2t"] = t["d2t"].int()
    bytes_mask = _t(c)
    bytes_mask["t2d"] = bytes_mask["t2d"].to(torch.uint8)
    return _read(_folder(tmp_path / "m", {"config.json": speculators_config(c)}, t)) | _read(
        _folder(tmp_path / "u", {"config.json": speculators_config(c)}, bytes_mask))


def conversion_losses(tmp_path):
    """A speculators draft converted to eagle: its proposal settings have no field there."""
    from eyas.formats import convert_checkpoint

    c = tiny_contract()
    src = _folder(tmp_path / "s", {"config.json": speculators_config(c)}, _t(c))
    return _codes(convert_checkpoint(src, tmp_path / "e", "eagle")[1].warnings)


def engine_refusals(tmp_path):
    """vLLM sizes fc for 3 chunks from a speculators config without num_aux_hidden_states (vLLM #54526)."""
    c = tiny_contract(capture_layers=(1, 2, 3, 4))
    cfg = speculators_config(c)
    del cfg["transformer_layer_config"]["num_aux_hidden_states"]  # as speculators writes it
    return _codes(check_checkpoint(_folder(tmp_path / "four", {"config.json": cfg}, random_tensors(c))).warnings)


SCENARIOS = {  # scenario: the codes it must produce
    parse_no_ids: {"layer_ids_absent"},
    parse_nested_only: {"layer_ids_convention_assumed"},
    parse_first_is_one: {"layer_ids_first_is_one"},
    parse_top_nested_differ: {"layer_ids_top_nested_differ"},
    parse_speculators_quirks: {
        "layer_type_absent", "norm_before_residual_absent", "rope_theta_conflict", "rope_scaling_conflict",
    },
    parse_fc_skipped: {"fc_skipped"},
    parse_rope_kinds: {"rope_alpha", "consumer_rope"},
    shared_lm_head: {"lm_head_shared", "consumer_lm_head_unloaded", "consumer_lm_head_replaced"},
    parse_published_quirks: {
        "layer_type_unknown", "dtype_conflict", "tie_word_embeddings", "consumer_ties_lm_head", "draft_not_runnable",
        "embed_scale_ignored",
    },
    parse_config_alone: {"tensors_not_checked"},
    tensors_wrong: {
        "layers_missing", "layers_extra", "tensor_missing", "tensor_unknown", "tensor_shape", "tensor_dtype",
        "tensor_not_finite",
        "flag_tensor_missing", "flag_tensor_unexpected", "feature_norm_missing", "feature_norm_unexpected",
        "feature_norm_shape", "fc_chunks", "fc_shape", "lm_head_shape", "embed_tokens_shape",
    },
    vocab_maps: {
        "vocab_map_missing", "d2t_missing", "t2d_missing", "vocab_map_shape", "d2t_dtype", "t2d_dtype",
        "d2t_out_of_range", "d2t_not_increasing", "t2d_count", "t2d_disagrees",
    },
    contract_rules: {
        "target_vocab_size", "target_draft_vocab_size", "target_hidden_size", "target_embeddings_unshareable",
        "capture_layers_out_of_range", "capture_layers_not_increasing", "capture_layers_not_recorded",
        "target_context_longer", "target_architectures", "verifier_name_missing", "verifier_not_portable",
        "rope_theta_absent",
    },
    check_folder: {"weights_missing", "target_not_given", "weights_layouts_several", "weights_prefixed",
                   "weights_aux_norm_names"},
    consumer_views: {
        "consumer_capture_default", "consumer_capture_layers", "consumer_norm_flags", "consumer_replaces_embeddings",
        "consumer_no_vocab_map", "consumer_builds_qwen3", "consumer_full_attention",
    },
    vocab_map_completed: {"t2d_derived", "d2t_cast", "t2d_cast"},
    engine_refusals: {"consumer_cannot_load"},
    conversion_losses: {"proposals_not_kept"},
}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_each_rule_produces_its_codes(tmp_path, scenario):
    found = scenario(tmp_path)
    assert SCENARIOS[scenario] <= found, SCENARIOS[scenario] - found
    assert found <= set(CODES)  # finding() refuses an unregistered code; nothing slips past it


def test_every_registered_code_is_produced_somewhere():
    produced = set().union(*SCENARIOS.values()) | set(DISAGREE)
    assert produced == set(CODES), sorted(set(CODES) - produced)


def test_the_table_is_well_formed():
    for code, c in CODES.items():
        assert code.isidentifier() and code == code.lower(), code
        assert c.severity in ("problem", "warning") and (c.slug is None or c.slug in SLUGS), code
        assert c.meaning and "\n" not in c.meaning, code
        assert slug_of(code) == c.slug
    with pytest.raises(KeyError):
        finding("no_such_code", "x", "text", "fix")


def test_finding_helpers():
    p = finding("d2t_dtype", "d2t", "d2t is torch.int32", "store int64")
    w = finding("fc_skipped", "eagle_config.use_aux_hidden_state", "vLLM skips fc", "set it")
    assert p == {"code": "d2t_dtype", "field": "d2t", "problem": "d2t is torch.int32", "fix": "store int64"}
    assert "warning" in w and "problem" not in w
    assert text_of(p) == "d2t is torch.int32" and text_of(prefixed(w, "vllm: ")) == "vllm: vLLM skips fc"
    assert prefixed(p, "x: ")["code"] == "d2t_dtype" and p["problem"] == "d2t is torch.int32"  # a copy
