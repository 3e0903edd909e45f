"""eyas.check: every problem listed at once, against a target config; what each engine will do."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import TINY_TARGET_LAYERS, random_tensors, tiny_contract
from eyas.check import check_checkpoint, consumers
from eyas.codes import text_of
from eyas.contract import Verifier
from eyas.errors import ContractError, FormatError
from eyas.formats import IDS, eagle_config, read_checkpoint, speculators_config, write_checkpoint
from eyas.target import target_config
from eyas.weights import from_canonical

TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": TINY_TARGET_LAYERS,
    "hidden_size": 64,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
}


@pytest.fixture
def target(tmp_path):
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(TARGET))
    return tmp_path / "target"


def _ck(tmp_path, fmt="speculators", name="ck", **overrides):
    c = tiny_contract(**overrides)
    write_checkpoint(tmp_path / name, c, random_tensors(c), fmt)
    return tmp_path / name


def _fields(rep) -> list[str]:
    return [p["field"] for p in rep.problems]


def test_clean_checkpoint_passes(tmp_path, target):
    rep = check_checkpoint(_ck(tmp_path, capture_layers=(2, 3, 5)), target=target)
    assert rep.ok and rep.problems == [] and rep.target["num_hidden_layers"] == TINY_TARGET_LAYERS
    assert check_checkpoint(_ck(tmp_path, name="cfg"), target=target / "config.json").ok


def test_every_problem_is_listed_at_once(tmp_path, target):
    path = _ck(
        tmp_path,
        capture_layers=(2, 3, 9),
        max_position_embeddings=256,
        rope_theta=None,
        verifier=Verifier(name_or_path="/models/llama", architectures=("MistralForCausalLM",)),
    )
    t = random_tensors(tiny_contract())
    t["input_norm.weight"] = torch.ones(192)  # flag says no
    t["t2d"] = torch.ones(256, dtype=torch.bool)  # wrong count
    t["layers.0.self_attn.q_norm.weight"] = torch.ones(16)  # a qwen3 tensor in a llama layer
    save_file(t, str(path / "model.safetensors"))
    rep = check_checkpoint(path, target=target)
    assert set(_fields(rep)) == {
        "input_norm.weight",
        "t2d",
        "layers.0.self_attn.q_norm.weight",
        IDS,
        "max_position_embeddings",
        "speculators_config.verifier.name_or_path",
        "verifier.architectures",
    }
    assert all(p["fix"] for p in rep.problems)
    assert any("[9] outside the target's 0..6" in p["problem"] for p in rep.problems)
    assert any("no rope_theta" in w["warning"] for w in rep.warnings)


def _without_embeddings(path, c, fmt):
    """`c` (widths that differ) written without embed_tokens, as a trainer may export it: write_checkpoint
    refuses to (no target can lend them)."""
    own = c.replace(has_embeddings=True)
    write_checkpoint(path, own, random_tensors(own), fmt)
    weights = load_file(path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != "embed_tokens.weight"}, path / "model.safetensors")
    return path


def test_target_mismatches(tmp_path, target):
    c = tiny_contract(
        vocab_size=300,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        target_hidden_size=48,
        capture_layers=(2, 3, 5),
    )
    _without_embeddings(tmp_path / "ck", c, "eagle")
    rep = check_checkpoint(tmp_path / "ck", target=target)
    assert set(_fields(rep)) == {"vocab_size", "target_hidden_size", "embed_tokens.weight"}


def test_embeddings_no_target_can_lend_are_a_problem_without_a_target(tmp_path, target, capsys):
    """target_hidden_size 96 != hidden_size 64 and no embed_tokens: the config alone says the target's embeddings
    cannot serve the draft (vLLM keeps the draft's own table, never loaded). check named it only against a target,
    then check alone but not inspect (exit 0, no problem), and write/convert wrote such a draft as lossless. A
    tensor rule now: said once, by every verb."""
    from eyas.cli import main

    c = tiny_contract(target_hidden_size=96)
    with pytest.raises(ContractError, match="the target's embeddings are 96 wide"):
        write_checkpoint(tmp_path / "refused", c, random_tensors(c), "speculators")
    assert not (tmp_path / "refused").exists()
    ck = _without_embeddings(tmp_path / "ck", c, "speculators")
    rep = check_checkpoint(ck)
    assert [p["code"] for p in rep.problems] == ["target_embeddings_unshareable"], rep.problems
    assert "the target's embeddings are 96 wide" in rep.problems[0]["problem"]
    with_target = check_checkpoint(ck, target=target)
    assert [p["code"] for p in with_target.problems].count("target_embeddings_unshareable") == 1
    assert main(["inspect", str(ck), "--json"]) == 1
    assert [p["code"] for p in json.loads(capsys.readouterr().out)["problems"]] == ["target_embeddings_unshareable"]
    assert main(["convert", str(ck), str(tmp_path / "copy"), "--format", "eagle"]) == 2
    assert "the target's embeddings are 96 wide" in capsys.readouterr().err and not (tmp_path / "copy").exists()


def test_unreadable_weights_are_errors_missing_weights_are_problems(tmp_path, target):
    path = _ck(tmp_path, capture_layers=(2, 3, 5))
    (path / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(FormatError, match="model.safetensors: not a readable safetensors file"):
        check_checkpoint(path, target=target)  # unreadable input: `eyas check` exits 2
    (path / "model.safetensors").unlink()
    rep = check_checkpoint(path, target=target)
    assert _fields(rep) == ["weights"] and [p["code"] for p in rep.problems] == ["weights_missing"]


def test_unreadable_input_raises(tmp_path, target):
    path = _ck(tmp_path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(FormatError, match="config.json: invalid JSON"):
        check_checkpoint(path)
    with pytest.raises(FormatError, match="is not a folder"):
        check_checkpoint(_ck(tmp_path, name="ok"), target=tmp_path / "nowhere")


def test_what_no_runner_builds_is_named_by_check_not_first_by_eval(tmp_path, target):
    """A hidden_act the drafter lacks is an unrunnable part (check warns, the run verbs refuse); a
    llama3 rope without its band factors is refused at read, naming the field; a target size that
    is no positive integer is refused naming the target, not compared as a mismatch."""
    path = _ck(tmp_path, fmt="eagle", name="act")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "hidden_act": "bogus"}))
    rep = check_checkpoint(path, target=target)
    assert any(w["code"] == "draft_not_runnable" and "hidden_act 'bogus'" in w["warning"] for w in rep.warnings)
    (path / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    with pytest.raises(FormatError, match=r"field 'rope_scaling.low_freq_factor' is None, expected a number"):
        check_checkpoint(path)
    (target / "config.json").write_text(json.dumps({**TARGET, "hidden_size": "64"}))
    with pytest.raises(FormatError, match=r"field 'hidden_size' is '64', not a positive integer"):
        check_checkpoint(_ck(tmp_path, name="ok"), target=target)



def test_a_target_of_another_family_is_named_so_not_called_damaged():
    """GPT-2 names its depth n_layer: 'num_hidden_layers is None ... restore it if it is damaged' misled."""
    from eyas.contract import contract_for_target

    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_embd": 32, "n_head": 4,
            "vocab_size": 64}
    with pytest.raises(FormatError, match=r"no field 'num_\w+' but 'n_\w+' \(model_type 'gpt2'\): eyas runs Llama"):
        contract_for_target(gpt2)


def test_a_draft_for_an_mla_target_splits_the_hidden_state_into_its_heads():
    """transformers writes DeepSeek-V3's `head_dim` as its rotary part (qk_rope_head_dim 64): mirrored, a draft
    for the 671B target had 128 heads of 64 (its published config.json, without head_dim, gave 56)."""
    from eyas.contract import contract_for_target

    v3 = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 129280,
          "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432, "kv_lora_rank": 512,
          "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128}
    assert contract_for_target(v3).head_dim == contract_for_target({**v3, "head_dim": 64}).head_dim == 56
    assert contract_for_target({**v3, "kv_lora_rank": None, "head_dim": 64}).head_dim == 64  # GQA keeps its own


def test_a_multimodal_targets_sizes_are_its_language_models():
    """PaliGemma's outer config writes hidden_size and vocab_size of its own beside `text_config`: they were
    read first, so init and check held the draft against sizes no layer of the language model has."""
    from eyas.contract import contract_for_target, target_facts

    text = {"model_type": "gemma", "num_hidden_layers": 8, "hidden_size": 32, "vocab_size": 48,
            "num_attention_heads": 4, "intermediate_size": 64, "rope_theta": 10000.0}
    pali = {"model_type": "paligemma", "hidden_size": 2048, "vocab_size": 257152, "text_config": text}
    assert (target_facts(pali)["hidden_size"], target_facts(pali)["vocab_size"]) == (32, 48)
    assert contract_for_target(pali).target_hidden_size == 32
    flat = {**text, "model_type": "qwen2_vl", "text_config": {"hidden_size": 8}}  # older flat exports: the top
    assert target_facts(flat)["hidden_size"] == 32


def test_a_draft_for_a_longrope_target_turns_plain_rope():
    """Phi-3 and Phi-4-mini rotate with longrope, which eyas's drafter does not run: init refused every draft for
    them ("rope_scaling type 'longrope' is not supported"). The draft's rope is its own: plain, at their theta."""
    from eyas.contract import contract_for_target
    from eyas.rope import rope_parameters

    phi = {"model_type": "phi3", "num_hidden_layers": 32, "hidden_size": 3072, "vocab_size": 200064,
           "num_attention_heads": 24, "num_key_value_heads": 8, "intermediate_size": 8192, "rope_theta": 10000.0,
           "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
           "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48}}
    with pytest.warns(UserWarning, match="rope_scaling 'longrope' is not mirrored: the draft turns plain rope"):
        c = contract_for_target(phi)
    assert c.rope_scaling is None and c.rope_theta == 10000.0 and rope_parameters(c)[1] == 1.0
    vl = {**phi, "model_type": "qwen2_5_vl", "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    with pytest.warns(UserWarning, match="rope_scaling 'mrope' is not mirrored"):  # Qwen2.5-VL's, as published
        assert contract_for_target(vl).rope_scaling is None


_LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
             "original_max_position_embeddings": 256}


@pytest.mark.parametrize("layer, checked", [
    ({"rope_scaling": _LONGROPE, "rope_parameters": {**_LONGROPE, "rope_theta": 10000.0}}, True),  # no tensor
    ({"hidden_act": "gelu_new"}, True),
    ({"num_experts": 8}, False),  # experts: tensors eyas has no layout for
])
def test_weights_are_checked_unless_the_layer_has_tensors_eyas_does_not_lay_out(tmp_path, layer, checked):
    """A rope or activation eyas cannot run changes no tensor's shape: the weights are still checked."""
    c = tiny_contract()
    cfg = speculators_config(c)
    cfg["transformer_layer_config"].update(layer, intermediate_size=96)  # the weights have 128
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps(cfg))
    save_file(random_tensors(c), str(tmp_path / "d" / "model.safetensors"))
    rep = check_checkpoint(tmp_path / "d")
    assert any(p["code"] == "tensor_shape" for p in rep.problems) is checked
    assert any(w["code"] == "tensors_not_checked" for w in rep.warnings) is not checked
    assert rep.checkpoint.contract.unsupported  # eyas runs none of them


def test_config_only_check_skips_tensors(tmp_path, target):
    path = tmp_path / "draft.json"
    path.write_text(json.dumps(speculators_config(tiny_contract(capture_layers=(2, 3, 5)))))
    rep = check_checkpoint(path, target=target)
    assert rep.ok and any("tensor checks skipped" in w["warning"] for w in rep.warnings)


def test_target_config_lookup(tmp_path, target):
    assert target_config(target) == TARGET == target_config(target / "config.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="has no config.json"):
        target_config(tmp_path / "empty")


# --- consumers ----------------------------------------------------------------------------------


def _cons(tmp_path, configs, c, naming="eagle", verifier=None):
    folder = tmp_path / "c"
    folder.mkdir()
    for name, cfg in configs.items():
        (folder / name).write_text(json.dumps(cfg))
    save_file(from_canonical(random_tensors(c), naming), str(folder / "model.safetensors"))
    return consumers(read_checkpoint(folder, verifier_config=verifier))


def test_kimi_style_ids_each_engine(tmp_path):
    """Nested ids [2, 3, 5] (capture convention): current SGLang and vLLM 0.32 take them, legacy SGLang adds 1.

    (eyas once said vLLM ignores nested ids; the running engine reads them: tests/test_engine_vllm.py.)"""
    c = tiny_contract(capture_layers=(2, 3, 5))
    cfg = eagle_config(c)
    del cfg[IDS]
    cfg["eagle_config"][IDS] = [2, 3, 5]
    cons = _cons(tmp_path, {"config.json": cfg}, c, verifier={"num_hidden_layers": 8})
    assert cons["sglang"]["capture_layers"] == [2, 3, 5] and cons["sglang"]["mismatches"] == []
    assert cons["sglang_legacy"]["capture_layers"] == [3, 4, 6]
    legacy = [m["warning"] for m in cons["sglang_legacy"]["mismatches"]]
    assert legacy == ["captures [3, 4, 6], the contract says [2, 3, 5]"]
    assert cons["vllm"]["capture_layers"] == [2, 3, 5] and cons["vllm"]["mismatches"] == []
    assert any("reads eagle_config" in n for n in cons["vllm"]["notes"])
    assert cons["speculators"]["loads"] is False


def test_a_capture_after_the_last_layer_fails_in_sglang_before_32334(tmp_path):
    """Capture point N (the state after the target's last layer): vLLM 0.32 captures it; SGLang's loop
    captures before layer i < N only (issue #32226, gpt-oss-120b: two states for fc's three) until PR #32334."""
    c = tiny_contract(capture_layers=(2, 4, 8))
    cfg = eagle_config(c)
    del cfg[IDS]
    cfg["eagle_config"][IDS] = [2, 4, 8]
    cons = _cons(tmp_path, {"config.json": cfg}, c, verifier={"num_hidden_layers": 8})
    assert cons["vllm"]["loads"] and cons["vllm"]["capture_layers"] == [2, 4, 8]
    assert cons["sglang"]["loads"] and any("captured only since PR #32334" in n for n in cons["sglang"]["notes"])
    assert not cons["sglang_legacy"]["loads"] and "fails (issue #32226" in cons["sglang_legacy"]["notes"][-1]
    (tmp_path / "no-target").mkdir()
    cons = _cons(tmp_path / "no-target", {"config.json": cfg}, c)  # depth unknown: nothing said
    assert cons["sglang_legacy"]["loads"] and not any("captured only since" in n for n in cons["sglang"]["notes"])


@pytest.mark.parametrize("scaling, vllm_loads, sglang_base", [
    ({"type": "dynamic", "alpha": 1000.0, "factor": 1.0}, True, None),  # AngelSlim's hunyuan-1.8b: as eyas
    ({"type": "dynamic", "alpha": 1000.0}, False, None),  # transformers 5.19 requires factor
    ({"rope_type": "dynamic", "factor": 2.0}, True, "theta*(f^2-f+1)^(d/(d-2)) = 3.51e+04"),
    ({"rope_type": "dynamic", "factor": 1.0}, True, None),
])
def test_dynamic_rope_in_each_engine(tmp_path, scaling, vllm_loads, sglang_base):
    """vLLM 0.32 and SGLang build alpha as eyas does; without alpha SGLang raises the base at every
    position (eyas and vLLM 0.32 turn at theta within max_position_embeddings)."""
    c = tiny_contract(capture_layers=(2, 3, 5), rope_scaling=scaling, rope_theta=10000.0)
    cons = _cons(tmp_path, {"config.json": eagle_config(c)}, c)
    assert cons["vllm"]["loads"] is vllm_loads
    assert vllm_loads or "add \"factor\": 1.0 to rope_scaling" in cons["vllm"]["notes"][-1]
    rope = [text_of(m) for m in cons["sglang"]["mismatches"] if m["code"] == "consumer_rope"]
    assert len(rope) == (sglang_base is not None) and (sglang_base is None or sglang_base in rope[0])


def test_speculators_format_in_each_engine(tmp_path):
    c = tiny_contract(capture_layers=(1, 2, 3, 5), has_embeddings=True)
    cfg = speculators_config(c)
    del cfg["norm_before_residual"]
    del cfg["transformer_layer_config"]["num_aux_hidden_states"]  # as speculators writes it
    cons = _cons(tmp_path, {"config.json": cfg}, c, naming="speculators")
    vllm = cons["vllm"]
    assert vllm["norm_before_residual"] is True and vllm["loads"] is False  # 4 aux states, fc sized for 3
    assert cons["sglang"]["loads"] is False and cons["sglang_legacy"]["loads"] is False
    spec = cons["speculators"]
    assert spec["loads"] and spec["capture_layers"] == [1, 2, 3, 5] and spec["embeddings"] == "draft's own"
    assert spec["norm_before_residual"] is False and spec["mismatches"] == []


def _without_aux_count(folder):
    """The speculators config of `folder` as speculators itself writes it: no num_aux_hidden_states."""
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["transformer_layer_config"]["num_aux_hidden_states"]
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_check_warns_where_an_engine_reading_the_format_refuses_the_draft(tmp_path):
    """vLLM refuses this 4-layer speculators draft without num_aux_hidden_states (fc sized for 3): check
    says so beside inspect; SGLang, which reads no speculators config, is a note only."""
    c = tiny_contract(capture_layers=(1, 2, 3, 5))
    write_checkpoint(tmp_path / "four", c, random_tensors(c), "speculators")
    rep = check_checkpoint(_without_aux_count(tmp_path / "four"))
    (w,) = [w for w in rep.warnings if w["code"] == "consumer_cannot_load"]
    assert text_of(w).startswith("vllm: cannot load config.json: sizes fc for 3 chunks") and rep.ok
    assert w["field"] == "transformer_layer_config.num_aux_hidden_states"
    assert 'write "num_aux_hidden_states": 4' in text_of(w)


@pytest.mark.parametrize("layers", [(5,), (1, 2, 3, 5)])
def test_eyas_writes_the_aux_count_vllm_sizes_fc_from(tmp_path, layers):
    """eyas's speculators export states how many states fc reads (vLLM reads no ids there, else 3):
    served by vLLM 0.32 in tests/test_engine_vllm.py."""
    c = tiny_contract(capture_layers=layers)
    write_checkpoint(tmp_path / "d", c, random_tensors(c), "speculators")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == len(layers)
    assert "consumer_cannot_load" not in {w["code"] for w in check_checkpoint(tmp_path / "d").warnings}


def test_init_says_what_check_would_say_of_what_it_wrote(tmp_path, capsys):
    """Capture from layer 1 cannot be written for SGLang's nested ids (a first id of 1 means +1)."""
    from eyas.cli import main

    assert main(["init", str(tmp_path / "one"), "--capture-layers", "1,5,9", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)["warnings"]
    # one truth: what SGLang cannot capture, not two ids that "name different layers" (eyas wrote both)
    codes = [w["code"] for w in said]
    assert "layer_ids_first_is_one" in codes and "layer_ids_top_nested_differ" not in codes
    assert "would capture [2, 6, 10]" in " ".join(w["warning"] for w in said)
    checked = check_checkpoint(tmp_path / "one").warnings  # init read the target; check was given none
    assert said == [w for w in checked if w["code"] != "target_not_given"]
    assert main(["convert", str(tmp_path / "one"), str(tmp_path / "eagle"), "--format", "eagle"]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "eagle"), "--engine", "sglang", "--json"]) == 1
    [problem] = json.loads(capsys.readouterr().out)["problems"]
    assert problem["code"] == "consumer_capture_layers" and "SGLang cannot capture layers that start at 1" in \
        problem["fix"] and "convert" not in problem["fix"]  # converting again wrote the same ids


@pytest.mark.parametrize("verifier, loads, says", [
    ({"name_or_path": None, "architectures": ["LlamaForCausalLM"]}, True, "vllm serve TARGET --speculative-config"),
    ({"architectures": ["LlamaForCausalLM"]}, False, "Invalid speculators config structure"),
])
def test_vllm_and_a_speculators_config_without_a_verifier_name(tmp_path, verifier, loads, says):
    """vLLM 0.32 validates that verifier.name_or_path is there (null passes) and serves the target it names."""
    c = tiny_contract()
    cfg = speculators_config(c)
    cfg["speculators_config"]["verifier"] = verifier
    vllm = _cons(tmp_path, {"config.json": cfg}, c)["vllm"]
    assert vllm["loads"] is loads and any(says in n for n in vllm["notes"])
    assert "(None)" not in json.dumps(vllm)


def test_eyas_eagle_output_wires_every_engine_as_the_contract(tmp_path):
    c = tiny_contract(capture_layers=(2, 3, 5), norm_before_residual=True)
    write_checkpoint(tmp_path / "e", c, random_tensors(c), "eagle")
    cons = consumers(read_checkpoint(tmp_path / "e"))
    for name in ("vllm", "sglang"):
        assert cons[name]["loads"] and cons[name]["capture_layers"] == [2, 3, 5] and cons[name]["mismatches"] == []
    legacy = cons["sglang_legacy"]
    assert legacy["capture_layers"] == [2, 3, 5]  # output-convention ids with first id 1: legacy agrees
    assert [m["warning"] for m in legacy["mismatches"]] == ["uses norm_before_residual=False, the contract says True"]


def test_engines_that_attend_over_every_token_name_the_window_they_drop(tmp_path):
    """vLLM applies a sliding-window draft layer's window; llama.cpp's EAGLE-3 graph and SGLang's LlamaAttention
    (RadixAttention without sliding_window_size) attend over every token. SGLang's said nothing."""
    c = tiny_contract(sliding_window=4, capture_layers=(2, 3, 5))  # ids every engine reads alike
    write_checkpoint(tmp_path / "e", c, random_tensors(c), "eagle")
    cons = consumers(read_checkpoint(tmp_path / "e"))
    for name in ("llamacpp", "sglang", "sglang_legacy"):
        assert [m["code"] for m in cons[name]["mismatches"]] == ["consumer_full_attention"], name
        assert "its last 4 tokens" in cons[name]["mismatches"][0]["warning"]
    assert cons["vllm"]["mismatches"] == [] and any("last 4 tokens" in n for n in cons["vllm"]["notes"])


def test_embeddings_and_vocab_map_wiring(tmp_path):
    c = tiny_contract(capture_layers=(2, 3, 5), has_embeddings=True, draft_vocab_size=256)
    write_checkpoint(tmp_path / "e", c, random_tensors(c), "eagle")
    cons = consumers(read_checkpoint(tmp_path / "e"))
    assert cons["vllm"]["embeddings"] == "draft's own"
    assert cons["sglang"]["embeddings"] == "shares target's"
    sglang = [m["warning"] for m in cons["sglang"]["mismatches"]]
    assert "replaces the draft's own embed_tokens with the target's" in sglang


def test_qwen3_layer_only_loads_in_speculators_format(tmp_path):
    c = tiny_contract(layer_type="qwen3", capture_layers=(2, 3, 5))
    t = random_tensors(c)
    write_checkpoint(tmp_path / "e", c, t, "eagle")
    write_checkpoint(tmp_path / "s", c, t, "speculators")
    eagle, spec = consumers(read_checkpoint(tmp_path / "e")), consumers(read_checkpoint(tmp_path / "s"))
    assert not eagle["vllm"]["loads"] and not eagle["sglang"]["loads"]
    assert spec["vllm"]["loads"] and spec["speculators"]["loads"]


def test_the_embedded_default_is_a_target(tmp_path):
    assert target_config("default")["num_hidden_layers"] == 30  # SmolLM2-135M-Instruct, read offline


def test_the_engine_that_serves_the_draft_grades_its_mismatches_as_problems(tmp_path, target):
    """A speculators config without norm_before_residual: vLLM wires True where the contract says False.
    A warning for any engine; with --engine vllm a problem (exit 1); speculators itself reads False; SGLang
    does not read the format at all, which --engine sglang says as its one problem."""
    c = tiny_contract(capture_layers=(2, 3, 5))
    folder = _ck(tmp_path, capture_layers=(2, 3, 5))
    cfg = speculators_config(c)
    del cfg["norm_before_residual"]
    (folder / "config.json").write_text(json.dumps(cfg))
    anyone = check_checkpoint(folder, target=target)
    vllm = [w for w in anyone.warnings if w["code"] == "consumer_norm_flags"]
    assert anyone.ok and [text_of(w) for w in vllm] == ["vllm: uses norm_before_residual=True, the contract says False"]
    served = check_checkpoint(folder, target=target, engine="vllm")
    assert not served.ok and served.engine == "vllm"
    assert [(p["code"], p["problem"]) for p in served.problems] == [("consumer_norm_flags", text_of(vllm[0]))]
    assert vllm[0] not in served.warnings and len(served.warnings) == len(anyone.warnings) - 1
    assert check_checkpoint(folder, target=target, engine="speculators").ok
    sglang = check_checkpoint(folder, target=target, engine="sglang").problems
    assert [p["code"] for p in sglang] == ["consumer_cannot_load"] and "is speculators format" in sglang[0]["problem"]
    with pytest.raises(ValueError, match="engine must be one of vllm, sglang"):
        check_checkpoint(folder, engine="tgi")


@pytest.mark.parametrize("layer_type, architecture, loads, problems", [
    ("qwen3", "Eagle3Qwen3ForCausalLM", True, []),  # vLLM's Qwen3 draft (q_norm/k_norm): was refused
    ("qwen3", "Qwen3ForCausalLM", True, []),  # renamed Eagle3Qwen3ForCausalLM under method eagle3
    ("qwen3", "LlamaForCausalLMEagle3", False, ["consumer_cannot_load"]),  # the Llama draft: no parameter k_norm
    ("llama", "Eagle3Qwen3vlForCausalLM", True, []),  # a Llama draft for a Qwen3-VL target: was read as qwen3
    # loads, its q_norm/k_norm at ones: was read as a qwen3 layer missing them
    ("llama", "Eagle3Qwen3ForCausalLM", True, ["consumer_builds_qwen3"]),
])
def test_vllm_builds_the_draft_class_the_eagle_configs_architectures_name(tmp_path, layer_type, architecture, loads,
                                                                          problems):
    """vLLM 0.32 builds the class the flat config's architectures resolve to (its registry): Qwen3 layers only
    for Eagle3Qwen3ForCausalLM, Llama layers for the others, the Qwen-VL ones included (tests/test_engine_vllm.py
    serves three of these)."""
    c = tiny_contract(layer_type=layer_type)
    write_checkpoint(tmp_path / "d", c, random_tensors(c), "eagle")
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    (tmp_path / "d" / "config.json").write_text(json.dumps({**cfg, "architectures": [architecture]}))
    ckpt = read_checkpoint(tmp_path / "d")
    assert ckpt.contract.layer_type == layer_type
    view = consumers(ckpt)["vllm"]
    assert view["loads"] is loads, view["refused"]
    if not loads:
        assert "write architectures [\"Eagle3Qwen3ForCausalLM\"]" in view["refused"][0]
    assert [p["code"] for p in check_checkpoint(tmp_path / "d", engine="vllm").problems] == problems
