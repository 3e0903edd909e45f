"""eyas.formats: both formats and the two-file folder, lossless conversion, layer-id conventions, bad input."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import LLAMA3_ROPE, random_tensors, tiny_contract
from eyas.check import consumers
from eyas.contract import Verifier
from eyas.errors import ContractError, EyasError, FormatError
from eyas.formats.emit import eagle_config
from eyas.formats import (
    IDS,
    convert_checkpoint,
    detect_format,
    eagle_config,
    read_checkpoint,
    speculators_config,
    write_checkpoint,
)
from eyas.weights import from_canonical

# Every variant the issue names: layer type, 3/4 capture layers, full/reduced vocab, embeddings, each flag.
VARIANTS = {
    "llama-3cap-reduced": dict(),
    "qwen3-4cap-full-embed": dict(
        layer_type="qwen3", capture_layers=(1, 2, 4, 6), draft_vocab_size=256, has_embeddings=True
    ),
    "norm_before_residual": dict(norm_before_residual=True, capture_layers=(2, 3, 5)),
    "norm_before_fc": dict(norm_before_fc=True, capture_layers=(2, 3, 4)),
    "fc_norm+norm_output": dict(fc_norm=True, norm_output=True, capture_layers=(0, 3, 6)),
    "wide-target-2layers-bias-llama3rope": dict(
        target_hidden_size=32,
        num_hidden_layers=2,
        attention_bias=True,
        has_embeddings=True,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE,
    ),
    "no-ids-no-rope": dict(capture_layers=None, rope_theta=None, verifier=Verifier()),
}


def _same_tensors(a, b) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _save(folder, configs: dict[str, dict], tensors, *, naming="speculators", layout="single"):
    """A checkpoint folder written by hand (configs as given, weights in the given naming and layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, cfg in configs.items():
        (folder / name).write_text(json.dumps(cfg))
    t = from_canonical(tensors, naming)
    if layout == "single":
        save_file(t, str(folder / "model.safetensors"))
    elif layout == "bin":
        torch.save(t, folder / "pytorch_model.bin")
    else:  # sharded safetensors, two shards
        names = sorted(t)
        wm = {}
        for i, part in enumerate((names[::2], names[1::2])):
            save_file({n: t[n] for n in part}, str(folder / f"model-{i + 1:05d}-of-00002.safetensors"))
            wm.update({n: f"model-{i + 1:05d}-of-00002.safetensors" for n in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    return folder


# --- writing and reading back -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["speculators", "eagle", "both"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_write_read_gives_the_contract(tmp_path, variant, fmt):
    c = tiny_contract(**VARIANTS[variant])
    t = random_tensors(c)
    write_checkpoint(tmp_path / "d", c, t, fmt)
    v = c.verifier
    ck = read_checkpoint(
        tmp_path / "d", verifier_config={"num_hidden_layers": v.num_hidden_layers} if c.capture_layers else None
    )
    assert ck.contract.replace(verifier=c.verifier) == c
    assert (ck.contract.verifier.name_or_path, ck.contract.verifier.architectures) == (v.name_or_path, v.architectures)
    assert _same_tensors(ck.tensors, t)
    assert (
        ck.files
        == {
            "speculators": {"config.json": "speculators"},
            "eagle": {"config.json": "eagle"},
            "both": {"config.json": "speculators", "config_eagle.json": "eagle"},
        }[fmt]
    )
    assert ck.weight_naming == ("eagle" if fmt == "eagle" else "speculators")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == sorted([*ck.files, "model.safetensors"])
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no temp folder left behind


@pytest.mark.parametrize(
    ("a", "b"), [("speculators", "eagle"), ("eagle", "speculators"), ("both", "eagle"), ("eagle", "both")]
)
@pytest.mark.parametrize("variant", VARIANTS)
def test_convert_a_b_a_is_lossless(tmp_path, variant, a, b):
    c = tiny_contract(**VARIANTS[variant])
    t = random_tensors(c, seed=3)
    write_checkpoint(tmp_path / "a", c, t, a)
    src, mid = convert_checkpoint(tmp_path / "a", tmp_path / "b", b)
    back, again = convert_checkpoint(tmp_path / "b", tmp_path / "a2", a)
    assert mid.contract == src.contract == back.contract == again.contract
    assert _same_tensors(again.tensors, src.tensors) and _same_tensors(again.tensors, t)
    for name in src.files:  # the same config text, byte for byte
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "a2" / name).read_text()


@pytest.mark.parametrize("layout", ["sharded", "bin"])
def test_convert_reads_sharded_and_pickled_sources(tmp_path, layout):
    c = tiny_contract(capture_layers=(2, 3, 5))
    t = random_tensors(c)
    _save(tmp_path / "src", {"config.json": eagle_config(c)}, t, naming="eagle", layout=layout)
    src, out = convert_checkpoint(tmp_path / "src", tmp_path / "out", "speculators")
    assert src.weight_files[0] in ("model.safetensors.index.json", "pytorch_model.bin")
    assert _same_tensors(out.tensors, t) and out.contract == src.contract
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]


def test_a_second_set_of_weights_is_named(tmp_path):
    """An index beside a stale model.safetensors: eyas (and vLLM) read the index, transformers the single
    file. Said once; a single file that the index itself lists as its shard is no second set."""
    c = tiny_contract()
    src = _save(tmp_path / "src", {"config.json": eagle_config(c)}, random_tensors(c), naming="eagle", layout="sharded")
    save_file(from_canonical(random_tensors(c, seed=1), "eagle"), str(src / "model.safetensors"))
    [w] = [w for w in read_checkpoint(src).warnings if w["code"] == "weights_layouts_several"]
    assert "(model.safetensors.index.json, model.safetensors): eyas reads model.safetensors.index.json" in w["warning"]
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"] = dict.fromkeys(index["weight_map"], "model.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "weights_layouts_several" not in {w["code"] for w in read_checkpoint(src).warnings}


@pytest.mark.parametrize("naming", ["eagle", "speculators"])
def test_names_under_the_model_prefix_are_read_through_and_converted_without_it(tmp_path, naming):
    """A whole-model export (`model.midlayer.*`, `model.fc.weight`, lm_head at the top): the same draft,
    one warning with the count, vLLM's view refuses it (vLLM 0.32 did: tests/engine_variants.py), and
    convert writes the names bare."""
    c = tiny_contract(has_embeddings=True)
    t = random_tensors(c)
    wrapped = {("model." + n if not n.startswith(("lm_head", "d2t", "t2d")) else n): x
               for n, x in from_canonical(t, naming).items()}
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(eagle_config(c)))
    save_file(wrapped, str(src / "model.safetensors"))
    ck = read_checkpoint(src)
    assert _same_tensors(ck.tensors, t) and ck.weight_naming == naming and ck.wrapped == len(t) - 3
    [w] = [w for w in ck.warnings if w["code"] == "weights_prefixed"]
    assert f"{len(t) - 3} of {len(t)} tensor names carry the prefix 'model.'" in w["warning"]
    assert "eyas convert" in w["fix"] and not ck.problems
    views = consumers(ck)
    assert not views["vllm"]["loads"] and views["sglang"]["loads"]
    _, out = convert_checkpoint(src, tmp_path / "out", "speculators")
    with safe_open(tmp_path / "out" / "model.safetensors", "pt") as f:
        assert set(f.keys()) == set(t)
    assert out.wrapped == 0 and _same_tensors(out.tensors, t)


