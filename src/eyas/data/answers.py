"""The target's answers to a batch of prompts: what capture trains on and self-written prompts are.

Answering is most of a capture's time (docs/training.md: 224 of the shipped run's 386 GPU seconds),
one token per step for a whole batch, and Hugging Face `generate` spends most of such a step outside
the arithmetic: masks, kwargs and a DynamicCache rebuilt or copied on every step. eyas's lean
forward (eyas.decode.lean_forward) runs the same steps over one preallocated, batched StaticKV.
Targets it does not implement, and targets whose second weight copy would not fit in memory, answer
through `generate`.

A batch is left-padded so every answer starts in the same column: row b's prompt holds columns
[start_b, P), its positions count from 0 at start_b, and no query attends to a padding key (a
padding query attends to itself only, so that its row of the softmax is defined; it is never read).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from eyas.devices import room_for_a_copy

if TYPE_CHECKING:
    from eyas.decode.lean_forward import LeanTarget
    from eyas.decode.static_cache import StaticKV
    from eyas.target import Target, TargetOutput

ANSWER_ENGINES = ("eyas", "generate")  # `eyas capture --answers`: eyas's loop where it applies, or always `generate`
DONE_EVERY = 8  # steps between checks that every row has ended (a check waits for a GPU)
PREFILL_SCORES = 1 << 27  # attention scores a prefill chunk may hold (fp32: 512 MiB), whatever the prompts' length


def eos_ids(target: Target) -> list[int]:
    """The target's end-of-turn token ids (generation config first, then the tokenizer)."""
    eos = target.model.generation_config.eos_token_id
    if eos is None:
        eos = target.tokenizer.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def pad_id(target: Target) -> int:
    """The padding id: the tokenizer's, else the first end-of-turn id (padding is never attended)."""
    pad = target.tokenizer.pad_token_id
    return pad if pad is not None else (eos_ids(target) or [0])[0]


@torch.inference_mode()
def answer(target: Target, prompt_ids: list[list[int]], sampling: dict[str, Any], *,
           lean: bool = True) -> list[list[int]]:
    """The target's answer to each prompt, cut after its first end-of-turn token.

    `sampling`: max_new_tokens, do_sample, and when sampling temperature, top_p, top_k (0: none),
    applied as `generate` applies them; draws come from torch's global RNG (the caller seeds it).
    `lean=False` answers through `generate` whatever the target (benchmarks/bench_answers.py's baseline).
    """
    pad, eos = pad_id(target), eos_ids(target)
    ids, starts = left_padded(prompt_ids, pad)
    ids, starts = ids.to(target.model.device), starts.to(target.model.device)
    fast = _lean_if_it_fits(target, ids.shape, sampling["max_new_tokens"]) if lean else None
    if fast is not None:
        new = _lean_generate(fast, ids, starts, sampling, eos)
    else:
        new = _hf_generate(target, ids, starts, sampling, pad, eos)
    answers = []
    for row in new.tolist():
        cut = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
        answers.append(row[:cut])  # a finished row went on generating; its tail is dropped here
    return answers


def left_padded(prompt_ids: list[list[int]], pad: int) -> tuple[Tensor, Tensor]:
    """ids [B, P] with every prompt ending at column P-1, and each row's first prompt column [B]."""
    P = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), P), pad, dtype=torch.long)
    for b, p in enumerate(prompt_ids):
        ids[b, P - len(p) :] = torch.tensor(p, dtype=torch.long)
    return ids, torch.tensor([P - len(p) for p in prompt_ids])


def _lean_if_it_fits(target: Target, shape: torch.Size, max_new_tokens: int) -> LeanTarget | None:
    """The lean forward, where the target has one and its packed weight copy plus the batch's cache
    take at most half the free memory (a copy already built costs nothing more: a capture that began
    with the lean forward keeps it)."""
    from eyas.decode import lean_forward  # the decoder loads when answers are generated, not with the CLI

    if lean_forward.unsupported(target) is not None:
        return None
    c, model = target.config, target.model
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    cache = 2 * c.num_hidden_layers * shape[0] * c.num_key_value_heads * head_dim * (shape[1] + max_new_tokens)
    cache *= _cache_dtype(model.device, model.dtype).itemsize
    fits = room_for_a_copy(model, cache, made=lean_forward.built(target))
    return lean_forward.lean_target(target) if fits else None


