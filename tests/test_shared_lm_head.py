"""A full-vocab draft that ships no lm_head.weight reads the target's lm_head (eyas.borrowed), as vLLM
and SGLang serve such drafts (SpecForge's --reuse-target-lm-head and speculators train on the target's
frozen head). Read, checked, converted for each engine and run with the target's matrix; a reduced-vocab
draft without lm_head is still missing a tensor.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_data import save_tiny_target

from conftest import random_tensors
from eyas.check import consumers
from eyas.cli import main
from eyas.codes import text_of
from eyas.contract import contract_for_target
from eyas.drafter_loading import load_drafter
from eyas.formats import convert_checkpoint, read_checkpoint, write_checkpoint
from eyas.target import target_config


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_tiny_target(tmp_path_factory.mktemp("target"))  # lm_head not tied to embed_tokens


@pytest.fixture
def shared(target, tmp_path):
    """A draft for the tiny target over its whole vocab, without lm_head.weight, in eyas's eagle format."""
    c = contract_for_target(target_config(target), capture_layers=(2, 3, 4)).replace(has_lm_head=False)
    return write_checkpoint(tmp_path / "shared", c, random_tensors(c), "eagle")


def test_read_and_run_with_the_targets_lm_head(shared, target, capsys):
    ckpt = read_checkpoint(shared)
    assert not ckpt.contract.has_lm_head and ckpt.problems == []
    (w,) = [w for w in ckpt.warnings if w["code"] == "lm_head_shared"]
    assert "eyas reads the target's lm_head" in text_of(w)
    drafter = load_drafter(shared, target=target)
    head = load_file(target / "model.safetensors")["lm_head.weight"]
    assert torch.equal(drafter.lm_head.weight, head) and "lm_head.weight" not in drafter.state_dict()
    assert main(["check", str(shared), "--target", str(target)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(shared)]) == 0
    assert "lm_head        none (the target's is used)  <- tensors: lm_head.weight absent\n" in capsys.readouterr().out


def test_each_format_is_written_for_the_engines_that_share_the_head(shared, tmp_path):
    """eagle: no draft_vocab_size, so SGLang loads the target's lm_head (llama.cpp's converter then does
    not detect EAGLE-3); speculators: draft_vocab_size, read by llama.cpp; vLLM shares it from either."""
    assert "draft_vocab_size" not in json.loads((shared / "config.json").read_text())
    spec = convert_checkpoint(shared, tmp_path / "spec", "speculators")[1]
    assert json.loads((spec.path / "config.json").read_text())["draft_vocab_size"] == 48
    assert spec.contract == read_checkpoint(shared).contract
    eagle, speculators = consumers(read_checkpoint(shared)), consumers(read_checkpoint(spec.path))
    for views in (eagle, speculators):
        assert any("shares the target's lm_head" in n for n in views["vllm"]["notes"])
    assert eagle["sglang"]["mismatches"] == [] and not eagle["llamacpp"]["loads"]
    assert speculators["llamacpp"]["loads"] and any("target's output" in n for n in speculators["llamacpp"]["notes"])


def test_sglang_builds_an_unloaded_head_when_draft_vocab_size_stays(shared):
    cfg = json.loads((shared / "config.json").read_text())
    (shared / "config.json").write_text(json.dumps({**cfg, "draft_vocab_size": 48}))
    (m,) = consumers(read_checkpoint(shared))["sglang"]["mismatches"]
    assert m["code"] == "consumer_lm_head_unloaded" and "remove draft_vocab_size" in m["fix"]


def test_a_reduced_vocab_draft_without_lm_head_is_missing_it(target, tmp_path):
    c = contract_for_target(target_config(target), capture_layers=(2, 3, 4), draft_vocab_size=32)
    weights = write_checkpoint(tmp_path / "reduced", c, random_tensors(c), "eagle") / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if k != "lm_head.weight"}, str(weights))
    ckpt = read_checkpoint(tmp_path / "reduced", strict=False)
    assert ckpt.contract.has_lm_head and any("lm_head.weight" in text_of(p) for p in ckpt.problems)