def test_both_spellings_of_a_tensor_are_refused(tmp_path):
    c = tiny_contract()
    t = random_tensors(c)
    src = _save(tmp_path / "src", {"config.json": eagle_config(c)}, t)
    save_file({**t, "model.fc.weight": t["fc.weight"].clone()}, str(src / "model.safetensors"))
    with pytest.raises(FormatError, match=r"model.safetensors: holds both 'fc.weight' and 'model.fc.weight'"):
        read_checkpoint(src)


def test_specforge_aux_norm_is_read_as_fc_norm_and_converted_to_it(tmp_path):
    """A SpecForge branch's `use_aux_norm` draft (ceefdebd): its flag is fc_norm, its aux_norm_low/mid/high
    tensors are fc_norm.0/1/2; engines read neither spelling (vLLM refuses the names: tests/engine_variants.py)."""
    c = tiny_contract(fc_norm=True)
    t = random_tensors(c)
    cfg = eagle_config(c)
    cfg.pop("fc_norm", None)
    cfg["eagle_config"].pop("fc_norm", None)
    cfg["use_aux_norm"] = True
    specforge = {"fc_norm.0.weight": "aux_norm_low.weight", "fc_norm.1.weight": "aux_norm_mid.weight",
                 "fc_norm.2.weight": "aux_norm_high.weight"}
    on_disk = {specforge.get(n, n): x for n, x in from_canonical(t, "eagle").items()}
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(cfg))
    save_file(on_disk, str(src / "model.safetensors"))
    ck = read_checkpoint(src)
    assert replace(ck.contract, verifier=c.verifier) == c and _same_tensors(ck.tensors, t) and not ck.problems
    assert "use_aux_norm" in ck.origin["fc_norm"]
    assert "weights_aux_norm_names" in {w["code"] for w in ck.warnings}
    views = consumers(ck)
    assert not views["vllm"]["loads"]
    assert any("uses fc_norm=False" in m["problem" if "problem" in m else "warning"]
               for m in views["sglang"]["mismatches"])
    _, out = convert_checkpoint(src, tmp_path / "out", "eagle")
    with safe_open(tmp_path / "out" / "model.safetensors", "pt") as f:
        assert {"fc_norm.0.weight", "fc_norm.2.weight"} <= set(f.keys())
    assert json.loads((tmp_path / "out" / "config.json").read_text())["fc_norm"] is True
    assert out.aux_norm_names == 0 and out.contract == ck.contract
    cfg["fc_norm"] = False
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="'fc_norm' is false but 'use_aux_norm' is true"):
        read_checkpoint(src)


