"""eyas.decode.bf16_kernel: bf16 weights times a few rows where oneDNN cannot pack bf16 (AVX2-only
CPUs). Its products must be torch's bf16 products summed in fp32, independent of how many rows are
multiplied at once, so that a verify's products are what one-token steps compute.
The CPUs tests run on can pack bf16, so the tests take oneDNN's packing away to reach the kernel."""

from __future__ import annotations

import os
import platform
import shutil

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_contract
from test_decode import GREEDY_TARGET, build_target, random_drafter

import eyas.decode.packed as packed_module
from eyas.decode import bf16_kernel, generate
from eyas.decode.lean_forward import lean_target
from eyas.decode.packed import PackedLinear
from eyas.machine import cpu_flags

CAN_BUILD = ({"avx2", "fma"} <= set(cpu_flags()) and platform.machine() == "x86_64"
             and shutil.which(os.environ.get("CC", "cc")) is not None)
pytestmark = [pytest.mark.usefixtures("one_thread", "fresh_build"),
              pytest.mark.skipif(not CAN_BUILD, reason="needs an x86 CPU with AVX2 + FMA and a C compiler")]


@pytest.fixture
def avx2_like(monkeypatch):
    """oneDNN cannot pack bf16, as on an AVX2-only CPU (fp32 still packs)."""
    pack = packed_module.pack
    monkeypatch.setattr(packed_module, "pack", lambda w: None if w.dtype == torch.bfloat16 else pack(w))


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """A private kernel cache (the user's is never written), and the built library forgotten before
    and after the test: each test builds it (under a second on a 2-core AVX-512 EPYC)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bf16_kernel._library.cache_clear()
    yield
    bf16_kernel._library.cache_clear()


def test_products_are_bf16_products_summed_in_fp32_whatever_the_rows():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(203, 96, generator=g) * 0.1).bfloat16()  # 203 rows: a partial last chunk
    x = torch.randn(19, 96, generator=g).bfloat16()  # 19 rows: passes of 7, 6 and 6
    y = bf16_kernel.matmul(x, w)
    exact = x.double() @ w.double().T
    assert y.dtype == torch.float32 and y.shape == (19, 203)
    torch.testing.assert_close(y.double(), exact, atol=1e-5, rtol=1e-5)
    for rows in (slice(0, 1), slice(3, 5), slice(4, 13), slice(2, 19)):  # every row sums the same way
        assert torch.equal(bf16_kernel.matmul(x[rows], w), y[rows])
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torch.equal(bf16_kernel.matmul(x, w), y)
    finally:
        torch.set_num_threads(before)
    assert bf16_kernel.matmul(x.view(1, 19, 96), w).shape == (1, 19, 203)


def test_packed_linear_takes_the_kernel_where_bf16_cannot_be_packed(avx2_like):
    torch.manual_seed(0)
    a, b = torch.nn.Linear(32, 8).bfloat16(), torch.nn.Linear(32, 16).bfloat16()
    x, r = torch.randn(1, 5, 32).bfloat16(), torch.randn(1, 5, 24).bfloat16()
    both = PackedLinear([a, b])
    assert both.native and both.packed is None
    ref = torch.cat([F.linear(x, a.weight, a.bias), F.linear(x, b.weight, b.bias)], dim=-1)
    out = both(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)  # bf16's tolerance: the sum's order is all that differs
    torch.testing.assert_close(both(x, add=r), r + ref)
    odd = torch.nn.Linear(12, 4).bfloat16()  # 12 inputs: not a multiple of 8, torch's kernel
    assert not PackedLinear([odd]).native
    assert not PackedLinear([torch.nn.Linear(32, 8)]).native  # fp32 packs as before


def test_greedy_bf16_decoding_on_the_kernel_follows_the_target(tmp_path, avx2_like):
    """A wrong product anywhere in the verify would leave the target's greedy path. This seeded tiny
    target has no near-tie in its 24 tokens; on a real one bf16 can flip a near-tie, because the
    verify's attention rounds differently from a one-token step's (benchmarks/README.md)."""
    target = build_target(tmp_path, 7, **GREEDY_TARGET)
    target.model.to(torch.bfloat16)
    drafter = random_drafter(target, tiny_contract()).to(torch.bfloat16)
    assert lean_target(target).layers[0].qkv.native and lean_target(target).lm_head.native
    prompt = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(1)).tolist()
    alone, _ = generate(target, None, prompt, max_new_tokens=24)
    for shape in ({"draft_tokens": 3}, {"tree": (3, 2, 6)}):
        out, stats = generate(target, drafter, prompt, max_new_tokens=24, **shape)
        assert torch.equal(out, alone), shape


def test_off_by_choice_or_without_a_compiler(avx2_like, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("EYAS_BF16_KERNEL", "0")  # to time the difference
    assert not bf16_kernel.available()
    bf16_kernel._said_off.cache_clear()
    with pytest.warns(UserWarning, match="EYAS_BF16_KERNEL=0: bf16 products run on torch's kernels") as said:
        for _ in range(2):
            assert not PackedLinear([torch.nn.Linear(32, 8).bfloat16()]).native  # torch's kernel
    assert len(said) == 1  # once
    monkeypatch.delenv("EYAS_BF16_KERNEL")
    bf16_kernel._library.cache_clear()
    which = bf16_kernel.shutil.which
    monkeypatch.setattr(bf16_kernel.shutil, "which", lambda name: None)
    with pytest.warns(UserWarning, match=r"could not be built \(no C compiler"):
        assert not bf16_kernel.available()
    monkeypatch.setattr(bf16_kernel.shutil, "which", which)
    bf16_kernel._library.cache_clear()
    assert bf16_kernel.available() and list((tmp_path / "cache" / "eyas" / "kernels").glob("bf16_avx2-*.so"))
