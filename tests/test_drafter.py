"""The plain-PyTorch drafter: checkpoint-shaped state dict, the EAGLE-3 math, masks and caches.

The key consistency claims are tested against independent constructions: the TTT unroll against
step-by-step chain decoding and against a tree mask derived from parent pointers; SDPA against the
eager formula; rope against transformers' own init functions; layer 0 against the formula by hand.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from conftest import random_tensors, tiny_contract
from eyas.contract import DraftContract, expected_shapes
from eyas.drafter import (
    DraftCache,
    Drafter,
    RMSNorm,
    eager_attention,
    repeat_kv,
    sdpa_attention,
)
from eyas.errors import ContractError
from eyas.formats import vocab_map_problems
from eyas.rope import rope_parameters

# Contracts exercised by the structural and consistency tests (tiny_contract overrides).
CONTRACTS = {
    "base": {},  # llama, 1 layer, 3 capture layers, draft vocab 64 of 256, shared embeddings
    "qwen3": dict(layer_type="qwen3"),
    "two_layers": dict(num_hidden_layers=2),
    "capture_4": dict(capture_layers=(0, 2, 4, 6)),
    "norm_output": dict(norm_output=True),
    "eagle31": dict(fc_norm=True, norm_output=True, norm_before_residual=True),
    "norm_before_fc": dict(norm_before_fc=True),
    "own_embed_full_vocab_bias": dict(has_embeddings=True, draft_vocab_size=256, attention_bias=True),
    "qwen3_two_layers_wide_target": dict(layer_type="qwen3", num_hidden_layers=2, target_hidden_size=96),
    "window_2": dict(sliding_window=2),  # narrower than the chains tested: a step's own earlier steps drop out
    "window_3_two_layers": dict(sliding_window=3, num_hidden_layers=2),
}


def shared_embed(c: DraftContract, seed: int = 0) -> torch.Tensor:
    return 0.5 * torch.randn(c.vocab_size, c.hidden_size, generator=torch.Generator().manual_seed(seed + 100))


def build(c: DraftContract, seed: int = 0, **kw) -> Drafter:
    embed = None if c.has_embeddings else shared_embed(c, seed)
    return Drafter.from_tensors(c, random_tensors(c, seed), embed_tokens=embed, **kw)


def batch(c: DraftContract, B: int, T: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed + 7)
    features = torch.randn(B, T, c.fc_in_features, generator=g)
    input_ids = torch.randint(0, c.vocab_size, (B, T), generator=g)
    return features, input_ids


def contract(name: str) -> DraftContract:
    return tiny_contract(**CONTRACTS[name])


# --- structure: state dict == canonical checkpoint ---


@pytest.mark.parametrize("name", list(CONTRACTS))
def test_state_dict_is_the_canonical_checkpoint(name):
    c = contract(name)
    tensors = random_tensors(c)
    d = build(c)
    sd = d.state_dict()
    shapes = expected_shapes(c)
    assert set(sd) == set(shapes)
    for k, shape in shapes.items():
        assert tuple(sd[k].shape) == shape, k
        assert torch.equal(sd[k], tensors[k]), k
    if c.has_vocab_map:
        assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    fresh = Drafter(c, embed_tokens=None if c.has_embeddings else shared_embed(c)).init_weights(0)
    assert {k: tuple(v.shape) for k, v in fresh.state_dict().items()} == shapes


def test_from_tensors_copies_its_inputs():
    c = tiny_contract()
    tensors = random_tensors(c)
    before = tensors["fc.weight"].clone()
    d = Drafter.from_tensors(c, tensors, embed_tokens=shared_embed(c))
    with torch.no_grad():
        d.fc.weight.add_(1.0)
    assert torch.equal(tensors["fc.weight"], before)


def test_from_tensors_rejects_tensors_that_do_not_fit():
    c = tiny_contract()
    embed = shared_embed(c)
    tensors = random_tensors(c)
    missing = {k: v for k, v in tensors.items() if k != "layers.0.hidden_norm.weight"}
    with pytest.raises(ContractError, match="missing \\['layers.0.hidden_norm.weight'\\]"):
        Drafter.from_tensors(c, missing, embed_tokens=embed)
    with pytest.raises(ContractError, match="unexpected \\['input_norm.weight'\\]"):
        Drafter.from_tensors(c, {**tensors, "input_norm.weight": torch.ones(192)}, embed_tokens=embed)
    bad = {**tensors, "fc.weight": torch.zeros(64, 128)}
    with pytest.raises(ContractError, match=r"fc.weight is \[64, 128\], expected \[64, 192\]"):
        Drafter.from_tensors(c, bad, embed_tokens=embed)


def test_a_full_vocab_draft_without_lm_head_borrows_the_targets():
    """has_lm_head False: the target's lm_head is a buffer, never saved, trained or re-initialised; the
    logits are those of the same draft shipping that matrix as its own."""
    own = tiny_contract(draft_vocab_size=256)
    shared = own.replace(has_lm_head=False)
    tensors = random_tensors(own)
    head = tensors.pop("lm_head.weight")
    embed = shared_embed(own)
    a = Drafter.from_tensors(own, {**tensors, "lm_head.weight": head}, embed_tokens=embed)
    b = Drafter.from_tensors(shared, tensors, embed_tokens=embed, lm_head=head)
    features, ids = batch(own, 2, 6)
    for x, y in zip(a.forward_ttt(features, ids, 2), b.forward_ttt(features, ids, 2), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert "lm_head.weight" not in b.state_dict() and "lm_head.weight" not in dict(b.named_parameters())
    b.init_weights(0)
    assert torch.equal(b.lm_head.weight, head)
    with pytest.raises(ContractError, match="no lm_head.weight and none was given"):
        Drafter.from_tensors(shared, tensors, embed_tokens=embed)
    with pytest.raises(ContractError, match=r"shared lm_head is \[64, 64\]"):
        Drafter.from_tensors(shared, tensors, embed_tokens=embed, lm_head=head[:64])
    with pytest.raises(ContractError, match="needs its own lm_head"):
        tiny_contract(has_lm_head=False)  # 64 of 256 tokens: the target's head has a row for each


def test_embeddings_and_vocab_map_are_required_when_the_contract_needs_them():
    c = tiny_contract()
    with pytest.raises(ContractError, match="no embed_tokens.weight"):
        Drafter.from_tensors(c, random_tensors(c))
    with pytest.raises(ContractError, match=r"shared embed_tokens is \[256, 32\]"):
        Drafter.from_tensors(c, random_tensors(c), embed_tokens=torch.zeros(256, 32))
    no_map = tiny_contract(has_vocab_map=False)
    with pytest.raises(ContractError, match="no d2t/t2d"):
        Drafter(no_map, embed_tokens=shared_embed(no_map))


def test_inconsistent_vocab_maps_are_rejected():
    c = tiny_contract()
    tensors = random_tensors(c)
    as_ids = {**tensors, "d2t": torch.arange(c.draft_vocab_size) + tensors["d2t"] + 200}
    with pytest.raises(ContractError, match=r"outside \[0, 256\)"):  # the words of formats.vocab_map_problems
        Drafter.from_tensors(c, as_ids, embed_tokens=shared_embed(c))
    t2d = tensors["t2d"].clone()
    t2d[torch.nonzero(~t2d)[0]] = True
    t2d[torch.nonzero(t2d)[-1]] = False  # same count, one id moved
    with pytest.raises(ContractError, match="t2d disagrees with d2t"):
        Drafter.from_tensors(c, {**tensors, "t2d": t2d}, embed_tokens=shared_embed(c))


def bad_vocab_maps(c: DraftContract, tensors: dict) -> dict[str, dict]:
    """Vocab maps `eyas check` refuses, each as the tensors it replaces."""
    draft_ids = torch.arange(c.draft_vocab_size)
    targets = draft_ids + tensors["d2t"]  # sorted ascending
    moved = tensors["t2d"].clone()
    moved[torch.nonzero(~moved)[0]] = True
    moved[torch.nonzero(moved)[-1]] = False
    return {
        "target ids, not offsets": {"d2t": targets},
        "unsorted": {"d2t": targets.flip(0) - draft_ids},  # the same ids, consistent with t2d, descending
        "int32 d2t": {"d2t": tensors["d2t"].int()},
        "t2d moved": {"t2d": moved},
        "t2d too few": {"t2d": tensors["t2d"] & (torch.arange(c.vocab_size) != targets[0])},
    }


def test_the_drafter_applies_the_checkers_vocab_map_rule():
    """One rule: the drafter refuses exactly what eyas check refuses, with the same words and fix."""
    c = tiny_contract()
    tensors = random_tensors(c)
    assert vocab_map_problems(c, tensors) == []
    for name, bad in bad_vocab_maps(c, tensors).items():
        found = [f for f in vocab_map_problems(c, {**tensors, **bad}) if "problem" in f]
        assert found, name
        with pytest.raises(ContractError) as e:
            Drafter.from_tensors(c, {**tensors, **bad}, embed_tokens=shared_embed(c))
        assert (str(e.value), e.value.hint) == (found[0]["problem"], found[0]["fix"]), name
        fresh = Drafter(c, embed_tokens=shared_embed(c))
        with pytest.raises(ContractError, match=re.escape(found[0]["problem"])):
            fresh.set_vocab_map(bad.get("d2t", tensors["d2t"]), bad.get("t2d", tensors["t2d"]))
    with pytest.raises(ContractError, match=r"d2t is \[3\], expected \[64\]"):  # shapes first
        Drafter(c, embed_tokens=shared_embed(c)).set_vocab_map(tensors["d2t"][:3], tensors["t2d"])


def test_d2t_maps_draft_ids_to_target_ids():
    c = tiny_contract()
    d = build(c)
    used = torch.nonzero(d.t2d).squeeze(1)  # the drafted target ids, sorted
    draft_ids = torch.arange(c.draft_vocab_size)
    assert torch.equal(d.to_target_ids(draft_ids), used)
    assert torch.equal(d.to_target_ids(draft_ids.flip(0)[None]), used.flip(0)[None])
    full = build(tiny_contract(draft_vocab_size=256))
    assert torch.equal(full.to_target_ids(torch.arange(256)), torch.arange(256))


# --- numerics: norm, attention, rope ---


def test_rmsnorm_computes_in_fp32_and_casts_back():
    norm = RMSNorm(64, 1e-6).half()
    x = 1000.0 * torch.randn(3, 64)  # x^2 overflows fp16 (max 65504): a half-precision mean would be inf
    y = norm(x.half())
    assert y.dtype == torch.float16
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y.float(), ref, rtol=2e-3, atol=2e-3)


def test_repeat_kv_is_repeat_interleave():
    x = torch.randn(2, 3, 5, 4)
    assert torch.equal(repeat_kv(x, 4), torch.repeat_interleave(x, 4, dim=1))


def test_sdpa_matches_eager_attention():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 5, 16, generator=g)
    k, v = torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    mask = torch.rand(2, 5, 9, generator=g) < 0.5
    mask[:, torch.arange(5), torch.arange(5) + 4] = True  # every query sees at least itself
    expected = eager_attention(q, k, v, mask)
    torch.testing.assert_close(sdpa_attention(q, k, v, mask), expected, rtol=1e-5, atol=1e-6)


def test_drafter_with_eager_attention_matches_sdpa():
    c = contract("eagle31")
    features, ids = batch(c, 2, 9)
    sdpa = build(c).forward_ttt(features, ids, 3)
    eager = build(c, attention="eager").forward_ttt(features, ids, 3)
    for a, b in zip(sdpa, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


ROPE_CASES = {
    "default": None,
    "linear": dict(rope_type="linear", factor=4.0),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64),
    "llama3_legacy_type_key": dict(type="llama3", factor=32.0, low_freq_factor=2.0, high_freq_factor=8.0,
                                   original_max_position_embeddings=128),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128),
    "yarn_mscale_untruncated": dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=32,
                                    mscale=0.707, mscale_all_dim=1.0, beta_fast=16, beta_slow=2,
                                    truncate=False),
    "yarn_attention_factor": dict(rope_type="yarn", factor=2.0, attention_factor=1.3),
    "dynamic": dict(rope_type="dynamic", factor=2.0),  # within max_position_embeddings: the default rope
}


@pytest.mark.parametrize("name", list(ROPE_CASES))
def test_rope_matches_transformers(name):
    scaling = ROPE_CASES[name]
    c = tiny_contract(rope_theta=500000.0, rope_scaling=scaling, head_dim=32, max_position_embeddings=512)
    inv_freq, scale = rope_parameters(c)
    params = {"rope_type": "default", **(scaling or {}), "rope_theta": 500000.0}
    if "type" in params:  # the legacy key: transformers-5 configs say rope_type
        params["rope_type"] = params.pop("type")
    hf = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=32, max_position_embeddings=512,
                     rope_parameters=params)
    if params["rope_type"] == "default":
        ref, ref_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(hf)
    else:
        ref, ref_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf, "cpu")
    torch.testing.assert_close(inv_freq, ref, rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-12)
    if scaling and name != "dynamic":  # the scaled frequencies differ from the plain ones
        assert not torch.allclose(inv_freq, rope_parameters(c.replace(rope_scaling=None))[0])


def test_ntk_alpha_rope_matches_transformers_hunyuan():
    """Hunyuan's `dynamic` + `alpha`: the base theta * alpha^(d/(d-2)) at every position, as transformers'
    HunYuan rope (and vLLM's and SGLang's DynamicNTKAlphaRotaryEmbedding) build it."""
    from transformers import HunYuanDenseV1Config
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding

    scaling = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}
    c = tiny_contract(rope_theta=10000.0, rope_scaling=scaling, head_dim=32, max_position_embeddings=512)
    inv_freq, scale = rope_parameters(c)
    hf = HunYuanDenseV1Config(hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=512,
                              rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0,
                                               "rope_theta": 10000.0})
    ref = HunYuanDenseV1RotaryEmbedding(hf)
    torch.testing.assert_close(inv_freq, ref.inv_freq, rtol=1e-6, atol=0)
    assert scale == ref.attention_scaling == 1.0
    plain = rope_parameters(c.replace(rope_scaling=None))[0]
    assert inv_freq[0] == plain[0] and inv_freq[-1] < plain[-1] / 100  # the slow pairs turn far slower


def test_unsupported_or_incomplete_rope_scaling_is_a_contract_error():
    with pytest.raises(ContractError, match="'longrope' is not supported"):
        Drafter(tiny_contract(rope_scaling={"rope_type": "longrope"}), embed_tokens=torch.zeros(256, 64))
    with pytest.raises(ContractError, match="has no 'low_freq_factor'"):
        rope_parameters(tiny_contract(rope_scaling={"rope_type": "llama3", "factor": 8.0}))


def test_rope_is_relative_and_has_no_position_cap():
    """Shifting every position (past max_position_embeddings=512) leaves the logits unchanged."""
    c = tiny_contract()
    d = build(c)
    features, ids = batch(c, 1, 10)
    pos = torch.arange(10)[None]
    with torch.no_grad():
        h = d.combine(features)
        near, _ = d(h, ids, pos)
        far, _ = d(h, ids, pos + 3000)
    torch.testing.assert_close(far, near, rtol=1e-3, atol=1e-3)


# --- the EAGLE-3 math ---


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("norm_before_residual", [False, True])
@pytest.mark.parametrize("norm_output", [False, True])
def test_layer0_math_by_hand(norm_before_residual, norm_output):
    """T = 1: attention over one key returns its value, so the whole step is a few matmuls."""
    c = tiny_contract(norm_before_residual=norm_before_residual, norm_output=norm_output)
    t = random_tensors(c)
    embed = shared_embed(c)
    d = Drafter.from_tensors(c, t, embed_tokens=embed)
    features, ids = batch(c, 1, 1)
    p = "layers.0."
    h = features @ t["fc.weight"].T
    e = embed[ids]
    e_n, h_n = _rms(e, t[p + "input_layernorm.weight"]), _rms(h, t[p + "hidden_norm.weight"])
    x = torch.cat([e_n, h_n], dim=-1)  # embedding first
    v = (x @ t[p + "self_attn.v_proj.weight"].T).view(1, 1, c.num_key_value_heads, c.head_dim)
    v = torch.repeat_interleave(v, c.num_attention_heads // c.num_key_value_heads, dim=2).reshape(1, 1, -1)
    residual = h_n if norm_before_residual else h
    h1 = residual + v @ t[p + "self_attn.o_proj.weight"].T
    m = _rms(h1, t[p + "post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(m @ t[p + "mlp.gate_proj.weight"].T) * (m @ t[p + "mlp.up_proj.weight"].T)
    out = h1 + mlp @ t[p + "mlp.down_proj.weight"].T
    out_n = _rms(out, t["norm.weight"])
    with torch.no_grad():
        logits, next_hidden = d(d.combine(features), ids, torch.zeros(1, 1, dtype=torch.long))
    torch.testing.assert_close(logits, out_n @ t["lm_head.weight"].T, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(next_hidden, out_n if norm_output else out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("flag", ["norm_before_residual", "norm_before_fc", "fc_norm", "norm_output", "qwen3",
                                  "attention_bias"])
def test_each_flag_changes_the_output(flag):
    """Flip one flag, keep every shared tensor: the logits change (step 1 for norm_output, which
    only changes what the next step reads)."""
    on = tiny_contract(**({"layer_type": "qwen3"} if flag == "qwen3" else {flag: True}))
    off = tiny_contract()
    t_on = random_tensors(on)
    t_off = {k: t_on[k] for k in expected_shapes(off)}
    embed = shared_embed(off)
    features, ids = batch(off, 1, 8)
    with torch.no_grad():
        a = Drafter.from_tensors(on, t_on, embed_tokens=embed).forward_ttt(features, ids, 2)
        b = Drafter.from_tensors(off, t_off, embed_tokens=embed).forward_ttt(features, ids, 2)
    if flag == "norm_output":
        torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    else:
        assert (a[0] - b[0]).abs().max() > 1e-3
    assert (a[1] - b[1]).abs().max() > 1e-3


def test_qwen3_qk_norm_is_per_head_over_head_dim():
    """Scaling one head's q (or one kv head's k) projection is invisible through a per-head RMSNorm,
    and visible without it (llama)."""
    for layer_type, invariant in (("qwen3", True), ("llama", False)):
        c = tiny_contract(layer_type=layer_type)
        t = random_tensors(c)
        scaled = dict(t)
        q = t["layers.0.self_attn.q_proj.weight"].clone()
        q[: c.head_dim] *= 5.0  # head 0 only
        k = t["layers.0.self_attn.k_proj.weight"].clone()
        k[c.head_dim:] *= 0.3  # kv head 1 only
        scaled["layers.0.self_attn.q_proj.weight"], scaled["layers.0.self_attn.k_proj.weight"] = q, k
        embed = shared_embed(c)
        features, ids = batch(c, 1, 8)
        pos = torch.arange(8)[None]
        with torch.no_grad():
            a = Drafter.from_tensors(c, t, embed_tokens=embed)
            b = Drafter.from_tensors(c, scaled, embed_tokens=embed)
            la, _ = a(a.combine(features), ids, pos)
            lb, _ = b(b.combine(features), ids, pos)
        assert torch.allclose(la, lb, rtol=1e-4, atol=1e-5) == invariant, layer_type


def test_combine_rejects_features_of_the_wrong_width():
    c = tiny_contract()
    with pytest.raises(ContractError, match="features are 128 wide; fc reads 3 captured layers x 64 = 192"):
        build(c).combine(torch.zeros(1, 2, 128))


# --- forward with a cache, chains, trees, TTT ---


@pytest.mark.parametrize("name", ["base", "two_layers", "qwen3_two_layers_wide_target", "eagle31", "window_2"])
def test_forward_at_once_equals_one_position_at_a_time(name):
    c = contract(name)
    d = build(c)
    features, ids = batch(c, 2, 7)
    pos = 1 + torch.arange(7).expand(2, 7)
    with torch.no_grad():
        h = d.combine(features)
        all_logits, all_hidden = d(h, ids, pos)
        cache = DraftCache(d, batch_size=2, max_len=7)
        steps = [d(h[:, i : i + 1], ids[:, i : i + 1], pos[:, i : i + 1], cache=cache) for i in range(7)]
    assert cache.length == 7
    torch.testing.assert_close(torch.cat([s[0] for s in steps], 1), all_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([s[1] for s in steps], 1), all_hidden, rtol=1e-5, atol=1e-5)


def test_cache_crop_forgets_rejected_positions():
    c = contract("two_layers")
    d = build(c)
    features, ids = batch(c, 1, 8)
    pos = torch.arange(8)[None]
    with torch.no_grad():
        h = d.combine(features)
        full, _ = d(h, ids, pos)
        cache = DraftCache(d, 1, max_len=9)
        d(h[:, :6], ids[:, :6], pos[:, :6], cache=cache)
        d(h[:, 6:9].flip(1), ids[:, 6:8].flip(1), pos[:, 6:8], cache=cache)  # two "rejected" tokens
        cache.crop(6)
        tail, _ = d(h[:, 6:], ids[:, 6:], pos[:, 6:], cache=cache)
        torch.testing.assert_close(tail, full[:, 6:], rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="at most 9 positions"):
            d(h[:, :2], ids[:, :2], pos[:, :2], cache=cache)
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(9)


def _next_ids(ids: torch.Tensor) -> torch.Tensor:
    """Teacher forcing's labels of step 0: x_{t+2} = input_ids[t + 1], 0 past the end."""
    return torch.cat([ids[:, 1:], ids.new_zeros(ids.shape[0], 1)], dim=1)