def test_speculators_config_is_explicit_and_vllm_detectable():
    c = tiny_contract(layer_type="qwen3", norm_before_fc=True, rope_theta=1e6)
    cfg = speculators_config(c, "bfloat16")
    assert detect_format(cfg) == "speculators"
    assert "model_type" not in cfg and "auto_map" not in cfg and "speculators_version" not in cfg
    assert cfg["transformer_layer_config"]["model_type"] == "qwen3"
    assert cfg["transformer_layer_config"]["vocab_size"] == c.vocab_size  # the target's vocab
    assert cfg["transformer_layer_config"]["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
    assert {k: cfg[k] for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")} == {
        "norm_before_residual": False,
        "norm_before_fc": True,
        "fc_norm": False,
        "norm_output": False,
    }
    assert cfg[IDS] == [1, 3, 4] and cfg["target_hidden_size"] == 64 and cfg["draft_vocab_size"] == 64
    v = cfg["speculators_config"]  # the minimum vLLM validates
    assert v["proposal_methods"][0]["speculative_tokens"] == 3 and v["verifier"]["name_or_path"] == "tiny/target"


@pytest.mark.parametrize(
    ("capture", "nested"), [((2, 3, 5), [1, 2, 4]), ((3, 4, 5), [3, 4, 5]), ((1, 3, 4), [1, 3, 4])]
)
def test_eagle_config_ids_for_each_engine(capture, nested):
    cfg = eagle_config(tiny_contract(capture_layers=capture, norm_before_residual=True))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    assert cfg[IDS] == list(capture)  # vLLM: capture indices, top level
    assert cfg["eagle_config"][IDS] == nested  # SGLang: nested, so that the current rule captures `capture`
    assert cfg["eagle_config"]["use_aux_hidden_state"] is True
    assert cfg["norm_before_residual"] is cfg["eagle_config"]["norm_before_residual"] is True


# --- the eagle format's layer ids ---------------------------------------------------------------


def _eagle_ids_only(c, nested=None, top=None):
    cfg = eagle_config(c)
    cfg.pop(IDS, None)
    cfg["eagle_config"].pop(IDS, None)
    if nested is not None:
        cfg["eagle_config"][IDS] = nested
    if top is not None:
        cfg[IDS] = top
    return cfg


@pytest.mark.parametrize(
    ("nested", "conv", "capture"),
    [
        ([1, 2, 4], None, (2, 3, 5)),  # first id 1: current SGLang adds 1
        ([2, 3, 5], None, (2, 3, 5)),  # first id 2: taken as capture points (Kimi-K2.5 style)
        ([2, 3, 5], "output", (3, 4, 6)),
        ([1, 2, 4], "input", (1, 2, 4)),
    ],
)
def test_nested_ids_follow_the_convention(tmp_path, nested, conv, capture):
    c = tiny_contract(capture_layers=capture)
    _save(tmp_path, {"config.json": _eagle_ids_only(c, nested=nested)}, random_tensors(c), naming="eagle")
    ck = read_checkpoint(tmp_path, layer_convention=conv)
    assert ck.contract.capture_layers == capture
    warned = [w for w in ck.warnings if w["code"] == "layer_ids_convention_assumed"]
    assert bool(warned) == (conv is None)
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in ck.origin["capture_layers"]


def test_top_level_ids_win_and_a_disagreement_is_named(tmp_path):
    c = tiny_contract(capture_layers=(2, 3, 5))
    _save(
        tmp_path,
        {"config.json": _eagle_ids_only(c, nested=[2, 3, 5], top=[2, 3, 5])},
        random_tensors(c),
        naming="eagle",
    )
    ck = read_checkpoint(tmp_path)
    assert ck.contract.capture_layers == (2, 3, 5) and ck.warnings == []
    ck = read_checkpoint(tmp_path, layer_convention="output")
    assert ck.contract.capture_layers == (2, 3, 5)
    assert any(
        "top-level eagle_aux_hidden_state_layer_ids [2, 3, 5]" in w["warning"] and "[3, 4, 6]" in w["warning"]
        for w in ck.warnings
    )


def test_no_ids_default_from_the_verifier_or_unknown(tmp_path):
    c = tiny_contract(capture_layers=None)
    _save(tmp_path, {"config.json": _eagle_ids_only(c)}, random_tensors(c), naming="eagle")
    ck = read_checkpoint(tmp_path)
    assert ck.contract.capture_layers is None and ck.contract.num_aux_layers == 3
    assert any("engines will use (2, N//2, N-3)" in w["warning"] for w in ck.warnings)
    ck = read_checkpoint(tmp_path, verifier_config={"text_config": {"num_hidden_layers": 32, "hidden_size": 64}})
    assert ck.contract.capture_layers == (2, 16, 29) and ck.contract.verifier.num_hidden_layers == 32
    assert ck.origin["capture_layers"].startswith("assumed")


def test_use_aux_hidden_state_false_is_warned(tmp_path):
    c = tiny_contract()
    cfg = eagle_config(c)
    cfg["eagle_config"]["use_aux_hidden_state"] = False
    _save(tmp_path, {"config.json": cfg}, random_tensors(c), naming="eagle")
    assert any("use_aux_hidden_state is false" in w["warning"] for w in read_checkpoint(tmp_path).warnings)


def test_fc_width_gives_the_aux_count_without_ids(tmp_path):
    c = tiny_contract(capture_layers=None, num_aux_layers=4)
    _save(tmp_path, {"config.json": _eagle_ids_only(c)}, random_tensors(c), naming="eagle")
    assert read_checkpoint(tmp_path).contract.num_aux_layers == 4


# --- the two-file folder and speculators quirks -------------------------------------------------


def _training_export(folder, c, spec_overrides=None):
    """What training pipelines export: a flat eagle config.json (nested output-convention ids only)
    plus config_speculators.json, weights in midlayer naming."""
    spec = speculators_config(c)
    spec.update(spec_overrides or {})
    cfg = _eagle_ids_only(c, nested=[k - 1 for k in c.capture_layers])
    del cfg["verifier"]
    return _save(folder, {"config.json": cfg, "config_speculators.json": spec}, random_tensors(c), naming="eagle")


def test_two_file_folder_reads_both_and_uses_speculators(tmp_path):
    c = tiny_contract(capture_layers=(2, 3, 5), norm_before_residual=True)
    _training_export(tmp_path, c)
    ck = read_checkpoint(tmp_path)
    assert ck.files == {"config.json": "eagle", "config_speculators.json": "speculators"}
    assert ck.config_used == "config_speculators.json" and "unambiguous" in ck.reason
    assert ck.contract.replace(verifier=c.verifier) == c and ck.contract.verifier.name_or_path == "tiny/target"


def test_two_file_folder_disagreement_names_both_files_and_the_field(tmp_path):
    c = tiny_contract(capture_layers=(2, 3, 5))
    _training_export(tmp_path, c, {IDS: [2, 3, 4]})
    ck = read_checkpoint(tmp_path)  # read, never refused: the disagreement is a problem finding
    assert [d["code"] for d in ck.disagreements] == ["config_files_disagree_capture_layers"]
    msg, hint = ck.problems[0]["problem"], ck.problems[0]["fix"]
    assert "config.json and config_speculators.json disagree on capture_layers" in msg and IDS in msg
    assert "--layer-convention" in hint
    assert ck.config_used == "config_speculators.json" and "config.json disagrees on capture_layers" in ck.reason
    lenient = read_checkpoint(tmp_path, strict=False)
    assert [p["field"] for p in lenient.problems] == ["capture_layers"]
    with pytest.raises(FormatError, match="disagree on capture_layers"):  # convert would drop one file's word
        convert_checkpoint(tmp_path, tmp_path.parent / "out", "eagle")


def test_speculators_missing_keys_are_warned(tmp_path):
    c = tiny_contract()
    cfg = speculators_config(c)
    del cfg["norm_before_residual"], cfg["transformer_layer_config"]["model_type"]
    _save(tmp_path, {"config.json": cfg}, random_tensors(c))
    ck = read_checkpoint(tmp_path)
    assert ck.contract.layer_type == "llama" and ck.contract.norm_before_residual is False
    assert {"layer_type_absent", "norm_before_residual_absent"} <= {w["code"] for w in ck.warnings}


def test_a_speculators_default_vocab_too_big_is_named_as_the_default_with_the_files_path(tmp_path):
    """No draft_vocab_size and a target vocab under speculators' default 32000: the error quoted "draft_vocab_size
    32000", a value the file does not hold, named the file without its folder, and said "must be <= vocab_size"."""
    c = tiny_contract(draft_vocab_size=256, has_vocab_map=False)
    cfg = speculators_config(c)
    del cfg["draft_vocab_size"]
    _save(tmp_path, {"config.json": cfg}, {k: v for k, v in random_tensors(c).items() if k not in ("d2t", "t2d")})
    with pytest.raises(ContractError) as e:
        read_checkpoint(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'config.json'}: no draft_vocab_size, and the default 32000 exceeds the "
                            "target vocab 256")
    assert e.value.hint == f"add draft_vocab_size (the rows of lm_head.weight) to {tmp_path / 'config.json'}"


def test_a_model_type_copied_from_a_qwen3_target_is_read_as_the_layer_the_class_builds(tmp_path):
    """LlamaForCausalLMEagle3 with model_type "qwen3" and Llama weights (what SGLang and vLLM build from the class)
    was refused for the q_norm/k_norm a qwen3 layer has; eyas's own qwen3 eagle config (the same two fields, with
    those tensors) stays qwen3."""
    c = tiny_contract()
    _save(tmp_path / "copied", {"config.json": {**eagle_config(c), "model_type": "qwen3"}}, random_tensors(c))
    ck = read_checkpoint(tmp_path / "copied")
    assert ck.contract.layer_type == "llama" and not ck.problems
    assert "layer_type_unknown" in {w["code"] for w in ck.warnings}
    assert ck.origin["layer_type"] == "config.json: architectures (its weights have no q_norm/k_norm)"
    q = replace(c, layer_type="qwen3")
    write_checkpoint(tmp_path / "own", q, random_tensors(q), "eagle")
    assert read_checkpoint(tmp_path / "own").contract.layer_type == "qwen3"


