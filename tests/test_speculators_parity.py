"""Parity with a real client: speculators' `Eagle3DraftModel` and eyas's `Drafter`, same weights.

Both models get the same random canonical tensors and the same packed batch; speculators runs its
TTT forward (teacher forcing, 3 steps) and we record what its `lm_head` produced at each step;
eyas runs `forward_ttt` with `next_ids` = input_ids shifted left by one (speculators' own teacher
forcing). Logits must agree to 1e-4 in fp32, for every flag the contract can express.

speculators builds the draft without a verifier download when `verifier.name_or_path` is None and
the weights are loaded by hand (`load_state_dict`), as done here.

Known differences by design, handled below rather than hidden:
- speculators sizes `fc` as A * hidden_size (not A * target_hidden_size) and `fc_norm` as
  hidden_size: only drafts with target_hidden_size == hidden_size can be compared (all of these).
- speculators has no free-running TTT (it always teacher-forces), so only teacher forcing is
  compared here; free running is checked against step-by-step decoding in test_drafter.py.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("speculators")

from speculators.config import SpeculatorsConfig, VerifierConfig  # noqa: E402
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: E402
from speculators.proposals.greedy import GreedyTokenProposalConfig  # noqa: E402
from transformers import LlamaConfig, Qwen3Config  # noqa: E402

from conftest import random_tensors, tiny_contract  # noqa: E402
from eyas.contract import DraftContract  # noqa: E402
from eyas.drafter import Drafter  # noqa: E402

pytestmark = pytest.mark.speculators

STEPS, T = 3, 12


def speculators_draft(c: DraftContract, tensors: dict, embed: torch.Tensor, attn: str) -> Eagle3DraftModel:
    """speculators' EAGLE-3 draft for contract `c`, loaded with the same canonical tensors."""
    layer_config_class = {"llama": LlamaConfig, "qwen3": Qwen3Config}[c.layer_type]
    rope = {"rope_type": "default", **(c.rope_scaling or {}), "rope_theta": c.rope_base}
    layer_config = layer_config_class(
        hidden_size=c.hidden_size,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        intermediate_size=c.intermediate_size,
        vocab_size=c.vocab_size,
        num_hidden_layers=c.num_hidden_layers,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        attention_bias=c.attention_bias,
        hidden_act=c.hidden_act,
        rope_parameters=rope,
    )
    layer_config._attn_implementation = attn
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_config,
        draft_vocab_size=c.draft_vocab_size,
        norm_before_residual=c.norm_before_residual,
        norm_before_fc=c.norm_before_fc,
        fc_norm=c.fc_norm,
        norm_output=c.norm_output,
        target_hidden_size=c.target_hidden_size,
        eagle_aux_hidden_state_layer_ids=list(c.capture_layers),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=STEPS)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"]),
        ),
    )
    model = Eagle3DraftModel(config).eval()
    state = dict(tensors)
    state["embed_tokens.weight"] = embed
    # training-only tensors (the verifier's head/norm for the loss); values do not matter here
    state["verifier_lm_head.weight"] = tensors["lm_head.weight"]
    state["verifier_norm.weight"] = tensors["norm.weight"]
    model.load_state_dict(state, strict=True)
    return model


def speculators_ttt_logits(model: Eagle3DraftModel, features, input_ids, document_ids, position_ids):
    """Run speculators' TTT forward and return what its lm_head produced at each step."""
    seen: list[torch.Tensor] = []
    handle = model.lm_head.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        model(
            hidden_states=features,
            input_ids=input_ids,
            document_ids=document_ids,
            position_ids=position_ids,
            ttt_steps=STEPS,
        )
    finally:
        handle.remove()
    return seen