@pytest.mark.parametrize("name", ["base", "norm_output", "qwen3_two_layers_wide_target", "capture_4",
                                  "own_embed_full_vocab_bias", "window_2", "window_3_two_layers"])
@pytest.mark.parametrize("teacher", [True, False])
def test_ttt_equals_chain_decoding_at_every_position(name, teacher):
    """forward_ttt's step j at t == draft a chain from position t with a cache, one token per call
    (default causal masks), feeding the ground truth (teacher) or the draft's own argmax mapped to
    a target id through t2d's sorted ids (free running)."""
    c = contract(name)
    d = build(c)
    B, T, S = 2, 6, 4
    features, ids = batch(c, B, T)
    pos = 3 + torch.arange(T).expand(B, T)
    nxt = _next_ids(ids)
    drafted = torch.nonzero(d.t2d).squeeze(1) if c.has_vocab_map else torch.arange(c.vocab_size)
    with torch.no_grad():
        ttt = d.forward_ttt(features, ids, S, next_ids=nxt if teacher else None, position_ids=pos)
        h = d.combine(features)
        for t in range(T):
            cache = DraftCache(d, B)
            logits, hidden = d(h[:, : t + 1], ids[:, : t + 1], pos[:, : t + 1], cache=cache)
            logits, hidden = logits[:, t:], hidden[:, t:]
            for j in range(S):
                torch.testing.assert_close(logits, ttt[j][:, t : t + 1], rtol=1e-5, atol=1e-5)
                if teacher:
                    tok = nxt[:, t + j : t + j + 1] if t + j < T else torch.zeros(B, 1, dtype=torch.long)
                else:
                    tok = drafted[logits.argmax(-1)]
                logits, hidden = d(hidden, tok, pos[:, t : t + 1] + j + 1, cache=cache)