def _lean_generate(lean: LeanTarget, ids: Tensor, starts: Tensor, sampling: dict[str, Any],
                   eos: list[int]) -> Tensor:
    """New tokens [B, n <= max_new_tokens] from the lean forward over a batched static cache; it
    stops early once every row has produced an end-of-turn token."""
    (B, P), n, device = ids.shape, sampling["max_new_tokens"], ids.device
    cache = lean.new_cache(P + n, batch=B, dtype=_cache_dtype(device, lean.embed.weight.dtype))
    cols = torch.arange(P + n, device=device)
    real = cols[None, :] >= starts[:, None]  # [B, P + n]: the columns that are not padding
    positions = (cols[None, :] - starts[:, None]).clamp(min=0)
    out = _prefill(lean, ids, positions, real, cache)
    padded = bool(starts.any())
    ends = torch.tensor(eos, dtype=torch.long, device=device)
    tokens = torch.empty(B, n, dtype=torch.long, device=device)
    ended = torch.zeros(B, dtype=torch.bool, device=device)
    choose = _chooser(sampling)
    for t in range(n):
        tokens[:, t] = choose(out.logits[:, -1])
        ended |= torch.isin(tokens[:, t], ends)
        if t == n - 1 or ((t + 1) % DONE_EVERY == 0 and bool(ended.all())):
            return tokens[:, : t + 1]
        step_mask = real[:, None, : P + t + 1] if padded else None
        out = lean.forward(tokens[:, t : t + 1], positions[:, P + t : P + t + 1], cache, (), mask=step_mask)
    return tokens


def _cache_dtype(device: torch.device, weights: torch.dtype) -> torch.dtype:
    """fp32 keys and values on a CPU, where fp32 attention is the fast one (eyas.decode.static_cache);
    the weights' dtype elsewhere, which halves a large batch's cache."""
    return torch.float32 if device.type == "cpu" else weights


def _prefill(lean: LeanTarget, ids: Tensor, positions: Tensor, real: Tensor, cache: StaticKV) -> TargetOutput:
    """The prompts' forward, in chunks of query columns small enough that one chunk's attention
    scores (batch x heads x queries x keys) stay under PREFILL_SCORES; logits of the last column."""
    (B, P), cols = ids.shape, torch.arange(ids.shape[1], device=ids.device)
    step = max(1, PREFILL_SCORES // (B * lean.heads * P))
    for c in range(0, P, step):
        e = min(c + step, P)
        q, k = cols[c:e, None], cols[None, :e]  # this chunk's queries, the keys up to them
        mask = (real[:, None, :e] | (q == k)) & (k <= q)  # [B, queries, keys]
        out = lean.forward(ids[:, c:e], positions[:, c:e], cache, (), mask=mask, logit_rows=slice(-1, None))
    return out


def _chooser(sampling: dict[str, Any]) -> Callable[[Tensor], Tensor]:
    """How every row's next token [B] comes from its logits [B, V]: argmax, or a draw from the warped p."""
    if not sampling["do_sample"]:
        return lambda logits: logits.argmax(dim=-1)
    from eyas.decode.sampling import Sampling, warp_probs

    s = Sampling(temperature=sampling["temperature"], top_p=sampling["top_p"], top_k=sampling["top_k"] or 0)
    return lambda logits: torch.multinomial(warp_probs(logits, s), 1)[:, 0]


def _hf_generate(target: Target, ids: Tensor, starts: Tensor, sampling: dict[str, Any], pad: int,
                 eos: list[int]) -> Tensor:
    """New tokens [B, n] from Hugging Face `generate` (finished rows continue with padding)."""
    attn = (torch.arange(ids.shape[1], device=ids.device)[None, :] >= starts[:, None]).long()
    kwargs: dict[str, Any] = dict(do_sample=False)
    if sampling["do_sample"]:
        kwargs = {k: sampling[k] for k in ("do_sample", "temperature", "top_p", "top_k")}
    out = target.model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=sampling["max_new_tokens"],
                                pad_token_id=pad, eos_token_id=eos or None, **kwargs)
    return out[:, ids.shape[1] :]
