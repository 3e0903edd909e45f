"""`generate`: the speculative decoding loop (draft, verify, accept, commit) at batch size 1.

The target alone (no drafter) runs the same loop with an empty draft, one token per round: the
baseline that isolates what the drafter adds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext

import torch
from torch import Tensor

from eyas.contract import default_capture_layers
from eyas.decode.accept import accept_chain_sampling, accept_greedy, accept_tree_sampling
from eyas.decode.ngram import BranchLength, NgramIndex, add_branch
from eyas.decode.packed import packed_linears
from eyas.decode.propose import Drafting
from eyas.decode.sampling import Sampling, choose, warp_probs
from eyas.decode.stats import DecodeStats
from eyas.decode.tree import DraftTree, root_only
from eyas.decode.verify import decoder, keep_accepted_kv, prefill, placed_nodes, verify
from eyas.devices import synchronize
from eyas.drafter import Drafter
from eyas.errors import EyasError
from eyas.target import Target, check_fits
from eyas.target_context import decode_bound

DEFAULT_DRAFT_TOKENS = 4  # chain length when a drafter is given without draft_tokens or tree


def _prompt(input_ids, device: torch.device) -> Tensor:
    """A prompt as [1, T] int64 on `device`: [T], [1, T] or a list of ints."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.ndim == 1:
        ids = ids[None]
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise EyasError(
            f"generate takes one prompt (batch size 1); got input_ids of shape {list(ids.shape)}",
            "call generate once per prompt",
        )
    if ids.shape[1] == 0:
        raise EyasError("the prompt is empty", "pass at least one token id")
    return ids.to(device)


def tree_shape(tree: Sequence[int], what: str = "tree") -> tuple[int, int, int]:
    """(depth, top_k, budget) checked: integers >= 1, and a budget of at least the depth. A node is kept
    only with its ancestors (scores fall along a path), so a budget b keeps nothing past depth b: the
    levels beyond it would be drafted, each a draft forward, for no token ever verified. `what` names
    the shape in errors (the CLI's "--tree")."""
    try:
        shape = tuple(int(v) for v in tree)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        shown = ",".join(map(str, tree)) if isinstance(tree, (list, tuple)) else repr(tree)
        raise EyasError(f"{what} {shown}: expected depth,top_k,budget, three integers >= 1", f"e.g. {what} 5,4,16")
    depth, top_k, budget = shape
    if budget < depth:
        levels = f"level {depth}" if depth == budget + 1 else f"levels {budget + 1}..{depth}"
        raise EyasError(f"{what} {depth},{top_k},{budget}: a budget of {budget} nodes keeps none past depth "
                        f"{budget}, so {levels} would be drafted for nothing",
                        f"use a budget of at least the depth, e.g. {what} "
                        + (f"{depth},{top_k},{2 * depth}" if depth <= 32 else "5,4,16 (EAGLE-3 drafts a few tokens "
                                                                              "deep)"))
    return shape


def _draft_plan(
    drafter: Drafter | None, draft_tokens: int | None, tree: tuple[int, int, int] | None
) -> tuple[int, tuple[int, int, int] | None]:
    """(max draft tokens on one path, tree shape or None for a chain), checked."""
    if drafter is None:
        if draft_tokens or tree:
            raise EyasError("draft_tokens / tree need a drafter", "pass a drafter, or neither option")
        return 0, None
    if draft_tokens is not None and tree is not None:
        raise EyasError("both draft_tokens and tree were given", "pass draft_tokens=k or tree=(d, k, n)")
    if tree is not None:
        # children past the budget's count are never kept (their better siblings fill it first): top_k capped
        # at the budget drafts the same tree without K x K candidates a level (--tree 3,49151,16 ran out of memory)
        depth, top_k, budget = tree_shape(tree)
        return depth, (depth, min(top_k, budget), budget)
    k = DEFAULT_DRAFT_TOKENS if draft_tokens is None else int(draft_tokens)
    if k < 1:
        raise EyasError(f"draft_tokens={k}: a chain needs at least 1 draft token", "e.g. draft_tokens=4")
    return k, None


