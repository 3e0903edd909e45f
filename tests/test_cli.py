"""The eyas CLI in-process (exit codes, --json, error lines) plus one run of the installed script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import random_tensors, tiny_contract
from eyas.cli import main
from eyas.codes import text_of
from eyas.contract import Verifier
from eyas.errors import FormatError
from eyas.formats import IDS, write_checkpoint

# --- real-size configs (config files only: the weights would be gigabytes) -----------------------

LLAMA31_8B_TARGET = {
    "_name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
LLAMA31_8B_DRAFT = {  # speculators format, as the converter writes it (reference speculators-and-vllm §1.3)
    "architectures": ["Eagle3Speculator"],
    "speculators_model_type": "eagle3",
    "speculators_config": {
        "algorithm": "eagle3",
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
        "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "architectures": ["LlamaForCausalLM"]},
    },
    "transformer_layer_config": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-05,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "vocab_size": 128256,
        "rope_theta": 500000.0,
        "rope_scaling": LLAMA31_8B_TARGET["rope_scaling"],
        "tie_word_embeddings": False,
    },
    "draft_vocab_size": 32000,
    "target_hidden_size": 4096,
    IDS: [2, 16, 29],
    "norm_before_residual": False,
    "norm_before_fc": False,
    "fc_norm": False,
    "norm_output": False,
    "embed_requires_grad": False,
    "dtype": "bfloat16",
}
KIMI_K25_TARGET = {
    "_name_or_path": "moonshotai/Kimi-K2.5",
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "vocab_size": 163840,
    "max_position_embeddings": 131072,
}
KIMI_K25_DRAFT = {  # SpecForge's kimi-k25-eagle3.json shape (reference eagle-specforge-sglang §3.2)
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "head_dim": 128,
    "num_hidden_layers": 1,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "vocab_size": 163840,
    "draft_vocab_size": 32000,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "eagle_config": {IDS: [2, 30, 58], "use_aux_hidden_state": True},
}


def _write_json(path: Path, obj: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2))
    return path


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_real_size_inspect_reports(tmp_path, capsys, pytestconfig):
    """What inspect prints for a Llama-3.1-8B and a Kimi-K2.5 draft config; saved for the report."""
    save = pytestconfig.cache.mkdir("eyas-inspect")  # .pytest_cache/d/eyas-inspect/*.txt
    cases = {
        "llama31_8b": (LLAMA31_8B_DRAFT, LLAMA31_8B_TARGET, "eagle3-llama3.1-8b/config.json"),
        "kimi_k25": (KIMI_K25_DRAFT, KIMI_K25_TARGET, "kimi-k25-eagle3/config.json"),
    }
    for name, (draft, target, rel) in cases.items():
        cfg = _write_json(tmp_path / rel, draft)
        tgt = _write_json(tmp_path / f"{name}-target" / "config.json", target)
        code, out, err = _run(capsys, "inspect", cfg, "--target", tgt)
        assert code == 0, err
        Path(save, f"{name}.txt").write_text(out.replace(str(tmp_path) + "/", ""))
        code, js, _ = _run(capsys, "inspect", cfg, "--target", tgt, "--json")
        rep = json.loads(js)
        assert rep["tensors"] is None and any("tensor checks skipped" in text_of(w) for w in rep["warnings"])
        cons = rep["consumers"]
        if name == "llama31_8b":
            assert rep["files"] == {"config.json": "speculators"}
            assert rep["contract"]["capture_layers"] == [2, 16, 29] and rep["contract"]["rope_theta"] == 500000.0
            assert cons["vllm"]["capture_layers"] == [2, 16, 29] and cons["vllm"]["loads"]
            assert cons["sglang"]["loads"] is False and cons["speculators"]["loads"]
        else:
            assert rep["files"] == {"config.json": "eagle"}
            assert rep["contract"]["capture_layers"] == [2, 30, 58] and rep["contract"]["head_dim"] == 128
            assert cons["sglang"]["capture_layers"] == [2, 30, 58] and cons["sglang_legacy"]["capture_layers"] == [
                3,
                31,
                59,
            ]
            assert cons["vllm"]["capture_layers"] == [2, 30, 58]  # the default for 61 layers happens to agree
            texts = [text_of(w) for w in rep["warnings"]]
            assert "sglang_legacy: captures [3, 31, 59], the contract says [2, 30, 58]" in texts
            assert any(w["code"] == "layer_ids_convention_assumed" for w in rep["warnings"])
        assert "consumers:" in out and "warnings:" in out


# --- normal use ---------------------------------------------------------------------------------


@pytest.fixture
def ckpt(tmp_path):
    c = tiny_contract(capture_layers=(2, 3, 5))
    write_checkpoint(tmp_path / "ck", c, random_tensors(c), "eagle")
    return tmp_path / "ck"


def test_inspect_json_has_the_agreed_keys(ckpt, capsys):
    code, out, err = _run(capsys, "inspect", ckpt, "--json")
    assert code == 0 and err == ""
    rep = json.loads(out)
    assert {"files", "contract", "consumers", "warnings"} <= set(rep)
    assert rep["files"] == {"config.json": "eagle"} and rep["contract"]["capture_layers"] == [2, 3, 5]
    assert set(rep["consumers"]) == {"vllm", "sglang", "sglang_legacy", "speculators", "llamacpp"}
    assert rep["tensors"]["count"] == 15 and rep["tensors"]["tensors"]["fc.weight"]["shape"] == [64, 192]
    code, text, _ = _run(capsys, "inspect", ckpt)
    assert (
        code == 0
        and "capture_layers [2, 3, 5]" in text
        and "midlayer" not in text.split("consumers:")[0].split("tensors:")[1]
    )


def test_convert_then_check(tmp_path, ckpt, capsys):
    code, out, err = _run(capsys, "convert", ckpt, tmp_path / "both", "--format", "both", "--json")
    assert code == 0 and "reading" in err
    rep = json.loads(out)
    assert rep["files"] == ["config.json", "config_eagle.json", "model.safetensors"] and rep["tensors"] == 15
    code, out, _ = _run(capsys, "convert", ckpt, tmp_path / "both", "--format", "eagle")
    assert code == 2
    target = _write_json(
        tmp_path / "t" / "config.json",
        {"num_hidden_layers": 6, "hidden_size": 64, "vocab_size": 256, "architectures": ["LlamaForCausalLM"]},
    )
    code, out, _ = _run(capsys, "check", tmp_path / "both", "--target", target.parent)
    assert code == 0 and out.startswith(f"{tmp_path / 'both'}: ok")
    code, out, _ = _run(capsys, "check", tmp_path / "both", "--target", target, "--json")
    assert code == 0 and json.loads(out)["ok"] is True


def test_check_without_a_draft_names_the_target_as_given(tmp_path, capsys):
    """No draft and none shipped for a lone target config: the error names the file typed, not its folder."""
    target = _write_json(tmp_path / "t" / "config.json", LLAMA31_8B_TARGET)
    code, _, err = _run(capsys, "check", "--target", target)
    assert code == 2 and f"error: no draft given and eyas ships none for the target {target}: it ships one for " \
        "HuggingFaceTB/SmolLM2-135M-Instruct (known by that name: the embedded default target" in err
    code, _, err = _run(capsys, "check", "default", "--target", target)  # said as asked
    assert code == 2 and err.startswith("error: the draft 'default' is the one eyas ships for HuggingFaceTB/")
    assert f"left out), not for the target {target}\n" in err


def test_check_engine_exits_1_on_what_that_engine_would_wire_otherwise(tmp_path, capsys):
    c = tiny_contract(capture_layers=(2, 3, 5))
    write_checkpoint(tmp_path / "ck", c, random_tensors(c), "speculators")
    cfg = json.loads((tmp_path / "ck" / "config.json").read_text())
    del cfg["norm_before_residual"]  # vLLM then wires True
    (tmp_path / "ck" / "config.json").write_text(json.dumps(cfg))
    assert _run(capsys, "check", tmp_path / "ck")[0] == 0
    code, out, _ = _run(capsys, "check", tmp_path / "ck", "--engine", "vllm", "--json")
    rep = json.loads(out)
    assert code == 1 and rep["engine"] == "vllm" and not rep["ok"]
    assert [p["code"] for p in rep["problems"]] == ["consumer_norm_flags"]
    code, out, _ = _run(capsys, "check", tmp_path / "ck", "--engine", "llamacpp")
    assert code == 0 and out.startswith(f"{tmp_path / 'ck'}: ok to serve with llamacpp")
    assert _run(capsys, "check", tmp_path / "ck", "--engine", "tgi")[0] == 2


def test_convert_records_the_verifier(tmp_path, capsys):
    c = tiny_contract(capture_layers=None, verifier=Verifier())
    write_checkpoint(tmp_path / "ck", c, random_tensors(c), "eagle")  # no ids, no verifier: as EAGLE ships
    target = _write_json(tmp_path / "t" / "config.json", LLAMA31_8B_TARGET | {"num_hidden_layers": 8})
    code, out, _ = _run(capsys, "check", tmp_path / "ck")
    assert code == 0
    code, out, err = _run(
        capsys,
        "convert",
        tmp_path / "ck",
        tmp_path / "s",
        "--format",
        "speculators",
        "--json",
        "--target",
        target.parent,
        "--verifier-name",
        "org/target",
    )
    assert code == 0, err
    rep = json.loads(out)
    assert rep["contract"]["capture_layers"] is None  # unnamed as in the source: engines pick per target
    assert "capture_layers_not_recorded" not in [p["code"] for p in rep["problems"]]  # check --target says none
    assert rep["contract"]["verifier"]["name_or_path"] == "org/target"
    assert rep["contract"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert any("assuming the engines' default [2, 4, 5]" in text_of(w) for w in rep["warnings"])
    cfg = json.loads((tmp_path / "s" / "config.json").read_text())
    assert cfg[IDS] is None and cfg["speculators_config"]["verifier"]["name_or_path"] == "org/target"


def test_convert_lists_what_check_will_say_of_the_copy_against_its_target(tmp_path, capsys):
    """The source names a Llama verifier; --target is a Qwen3 model: the copy keeps the source's verifier
    (and the flag's name), and convert says what check --target will (another architecture)."""
    c = tiny_contract(capture_layers=(2, 3, 5))
    write_checkpoint(tmp_path / "ck", c, random_tensors(c), "eagle")
    target = _write_json(tmp_path / "q" / "config.json", {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 256,
                                                          "num_hidden_layers": 8, "hidden_size": 64})
    code, out, _ = _run(capsys, "convert", tmp_path / "ck", tmp_path / "s", "--format", "speculators", "--target",
                        target.parent, "--verifier-name", "Qwen/Qwen3-8B", "--json")
    rep = json.loads(out)
    assert code == 0 and rep["contract"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    assert [p["code"] for p in rep["problems"]] == ["target_architectures"]
    check = json.loads(_run(capsys, "check", tmp_path / "s", "--target", target.parent, "--json")[1])
    assert [p["code"] for p in check["problems"]] == ["target_architectures"]


def test_check_json_lists_problems_exit_1(tmp_path, ckpt, capsys):
    target = _write_json(tmp_path / "t.json", {"num_hidden_layers": 4, "hidden_size": 64, "vocab_size": 512})
    code, out, _ = _run(capsys, "check", ckpt, "--target", target, "--json")
    rep = json.loads(out)
    assert code == 1 and rep["ok"] is False
    assert {p["field"] for p in rep["problems"]} == {"vocab_size", IDS}
    code, out, _ = _run(capsys, "check", ckpt, "--target", target)
    assert code == 1 and "fix:" in out and "[vocab_size]" in out


def test_layer_convention_flag(tmp_path, capsys):
    flat = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
        "draft_vocab_size": 64,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "eagle_config": {IDS: [2, 3, 5]},
    }
    path = _write_json(tmp_path / "d.json", flat)
    for conv, want in ((None, [2, 3, 5]), ("input", [2, 3, 5]), ("output", [3, 4, 6])):
        code, out, _ = _run(capsys, "inspect", path, "--json", *(["--layer-convention", conv] if conv else []))
        assert code == 0 and json.loads(out)["contract"]["capture_layers"] == want
    assert _run(capsys, "check", path, "--layer-convention", "sideways")[0] == 2


def test_help_shows_examples(capsys):
    for cmd in ("inspect", "convert", "check"):
        code, out, _ = _run(capsys, cmd, "--help")
        assert code == 0 and "examples:" in out and out.count(f"eyas {cmd} ") >= 2
    assert _run(capsys)[0] == 2  # no command: usage error


# --- bad input: exit 2 (inspect, convert) or listed (check); one line naming file and field ----


def _good(tmp_path, fmt="speculators"):
    c = tiny_contract()
    write_checkpoint(tmp_path / "ck", c, random_tensors(c), fmt)
    return tmp_path / "ck", c


def _weights(path, c, **changes):
    t = random_tensors(c)
    t.update(changes)
    save_file(t, str(path / "model.safetensors"))


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled!",))


def _bad_malformed(p, c):
    (p / "config.json").write_text('{"speculators_model_type": "eagle3",,}')


def _bad_empty(p, c):
    (p / "config.json").write_text("  \n")


def _bad_neither(p, c):
    (p / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))