@pytest.mark.parametrize("window", [1, 3, 5])
def test_a_sliding_window_sees_what_the_context_cut_to_it_shows(window):
    """A draft whose layer attends over its last `window` positions reads, at position t, what the
    same weights without a window read from the sequence cut to positions t - window + 1 .. t (one
    layer: a second would see further through the first; rope is relative): the window counts the
    query itself, as Hugging Face's masks and vLLM count it. The chain steps then drafted at t see
    their own steps and the context within the window of theirs."""
    c = contract("base")
    windowed = build(replace(c, sliding_window=window))
    whole = build(c)
    T, S = 9, 3
    features, ids = batch(c, 1, T)
    pos = torch.arange(T)[None]
    with torch.no_grad():
        got = windowed.forward_ttt(features, ids, S, position_ids=pos)
        for t in range(T):
            a = max(0, t - window + 1)
            cut = whole.forward_ttt(features[:, a:t + 1], ids[:, a:t + 1], 1, position_ids=pos[:, a:t + 1])
            torch.testing.assert_close(got[0][:, t], cut[0][:, -1], rtol=1e-5, atol=1e-5)
        assert not torch.allclose(got[0], whole.forward_ttt(features, ids, 1, position_ids=pos)[0])
        h = windowed.combine(features)  # chain step 2 from t = 6: keys within `window` of position 8
        cache = DraftCache(windowed, 1)
        logits, hidden = windowed(h[:, :7], ids[:, :7], pos[:, :7], cache=cache)
        drafted = torch.nonzero(windowed.t2d).squeeze(1)
        for j in (1, 2):
            logits, hidden = windowed(hidden[:, -1:], drafted[logits[:, -1:].argmax(-1)], pos[:, 6:7] + j,
                                      cache=cache)
        torch.testing.assert_close(logits[:, -1], got[2][:, 6], rtol=1e-5, atol=1e-5)