def _check_request(target: Target, prompt_len: int, max_new_tokens: int, temperature, top_p, top_k) -> None:
    if max_new_tokens < 1:
        raise EyasError(f"max_new_tokens={max_new_tokens}: nothing to generate", "pass max_new_tokens >= 1")
    # longrope: its original length (past it, its rotary factors change)
    context, why = decode_bound(target.config.to_dict(), getattr(target.config, "max_position_embeddings", None))
    if context is not None and prompt_len + max_new_tokens > context:
        raise EyasError(
            f"the prompt has {prompt_len} tokens and max_new_tokens is {max_new_tokens}: "
            f"{prompt_len + max_new_tokens} positions, but the target's context is {context}{why}",
            f"shorten the prompt to at most {context - max_new_tokens} tokens or lower max_new_tokens",
        )
    if not temperature >= 0 or not 0 < top_p <= 1 or top_k < 0:  # NaN fails each: it sampled greedily
        raise EyasError(
            f"temperature={temperature}, top_p={top_p}, top_k={top_k}",
            "temperature >= 0 (0 = greedy), 0 < top_p <= 1, top_k >= 0 (0 = off)",
        )


def branch_tokens(ngram_tokens: int, drafter: Drafter | None, tree: Sequence[int] | None, temperature: float) -> int:
    """The n-gram branch's cap as decoding uses it: none beside a sampled chain, whose acceptance rule reads
    the draft's distribution, which copied tokens have none of (a sampled chain reported a branch of 8 and 8
    depths, 4 of them never tried)."""
    return 0 if drafter is not None and tree is None and temperature > 0 else ngram_tokens


def _verified_nodes(max_draft: int, tree_shape: tuple[int, int, int] | None, ngram_tokens: int) -> int:
    """The most nodes one verify forward can hold: the root, the draft's nodes, an n-gram branch."""
    return 1 + (tree_shape[2] if tree_shape else max_draft) + ngram_tokens


