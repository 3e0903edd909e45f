"""Real clients read eyas's output: speculators' own config class and model, and transformers' AutoConfig.

Offline: HF_HUB_OFFLINE=1, local folders only, no verifier download (speculators only downloads in
`Eagle3DraftModel.from_pretrained`, which is not used; the model is built from the config and the
weights are loaded by hand).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from conftest import LLAMA3_ROPE, random_tensors, tiny_contract
from eyas.contract import Verifier
from eyas.formats import IDS, write_checkpoint

pytest.importorskip("speculators")

from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402

pytestmark = pytest.mark.speculators

VARIANTS = {
    "llama-3cap-reduced": dict(capture_layers=(2, 3, 5)),
    "qwen3-4cap-flags": dict(
        layer_type="qwen3",
        capture_layers=(1, 2, 4, 6),
        norm_before_fc=True,
        norm_before_residual=True,
        norm_output=True,
        has_embeddings=True,
    ),
    "llama3-rope-fc_norm-full-vocab": dict(
        fc_norm=True,
        draft_vocab_size=256,
        rope_theta=500000.0,
        max_position_embeddings=1024,
        rope_scaling=LLAMA3_ROPE,
    ),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_clients_load_eyas_output(tmp_path, monkeypatch, variant):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    c = tiny_contract(**VARIANTS[variant], verifier=Verifier(name_or_path=None, architectures=("LlamaForCausalLM",)))
    t = random_tensors(c)
    write_checkpoint(tmp_path / "both", c, t, "both")
    write_checkpoint(tmp_path / "eagle", c, t, "eagle")

    cfg = Eagle3SpeculatorConfig.from_pretrained(tmp_path / "both")
    layer = cfg.transformer_layer_config
    assert type(layer).__name__ == {"llama": "LlamaConfig", "qwen3": "Qwen3Config"}[c.layer_type]
    assert (layer.hidden_size, layer.num_attention_heads, layer.num_key_value_heads, layer.head_dim) == (64, 4, 2, 16)
    assert (layer.intermediate_size, layer.vocab_size, layer.max_position_embeddings) == (
        128,
        c.vocab_size,
        c.max_position_embeddings,
    )
    assert layer.rope_parameters["rope_theta"] == c.rope_theta
    assert layer.rope_parameters["rope_type"] == (c.rope_scaling or {}).get("rope_type", "default")
    assert cfg.draft_vocab_size == c.draft_vocab_size and cfg.target_hidden_size == c.target_hidden_size
    assert cfg.eagle_aux_hidden_state_layer_ids == list(c.capture_layers)
    assert [cfg.norm_before_residual, cfg.norm_before_fc, cfg.fc_norm, cfg.norm_output] == [
        c.norm_before_residual,
        c.norm_before_fc,
        c.fc_norm,
        c.norm_output,
    ]
    assert cfg.speculators_config.verifier.architectures == ["LlamaForCausalLM"]
    assert cfg.speculators_config.proposal_methods[0].speculative_tokens == 3

    # speculators' own draft model takes every tensor eyas wrote, under the names eyas wrote them
    model = Eagle3DraftModel(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(tmp_path / "both" / "model.safetensors")), strict=False)
    assert unexpected == []
    allowed = {"verifier_lm_head.weight", "verifier_norm.weight"} | (
        set() if c.has_embeddings else {"embed_tokens.weight"}
    )
    assert set(missing) <= allowed, missing
    assert torch.equal(model.fc.weight, t["fc.weight"])

    # transformers reads both eagle-format files as plain HF configs (no remote code)
    for path in (tmp_path / "eagle", tmp_path / "both" / "config_eagle.json"):
        ac = AutoConfig.from_pretrained(path)
        assert ac.model_type == c.layer_type and ac.architectures == ["LlamaForCausalLMEagle3"]
        assert (ac.hidden_size, ac.vocab_size, ac.draft_vocab_size, ac.target_hidden_size) == (
            64,
            c.vocab_size,
            c.draft_vocab_size,
            64,
        )
        assert getattr(ac, IDS) == list(c.capture_layers)
        assert ac.eagle_config["use_aux_hidden_state"] is True and ac.norm_before_fc == c.norm_before_fc
