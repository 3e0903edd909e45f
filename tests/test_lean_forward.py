"""eyas.decode.lean_forward, eyas.decode.static_cache, eyas.decode.packed: decoding's own forward
must compute what transformers' forward computes (logits, captured features, the cache), so that
swapping it in changes speed only. Greedy identity through generate is tested in test_decode."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_contract
from test_decode import GREEDY_TARGET, build_target, random_drafter
from transformers import Qwen3Config, Qwen3ForCausalLM

import eyas.decode.cost as cost
import eyas.decode.lean_forward as lean_module
from eyas.decode import DraftTree, generate, keep_accepted_kv, verify
from eyas.decode.cost import draft_step_ms, target_forward_ms
from eyas.decode.lean_forward import lean_target, unsupported
from eyas.decode.packed import PackedLinear, packed_linears
from eyas.decode.static_cache import StaticKV
from eyas.decode.verify import decoder, prefill
from eyas.drafter import DraftCache
from eyas.target import Target

pytestmark = pytest.mark.usefixtures("one_thread")
CAPTURE = (0, 1, 3, 6)  # the embeddings, inner layers and the last layer's output (6 layers)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Target:
    return build_target(tmp_path_factory.mktemp("lean-llama"), 3, **GREEDY_TARGET)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Target:
    torch.manual_seed(4)
    folder = tmp_path_factory.mktemp("lean-qwen3")
    Qwen3ForCausalLM(Qwen3Config(**GREEDY_TARGET, initializer_range=0.3, attention_bias=True,
                                 tie_word_embeddings=True)).save_pretrained(folder)
    return Target.load(folder)


def close(a, b):
    torch.testing.assert_close(a, b, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_lean_forward_matches_transformers(name, request):
    """Prefill, a chain and a tree on a cache: logits, features and the kept cache as transformers'."""
    target = request.getfixturevalue(name)
    lean = lean_target(target)
    assert lean is not None and decoder(target) is lean
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (1, 11), generator=g)
    ref = target.forward(prompt, CAPTURE)
    out = prefill(lean, prompt, CAPTURE, 40)
    close(out.features, ref.features)
    close(out.logits[0, -1], ref.logits[0, -1])
    assert out.logits.shape[1] == 1  # the prefill scores its last position only
    cache, hf_cache, n = out.past_key_values, ref.past_key_values, 11
    for parents in ([-1, 0, 1, 2], [-1, 0, 0, 1, 2, 4]):  # a chain, then a tree
        depths = [0]
        for p in parents[1:]:
            depths.append(depths[p] + 1)
        tree = DraftTree(torch.randint(0, 256, (len(parents),), generator=g), parents, depths)
        ours, theirs = verify(lean, tree, cache, n, CAPTURE), verify(target, tree, hf_cache, n, CAPTURE)
        close(ours.logits, theirs.logits)
        close(ours.features, theirs.features)
        path = [0, 2, 4] if len(parents) > 4 else [0, 1, 2]
        keep_accepted_kv(cache, n, path)
        keep_accepted_kv(hf_cache, n, path)
        n += len(path)
        assert cache.get_seq_length() == hf_cache.get_seq_length() == n
        for i, layer in enumerate(hf_cache.layers):
            close(cache.k[i, :, :, :n], layer.keys.float())
            close(cache.v[i, :, :, :n], layer.values.float())


def test_lean_forward_in_bf16_is_as_close_to_fp32_as_transformers(tmp_path):
    """bf16 weights: the same products, but attention in fp32 and residuals added before rounding,
    so the logits are no further from the fp32 model's than transformers' own bf16 logits."""
    build_target(tmp_path, 5, **GREEDY_TARGET)
    fp32, bf16 = Target.load(tmp_path), Target.load(tmp_path, dtype=torch.bfloat16)
    for seed in range(3):
        prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(seed))
        truth = fp32.forward(prompt, ()).logits[0, -1]
        ours = prefill(decoder(bf16), prompt, (), 20).logits[0, -1]
        theirs = bf16.forward(prompt, ()).logits[0, -1]
        assert ours.dtype == torch.bfloat16
        assert (ours.float() - truth).abs().max() <= 1.25 * (theirs.float() - truth).abs().max()


def test_rebuilt_when_the_weights_change(tmp_path):
    target = build_target(tmp_path, 6, **GREEDY_TARGET)
    first = lean_target(target)
    assert lean_target(target) is first
    target.model.to(torch.bfloat16)
    assert lean_target(target) is not first  # packed from the new weights, not the stale copy


