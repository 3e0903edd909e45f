"""eyas.ttt_attention: the diagonal TTT attention equals the masked reference (`forward_ttt(masked=True)`).

Rows pack several documents plus padding, query blocks are shrunk so that a row spans several of them
(and blocks start inside a document), and both teacher forcing and free running are compared: logits
and gradients within fp32 tolerance, bf16 within bf16's.
"""

from __future__ import annotations

import pytest
import torch

import eyas.ttt_attention as ttt
from conftest import random_tensors, tiny_contract
from eyas.drafter import Drafter, ttt_mask
from eyas.shift import label_ids

pytestmark = pytest.mark.usefixtures("one_thread")

STEPS = 5
# Two rows of 23 positions: documents of 7, 9 and 7 tokens; 15 tokens and 8 of padding (document -1).
DOCS = torch.tensor([[0] * 7 + [1] * 9 + [2] * 7, [0] * 15 + [-1] * 8])


def packed_batch(c, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    B, T = DOCS.shape
    starts = torch.stack([torch.searchsorted(row, row) for row in DOCS.contiguous()])  # first position of each doc
    ids = torch.randint(0, c.vocab_size, (B, T), generator=g)
    return {"features": torch.randn(B, T, c.fc_in_features, generator=g), "input_ids": ids,
            "position_ids": 1 + torch.arange(T) - starts, "document_ids": DOCS, "next_ids": label_ids(ids)}


def drafter(c, dtype=torch.float32) -> Drafter:
    embed = 0.5 * torch.randn(c.vocab_size, c.hidden_size, generator=torch.Generator().manual_seed(1))
    return Drafter.from_tensors(c, random_tensors(c), embed_tokens=embed, dtype=dtype)


def unroll(d: Drafter, b: dict, *, masked: bool, teacher: bool = True) -> list[torch.Tensor]:
    return d.forward_ttt(b["features"].to(d.fc.weight.dtype), b["input_ids"], STEPS,
                         next_ids=b["next_ids"] if teacher else None, position_ids=b["position_ids"],
                         document_ids=b["document_ids"], masked=masked)


@pytest.fixture(params=[4, 6, 256], ids=lambda n: f"block{n}")
def block(request, monkeypatch):
    """Query blocks of 4 and 6 split rows mid-document; 256 takes the whole row at once."""
    monkeypatch.setattr(ttt, "QUERY_BLOCK", request.param)
    return request.param


@pytest.mark.parametrize("teacher", [True, False], ids=["teacher", "free"])
@pytest.mark.parametrize("overrides", [{}, dict(num_hidden_layers=2, layer_type="qwen3"),
                                       dict(num_attention_heads=4, num_key_value_heads=4),
                                       dict(num_hidden_layers=2, sliding_window=3)],
                         ids=["llama_gqa", "qwen3_two_layers", "mha", "window_3"])
def test_diagonal_attention_equals_the_masked_reference(block, teacher, overrides):
    c = tiny_contract(**overrides)
    d, b = drafter(c), packed_batch(c)
    with torch.no_grad():
        fast, ref = unroll(d, b, masked=False, teacher=teacher), unroll(d, b, masked=True, teacher=teacher)
    for j in range(STEPS):
        torch.testing.assert_close(fast[j], ref[j], rtol=1e-5, atol=1e-5, msg=f"step {j}")


def test_gradients_equal_the_masked_reference(block):
    c = tiny_contract(num_hidden_layers=2)
    b = packed_batch(c)
    grads = []
    for masked in (False, True):
        d = drafter(c)
        logits = unroll(d, b, masked=masked)
        sum(0.8**j * lg.logsumexp(-1).mean() for j, lg in enumerate(logits)).backward()
        grads.append({k: p.grad for k, p in d.named_parameters()})
    for name, g in grads[1].items():
        torch.testing.assert_close(grads[0][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_bf16_autocast_stays_close_to_the_reference():
    c = tiny_contract()
    d, b = drafter(c), packed_batch(c)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast, ref = unroll(d, b, masked=False), unroll(d, b, masked=True)
    for j in range(STEPS):
        torch.testing.assert_close(fast[j].float(), ref[j].float(), rtol=0.05, atol=0.05)


def test_query_blocks_start_at_the_earliest_document_start():
    mask = ttt_mask(DOCS.shape[1], 1, DOCS, torch.device("cpu"))
    blocks = ttt.query_blocks(mask, 6)
    assert [(a, b) for a, b, _ in blocks] == [(0, 6), (6, 12), (12, 18), (18, 23)]
    # block 6..12: row 0 has positions of documents 0 (from 0) and 1; block 12..18: document 1 starts
    # at 7 in row 0, padding at 15 in row 1 but row 1's document 0 (from 0) is still in the block.
    assert [lo for _, _, lo in blocks] == [0, 0, 0, 15]