def _bad_no_config(p, c):
    (p / "config.json").unlink()


def _bad_no_weights(p, c):
    (p / "model.safetensors").unlink()


def _bad_truncated(p, c):
    data = (p / "model.safetensors").read_bytes()
    (p / "model.safetensors").write_bytes(data[: len(data) - 7])


def _bad_shape(p, c):
    _weights(p, c, **{"fc.weight": torch.zeros(64, 256)})


def _bad_d2t_range(p, c):
    _weights(p, c, d2t=torch.arange(64, dtype=torch.int64) * 10)


def _bad_d2t_order(p, c):
    _weights(p, c, d2t=-torch.arange(64, dtype=torch.int64))


def _bad_t2d_count(p, c):
    _weights(p, c, t2d=torch.zeros(256, dtype=torch.bool))


def _bad_disagree(p, c):
    cfg = json.loads((p / "config.json").read_text())
    cfg["draft_vocab_size"] = 32
    (p / "config_speculators.json").write_text(json.dumps(cfg))


def _bad_bom(p, c):  # SpecForge's qwen3-32b/4b configs at b185edc0 start with one; transformers refuses them too
    (p / "config.json").write_text("\ufeff" + (p / "config.json").read_text(), encoding="utf-8")


def _bad_pickle(p, c):
    (p / "model.safetensors").unlink()
    torch.save({"fc.weight": torch.ones(1), "x": _Evil()}, p / "pytorch_model.bin")


