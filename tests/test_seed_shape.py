"""The seed's case at its real shape, on CPU: a Kimi-K2-shaped draft (7168 wide, fc reading 3 x 7168, a
61-layer target, capture [2, 30, 58]) exported as training pipelines export it (a flat config.json beside
config_speculators.json, the flat one carrying its ids one layer off), judged on a SpecForge-format cache.

The target is a stand-in: its config (61 layers, 7168 wide) and one shard holding only what eyas reads
from a target whose features are cached (embeddings, final norm, lm_head), with a small vocabulary so the
test stays within CI's budget. The draft's attention and MLP are narrowed for the same reason; its width,
fc and capture layers are the real ones.
"""

from __future__ import annotations

import json

import pytest
import torch

from cache_writers import write_specforge_records
from conftest import random_tensors
from eyas.cli import main
from eyas.contract import DraftContract, Verifier
from eyas.formats import speculators_config, write_checkpoint
from eyas.weights import write_tensors

H, N, V, DRAFT_V = 7168, 61, 4096, 1024
CAPTURE = (2, 30, 58)  # the seed's layers; SpecForge ids [1, 29, 57] ("output of layer k")
T, SAMPLES = 48, 2

pytestmark = pytest.mark.usefixtures("one_thread")


def _contract() -> DraftContract:
    return DraftContract(
        hidden_size=H, num_attention_heads=4, num_key_value_heads=1, head_dim=128, intermediate_size=256,
        vocab_size=V, draft_vocab_size=DRAFT_V, target_hidden_size=H, capture_layers=CAPTURE, rms_norm_eps=1e-6,
        rope_theta=50000.0, max_position_embeddings=4096, has_vocab_map=True,
        verifier=Verifier(name_or_path="moonshotai/Kimi-K2-Instruct", architectures=("DeepseekV3ForCausalLM",),
                          num_hidden_layers=N, hidden_size=H, vocab_size=V),
    )


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    root = tmp_path_factory.mktemp("seed")
    g = torch.Generator().manual_seed(0)
    c = _contract()
    tensors = random_tensors(c, dtype=torch.bfloat16)
    draft = write_checkpoint(root / "draft", c, tensors, "eagle")
    # the seed's folder: config_speculators.json as speculators writes it, config.json (flat) with its
    # nested ids one layer off
    (draft / "config_speculators.json").write_text(json.dumps(speculators_config(c)))
    flat = json.loads((draft / "config.json").read_text())
    flat["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [k + 1 for k in CAPTURE]
    flat.pop("eagle_aux_hidden_state_layer_ids", None)
    (draft / "config.json").write_text(json.dumps(flat))
    target = root / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "num_hidden_layers": N,
        "hidden_size": H, "vocab_size": V, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}))
    write_tensors(target, {"model.embed_tokens.weight": 0.02 * torch.randn(V, H, generator=g, dtype=torch.bfloat16),
                           "model.norm.weight": torch.ones(H, dtype=torch.bfloat16),
                           "lm_head.weight": 0.02 * torch.randn(V, H, generator=g, dtype=torch.bfloat16)})
    records = []
    for _ in range(SAMPLES):
        mask = torch.zeros(T, dtype=torch.long)
        mask[T // 3:] = 1
        records.append({"input_ids": torch.randint(0, V, (T,), generator=g), "loss_mask": mask,
                        "aux_hidden_state": torch.randn(1, T, 3 * H, generator=g, dtype=torch.bfloat16),
                        "hidden_state": torch.randn(1, T, H, generator=g, dtype=torch.bfloat16)})
    cache = root / "cache"
    write_specforge_records(cache, records)
    return draft, target, cache


def test_check_names_the_config_fault_and_which_engine_reads_which_file(seed, capsys):
    draft, target, _ = seed
    capsys.readouterr()
    assert main(["check", str(draft), "--target", str(target / "config.json"), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    codes = [p["code"] for p in rep["problems"]]
    assert "config_files_disagree_capture_layers" in codes
    text = json.dumps(rep)
    assert "config_speculators.json" in text and "config.json" in text and "3, 31, 59" in text


def test_doctor_names_the_fault_and_says_what_it_assumed_about_the_cache(seed, capsys):
    draft, target, cache = seed
    capsys.readouterr()
    code = main(["doctor", str(draft), "--target", str(target), "--features", str(cache), "--json", "--no-progress"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["verdict"] == "faulty"
    assert "config_files" in {f["fault"] for f in rep["findings"]} | {f.get("slug") for f in rep["findings"]} or \
        any("capture" in f["title"] for f in rep["findings"])
    assert rep["cache"]["format"] == "specforge" and rep["cache"]["layers_recorded"] is False
    assert "capture [2, 30, 58]" in rep["cache"]["layers"]
    assert any("--target FULL_TARGET_FOLDER" in n for n in rep["notes"])
    assert rep["cache_measured"]["positions"] > 0 and rep["cache_measured"]["verdict"] == "target"
    assert rep["cache_measured"]["longer_than_context"] == 0 and "stderr_warnings" not in rep  # nothing asked


def test_doctor_says_a_limit_the_cache_falls_short_of_and_rows_past_the_targets_context(seed, tmp_path, capsys):
    """As eval says both: the cache is measured whole where only the target's head is at hand."""
    draft, target, cache = seed
    shorter = tmp_path / "target"  # the same head, a context shorter than the cache's rows
    shorter.mkdir()
    for f in target.iterdir():
        (shorter / f.name).symlink_to(f)
    (shorter / "config.json").unlink()
    (shorter / "config.json").write_text(json.dumps({**json.loads((target / "config.json").read_text()),
                                                     "max_position_embeddings": T - 8}))
    capsys.readouterr()
    main(["doctor", str(draft), "--target", str(shorter), "--features", str(cache), "--limit", "99", "--json",
          "--no-progress"])
    rep = json.loads(capsys.readouterr().out)
    assert rep["cache_measured"]["longer_than_context"] == SAMPLES
    assert rep["stderr_warnings"] == [
        f"--limit 99: {cache} has {SAMPLES} samples; measuring those",
        f"{SAMPLES} sample(s) of {cache} are longer than the target's context ({T - 8} tokens; the longest {T}): "
        "their positions past it are measured, though no engine serves them"]


def test_eval_runs_at_the_real_width_and_reports_its_cost(seed, capsys):
    draft, target, cache = seed
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(cache), "--target", str(target), "--json", "--no-progress",
                 "--depth", "3"]) == 0
    out = capsys.readouterr()
    rep = json.loads(out.out)
    assert "stored: output of layers 1, 29, 57 = capture [2, 30, 58]" in out.err
    assert rep["capture_layers"] == list(CAPTURE) and rep["data"]["format"] == "specforge"
    assert rep["tokens"] == SAMPLES * (T - T // 3 - 1)
    cost = rep["cost"]
    assert cost["device"] == "cpu" and cost["positions_per_s"] > 0
    # SpecForge stores the state after the final norm: lm_head alone judges it (the norm was read, and listed, unused)
    assert sorted(cost["target_tensors_read"]) == ["lm_head.weight", "model.embed_tokens.weight"]


def test_doctor_without_features_or_the_full_target_reports_statically(seed, capsys):
    draft, target, _ = seed
    capsys.readouterr()
    assert main(["doctor", str(draft), "--target", str(target), "--json", "--no-progress"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert rep["cache"] is None and rep["cache_measured"] is None and rep["measured"] is None
    assert any(n.startswith("not measured: the target's weights are not all in") for n in rep["notes"])
