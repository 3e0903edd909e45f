"""eyas.data.answers: a batch of answers from the lean forward must be the answers Hugging Face
`generate` gives (greedy: token-identical in fp32; sampled: the same distribution), left padding
and early stopping included; targets the lean forward does not implement answer through `generate`."""

from __future__ import annotations

import pytest
import torch
from test_decode import GREEDY_TARGET, SAMPLING_TARGET, build_target, chi_square_pvalue
from test_lean_forward import llama, qwen3  # noqa: F401 (module fixtures: a Llama and a Qwen3 target)

import eyas.data.answers as answers
import eyas.devices as devices
import eyas.decode.lean_forward as lean_module
from eyas.decode.lean_forward import lean_target
from eyas.decode.sampling import Sampling
from eyas.target import Target

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[5, 9, 2], [7, 1, 1, 30, 4, 4, 8, 100, 3], [2] * 14, [60, 61]]  # four lengths: left padding


def both(target: Target, prompts: list[list[int]], sampling: dict, eos: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """New tokens from the lean loop and from `generate`, for the same left-padded batch."""
    ids, starts = answers.left_padded(prompts, 0)
    lean = lean_target(target)
    assert lean is not None
    return (answers._lean_generate(lean, ids, starts, sampling, eos),
            answers._hf_generate(target, ids, starts, sampling, 0, eos))


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_lean_answers_are_generates_greedy_answers(name, request):
    target = request.getfixturevalue(name)
    ours, theirs = both(target, PROMPTS, dict(do_sample=False, max_new_tokens=20), [])
    assert ours.shape == (len(PROMPTS), 20)
    assert torch.equal(ours, theirs)


def test_a_batch_stops_once_every_row_has_ended(llama):
    """Every token ends a turn here: each row ends at once, and the loop sees it at its next check."""
    ours, theirs = both(llama, PROMPTS, dict(do_sample=False, max_new_tokens=40), list(range(256)))
    assert ours.shape == (len(PROMPTS), answers.DONE_EVERY)
    assert torch.equal(ours[:, 0], theirs[:, 0])


def test_answer_cuts_each_row_after_its_end_of_turn_token(llama, monkeypatch):
    """The end token is one each row produces at a different step; rows after it are dropped, as
    after `generate`'s padding."""
    sampling = dict(do_sample=False, max_new_tokens=20)
    full, _ = both(llama, PROMPTS, sampling, [])
    end = int(full[1, 5])  # row 1's sixth token
    monkeypatch.setattr(answers, "eos_ids", lambda target: [end])
    monkeypatch.setattr(answers, "pad_id", lambda target: 0)
    got = answers.answer(llama, PROMPTS, sampling)
    for row, tokens in zip(full.tolist(), got):
        cut = row.index(end) + 1 if end in row else len(row)
        assert tokens == row[:cut]
    assert got[1][-1] == end and len(got[1]) <= 6


def test_a_target_without_the_lean_forward_answers_through_generate(llama, monkeypatch):
    monkeypatch.setattr(lean_module, "unsupported", lambda target: "model type 'other'")
    monkeypatch.setattr(answers, "pad_id", lambda target: 0)
    monkeypatch.setattr(answers, "eos_ids", lambda target: [])
    called = []
    monkeypatch.setattr(answers, "_lean_generate", lambda *a: called.append(a))
    got = answers.answer(llama, PROMPTS, dict(do_sample=False, max_new_tokens=5))
    assert not called and [len(g) for g in got] == [5] * len(PROMPTS)


def test_a_lean_copy_that_would_not_fit_leaves_the_answers_to_generate(llama, monkeypatch):
    monkeypatch.setattr(devices, "free_bytes", lambda device: 1000)
    assert answers._lean_if_it_fits(llama, torch.Size([4, 14]), 20) is None
    monkeypatch.setattr(devices, "free_bytes", lambda device: 1 << 40)
    assert answers._lean_if_it_fits(llama, torch.Size([4, 14]), 20) is not None
    weights = sum(p.numel() * p.element_size() for p in llama.model.parameters())
    monkeypatch.setattr(devices, "free_bytes", lambda device: weights)  # half: the cache, not a second copy
    assert answers._lean_if_it_fits(llama, torch.Size([4, 14]), 20) is not None  # the copy exists: kept


def test_gpu_memory_cached_by_torch_counts_as_free(monkeypatch):
    """After a large batch PyTorch keeps its peak reserved; the driver calls it taken, the size checks must not."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1_000, 80_000))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 50_000)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 20_000)
    assert devices.free_bytes(torch.device("cuda", 0)) == 31_000


def test_sampled_answers_follow_the_targets_distribution(tmp_path):
    """Two prompts of different lengths in one padded batch, 400 rows each, three tokens: each row's
    tokens follow its own prompt's warped distribution (Pearson, down the prefix tree)."""
    target = build_target(tmp_path, 1, **SAMPLING_TARGET)
    prompts = [[3, 1, 4, 1, 5], [2, 7]]
    s = Sampling(temperature=0.9, top_p=0.95, top_k=6)
    sampling = dict(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=3)
    ids, starts = answers.left_padded([p for p in prompts for _ in range(400)], 0)
    torch.manual_seed(0)
    new = answers._lean_generate(lean_target(target), ids, starts, sampling, [])
    for i, prompt in enumerate(prompts):
        rows = [tuple(r) for r in new[400 * i : 400 * (i + 1)].tolist()]
        p = chi_square_pvalue(rows, target, s, torch.tensor([prompt]))
        assert p > 0.001, f"prompt {i}: sampled answers do not follow the target distribution (p = {p:.2g})"


def test_a_long_prefill_in_chunks_gives_the_same_answers(llama, monkeypatch):
    """Prompts whose attention scores exceed the bound are prefilled a few columns at a time."""
    whole, _ = both(llama, PROMPTS, dict(do_sample=False, max_new_tokens=10), [])
    monkeypatch.setattr(answers, "PREFILL_SCORES", len(PROMPTS) * 4 * 14 * 3)  # 3 query columns a chunk
    chunked, _ = both(llama, PROMPTS, dict(do_sample=False, max_new_tokens=10), [])
    assert torch.equal(chunked, whole)


def test_a_cache_in_the_weights_dtype_answers_as_the_fp32_one(tmp_path, monkeypatch):
    """Off the CPU the cache keeps the weights' dtype (bf16 attention); run that path here."""
    target = build_target(tmp_path, 3, **GREEDY_TARGET)
    target.model.to(torch.bfloat16)
    sampling = dict(do_sample=False, max_new_tokens=6)
    fp32_cache, _ = both(target, PROMPTS, sampling, [])
    monkeypatch.setattr(answers, "_cache_dtype", lambda device, weights: weights)
    bf16_cache, _ = both(target, PROMPTS, sampling, [])
    assert bf16_cache.shape == fp32_cache.shape
    assert torch.equal(bf16_cache[:, :3], fp32_cache[:, :3])  # logit gaps here are far above bf16 rounding