BAD = {  # name: (damage, file named, field named, exit code of check)
    "malformed json": (_bad_malformed, "config.json", "line 1, column", 2),
    "empty json": (_bad_empty, "config.json", "empty", 2),
    "neither format": (_bad_neither, "config.json", "speculators_model_type", 2),
    "no config": (_bad_no_config, "ck", "config.json", 2),
    "no weights": (_bad_no_weights, "ck", "model.safetensors", 1),
    "truncated safetensors": (_bad_truncated, "model.safetensors", "safetensors", 2),  # unreadable: exit 2
    "shape contradicts config": (_bad_shape, "model.safetensors", "fc.weight", 1),
    "d2t out of range": (_bad_d2t_range, "model.safetensors", "d2t", 1),
    "d2t not increasing": (_bad_d2t_order, "model.safetensors", "d2t", 1),
    "t2d count": (_bad_t2d_count, "model.safetensors", "t2d", 1),
    "byte-order mark": (_bad_bom, "config.json", "UTF-8 BOM", 2),
    "pickle refused": (_bad_pickle, "pytorch_model.bin", "weights_only", 2),  # unreadable: exit 2
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input(tmp_path, capsys, case):
    damage, file_, field_, check_code = BAD[case]
    path, c = _good(tmp_path)
    damage(path, c)
    code, out, err = _run(capsys, "convert", path, tmp_path / "out", "--format", "eagle")
    lines = err.strip().splitlines()
    assert code == 2 and out == "", (case, err)
    assert lines[-2].startswith("error: ") and lines[-1].startswith("hint: ") and "Traceback" not in err
    assert file_ in lines[-2] and field_ in lines[-2], lines[-2]
    assert not (tmp_path / "out").exists()  # nothing written
    for verb in ("check", "inspect"):  # inspect shows what check diagnoses, and exits as check does
        code, out, err = _run(capsys, verb, path, "--json")
        assert code == check_code, (case, verb, out, err)
        if check_code == 1:
            text = json.dumps(json.loads(out)["problems"])
            assert file_ in text and field_ in text
        else:
            assert f"{file_}" in err and field_ in err


def test_disagreeing_configs_are_shown_refused_by_convert_and_graded_by_check(tmp_path, capsys):
    """inspect shows any folder it can read, and exits as check does; convert would drop one file's word;
    check lists the problem."""
    path, c = _good(tmp_path)
    _bad_disagree(path, c)
    code, out, err = _run(capsys, "inspect", path, "--json")
    rep = json.loads(out)
    assert code == 1 and rep["files"] == {"config.json": "speculators", "config_speculators.json": "speculators"}
    assert [(d["code"], d["field"]) for d in rep["disagreements"]] == [
        ("config_files_disagree_vocab", "draft_vocab_size")
    ]
    code, text, _ = _run(capsys, "inspect", path)
    assert code == 1 and "disagreements (the contract is read from config.json):" in text
    assert "problem [draft_vocab_size] config_speculators.json and config.json disagree on draft_vocab_size" in text
    code, out, err = _run(capsys, "convert", path, tmp_path / "out", "--format", "eagle")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and lines[-2].startswith("error: ") and lines[-1].startswith("hint: ")
    assert "config_speculators.json" in lines[-2] and "draft_vocab_size" in lines[-2]
    assert not (tmp_path / "out").exists()
    code, out, _ = _run(capsys, "check", path, "--json")
    text = json.dumps(json.loads(out)["problems"])
    assert code == 1 and "config_speculators.json" in text and "draft_vocab_size" in text


def test_seed_folder_with_a_flat_config_beside_the_speculators_one_is_shown(tmp_path, capsys):
    """The shipped draft's flat config as config.json, another context length in it, beside its
    speculators config: a context length does not change the draft, so it is a warning."""
    from eyas.drafter_loading import resolve_drafter

    shipped = resolve_drafter(None)
    folder = tmp_path / "seed"
    folder.mkdir()
    flat = json.loads((shipped / "config_eagle.json").read_text()) | {"max_position_embeddings": 2048}
    _write_json(folder / "config.json", flat)
    (folder / "config_speculators.json").write_text((shipped / "config.json").read_text())
    (folder / "model.safetensors").symlink_to(shipped / "model.safetensors")
    code, out, err = _run(capsys, "inspect", folder, "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["files"] == {"config.json": "eagle", "config_speculators.json": "speculators"}
    assert rep["config_used"] == "config_speculators.json"
    assert [(d["code"], "warning" in d) for d in rep["disagreements"]] == [("config_files_disagree_context", True)]
    code, text, _ = _run(capsys, "inspect", folder)
    assert "disagreements (the contract is read from config_speculators.json):" in text
    assert "warning [max_position_embeddings]" in text and "2048" in text
    assert "config.json disagrees on max_position_embeddings" in text  # the reason says it too
    assert _run(capsys, "check", folder)[0] == 0


def test_dst_inside_src(tmp_path, capsys):
    path, _ = _good(tmp_path)
    code, _, err = _run(capsys, "convert", path, path / "sub", "--format", "eagle")
    assert code == 2 and "DST is inside SRC" in err and str(path / "sub") in err
    code, _, err = _run(capsys, "convert", path, path, "--format", "eagle")  # said as that, not "not empty"
    assert code == 2 and f"{path} (DST) is {path} (SRC)" in err
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]


def test_debug_env_reraises(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EYAS_DEBUG", "1")
    with pytest.raises(FormatError):
        main(["inspect", str(tmp_path / "missing")])


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_stdout_the_machine_refuses_is_one_line(ckpt, tmp_path, json_flag):
    """`> /dev/full`: every write fails with ENOSPC, as on a full disk; said in one line, exit 2. An error's
    own JSON object that stdout refuses leaves the error's lines alone on stderr."""
    exe = Path(sys.executable).parent / "eyas"
    with open("/dev/full", "w") as full:
        run = subprocess.run([exe, "inspect", ckpt, *json_flag], stdout=full, stderr=subprocess.PIPE, text=True,
                             timeout=120)
        failed = subprocess.run([exe, "check", tmp_path / "nothing", *json_flag], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.splitlines() == ["error: cannot write the output: No space left on device",
                                       "hint: free space where standard output goes, or send it elsewhere"]
    assert failed.returncode == 2 and [line.split(":")[0] for line in failed.stderr.splitlines()] == ["error", "hint"]


def test_installed_script(ckpt, tmp_path):
    exe = Path(sys.executable).parent / "eyas"
    ok = subprocess.run([exe, "inspect", ckpt, "--json"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["files"] == {"config.json": "eagle"}
    bad = subprocess.run([exe, "check", tmp_path / "nothing"], capture_output=True, text=True, timeout=120)
    assert (
        bad.returncode == 2 and bad.stdout == "" and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr
    )


def test_a_reader_that_leaves_early_ends_it_quietly(ckpt):
    """`eyas inspect | head`: the pipe is closed before eyas prints (it is still starting); no traceback
    and no "Exception ignored" at exit, exit 141 as SIGPIPE ends `cat`."""
    proc = subprocess.Popen([sys.executable, "-m", "eyas", "inspect", str(ckpt)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and err == b"", err.decode()[-2000:]


def test_every_json_output_is_strict_json(capsys):
    """NaN and infinities print as null in every verb's --json (one printer), never as bare NaN."""
    from eyas.cli.output import print_json

    print_json({"a": float("nan"), "b": [1.5, float("inf"), (float("-inf"), 2)], "c": {"d": float("nan")}})
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert out == {"a": None, "b": [1.5, None, [None, 2]], "c": {"d": None}}
