"""What one forward costs on this machine: the terms of speculative decoding's speedup.

    speedup = tau x T(1) / (T_verify(N) + d x T_draft)

tau is the tokens a round yields, T(1) a target forward over one new token (plain decoding's step),
T_verify(N) one over a round's N+1 nodes, T_draft one draft step and d the steps per round. The
acceptance side (tau) comes from decoding; the cost side is measured here, on a cache of `context`
positions, as decoding runs it (the lean forward where it applies, packed draft linears, static
caches). Sizes are interleaved and each keeps its fastest repeat, so a load spike on a shared
machine hits every size alike and rarely survives the minimum. With one torch thread the clock is
this thread's CPU time, which other processes on a shared machine barely move (it equals the wall
time on an idle one); with more threads, or on a GPU, it is the wall clock, read after the GPU has
finished what was queued (a launch returns before its kernels run).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext

import torch

from eyas.contract import default_capture_layers
from eyas.decode.packed import packed_linears
from eyas.decode.propose import draft_cache, draft_step0
from eyas.decode.tree import chain_tree
from eyas.decode.verify import decoder, keep_accepted_kv, prefill, verify
from eyas.devices import synchronize
from eyas.drafter import DraftCache, Drafter
from eyas.target import Target


def clock(device: torch.device | None = None) -> float:
    """Seconds on the clock costs are measured with, once the work queued on `device` is done (see the
    module docstring)."""
    if device is not None and device.type != "cpu":
        synchronize(device)
        return time.perf_counter()
    return time.thread_time() if torch.get_num_threads() == 1 else time.perf_counter()


@torch.no_grad()
def target_forward_ms(
    target: Target, sizes: Sequence[int], *, context: int = 256, repeats: int = 3, lean: bool = True,
    capture: Sequence[int] | None = None,
) -> dict[int, float]:
    """Milliseconds per target forward over `size` new tokens after `context` cached ones, by size.

    `lean=False` times transformers' forward (the path targets the lean forward does not support
    take) for comparison. `capture` defaults to three layers, as a drafter reads them.
    """
    capture = default_capture_layers(target.num_layers) if capture is None else tuple(capture)
    model = decoder(target) if lean else target
    g = torch.Generator().manual_seed(0)
    device = target.model.device
    ids = torch.randint(0, target.vocab_size, (1, context + max(sizes)), generator=g).to(device)
    cache = prefill(model, ids[:, :context], capture, context + max(sizes)).past_key_values
    best = {size: float("inf") for size in sizes}
    for _ in range(repeats + 1):  # the first pass warms up (allocator, oneDNN primitives)
        for size in sizes:
            t0 = clock(device)
            verify(model, chain_tree(ids[0, context : context + size]), cache, context, capture)
            best[size] = min(best[size], clock(device) - t0)
            keep_accepted_kv(cache, context, [])
    return {size: 1000 * s for size, s in best.items()}


@torch.no_grad()
def draft_step_ms(
    drafter: Drafter, sizes: Sequence[int] = (1,), *, context: int = 256, repeats: int = 3, lean: bool = True,
) -> dict[int, float]:
    """Milliseconds per draft step over `size` new positions (1: a chain step; top_k: a tree level)
    after `context` positions, with random features (the cost does not depend on their values).
    `lean=False`: plain linears over the training-time DraftCache, for comparison."""
    c = drafter.contract
    device = drafter.norm.weight.device
    g = torch.Generator().manual_seed(0)
    features = torch.randn(1, context, c.fc_in_features, generator=g).to(device)
    ids = torch.randint(0, c.vocab_size, (1, context + max(sizes)), generator=g).to(device)
    best = {size: float("inf") for size in sizes}
    with packed_linears(drafter) if lean else nullcontext():
        cache = draft_cache(drafter, context + max(sizes)) if lean else DraftCache(drafter, 1)
        _, hidden = draft_step0(drafter, cache, features, ids[:, :context], context)
        for _ in range(repeats + 1):
            for size in sizes:
                positions = torch.full((1, size), context, device=device)
                t0 = clock(device)
                drafter(hidden.expand(1, size, -1), ids[:, context : context + size], positions, cache=cache)
                best[size] = min(best[size], clock(device) - t0)
                cache.crop(context)
    return {size: 1000 * s for size, s in best.items()}