@torch.no_grad()
def generate(
    target: Target,
    drafter: Drafter | None,
    input_ids: Tensor | Sequence[int],
    *,
    max_new_tokens: int,
    draft_tokens: int | None = None,
    tree: tuple[int, int, int] | None = None,
    ngram_tokens: int = 0,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_ids: Iterable[int] = (),
    seed: int | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> tuple[Tensor, dict]:
    """Generate up to `max_new_tokens` tokens after `input_ids`, speculatively when a drafter is given.

    Batch size 1 only (one prompt: [T], [1, T] or a list of ids; more raises EyasError): rounds
    accept different numbers of tokens per sequence. With `drafter=None` the target decodes alone
    through the same KV-cache loop (the baseline). Drafting: `draft_tokens=k` (a chain, the default
    with k = DEFAULT_DRAFT_TOKENS) or `tree=(depth, top_k, budget)` (EAGLE-2: up to `depth` tokens
    on a path, `top_k` children and frontier nodes per level, `budget` draft nodes verified).
    `ngram_tokens=m` adds up to m tokens copied from the context (eyas.decode.ngram) as one more
    branch of every round's tree, with or without a drafter (not to sampled chains, whose
    acceptance rule reads the draft's distribution): as many as the branch's recent acceptance
    suggests (`BranchLength`), so long copied runs get long branches and open text short ones.

    temperature 0 is greedy: the output is the target's own greedy decoding (token for token, up to
    floating-point ties). Otherwise tokens follow the target distribution under temperature / top_k
    / top_p exactly (lossless rejection sampling), reproducibly for a given `seed`. Generation stops
    after a token in `stop_ids` (which is kept) or after `max_new_tokens`. `on_tokens` receives each
    batch of newly accepted ids as soon as they are known.

    Returns (output_ids [1, T + new] on the target's device, stats) with stats keys:
    accept_counts (histogram over rounds of accepted draft tokens, length max path + 1), tau (mean
    tokens per target verify round = accepted + 1, before truncation by stop/max), acceptance_by_depth
    (P(draft token at depth j accepted | all shallower accepted and a candidate at depth j existed),
    None where never tried), ngram_accepted (accepted tokens only the n-gram branch proposed), rounds
    (verify forwards, the prefill excluded), new_tokens, time_prefill_s, time_draft_s, time_verify_s,
    time_other_s, time_total_s, tokens_per_s (new tokens / total time).
    """
    device = target.model.device
    prompt = _prompt(input_ids, device)  # [1, T]
    T = prompt.shape[1]
    _check_request(target, T, max_new_tokens, temperature, top_p, top_k)
    max_draft, tree_shape = _draft_plan(drafter, draft_tokens, tree)
    if ngram_tokens < 0:
        raise EyasError(f"ngram_tokens={ngram_tokens}: expected 0 (off) or more", "e.g. ngram_tokens=8")
    capture: tuple[int, ...] = ()
    if drafter is not None:
        check_fits(drafter.contract, target)
        capture = drafter.contract.capture_layers or default_capture_layers(target.num_layers)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    s = Sampling(temperature, top_p, top_k, generator)
    ngram_tokens = branch_tokens(ngram_tokens, drafter, tree_shape, temperature)
    out = _Output(max_new_tokens, {int(x) for x in stop_ids}, on_tokens)
    stats = DecodeStats(max(max_draft, ngram_tokens))
    with nullcontext() if drafter is None else packed_linears(drafter):
        # Prefill: the target reads the prompt; its last logits give the first new token x_T.
        t0 = time.perf_counter()
        model = decoder(target)
        max_len = T + max_new_tokens + _verified_nodes(max_draft, tree_shape, ngram_tokens)
        first = prefill(model, prompt, capture, max_len)
        synchronize(device)
        stats.time["prefill"] += time.perf_counter() - t0
        cache, token = first.past_key_values, choose(first.logits[0, -1], s)
        done = out.emit([token])
        context = NgramIndex(prompt[0].tolist() + [token]) if ngram_tokens else None
        length = BranchLength(ngram_tokens)
        drafting = None
        if drafter is not None:
            spare = max(max_draft, tree_shape[1] * max_draft) if tree_shape else max_draft
            drafting = Drafting(drafter, prompt, first.features, token, T + max_new_tokens + spare, tree_shape, s,
                                target.vocab_size)

        while not done:
            n = cache.get_seq_length()  # x_0..x_{n-1} are cached; `token` is x_n
            room = max_new_tokens - len(out.ids)  # this round may emit at most `room` tokens

            # 1. draft (at most room - 1 tokens deep: a round emits the accepted ones plus one)
            t0 = time.perf_counter()
            root = torch.tensor([token], device=device)
            if drafting is not None and room > 1:
                draft = drafting.propose(root, n, min(max_draft, room - 1))
            else:
                draft = root_only(token, device)
            first_copied = len(draft.parents)  # nodes from here on were proposed by the n-gram branch only
            branch = []
            if context is not None and room > 1:
                branch = context.propose(min(length.now, room - 1))
                draft, _ = add_branch(draft, branch)
            synchronize(device)
            stats.time["draft"] += time.perf_counter() - t0

            # 2. verify: one target forward over the root and every draft node (the first nodes only, once per
            # 8192 positions, where Llama 4 would scale the others for positions not theirs)
            draft = placed_nodes(model, draft, n)
            t0 = time.perf_counter()
            scored = verify(model, draft, cache, n, capture)
            synchronize(device)
            stats.time["verify"] += time.perf_counter() - t0

            # 3. accept
            path, token = _accept(draft, scored.logits[0], s)
            stats.round(draft, path)
            stats.ngram_accepted += sum(node >= first_copied for node in path)

            # 4. commit: the target cache, the draft's pending inputs and the n-gram index follow the path
            nodes = [0] + path
            keep_accepted_kv(cache, n, nodes)
            accepted = draft.tokens[path].tolist() + [token]  # x_{n+1} .. x_{n+a+1}
            if drafting is not None:
                drafting.commit(scored.features[:, torch.tensor(nodes, device=device)], accepted)  # g_n .. g_{n+a}
            if context is not None:
                context.extend(accepted)
                length.update(branch, accepted[:-1])
            done = out.emit(accepted)

    output = torch.cat([prompt, prompt.new_tensor([out.ids])], dim=1)  # [1, T + new]
    return output, stats.result(len(out.ids))


def _accept(draft: DraftTree, logits: Tensor, s: Sampling) -> tuple[list[int], int]:
    """The accepted nodes and the next token, by the rule that fits the draft and the sampling."""
    if s.greedy:
        return accept_greedy(draft, logits)
    if draft.q is not None:
        return accept_chain_sampling(draft, warp_probs(logits, s), s)
    return accept_tree_sampling(draft, warp_probs(logits, s), s)


class _Output:
    """The tokens generated so far, cut at a stop id or the limit, and streamed as they come."""

    def __init__(self, max_new_tokens: int, stops: set[int], on_tokens: Callable[[list[int]], None] | None):
        self.max_new_tokens, self.stops, self.on_tokens = max_new_tokens, stops, on_tokens
        self.ids: list[int] = []

    def emit(self, tokens: list[int]) -> bool:
        """Append accepted tokens up to a stop id or the limit; True when generation is over."""
        fresh = []
        for x in tokens:
            fresh.append(x)
            if x in self.stops or len(self.ids) + len(fresh) == self.max_new_tokens:
                break
        self.ids.extend(fresh)
        if self.on_tokens is not None:
            self.on_tokens(fresh)
        return fresh[-1] in self.stops or len(self.ids) == self.max_new_tokens