def test_an_unknown_model_type_is_a_warning_and_latent_attention_is_not_run(tmp_path):
    path, _ = _good(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["transformer_layer_config"]["model_type"] = "deepseek_v3"
    (path / "config.json").write_text(json.dumps(cfg))
    ck = read_checkpoint(path)
    assert ck.contract.layer_type == "llama" and ck.contract.unsupported is None
    assert "layer_type_unknown" in {w["code"] for w in ck.warnings}
    cfg["transformer_layer_config"]["kv_lora_rank"] = 512
    (path / "config.json").write_text(json.dumps(cfg))
    ck = read_checkpoint(path)
    assert ck.contract.unsupported == "multi-head latent attention (kv_lora_rank 512)" and not ck.problems


def test_transformers5_rope_parameters_only(tmp_path):
    c = tiny_contract(rope_theta=500000.0, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    cfg = speculators_config(c)
    tlc = cfg["transformer_layer_config"]
    del tlc["rope_theta"], tlc["rope_scaling"]
    _save(tmp_path, {"config.json": cfg}, random_tensors(c))
    got = read_checkpoint(tmp_path).contract
    assert got.rope_theta == 500000.0 and got.rope_scaling == {"rope_type": "yarn", "factor": 4.0}


def test_config_file_alone_reads_the_contract(tmp_path):
    c = tiny_contract()
    path = tmp_path / "draft.json"
    path.write_text(json.dumps(eagle_config(c)))
    ck = read_checkpoint(path)
    assert not ck.tensors_loaded and ck.files == {"draft.json": "eagle"}
    assert ck.contract.has_vocab_map and not ck.contract.has_embeddings
    assert any("tensor checks skipped" in w["warning"] for w in ck.warnings)


# --- bad input: one message naming the file and the field, nothing written -----------------------


def _good(tmp_path, fmt="speculators", **overrides):
    c = tiny_contract(**overrides)
    write_checkpoint(tmp_path / "ck", c, random_tensors(c), fmt)
    return tmp_path / "ck", c


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"hidden_size": 64,', "config.json: invalid JSON at line 1, column 20"),
        ("", "config.json: the file is empty"),
        ("[1, 2]", "config.json: top level is a JSON list"),
        (
            json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64}),
            "config.json: neither a speculators config",
        ),
        (
            json.dumps({"speculators_model_type": "mtp", "speculators_config": {}}),
            "field 'speculators_model_type' is 'mtp'",
        ),
    ],
)
def test_unreadable_configs(tmp_path, text, match):
    path, _ = _good(tmp_path)
    (path / "config.json").write_text(text)
    with pytest.raises(FormatError, match=match):
        read_checkpoint(path)
    with pytest.raises(FormatError, match=match):  # not even `check` can go on
        read_checkpoint(path, strict=False)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            lambda cfg: cfg["transformer_layer_config"].update(hidden_size="64"),
            "field 'transformer_layer_config.hidden_size' is '64', expected an integer",
        ),
        (
            lambda cfg: cfg["transformer_layer_config"].pop("intermediate_size"),
            "field 'transformer_layer_config.intermediate_size' is missing",
        ),
        (lambda cfg: cfg.update({IDS: "1,3,4"}), f"field '{IDS}' is '1,3,4', expected a list"),
        (
            lambda cfg: cfg.update(norm_before_fc=True, fc_norm=True),
            "config.json: norm_before_fc and fc_norm are both set",
        ),
    ],
)
def test_bad_fields_are_named(tmp_path, edit, match):
    path, _ = _good(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises((FormatError, ContractError), match=match):
        read_checkpoint(path)


_TLC = "transformer_layer_config"


@pytest.mark.parametrize(
    ("fmt", "edit", "match"),
    [  # values of the right JSON shape but the wrong kind or range: refused where they are read
        ("speculators", lambda c: c[_TLC].update(hidden_size=0), f"'{_TLC}.hidden_size' is 0, expected an integer"),
        ("speculators", lambda c: c[_TLC].update(vocab_size=2**62), f"'{_TLC}.vocab_size' is {2**62}, expected"),
        ("speculators", lambda c: c[_TLC].update(intermediate_size=True), "'.*intermediate_size' is True, expected"),
        ("speculators", lambda c: c[_TLC].update(num_hidden_layers=10**6), "'.*num_hidden_layers' is 1000000"),
        ("speculators", lambda c: c[_TLC].update(num_key_value_heads=3), "a divisor of num_attention_heads 4"),
        ("speculators", lambda c: (c[_TLC].update(num_attention_heads=128), c[_TLC].pop("head_dim")),
         "at most hidden_size 64, or a head_dim"),
        ("speculators", lambda c: c[_TLC].update(rms_norm_eps=float("nan")), "rms_norm_eps' is nan, expected a finite"),
        ("speculators", lambda c: c[_TLC].update(rms_norm_eps=10**400), "rms_norm_eps' is 1000.*, expected a finite"),
        ("speculators", lambda c: c[_TLC].update(rope_theta=1.0), "rope_theta' is 1.0, expected a finite number above"),
        ("speculators", lambda c: c[_TLC].update(rope_parameters={"rope_theta": "1e4"}), "rope_parameters.rope_theta"),
        ("speculators", lambda c: c[_TLC].update(rope_scaling={"rope_type": "linear", "factor": [2]}),
         "'.*rope_scaling.factor' is \\[2\\], expected a finite number above 0"),
        ("eagle", lambda c: c.update(rope_scaling={"type": "dynamic", "factor": 1.0, "alpha": 1e-300}),
         "'rope_scaling.alpha' is 1e-300, expected a factor that keeps the base .* finite and above 1"),
        ("eagle", lambda c: c.update(rope_scaling={"type": "dynamic", "factor": 1.0, "alpha": 1e308}),
         "'rope_scaling.alpha' is 1e\\+308, expected a factor"),
        ("speculators", lambda c: c[_TLC].update(hidden_act=1), "'.*hidden_act' is 1, expected a string"),
        ("speculators", lambda c: c["speculators_config"]["verifier"].update(name_or_path=1),
         "'speculators_config.verifier.name_or_path' is 1, expected a string"),
        ("speculators", lambda c: c["speculators_config"]["verifier"].update(architectures="Llama"),
         "'speculators_config.verifier.architectures' is 'Llama', expected a list of strings"),
        ("speculators", lambda c: c.update({IDS: [1, -2, 4]}), f"'{IDS}' is \\[1, -2, 4\\], expected a list of layer"),
        ("eagle", lambda c: c.update(architectures=3), "'architectures' is 3, expected a list of strings"),
        ("eagle", lambda c: c.update(verifier="me"), "'verifier' is 'me', expected an object"),
        ("eagle", lambda c: c["eagle_config"].update(use_aux_hidden_state="yes"), "use_aux_hidden_state' is 'yes'"),
        ("eagle", lambda c: c.update(eagle_config=[1]), "'eagle_config' is \\[1\\], expected an object"),
        ("eagle", lambda c: c.update(target_hidden_size=-64), "'target_hidden_size' is -64, expected an integer"),
    ],
)
def test_field_types_and_ranges_are_checked(tmp_path, fmt, edit, match):
    path, _ = _good(tmp_path, fmt)
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    for strict in (True, False):  # not even `check` goes on with a value it cannot use
        with pytest.raises(FormatError, match="config.json: field .*" + match):
            read_checkpoint(path, strict=strict)


@pytest.mark.parametrize(
    "data", [b'{"hidden_size": ' + b"9" * 5000 + b"}", b"[" * 100_000 + b"]" * 100_000, b'{"a": "\xff"}'],
    ids=["5000-digit-int", "deep-nesting", "bad-utf8"],
)
def test_json_python_cannot_hold_is_refused(tmp_path, data):
    path, _ = _good(tmp_path)
    (path / "config.json").write_bytes(data)
    with pytest.raises(FormatError, match="config.json: "):
        read_checkpoint(path)


def test_a_tensor_mismatch_names_both_files(tmp_path):
    path, _ = _good(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg[_TLC]["intermediate_size"] = 96
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ContractError, match=r"model.safetensors \(checked against config.json\): .*mlp"):
        read_checkpoint(path)


def test_eagle_flag_top_and_nested_disagree(tmp_path):
    path, _ = _good(tmp_path, "eagle")
    cfg = json.loads((path / "config.json").read_text())
    cfg["eagle_config"]["norm_before_fc"] = True
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="field 'norm_before_fc' is False but 'eagle_config.norm_before_fc' is True"):
        read_checkpoint(path)
    cfg["norm_before_fc"], cfg["eagle_config"]["norm_before_fc"] = "false", False  # a type, not a disagreement
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(FormatError, match="field 'norm_before_fc' is 'false', expected true or false"):
        read_checkpoint(path)