VARIANTS = {
    "base": {},  # llama, 3 capture layers, draft vocab 64 of 256 with d2t/t2d
    "norm_before_residual": dict(norm_before_residual=True),
    "norm_before_fc": dict(norm_before_fc=True),
    "fc_norm": dict(fc_norm=True),
    "norm_output": dict(norm_output=True),
    "qwen3": dict(layer_type="qwen3"),
    "capture_4": dict(capture_layers=(1, 2, 3, 4)),
    "full_vocab": dict(draft_vocab_size=256),
    "own_embeddings": dict(has_embeddings=True),
    "two_layers": dict(num_hidden_layers=2),
    "qwen3_two_layers_norm_output": dict(layer_type="qwen3", num_hidden_layers=2, norm_output=True),
    "attention_bias": dict(attention_bias=True),
    "rope_llama3": dict(
        rope_scaling=dict(
            rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64,
        )
    ),
    "rope_yarn": dict(rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128)),
}


def _inputs(c: DraftContract, seed: int, documents: bool):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(1, T, c.fc_in_features, generator=g)
    input_ids = torch.randint(0, c.vocab_size, (1, T), generator=g)
    document_ids = torch.zeros(1, T, dtype=torch.long)
    if documents:
        document_ids[:, 5:] = 1  # two packed documents
    position_ids = 1 + torch.arange(T)[None]
    return features, input_ids, document_ids, position_ids


def _compare(c: DraftContract, attn: str = "eager", documents: bool = False, seed: int = 0) -> None:
    tensors = random_tensors(c, seed)
    embed = tensors.get("embed_tokens.weight")
    if embed is None:
        g = torch.Generator().manual_seed(seed + 1)
        embed = 0.05 * torch.randn(c.vocab_size, c.hidden_size, generator=g)
    theirs = speculators_draft(c, tensors, embed, attn)
    ours = Drafter.from_tensors(c, tensors, embed_tokens=None if c.has_embeddings else embed)
    features, input_ids, document_ids, position_ids = _inputs(c, seed, documents)
    with torch.no_grad():
        expected = speculators_ttt_logits(theirs, features, input_ids, document_ids, position_ids)
        next_ids = torch.cat([input_ids[:, 1:], input_ids.new_zeros(1, 1)], dim=1)
        got = ours.forward_ttt(
            features, input_ids, STEPS,
            next_ids=next_ids, position_ids=position_ids, document_ids=document_ids,
        )
    assert len(expected) == len(got) == STEPS
    for step, (e, o) in enumerate(zip(expected, got, strict=True)):
        assert e.shape == o.shape == (1, T, c.draft_vocab_size)
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4, msg=lambda m, s=step: f"step {s}: {m}")


@pytest.mark.parametrize("name", list(VARIANTS))
def test_ttt_logits_match_speculators(name):
    _compare(tiny_contract(**VARIANTS[name]))


def test_packed_documents_match_speculators():
    """Two documents in one packed row: both mask the cross-document step-0 keys the same way."""
    _compare(tiny_contract(), documents=True, seed=3)


def test_speculators_sdpa_path_matches():
    """speculators' SDPA path (boolean mask) against eyas as well, with the 3.1 flags on."""
    _compare(tiny_contract(fc_norm=True, norm_output=True, norm_before_residual=True), attn="sdpa", seed=5)


def test_parity_is_not_vacuous():
    """A one-flag difference between the two models is caught at 1e-4."""
    c = tiny_contract()
    tensors = random_tensors(c, 0)
    embed = 0.05 * torch.randn(c.vocab_size, c.hidden_size)
    theirs = speculators_draft(c.replace(norm_before_residual=True), tensors, embed, "eager")
    ours = Drafter.from_tensors(c, tensors, embed_tokens=embed)
    features, input_ids, document_ids, position_ids = _inputs(c, 0, False)
    with torch.no_grad():
        expected = speculators_ttt_logits(theirs, features, input_ids, document_ids, position_ids)
        got = ours.forward_ttt(features, input_ids, STEPS, position_ids=position_ids)
    assert not torch.allclose(got[0], expected[0], rtol=1e-4, atol=1e-4)
