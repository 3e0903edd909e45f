"""Shared fixtures: tiny random EAGLE-3 drafts built in memory (no binary fixtures in the repo)."""

from __future__ import annotations

import pytest
import torch

from eyas.contract import DraftContract, Verifier, expected_shapes

TINY_TARGET_LAYERS = 6
# Llama-3.1-style rope scaling, shrunk to tiny context lengths
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """Timings made in tests are never provisional: on a loaded CI machine the quick sweep and the
    dtype timing would otherwise be made again at every call (eyas.machine.Contention); the tests of
    that rule (tests/test_contention.py) set the machine's load themselves."""
    monkeypatch.setattr("eyas.machine._machine_seconds", lambda: None)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models are dominated by per-op overhead: one thread is faster and steadier on 2 shared
    cores. Modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def fake_dtype_measurement(calls: list, faster: str):
    """A stand-in for eyas.dtype_choice.measure_dtypes: `faster` ("bf16" or "fp32") wins, each call
    is recorded in `calls`, and the Hugging Face baselines run greedy in bf16, lookup in fp32."""
    slower = "fp32" if faster == "bf16" else "bf16"

    def measure(spec, **kw):
        calls.append(spec)
        return {"dtype": faster, "forward_ms": {faster: {"1": 5.0}, slower: {"1": 9.0}}, "sizes": [1],
                "hf_forward_ms": {"bf16": {"1": 5.0, "11": 30.0}, "fp32": {"1": 6.0, "11": 20.0}},
                "hf_dtypes": {"hf_greedy": "bf16", "hf_prompt_lookup": "fp32"}}

    return measure


def tiny_contract(**overrides) -> DraftContract:
    """A tiny draft: hidden 64, 4 heads (2 kv), vocab 256 with a 64-token draft vocab."""
    base = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=256,
        draft_vocab_size=64,
        target_hidden_size=64,
        capture_layers=(1, 3, 4),
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=512,
        has_vocab_map=True,
        verifier=Verifier(
            name_or_path="tiny/target",
            architectures=("LlamaForCausalLM",),
            num_hidden_layers=TINY_TARGET_LAYERS,
            hidden_size=64,
            vocab_size=256,
        ),
    )
    base.update(overrides)
    if base["draft_vocab_size"] == base["vocab_size"] and "has_vocab_map" not in overrides:
        base["has_vocab_map"] = False
    return DraftContract(**base)


def random_tensors(c: DraftContract, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Random weights (fp32, or `dtype` drawn directly: a real-size draft in bf16 never exists in fp32)
    with every shape the contract expects, and a valid vocab map."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in expected_shapes(c).items():
        if name == "d2t":
            used = torch.randperm(c.vocab_size, generator=g)[: c.draft_vocab_size].sort().values
            out["d2t"] = used - torch.arange(c.draft_vocab_size)
            t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
            t2d[used] = True
            out["t2d"] = t2d
        elif name == "t2d":
            continue
        elif "norm" in name:
            out[name] = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=dtype)
        else:
            out[name] = 0.05 * torch.randn(shape, generator=g, dtype=dtype)
    return out
