"""Every published EAGLE-3 draft config in tests/data/configs reads, and says one thing per engine.

The corpus is real configs written by six trainers and converters (tests/data/configs/SOURCES.md).
Per file: inspect and check read it (exit 0 or 1, never 2), the contract's capture layers, and what
each engine's view says it captures (`TABLE`). Across the corpus: no statement about an engine is made
outside that engine's view (so no warning can contradict it), the view's own statements agree with its
capture layers, and every SGLang statement names the source it was read from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import tiny_contract
from eyas.check import check_checkpoint, consumers
from eyas.cli import main
from eyas.cli.checkpoint import inspect_report
from eyas.codes import text_of
from eyas.drafter import Drafter
from eyas.errors import ContractError
from eyas.formats import read_checkpoint

CORPUS = Path(__file__).parent / "data" / "configs"
X = "no load"  # the view says the engine cannot load the draft
N = None  # the engine captures its default (2, N//2, N-3) of the target it serves (no --target here)
ENGINES = ("vllm", "sglang", "sglang_legacy", "speculators", "llamacpp")

# file: (format, contract capture_layers, layer_type, eyas runs it, {engine: capture per its view})
TABLE: dict[str, tuple] = {
    "angelslim/cosyvoice3-llm-eagle3.json": ("eagle", None, "llama", True, (X, X, X, X, X)),
    "angelslim/hunyuan-7b-eagle3.json": ("eagle", None, "llama", True, (N, X, X, X, N)),
    "angelslim/hunyuan-1.8b-eagle3-ntk-alpha.json": ("eagle", None, "llama", True, (N, X, X, X, N)),
    "angelslim/qwen2-audio-7b-eagle3.json": ("eagle", None, "llama", True, (N, X, X, X, N)),
    "angelslim/qwen2.5-vl-7b-eagle3-mrope.json": ("eagle", None, "llama", False, (N, X, X, X, N)),
    "angelslim/qwen3-8b-eagle3.json": ("eagle", None, "llama", True, (N, X, X, X, N)),
    "angelslim/qwen3-vl-8b-eagle3-mrope.json": ("eagle", None, "llama", False, (N, X, X, X, N)),
    "safeailab-eagle/traineagle3-config.json": ("eagle", None, "llama", True, (N, X, X, X, N)),
    "safeailab-eagle/traineagle3-config-pr326-granite.json": ("eagle", None, "llama", False, (N, X, X, X, N)),
    "specforge/deepseek-r1-eagle3.json": ("eagle", None, "deepseek_v3", False, (X, X, X, X, X)),
    "specforge/deepseek-v2-lite-eagle3.json": ("eagle", None, "llama", True, (N, N, N, X, N)),
    "specforge/deepseek-v3-671b-eagle3.json": (
        "eagle", [2, 30, 58], "llama", True, ([1, 29, 57], [2, 30, 58], [2, 30, 58], X, N)),
    "specforge/gpt-oss-120B-eagle3.json": (
        "eagle", [2, 18, 34], "llama", True, ([1, 17, 33], [2, 18, 34], [2, 18, 34], X, N)),
    "specforge/kimi-k2-eagle3-nextn.json": ("eagle", None, "kimi_k2", False, (X, X, X, X, X)),
    "specforge/kimi-k2-eagle3.json": (
        "eagle", [2, 30, 58], "llama", True, ([2, 30, 58], [2, 30, 58], [3, 31, 59], X, N)),
    "specforge/kimi-k25-eagle3.json": (
        "eagle", [2, 30, 58], "llama", True, ([2, 30, 58], [2, 30, 58], [3, 31, 59], X, N)),
    "specforge/llama3-8B-eagle3.json": ("eagle", None, "llama", True, (N, N, N, X, N)),
    "specforge/longcat-flash-eagle3.json": ("eagle", None, "llama", True, (N, N, N, X, N)),
    "specforge/phi4-eagle3.json": ("eagle", None, "llama", True, (N, N, N, X, N)),
    "specforge/qwen2-5-vl-7b-eagle3.json": ("eagle", None, "llama", False, (N, N, N, X, N)),
    "specforge/qwen3-235B-A22B-eagle3.json": (
        "eagle", [2, 47, 91], "llama", True, ([1, 46, 90], [2, 47, 91], [2, 47, 91], X, N)),
    "specforge/qwen3-30B-A3B-eagle3-moe-draft.json": ("eagle", [2, 24, 45], "qwen3_moe", False, (X, X, X, X, X)),
    "specforge/qwen3-30B-A3B-eagle3.1.json": ("eagle", None, "llama", True, (N, N, N, X, N)),
    "specforge/qwq-32B-eagle3.json": ("eagle", None, "llama", True, (N, N, N, X, N)),
    "speculators-research/llama3_8_B.json": ("eagle", None, "llama", True, (N, X, X, X, N)),
    "speculators-research/qwen3config.json": ("eagle", None, "llama", True, (N, X, X, X, N)),
    "speculators-research/llama33_70b_head_k3.json": ("eagle", None, "llama", True, (N, X, X, X, N)),
    "speculators/issue-1065-qwen3moe-eagle3.json": (
        "speculators", [2, 46, 91, 93], "llama", True, (X, X, X, [2, 46, 91, 93], X)),
    "torchspec/kimi_k25_eagle3.json": ("eagle", None, "llama", True, (N, N, N, X, X)),  # no draft_vocab_size
    "torchspec/kimi_k25_eagle3_mla.json": ("eagle", [2, 30, 58], "kimi_k2", False, (X, [2, 30, 58], [2, 30, 58], X, X)),
    "torchspec/minimax_m25_eagle3.json": ("eagle", None, "llama", True, (N, N, N, X, X)),  # no draft_vocab_size
    "torchspec/qwen3_8b_eagle3.json": ("eagle", None, "llama", True, (N, N, N, X, N)),
    "torchspec/qwen3_8b_eagle3_mla.json": ("eagle", None, "deepseek_v3", False, (X, N, N, X, X)),
    "angelslim/qwen3-4b-eagle3-arch-typo.json": ("eagle", None, "llama", True, (X, X, X, X, X)),
    "specforge/gemma3-27b-eagle3-aux-norm.json": (
        "eagle", [2, 30, 62], "llama", True, ([1, 29, 61], [2, 30, 62], [2, 30, 62], X, N)),
    "specforge/gemma4-26b-a4b-eagle3.json": (
        "eagle", [5, 17, 29], "llama", True, ([5, 17, 29], [5, 17, 29], [6, 18, 30], X, N)),
    "specforge/qwen3-8b-peagle.json": ("eagle", None, "llama", False, (X, X, X, X, X)),
    "specforge/qwen3-vl-235b-eagle3.json": (
        "eagle", [3, 46, 90], "llama", False, ([3, 46, 90], [3, 46, 90], [4, 47, 91], X, N)),
    "specforge/qwen3-vl-8b-eagle3-mrope-default.json": (
        "eagle", [3, 17, 32], "llama", False, ([3, 17, 32], [3, 17, 32], [4, 18, 33], X, N)),
    "specforge/qwq-32B-eagle3-2ec57dd3.json": ("eagle", None, "llama", True, (X, X, X, X, X)),
    "specforge/step-3.5-flash-eagle3.json": (
        "eagle", [4, 20, 40], "llama", True, ([4, 20, 40], [4, 20, 40], [5, 21, 41], X, N)),
}
FILES = sorted(TABLE)


def _path(name: str) -> Path:
    return CORPUS / name


def test_the_corpus_is_what_the_table_and_sources_list():
    on_disk = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.glob("*/*.json"))
    assert on_disk == FILES
    assert len(FILES) >= 20 and len({f.split("/")[0] for f in FILES}) >= 6
    sources = (CORPUS / "SOURCES.md").read_text()
    assert all(f"| {f} |" in sources for f in FILES)


@pytest.mark.parametrize("name", FILES)
def test_each_file_reads_with_its_capture_layers_per_engine(name):
    fmt, capture, layer_type, runs, per_engine = TABLE[name]
    ckpt = read_checkpoint(_path(name))
    c = ckpt.contract
    assert (ckpt.files[ckpt.config_used], c.capture_layers and list(c.capture_layers)) == (fmt, capture)
    assert (c.layer_type, c.unsupported is None) == (layer_type, runs)
    views = consumers(ckpt)
    said = tuple(views[e]["capture_layers"] if views[e]["loads"] else X for e in ENGINES)
    assert said == per_engine


@pytest.mark.parametrize("name", FILES)
def test_inspect_and_check_read_every_file(name, capsys):
    assert main(["inspect", str(_path(name)), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["contract"]["unsupported"] == (None if TABLE[name][3] else rep["contract"]["unsupported"])
    assert main(["check", str(_path(name))]) in (0, 1)


_ENGINE_NAME = re.compile(r"vLLM|SGLang|SpecForge|llama\.cpp|\bspeculators\b")
_FORMAT_WORDS = re.compile(r"--format (?:speculators|eagle|both)|speculators[ _](?:format|config|model_type)")


def _names_an_engine(text: str) -> bool:
    return bool(_ENGINE_NAME.search(_FORMAT_WORDS.sub("", text)))


@pytest.mark.parametrize("name", FILES)
def test_one_truth_per_engine(name):
    """Statements about an engine live in its view only, and agree with what that view says it captures."""
    ckpt = read_checkpoint(_path(name))
    views = consumers(ckpt)
    rep = inspect_report(ckpt)
    checked = check_checkpoint(_path(name))
    assert rep["warnings"] == [w for w in checked.warnings if w["code"] != "target_not_given"]  # the same warnings
    for f in rep["warnings"] + checked.warnings + checked.problems:
        text = text_of(f)
        head = text.split(": ", 1)[0]
        if head in views:  # derived from that engine's view (eyas.check.consumers.consumer_warnings)
            assert f in [m for m in views[head]["mismatches"]] or any(
                text == f"{head}: {text_of(m)}" for m in views[head]["mismatches"])
        else:
            assert not _names_an_engine(text), text
    for engine, r in views.items():
        statements = [*r["notes"][1:], *(text_of(m) for m in r["mismatches"])]
        for s in statements:
            for listed in re.findall(r"captures (\[[\d, ]+\])", s):
                assert json.loads(listed) == r["capture_layers"], (engine, s)
        assert r["loads"] or {m["code"] for m in r["mismatches"]} <= {"consumer_cannot_load"}, engine  # its refusal
        if engine.startswith("sglang"):
            cited = [s for s in r["notes"][1:] if "[sglang " not in s and "PR #" not in s]
            assert not cited, cited  # every SGLang statement names its source
    assert "vLLM ignores these ids" not in json.dumps(rep)


def test_model_type_is_a_warning_and_the_layer_comes_from_architectures():
    ckpt = read_checkpoint(_path("specforge/phi4-eagle3.json"))
    (w,) = [w for w in ckpt.warnings if w["code"] == "layer_type_unknown"]
    assert "'phi3'" in text_of(w) and "LlamaForCausalLMEagle3" in text_of(w)
    assert ckpt.contract.layer_type == "llama" and ckpt.contract.unsupported is None


@pytest.mark.parametrize("name, part", [
    ("specforge/qwen3-30B-A3B-eagle3-moe-draft.json", "mixture-of-experts MLP (128 experts)"),
    ("specforge/deepseek-r1-eagle3.json", "multi-head latent attention (kv_lora_rank 512)"),
    ("torchspec/kimi_k25_eagle3_mla.json", "multi-head latent attention"),
    ("specforge/kimi-k2-eagle3-nextn.json", "NextN/MTP layer"),
    ("specforge/qwen2-5-vl-7b-eagle3.json", "multimodal rope (rope type 'mrope', mrope_section [16, 24, 24])"),
])
def test_drafts_eyas_cannot_run_are_read_and_refused_by_name(name, part):
    ckpt = read_checkpoint(_path(name))
    assert part in ckpt.contract.unsupported
    assert any(w["code"] == "draft_not_runnable" for w in ckpt.warnings)
    with pytest.raises(ContractError, match=re.escape(part)):
        Drafter.from_tensors(ckpt.contract, {})


def test_inspect_states_no_head_dim_for_latent_attention(tmp_path, capsys):
    """An MLA layer has a query/key head (qk_nope + qk_rope) and a value head, no one head_dim: inspect's layer row
    names none rather than hidden / heads (56 here), a size nothing in the draft has."""
    (tmp_path / "config.json").write_bytes(_path("specforge/deepseek-r1-eagle3.json").read_bytes())
    main(["inspect", str(tmp_path)])
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("layer ")]
    assert "heads 128 / kv 128, intermediate 18432" in row and "head_dim" not in row, row


def test_a_run_verb_refuses_an_unrunnable_draft_in_one_line(tmp_path, capsys):
    """eyas generate on a MoE draft whose dims fit the embedded target: refused, exit 2, naming the part."""
    from safetensors.torch import save_file

    cfg = json.loads(_path("specforge/qwen3-30B-A3B-eagle3-moe-draft.json").read_text())
    cfg.update(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64, intermediate_size=64,
               vocab_size=49152, draft_vocab_size=49152, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 14, 26]})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({"layers.0.mlp.experts.0.up_proj.weight": torch.zeros(2, 2), "fc.weight": torch.zeros(576, 1728)},
              str(tmp_path / "model.safetensors"))
    assert main(["generate", str(tmp_path), "--prompt", "hi", "--max-new-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert "mixture-of-experts MLP" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert main(["convert", str(tmp_path), str(tmp_path.parent / "converted"), "--format", "eagle"]) == 2
    assert "cannot convert this draft losslessly: it has a mixture-of-experts MLP" in capsys.readouterr().err


def test_fields_real_files_use():
    """dtype and torch_dtype, rope_parameters, mrope sections, eos lists, ModelOpt keys, tied embeddings."""
    hunyuan = read_checkpoint(_path("angelslim/hunyuan-7b-eagle3.json"))
    assert any(w["code"] == "tie_word_embeddings" for w in hunyuan.warnings)
    small = read_checkpoint(_path("angelslim/hunyuan-1.8b-eagle3-ntk-alpha.json"))  # NTK-alpha: read and run
    (alpha,) = [w for w in small.warnings if w["code"] == "rope_alpha"]
    assert "10000*1000^(128/126) = 1.116e+07" in text_of(alpha) and small.contract.unsupported is None
    assert "consumer_ties_lm_head" not in json.dumps(consumers(hunyuan))  # SGLang does not load its class
    vl = read_checkpoint(_path("specforge/qwen2-5-vl-7b-eagle3.json")).contract
    assert vl.rope_scaling == {"type": "mrope", "mrope_section": [16, 24, 24]}
    research = read_checkpoint(_path("speculators-research/llama3_8_B.json")).contract  # eos_token_id list
    assert research.rope_scaling["rope_type"] == "llama3" and research.draft_vocab_size == 32000
    mla = read_checkpoint(_path("torchspec/kimi_k25_eagle3_mla.json")).contract  # ModelOpt eagle_config keys
    assert mla.capture_layers == (2, 30, 58)


def test_text_config_nesting_and_dtype_conflict(tmp_path):
    cfg = json.loads(_path("specforge/llama3-8B-eagle3.json").read_text())
    layer = {k: cfg.pop(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                     "intermediate_size", "vocab_size", "max_position_embeddings")}
    cfg.update(text_config=layer, dtype="bfloat16")  # torch_dtype float16 stays
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ckpt = read_checkpoint(tmp_path / "config.json")
    assert ckpt.contract.hidden_size == 4096 and "text_config.hidden_size" in ckpt.origin["hidden_size"]
    assert any(w["code"] == "dtype_conflict" for w in ckpt.warnings)


def test_modelopt_layout_flags_name_what_eyas_lacks(tmp_path):
    c = tiny_contract()
    from eyas.formats import eagle_config

    cfg = eagle_config(c)
    cfg["eagle_config"].update(use_input_layernorm_in_first_layer=True, use_last_layernorm=False)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    unsupported = read_checkpoint(tmp_path / "config.json").contract.unsupported
    assert unsupported == "missing final norm before lm_head (eagle_config.use_last_layernorm false)"


def test_a_specforge_aux_norm_config_is_read_as_fc_norm_and_every_engine_is_said_to_miss_it():
    ckpt = read_checkpoint(_path("specforge/gemma3-27b-eagle3-aux-norm.json"))
    assert ckpt.contract.fc_norm and "use_aux_norm" in ckpt.origin["fc_norm"]
    said = {name for name, r in consumers(ckpt).items() for m in r["mismatches"] if m["field"] == "fc_norm"}
    assert said == {"vllm", "sglang", "sglang_legacy", "llamacpp"}