def _ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[N, N] bool: node i may attend to node k iff k is i or one of its ancestors."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        k = i
        while k >= 0:
            mask[i, k] = True
            k = parents[k]
    return mask


def test_ttt_equals_a_tree_decoded_with_an_ancestor_mask():
    """Lay the TTT unroll out as a tree: the step-0 prefix is a chain (node t's parent is t-1) and
    step j at t hangs below step j-1 at t. Decoding it level by level with a DraftCache and
    ancestor masks (a tree decoder's attn_mask) reproduces forward_ttt's teacher-forced logits."""
    c = contract("eagle31")
    d = build(c)
    T, S = 7, 4
    features, ids = batch(c, 1, T)
    pos = 1 + torch.arange(T)[None]
    nxt = _next_ids(ids)
    parents = [t - 1 for t in range(T)]  # step 0: a chain
    for j in range(1, S):
        parents += [(j - 1) * T + t for t in range(T)]  # node (j, t) = j*T + t, below (j-1, t)
    mask = _ancestor_mask(parents)
    with torch.no_grad():
        ttt = d.forward_ttt(features, ids, S, next_ids=nxt, position_ids=pos)
        cache = DraftCache(d, 1, max_len=S * T)
        hidden, tokens = d.combine(features), ids
        for j in range(S):
            level = slice(j * T, (j + 1) * T)
            level_mask = mask[None, level, : (j + 1) * T]  # [1, T, keys so far]
            logits, hidden = d(hidden, tokens, pos + j, cache=cache, attn_mask=level_mask)
            torch.testing.assert_close(logits, ttt[j], rtol=1e-5, atol=1e-5)
            tokens = torch.cat([nxt[:, j:], nxt.new_zeros(1, j)], dim=1)  # level j+1 reads x_{t+j+2}