def test_folder_without_config_or_weights(tmp_path):
    with pytest.raises(FormatError, match="no config file"):
        read_checkpoint(tmp_path)
    path, _ = _good(tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(FormatError, match="no weights"):
        read_checkpoint(path)
    assert [p["field"] for p in read_checkpoint(path, strict=False).problems] == ["weights"]


def test_truncated_weights(tmp_path):
    path, _ = _good(tmp_path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(FormatError, match="model.safetensors: not a readable safetensors file"):
        read_checkpoint(path)


def _tamper(path, c, changes: dict):
    """Rewrite the weights with some tensors replaced (None deletes)."""
    t = random_tensors(c)
    for k, v in changes.items():
        if v is None:
            del t[k]
        else:
            t[k] = v
    save_file(t, str(path / "model.safetensors"))


_Q = "layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize(
    ("changes", "field", "match"),
    [
        (
            {"fc.weight": torch.zeros(64, 256)},
            "fc.weight",
            r"fc.weight is \[64, 256\] = 4 chunks of target_hidden_size 64, but the config names 3 capture layers",
        ),
        (
            {"lm_head.weight": torch.zeros(60, 64)},
            "lm_head.weight",
            r"lm_head.weight is \[60, 64\], expected \[64, 64\]",
        ),
        ({_Q: torch.zeros(64, 64)}, _Q, "2 x hidden_size 64"),
        (
            {"input_norm.weight": torch.ones(192)},
            "input_norm.weight",
            "input_norm.weight is present but norm_before_fc is not true",
        ),
        ({"fc_norm.0.weight": torch.ones(64)}, "fc_norm.0.weight", "fc_norm is not true"),
        (
            {"layers.0.self_attn.q_norm.weight": torch.ones(16)},
            "layers.0.self_attn.q_norm.weight",
            r"layer type \(model_type\) is not qwen3",
        ),
        # (a valid d2t without t2d is completed on read: tests/test_vocab_map.py)
        ({"t2d": None, "d2t": torch.full((64,), 250, dtype=torch.int64)}, "d2t", r"outside \[0, 256\)"),
        ({"d2t": None, "t2d": None}, "d2t", "there is no d2t/t2d"),
        ({"d2t": torch.full((64,), 250, dtype=torch.int64)}, "d2t", r"outside \[0, 256\)"),
        (
            {"d2t": torch.zeros(64, dtype=torch.int64).index_fill(0, torch.tensor([5]), -1)},
            "d2t",
            "not strictly increasing at draft id 5",
        ),
        ({"t2d": torch.ones(256, dtype=torch.bool)}, "t2d", "t2d marks 256 target ids, expected draft_vocab_size 64"),
        ({"d2t": torch.full((64,), 250, dtype=torch.int32)}, "d2t", "d2t is torch.int32"),  # a valid one is cast
        (
            {"layers.1.mlp.up_proj.weight": torch.ones(128, 64)},
            "layers.1",
            "layers.1.* are stored but num_hidden_layers is 1",
        ),
        ({"extra.weight": torch.ones(2)}, "extra.weight", "not an EAGLE-3 tensor"),
    ],
)
def test_tensors_that_contradict_the_config(tmp_path, changes, field, match):
    path, c = _good(tmp_path)
    _tamper(path, c, changes)
    with pytest.raises(ContractError, match=match) as e:
        read_checkpoint(path)
    assert "model.safetensors" in str(e.value) and e.value.hint
    problems = read_checkpoint(path, strict=False).problems
    assert field in [p["field"] for p in problems]


def test_auto_map_is_never_executed(tmp_path):
    path, _ = _good(tmp_path)
    marker = tmp_path / "ran"
    (path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Eagle3SpeculatorConfig: pass\n")
    cfg = json.loads((path / "config.json").read_text())
    cfg["auto_map"] = {"": "evil.Eagle3SpeculatorConfig", "AutoConfig": "evil.Eagle3SpeculatorConfig"}
    (path / "config.json").write_text(json.dumps(cfg))
    read_checkpoint(path)
    convert_checkpoint(path, tmp_path / "out", "eagle")
    assert not marker.exists()


# --- writing safely -----------------------------------------------------------------------------


def test_destination_rules(tmp_path):
    src, c = _good(tmp_path)
    for dst in (src, src / "inner"):
        with pytest.raises(FormatError, match="DST is inside SRC"):
            convert_checkpoint(src, dst, "eagle")
    with pytest.raises(FormatError, match="DST contains SRC"):
        convert_checkpoint(src, tmp_path, "eagle", force=True)
    assert sorted(p.name for p in src.iterdir()) == ["config.json", "model.safetensors"]
    out = tmp_path / "out"
    out.mkdir()
    convert_checkpoint(src, out, "eagle")  # an empty folder is fine
    with pytest.raises(FormatError, match="folder is not empty"):
        convert_checkpoint(src, out, "speculators")
    assert read_checkpoint(out).files == {"config.json": "eagle"}
    convert_checkpoint(src, out, "speculators", force=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "out"]


@pytest.mark.parametrize("depth", [32, 6])
def test_convert_keeps_capture_layers_unnamed_where_the_source_names_none(tmp_path, depth):
    """Read with a target, a draft without layer ids gets the engines' default for its depth; its copy
    still names none (served as the source is), and a 6-layer target's [2, 3, 3] is never written."""
    c = tiny_contract(capture_layers=None, verifier=Verifier(name_or_path="a/b", num_hidden_layers=depth))
    write_checkpoint(tmp_path / "src", c, random_tensors(c), "speculators")  # a known depth: the library writes it
    cfg = json.loads((tmp_path / "src" / "config.json").read_text())
    assert cfg[IDS] is None
    target = {"num_hidden_layers": depth, "hidden_size": 64, "vocab_size": 256}
    source, written = convert_checkpoint(tmp_path / "src", tmp_path / "out", "both", verifier_config=target)
    assert source.contract.capture_layers == (2, depth // 2, depth - 3) and written.contract.capture_layers is None
    assert json.loads((tmp_path / "out" / "config.json").read_text())[IDS] is None
    assert IDS not in json.loads((tmp_path / "out" / "config_eagle.json").read_text())
    assert read_checkpoint(tmp_path / "out", verifier_config=target).contract == source.contract


def test_a_source_whose_files_link_into_dst_is_never_overwritten(tmp_path):
    """A link-farm source (a hub cache snapshot: its weights a link to a blob elsewhere): --force on the
    folder the link points into would delete the source's weights, or rewrite them."""
    orig, _ = _good(tmp_path)
    view = tmp_path / "view"
    view.mkdir()
    (view / "config.json").write_text((orig / "config.json").read_text())
    (view / "model.safetensors").symlink_to(orig / "model.safetensors")
    before = (orig / "model.safetensors").read_bytes()
    with pytest.raises(FormatError, match="DST holds the file .*model.safetensors that SRC's model.safetensors links"):
        convert_checkpoint(view, orig, "speculators", force=True)
    assert (orig / "model.safetensors").read_bytes() == before and not read_checkpoint(view).problems


def test_force_replaces_a_draft_and_nothing_else(tmp_path):
    """--force replaces a folder holding a draft; a model's folder, a capture's or one holding
    folders (the current directory, a clone) is refused whole, and left as it was."""
    c = tiny_contract()
    t = random_tensors(c)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    (model / "tokenizer.json").write_text("{}")
    here = tmp_path / "here"
    (here / "shards").mkdir(parents=True)
    (here / "config.json").write_text(json.dumps(eagle_config(c, "float32")))  # a draft's config, beside shards/
    trained = write_checkpoint(tmp_path / "trained", c, t, "both")  # a draft with its notes, as the shipped one
    for name in ("README.md", "train_log.jsonl", "heldout_tau.png"):
        (trained / name).write_text("kept")
    for dst, why in ((model, "holds no EAGLE-3 draft config"), (here, "holds folders (shards)"),
                     (trained, "holds files that are not a draft's, which replacing it would delete "
                               "(README.md, heldout_tau.png, train_log.jsonl)")):
        before = sorted(p.name for p in dst.rglob("*"))
        with pytest.raises(FormatError, match=re.escape(f"--force replaces only a draft folder, and this one {why}")):
            write_checkpoint(dst, c, t, "eagle", force=True)
        assert sorted(p.name for p in dst.rglob("*")) == before
    draft = write_checkpoint(tmp_path / "draft", c, t, "eagle")
    (draft / "model-00001-of-00002.safetensors").write_bytes(b"")  # a shard of an earlier layout: a draft's
    assert write_checkpoint(draft, c, t, "speculators", force=True) == draft
    assert sorted(p.name for p in draft.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((draft / "config.json").read_text()).get("speculators_config")


def test_failures_leave_nothing_behind(tmp_path, monkeypatch):
    c = tiny_contract()
    t = random_tensors(c)
    bad = dict(t, **{"fc.weight": torch.zeros(64, 128)})
    with pytest.raises(ContractError, match="fc.weight"):
        write_checkpoint(tmp_path / "d", c, bad, "eagle")
    assert list(tmp_path.iterdir()) == []

    old = write_checkpoint(tmp_path / "d", c, t, "eagle")  # a draft: what --force may replace
    kept = {p.name: p.read_bytes() for p in old.iterdir()}

    def boom(*a, **k):
        raise OSError("disk full")

    with monkeypatch.context() as m:
        m.setattr("eyas.formats.write.write_tensors", boom)
        with pytest.raises(OSError, match="disk full"):
            write_checkpoint(tmp_path / "d", c, t, "both", force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["d"] and {p.name: p.read_bytes() for p in old.iterdir()} == kept

    real_replace = os.replace

    def rename_fails(src, dst):  # the final rename fails after the old folder was moved aside
        if str(src).endswith(".tmp") and str(dst) == str(tmp_path / "d"):
            raise OSError("rename failed")
        real_replace(src, dst)

    monkeypatch.setattr("eyas.atomic.os.replace", rename_fails)
    with pytest.raises(EyasError, match=r"d: cannot write it \(rename failed\)"):
        write_checkpoint(tmp_path / "d", c, t, "eagle", force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["d"] and {p.name: p.read_bytes() for p in old.iterdir()} == kept


def test_a_full_disk_is_one_line_and_leaves_no_folder(tmp_path):
    """The machine refuses a write (here a file-size limit, as a full disk or a quota would): one
    `error:` line naming the file, exit 2, and neither the temp folder nor the parents made for DST."""
    src, _ = _good(tmp_path)
    dst = tmp_path / "new" / "parent" / "dst"
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))"  # configs fit, weights not
    run = subprocess.run([sys.executable, "-c", f"{limit}; from eyas.cli import main; raise SystemExit(main())",
                          "convert", str(src), str(dst), "--format", "eagle"], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.safetensors: cannot write it" in errors[0] and "Traceback" not in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_torch_save_on_a_full_disk_and_a_folder_the_machine_will_not_make_are_one_line(tmp_path):
    """torch.save reports a full disk as a RuntimeError raised over the OSError (train's checkpoints);
    a folder under a file, or under /proc, cannot be made: both are the user's error, not a traceback."""
    code = ("import resource, torch; resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096)); "
            "from eyas.atomic import write_atomic; from eyas.errors import EyasError\n"
            "try: write_atomic(%r, lambda f: torch.save(torch.zeros(100000), f))\n"
            "except EyasError as e: print(e)") % str(tmp_path / "state.pt")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.stdout.startswith(f"{tmp_path / 'state.pt'}: cannot write it (") and "Traceback" not in run.stderr
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "afile").write_text("x")
    from eyas.atomic import make_folders
    with pytest.raises(EyasError, match=r"afile/sub: cannot write it \(Not a directory\)"):
        make_folders(tmp_path / "afile" / "sub")


def test_weights_that_are_not_finite_are_named_with_their_counts(tmp_path):
    path, c = _good(tmp_path)
    fc = random_tensors(c)["fc.weight"]
    fc[0, :3], fc[1, 0] = float("nan"), float("-inf")
    _tamper(path, c, {"fc.weight": fc, "norm.weight": torch.full((64,), float("inf"), dtype=torch.bfloat16)})
    with pytest.raises(ContractError, match=r"fc.weight holds 3 nan and 1 inf of its 12288 values") as e:
        read_checkpoint(path)
    assert "model.safetensors" in str(e.value) and "training diverged" in e.value.hint
    problems = read_checkpoint(path, strict=False).problems
    assert [p["field"] for p in problems if p["code"] == "tensor_not_finite"] == ["fc.weight", "norm.weight"]
    with pytest.raises(ContractError, match="fc.weight holds 3 nan"):
        write_checkpoint(tmp_path / "out", c, random_tensors(c) | {"fc.weight": fc}, "eagle")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("fields", "said"), [
    ({"embed_scale": 8.0}, "embed_scale 8.0: its trainer multiplied"),
    ({"target_model_type": "gemma3_text"}, "sqrt(hidden_size) = 8.0"),  # the tiny draft's hidden 64
    ({"embed_scale": 1.0, "target_model_type": "gemma3_text"}, None),  # stated unscaled: nothing to say
    ({"target_model_type": "llama"}, None),
])
def test_a_scaled_embedding_is_warned(tmp_path, fields, said):
    c = tiny_contract()
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**eagle_config(c), **fields}))
    found = [w["warning"] for w in read_checkpoint(path).warnings if w["code"] == "embed_scale_ignored"]
    if said is None:
        assert not found
    else:
        assert len(found) == 1 and said in found[0]