def test_unsupported_targets_decode_through_transformers(llama, monkeypatch):
    """A target the lean forward does not implement decodes through transformers, with the same output."""
    prompt = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(2))
    drafter = random_drafter(llama, tiny_contract())
    lean_out, _ = generate(llama, drafter, prompt, max_new_tokens=12, tree=(3, 2, 5))
    monkeypatch.setattr(lean_module, "unsupported", lambda target: "test")
    assert decoder(llama) is llama
    hf_out, _ = generate(llama, drafter, prompt, max_new_tokens=12, tree=(3, 2, 5))
    assert hf_out.tolist() == lean_out.tolist()
    monkeypatch.undo()
    llama.config.hidden_act = "gelu"
    try:
        assert "gelu" in unsupported(llama) and lean_target(llama) is None
    finally:
        llama.config.hidden_act = "silu"


def test_a_target_spread_over_devices_decodes_through_transformers(tmp_path):
    target = build_target(tmp_path, 6, **GREEDY_TARGET)
    target.model.lm_head.to("meta")  # as accelerate's device_map would place a layer elsewhere
    assert "several devices" in unsupported(target) and lean_target(target) is None


def test_static_cache_keep_and_crop():
    cache = StaticKV(2, 1, 2, 8, torch.device("cpu"))
    k = torch.arange(10.0).view(1, 1, 5, 2)
    for layer in range(2):
        keys, _ = cache.update(layer, k + layer, -k)
        assert keys.shape == (1, 1, 5, 2)
    cache.length += 5
    cache.keep(2, [0, 2])  # slots 2 and 4 move to 2 and 3
    assert cache.length == 4
    assert cache.k[1, 0, 0, :4].tolist() == [[1, 2], [3, 4], [5, 6], [9, 10]]
    cache.crop(1)
    with pytest.raises(ValueError, match="cannot crop"):
        cache.crop(3)
    with pytest.raises(Exception, match="holds 8 positions"):
        cache.update(0, torch.zeros(1, 1, 8, 2), torch.zeros(1, 1, 8, 2))


def test_packed_linear_and_the_packed_context(llama):
    """Packed products equal F.linear (one product for several linears, with a residual added), and
    `packed_linears` swaps a module's linears only inside the context."""
    torch.manual_seed(0)
    a, b = torch.nn.Linear(16, 8), torch.nn.Linear(16, 4)
    x, r = torch.randn(1, 3, 16), torch.randn(1, 3, 12)
    both = PackedLinear([a, b])
    close(both(x), torch.cat([a(x), b(x)], dim=-1))
    close(both(x, add=r), r + torch.cat([a(x), b(x)], dim=-1))
    c = torch.nn.Linear(16, 8, bias=False)  # no bias: the residual is fused into the product
    close(PackedLinear([c])(x, add=r[..., :8]), r[..., :8] + c(x))
    drafter = random_drafter(llama, tiny_contract())
    hidden, ids, pos = torch.randn(1, 2, 64), torch.tensor([[3, 5]]), torch.tensor([[4, 5]])
    with torch.no_grad():
        ref, _ = drafter(hidden, ids, pos, cache=DraftCache(drafter, 1))
        linear = drafter.lm_head
        with packed_linears(drafter):
            assert drafter.lm_head is not linear
            ours, _ = drafter(hidden, ids, pos, cache=DraftCache(drafter, 1))
    assert drafter.lm_head is linear and isinstance(linear, torch.nn.Linear)
    close(ours, ref)


def test_costs_are_measured(llama):
    drafter = random_drafter(llama, tiny_contract(), seed=1)
    ms = target_forward_ms(llama, (1, 4), context=16, repeats=1)
    assert set(ms) == {1, 4} and all(v > 0 for v in ms.values())
    assert set(target_forward_ms(llama, (2,), context=16, repeats=1, lean=False)) == {2}
    assert all(v > 0 for v in draft_step_ms(drafter, (1, 3), context=16, repeats=1).values())


def test_the_cost_clock_waits_for_the_gpu(monkeypatch):
    """A CUDA launch returns before its kernels run: the clock reads the wall time after a sync."""
    synced = []
    monkeypatch.setattr(cost, "synchronize", synced.append)
    cuda = torch.device("cuda", 0)
    cost.clock(cuda)
    cost.clock(torch.device("cpu"))
    cost.clock()
    assert synced == [cuda]