def test_packed_documents_equal_separate_sequences():
    c = contract("two_layers")
    d = build(c)
    features, ids = batch(c, 1, 11)
    docs = torch.tensor([[0] * 4 + [1] * 7])
    pos = torch.cat([torch.arange(4), torch.arange(7)])[None]
    with torch.no_grad():
        packed = d.forward_ttt(features, ids, 3, position_ids=pos, document_ids=docs)
        first = d.forward_ttt(features[:, :4], ids[:, :4], 3, position_ids=pos[:, :4])
        second = d.forward_ttt(features[:, 4:], ids[:, 4:], 3, position_ids=pos[:, 4:])
    for j in range(3):
        torch.testing.assert_close(packed[j], torch.cat([first[j], second[j]], dim=1), rtol=1e-5, atol=1e-5)


def test_forward_ttt_trains_through_the_cache():
    """Gradients reach fc and layer 0 through all steps; the shared embedding stays frozen."""
    c = tiny_contract()
    d = build(c)
    features, ids = batch(c, 2, 6)
    logits = d.forward_ttt(features, ids, 3, next_ids=_next_ids(ids))
    sum(lg.logsumexp(-1).mean() for lg in logits).backward()
    assert d.fc.weight.grad.abs().sum() > 0
    assert d.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert not d.embed_tokens.weight.requires_grad