@pytest.mark.parametrize("fields", [{"embed_scale": 8.0}, {"target_model_type": "gemma3_text"},
                                    {"embed_scale": 1.0, "target_model_type": "gemma3_text"},
                                    {"target_model_type": ""}])  # names no type: read as absent
def test_a_trainers_embedding_scale_survives_every_conversion(tmp_path, fields):
    """SpecForge's embed_scale and target_model_type are kept (contract embed_scale, verifier.model_type) and
    written again into every format, so each output warns as its source did, and a stated 1 stays unscaled."""
    c = tiny_contract()
    src = tmp_path / "src"
    write_checkpoint(src, c, random_tensors(c), "eagle")
    (src / "config.json").write_text(json.dumps({**eagle_config(c), **fields}))

    def scaled(path):
        return [w["field"] for w in read_checkpoint(path).warnings if w["code"] == "embed_scale_ignored"]
    source = read_checkpoint(src)
    assert (source.contract.embed_scale, source.contract.verifier.model_type) == (
        fields.get("embed_scale"), fields.get("target_model_type") or None)
    hops = [("speculators", "s"), ("eagle", "e"), ("both", "b")]
    for to, name in hops:
        _, written = convert_checkpoint(src if name == "s" else tmp_path / "s", tmp_path / name, to)
        assert written.contract == source.contract.replace(verifier=written.contract.verifier)
        assert written.contract.verifier.model_type == source.contract.verifier.model_type
        assert scaled(tmp_path / name) == scaled(src) * (2 if to == "both" else 1), to  # each file says it
        assert not read_checkpoint(tmp_path / name).disagreements


def test_a_config_led_by_a_byte_order_mark_is_refused_with_its_own_hint(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("\ufeff" + json.dumps(eagle_config(tiny_contract())), encoding="utf-8")
    with pytest.raises(FormatError) as e:
        read_checkpoint(path)
    assert "UTF-8 BOM" in str(e.value) and "byte-order mark" in e.value.hint


def test_granite_scalings_are_named_and_llamas_own_values_pass(tmp_path):
    """A draft layer that scales embeddings, scores, residual adds or logits (Granite's keys, as an EAGLE
    pull request wrote them) computes what no EAGLE-3 draft class of vLLM or eyas does."""
    c = tiny_contract()  # head_dim 16: Llama's score scale is 0.25
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**eagle_config(c), "residual_multiplier": 0.22, "attention_multiplier": 0.25}))
    assert read_checkpoint(path).contract.unsupported == "Granite-style scaling (residual_multiplier 0.22)"
    path.write_text(json.dumps({**eagle_config(c), "embedding_multiplier": 1, "attention_multiplier": 0.25}))
    assert read_checkpoint(path).contract.unsupported is None


def test_a_training_config_with_target_vocab_size_is_refused_with_the_renaming(tmp_path):
    path = tmp_path / "config.json"
    cfg = {k: v for k, v in eagle_config(tiny_contract()).items() if k not in ("draft_vocab_size", "eagle_config")}
    path.write_text(json.dumps({**cfg, "architectures": ["LlamaForCausalLM"], "target_vocab_size": 1000}))
    with pytest.raises(FormatError) as e:
        read_checkpoint(path)
    assert "vocab_size = its target_vocab_size and draft_vocab_size = its vocab_size" in e.value.hint


def test_a_config_that_is_there_but_no_file_says_what_it_is(tmp_path):
    (tmp_path / "a" / "config.json").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "config.json").symlink_to("nowhere")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").symlink_to("config.json")
    for name, what in (("a", "a folder"), ("b", "a link to nothing"), ("c", "a link that loops")):
        with pytest.raises(FormatError, match=re.escape(f"config.json: is there but is not a readable file ({what})")):
            read_checkpoint(tmp_path / name)


# --- the draft layer's attention window ------------------------------------------------------------


def _config_with(tmp_path, name, fmt, **keys):
    """A draft folder whose layer config carries `keys` (top level for eagle, transformer_layer_config
    for speculators); None deletes a key."""
    path, c = _good(tmp_path / name, fmt)
    cfg = json.loads((path / "config.json").read_text())
    layer = cfg["transformer_layer_config"] if fmt == "speculators" else cfg
    for key, value in keys.items():
        layer.pop(key, None) if value is None else layer.update({key: value})
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize("fmt", ["speculators", "eagle"])
def test_a_sliding_window_is_read_said_and_written_back(tmp_path, fmt):
    """`layer_types` ["sliding_attention"] with `sliding_window` (a published speculators config, issue
    1065) is the contract's window: run by eyas's drafter as by vLLM (tests/test_drafter.py), told in
    vLLM's view, and kept by every conversion (convert dropped it, saying "contract unchanged"). A window
    a trainer copied from its target with no layer_types, or "full_attention", is full attention."""
    src = _config_with(tmp_path, "w", fmt, layer_types=["sliding_attention"], sliding_window=16,
                       use_sliding_window=True)
    ckpt = read_checkpoint(src)
    assert ckpt.contract.sliding_window == 16
    assert not [w for w in ckpt.warnings if "window" in w["warning"]]
    assert any("last 16 tokens" in n for n in consumers(ckpt)["vllm"]["notes"])
    for to in ("speculators", "eagle", "both"):
        _, out = convert_checkpoint(src, tmp_path / f"out-{fmt}-{to}", to)
        assert out.contract == ckpt.contract
        for name in ("config.json", "config_eagle.json")[: 2 if to == "both" else 1]:
            cfg = json.loads((out.path / name).read_text())
            layer = cfg.get("transformer_layer_config", cfg)
            assert (layer["layer_types"], layer["sliding_window"]) == (["sliding_attention"], 16)
    for i, keys in enumerate(({"sliding_window": 32768, "use_sliding_window": False},
                              {"layer_types": ["full_attention"], "sliding_window": 512})):
        full = read_checkpoint(_config_with(tmp_path, f"full{i}", fmt, **keys))
        assert full.contract.sliding_window is None and not [w for w in full.warnings if "window" in w["warning"]]


def test_attention_kinds_eyas_cannot_run_or_a_window_without_its_size(tmp_path):
    mixed = read_checkpoint(_config_with(tmp_path, "m", "eagle", layer_types=["chunked_attention"]))
    assert "attention kinds ['chunked_attention']" in mixed.contract.unsupported
    with pytest.raises(FormatError, match=r"config.json: field 'sliding_window' is missing"):
        read_checkpoint(_config_with(tmp_path, "n", "eagle", layer_types=["sliding_attention"], sliding_window=None))
    null = _config_with(tmp_path, "z", "eagle", layer_types=["sliding_attention"], sliding_window=8)
    cfg = json.loads((null / "config.json").read_text())
    (null / "config.json").write_text(json.dumps({**cfg, "sliding_window": None}))  # there, but null
    with pytest.raises(FormatError, match=r"config.json: field 'sliding_window' is null") as e:
        read_checkpoint(null)
    assert e.value.hint.startswith("set sliding_window in")
    with pytest.raises(FormatError, match=r"field 'transformer_layer_config.layer_types' is 'full_attention'"):
        read_checkpoint(_config_with(tmp_path, "s", "speculators", layer_types="full_attention"))


def test_the_current_folder_is_never_replaced(tmp_path, monkeypatch):
    """DST "." (or a folder above it) would be replaced by a new folder, leaving the shell in a deleted one."""
    c = tiny_contract()
    (tmp_path / "here" / "below").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "here" / "below")
    for dst, what in ((".", "is the current folder:"), (tmp_path / "here", "is the current folder or holds it")):
        with pytest.raises(FormatError, match=re.escape(what)):
            write_checkpoint(dst, c, random_tensors(c), "eagle")
    assert [p.name for p in tmp_path.rglob("*")] == ["here", "below"]
    assert write_checkpoint("draft", c, random_tensors(c), "eagle").parent == tmp_path / "here" / "below"


# --- convert: a draft eyas cannot run, the warnings it repeats, the verifier it records ------------

_LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
             "original_max_position_embeddings": 256}