# --- fresh drafts and dtypes ---


def test_init_weights_is_seeded_and_leaves_data_alone():
    c = tiny_contract(attention_bias=True, norm_before_fc=True)
    embed = shared_embed(c)
    a = Drafter(c, embed_tokens=embed).init_weights(1)
    b = Drafter(c, embed_tokens=embed).init_weights(1)
    other = Drafter(c, embed_tokens=embed).init_weights(2)
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    assert not torch.equal(a.fc.weight, other.fc.weight)
    assert torch.equal(a.input_norm.weight, torch.ones(192))
    assert torch.equal(a.layers[0].hidden_norm.weight, torch.ones(64))
    assert torch.equal(a.layers[0].self_attn.q_proj.bias, torch.zeros(64))
    assert a.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert a.embed_tokens.weight is embed  # borrowed, not re-initialised or copied
    assert not a.t2d.any()  # no vocab map is invented ...
    t = random_tensors(c)
    a.set_vocab_map(t["d2t"], t["t2d"])  # ... it is installed, checked
    assert torch.equal(a.to_target_ids(torch.arange(64)), torch.nonzero(t["t2d"]).squeeze(1))
    with pytest.raises(ContractError, match="d2t is torch.int32"):
        a.set_vocab_map(t["d2t"].int(), t["t2d"])


def test_bfloat16_drafter_keeps_integer_buffers_and_tracks_fp32():
    c = contract("eagle31")
    features, ids = batch(c, 1, 8)
    d32, d16 = build(c), build(c, dtype=torch.bfloat16)
    assert d16.fc.weight.dtype == torch.bfloat16 and d16.embed_tokens.weight.dtype == torch.bfloat16
    assert d16.d2t.dtype == torch.int64 and d16.t2d.dtype == torch.bool
    assert d16.inv_freq.dtype == torch.float32
    with torch.no_grad():
        l32 = d32.forward_ttt(features, ids, 2, next_ids=_next_ids(ids))
        l16 = d16.forward_ttt(features.bfloat16(), ids, 2, next_ids=_next_ids(ids))
    assert l16[1].dtype == torch.bfloat16
    for a, b in zip(l16, l32, strict=True):
        torch.testing.assert_close(a.float(), b, rtol=0.05, atol=0.05)