@pytest.mark.parametrize("fmt", ["speculators", "eagle"])
@pytest.mark.parametrize("keys", [
    {"rope_scaling": _LONGROPE, "rope_parameters": {**_LONGROPE, "rope_theta": 100000.0}, "rope_theta": None},
    {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
    {"hidden_act": "gelu_new"},
], ids=["longrope", "mrope", "hidden_act"])
def test_convert_keeps_a_part_eyas_cannot_run_where_its_formats_state_it(tmp_path, fmt, keys):
    """A rope type or an activation the drafter lacks is written through as read, so convert round-trips
    it (it refused such drafts as it refuses a layer the formats have no fields for)."""
    src = _config_with(tmp_path, "src", fmt, **keys)
    first = read_checkpoint(src)
    assert first.contract.unsupported
    convert_checkpoint(src, tmp_path / "mid", "eagle" if fmt == "speculators" else "speculators")
    _, back = convert_checkpoint(tmp_path / "mid", tmp_path / "back", fmt)
    assert back.contract.to_dict() == first.contract.to_dict()
    assert _same_tensors(back.tensors, first.tensors)


@pytest.mark.parametrize(("keys", "part"), [
    ({"layer_types": ["chunked_attention", "full_attention"], "sliding_window": 8}, "attention kinds"),
    ({"residual_multiplier": 0.22}, "Granite-style scaling"),
    ({"num_experts": 8}, "mixture-of-experts MLP (8 experts)"),
    ({"model_type": "qwen3_moe"}, "mixture-of-experts MLP (model_type 'qwen3_moe')"),
], ids=["layer_types", "granite", "experts", "moe_model_type"])
def test_convert_refuses_a_part_its_formats_cannot_state(tmp_path, keys, part):
    """Attention kinds per layer, Granite multipliers and a MoE layer's fields are no contract fields: the
    written config would drop them, into the same format too."""
    src = _config_with(tmp_path, "src", "speculators", **keys)
    for to in ("eagle", "speculators", "both"):
        with pytest.raises(FormatError, match=re.escape(f"cannot convert this draft losslessly: it has a {part}")):
            convert_checkpoint(src, tmp_path / to, to)
        assert not (tmp_path / to).exists()


def test_a_layer_reads_its_own_entry_of_a_layer_types_list_copied_from_the_target(tmp_path):
    """vLLM's Llama layer reads layer_types at the draft layer's own index: entries past the draft's
    layers are read by no one, and the draft converts (eyas writes one entry per layer)."""
    src = _config_with(tmp_path, "src", "speculators", layer_types=["sliding_attention", "full_attention"],
                       sliding_window=8)
    first = read_checkpoint(src)
    assert first.contract.sliding_window == 8 and first.contract.unsupported is None
    _, back = convert_checkpoint(src, tmp_path / "eagle", "eagle")
    assert back.contract.to_dict() == first.contract.to_dict()


def test_convert_says_each_warning_once_naming_the_source(tmp_path, capsys):
    """The written copy, read back in a temp folder, repeated the source's warnings under a path that is
    gone once the folder is renamed into place."""
    from eyas.cli import main

    c = tiny_contract(draft_vocab_size=256).replace(has_lm_head=False)
    write_checkpoint(tmp_path / "d", c, random_tensors(c), "eagle")
    for args in ([], ["--json"]):
        dst = tmp_path / f"out{len(args)}"
        assert main(["convert", str(tmp_path / "d"), str(dst), "--format", "eagle", *args]) == 0
        out = capsys.readouterr().out
        assert out.count("no lm_head.weight") == 1 and str(tmp_path / "d" / "model.safetensors") in out
        assert ".tmp" not in out
    _, written = convert_checkpoint(tmp_path / "d", tmp_path / "api", "speculators")
    (shared,) = [w for w in written.warnings if w["code"] == "lm_head_shared"]
    assert shared["warning"].startswith(str(tmp_path / "api" / "model.safetensors"))


def test_convert_keeps_the_draft_length_a_speculators_source_states(tmp_path, capsys):
    """speculators' proposal_methods say how many tokens `vllm serve DIR` drafts per step: convert wrote its own 3
    over the source's 5, unsaid. Now a speculators copy keeps them, and an eagle copy (no field for it) says so."""
    from eyas.cli import main

    c = tiny_contract()
    src = write_checkpoint(tmp_path / "src", c, random_tensors(c), "speculators")
    cfg = json.loads((src / "config.json").read_text())
    methods = [{"proposal_type": "greedy", "speculative_tokens": 5, "verifier_accept_k": 1, "accept_tolerance": 0.0}]
    cfg["speculators_config"]["proposal_methods"] = methods
    (src / "config.json").write_text(json.dumps(cfg))
    for fmt in ("speculators", "both"):
        assert main(["convert", str(src), str(tmp_path / fmt), "--format", fmt]) == 0
        assert json.loads((tmp_path / fmt / "config.json").read_text())["speculators_config"]["proposal_methods"] \
            == methods
        assert "proposal_methods" not in capsys.readouterr().out
    assert main(["convert", str(src), str(tmp_path / "eagle"), "--format", "eagle", "--json"]) == 0
    (said,) = [w for w in json.loads(capsys.readouterr().out)["warnings"] if w["code"] == "proposals_not_kept"]
    assert "speculative_tokens 5" in said["warning"] and '"num_speculative_tokens": 5' in said["fix"]
    assert main(["convert", str(tmp_path / "eagle"), str(tmp_path / "back"), "--format", "speculators"]) == 0
    assert json.loads((tmp_path / "back" / "config.json").read_text())["speculators_config"]["proposal_methods"][0][
        "speculative_tokens"] == 3  # eyas's own, where the source states none


def test_convert_to_speculators_names_the_verifier_as_init_does(tmp_path, capsys):
    """An eagle draft naming no verifier: --verifier-name, else --target's path, is recorded (vLLM serves
    the verifier a speculators config names); with neither, a warning says how to give one. A verifier the
    source names is kept."""
    from eyas.cli import main

    c = tiny_contract(verifier=Verifier())
    write_checkpoint(tmp_path / "src", c, random_tensors(c), "eagle")
    tgt = tmp_path / "tgt"
    tgt.mkdir()
    (tgt / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 6, "vocab_size": 256}))

    def verifier(dst, *flags):
        assert main(["convert", str(tmp_path / "src"), str(tmp_path / dst), "--format", "speculators", *flags]) == 0
        cfg = json.loads((tmp_path / dst / "config.json").read_text())
        return cfg["speculators_config"]["verifier"]["name_or_path"], capsys.readouterr().out

    name, out = verifier("t", "--target", str(tgt))
    assert name == str(tgt) and "no verifier name" not in out
    assert verifier("n", "--target", str(tgt), "--verifier-name", "org/model")[0] == "org/model"
    name, out = verifier("none")
    assert name is None and "no verifier name" in out and "--verifier-name ID" in out
    name, out = verifier("json", "--json")
    assert [p["code"] for p in json.loads(out)["problems"]] == ["verifier_name_missing"]
    assert main(["convert", str(tmp_path / "n"), str(tmp_path / "kept"), "--format", "speculators",
                 "--target", str(tgt)]) == 0
    assert json.loads((tmp_path / "kept" / "config.json").read_text())["speculators_config"]["verifier"] == {
        "name_or_path": "org/model", "architectures": ["LlamaForCausalLM"]}
