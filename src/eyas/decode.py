"""Speculative decoding with an EAGLE-3 drafter: chain or EAGLE-2 tree drafts, greedy or sampled.

One round, at batch size 1 (Leviathan et al. 2023 / Chen et al. 2023, with EAGLE's feature-level
drafting and EAGLE-2's dynamic trees):

1. draft   the drafter reads the target features of the tokens accepted last round (its cache keeps
           these "step 0" entries), then proposes a chain of k tokens or a tree of candidates.
2. verify  the target scores the current token and every draft token in ONE forward; a tree uses an
           attention mask in which each node sees the cache and its own ancestors.
3. accept  greedy: the longest draft path that matches the target's argmax; sampling: rejection
           sampling that leaves the target distribution exactly as it is (`accept_chain_sampling`,
           `accept_tree_sampling`).
4. commit  the target cache keeps the k/v of the accepted path and drops the rest; the accepted
           positions' features go to the next round's draft.

Positions. The target cache holds x_0..x_{n-1}; the current token x_n (chosen last round) is not in
it yet. EAGLE-3 alignment (eyas.drafter): the draft entry at position t pairs the target feature g_t
(the prefix through x_t) with the token x_{t+1} and predicts x_{t+2}. A draft node at depth d is
the token x_{n+d}: the draft reads it at rope position n+d-1, the target at position n+d. The
target alone (no drafter) runs the same loop with an empty draft: one token per round.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from eyas.contract import default_capture_layers
from eyas.drafter import DraftCache, Drafter
from eyas.errors import EyasError
from eyas.target import Target, check_fits

DEFAULT_DRAFT_TOKENS = 4  # chain length when a drafter is given without draft_tokens or tree


# --- choosing tokens from logits --------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn; temperature 0 means greedy (argmax, no randomness)."""

    temperature: float = 0.0
    top_p: float = 1.0  # nucleus: keep the most likely tokens whose mass reaches top_p
    top_k: int = 0  # 0: no top-k filter
    generator: torch.Generator | None = None  # None: torch's global RNG

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def warp_probs(logits: Tensor, s: Sampling) -> Tensor:
    """The distribution tokens are drawn from: [..., V] logits -> [..., V] fp32 probabilities.

    Temperature, then top-k, then top-p, in the order Hugging Face `generate` applies them. The same
    warp is applied to the target (p) and to a chain draft (q): speculative sampling is exact for
    any q, and a q shaped like p is accepted more often.
    """
    logits = logits.float() / s.temperature
    if s.top_k > 0:
        kth = logits.topk(min(s.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of strictly likelier tokens
        drop = torch.zeros_like(mass_before, dtype=torch.bool).scatter(-1, order, mass_before >= s.top_p)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def draw(probs: Tensor, s: Sampling) -> int:
    """One token id from a [V] distribution (not necessarily normalised)."""
    return int(torch.multinomial(probs, 1, generator=s.generator))


def uniform(s: Sampling, device: torch.device) -> float:
    """One draw from U[0, 1): the coin of an accept/reject decision."""
    return float(torch.rand((), generator=s.generator, device=device))


def choose(logits: Tensor, s: Sampling) -> int:
    """The next token from [V] logits with nothing drafted: argmax, or a draw from the warped p."""
    return int(logits.argmax()) if s.greedy else draw(warp_probs(logits, s), s)


# --- the draft tree ----------------------------------------------------------------------------


@dataclass
class DraftTree:
    """Tokens to verify in one round: node 0 is the root (x_n), every other node a draft token.

    A chain is the tree in which node i's parent is i-1. Nodes are ordered parents first, so node
    i's ancestors all have smaller indices.
    """

    tokens: Tensor  # [N+1] target-vocab ids; tokens[0] is the root x_n
    parents: list[int]  # parents[0] = -1
    depths: list[int]  # depths[0] = 0; node i is the token at sequence position n + depths[i]
    q: Tensor | None = None  # [N+1, V] sampled chains only: q[i] = the draft distribution node i was drawn from

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, i: int) -> list[int]:
        return [c for c, p in enumerate(self.parents) if p == i]


def root_only(token: int, device: torch.device) -> DraftTree:
    """An empty draft: the round verifies x_n alone and yields one token (the target-only step)."""
    return DraftTree(torch.tensor([token], device=device), [-1], [0])


def draft_step0(
    drafter: Drafter, cache: DraftCache, features: Tensor, next_ids: Tensor, n: int
) -> tuple[Tensor, Tensor]:
    """The draft reads the positions it has not seen: t = n-P .. n-1, each g_t with x_{t+1}.

    features [1, P, A*H_t], next_ids [1, P]. Their step-0 entries stay in the cache for all later
    rounds. Returns the output at position n-1, which predicts x_{n+1}: logits [1, 1, Vd] and
    hidden [1, 1, H] (the input hidden of the next draft step).
    """
    P = next_ids.shape[1]
    assert cache.length == n - P, "the draft cache must hold exactly the positions before the new ones"
    dtype = drafter.fc.weight.dtype
    hidden = drafter.combine(features.to(dtype))  # [1, P, A*H_t] -> [1, P, H]
    positions = torch.arange(n - P, n, device=next_ids.device)[None]  # [1, P]
    logits, hidden = drafter(hidden, next_ids, positions, cache=cache)  # causal over cache + new
    return logits[:, -1:], hidden[:, -1:]


def propose_chain(
    drafter: Drafter, cache: DraftCache, logits: Tensor, hidden: Tensor, root: Tensor, n: int, k: int,
    s: Sampling, vocab_map: Tensor, vocab_size: int,
) -> DraftTree:
    """k draft tokens, one draft step each; step j reads d_j = x_{n+j} at rope position n+j-1.

    logits [1, 1, Vd] / hidden [1, 1, H]: the step-0 output at n-1 (predicts d_1). Greedy: d_j =
    argmax. Sampling: d_j ~ q_j = warp(draft logits), recorded over the TARGET vocab (zero outside
    the draft vocab) for the acceptance test. Each step attends causally to the cache, which is
    exactly the training-time-test pattern: step-0 entries up to n-1, then the chain's own entries.
    """
    tokens, qs = [root], []
    for j in range(1, k + 1):
        if s.greedy:
            d = logits[0, -1].argmax()
        else:
            q = warp_probs(logits[0, -1], s)  # [Vd]
            d = torch.tensor(draw(q, s), device=q.device)
            qs.append(q.new_zeros(vocab_size).index_copy_(0, vocab_map, q))  # [Vd] -> [V]
        x = drafter.to_target_ids(d).view(1, 1)  # [1, 1] target id of d_j
        tokens.append(x.view(1))
        if j < k:  # the last draft token is only verified, never read by the draft
            position = torch.full((1, 1), n + j - 1, device=x.device)
            logits, hidden = drafter(hidden, x, position, cache=cache)
    q = None if s.greedy else torch.stack([torch.zeros_like(qs[0])] + qs)  # row 0: the root, not drafted
    return DraftTree(torch.cat(tokens), list(range(-1, k)), list(range(k + 1)), q)


def propose_tree(
    drafter: Drafter, cache: DraftCache, logits: Tensor, hidden: Tensor, root: Tensor, n: int,
    depth: int, top_k: int, budget: int,
) -> DraftTree:
    """EAGLE-2 dynamic tree: expand the best nodes of each level, verify the best `budget` nodes.

    Score of a node = cumulative draft log-prob of its path (sum of log q along it). Level 1 = the
    top_k tokens after the root. For each further level the current frontier (top_k nodes) is read
    by the draft in ONE step; every frontier node gets its top_k children as candidates, and the
    top_k candidates by score form the next frontier. Finally the `budget` best candidates of all
    levels are kept. Scores never increase along a path (log q <= 0), and ties are broken by
    creation order (parents are created first), so the kept set contains every kept node's parent.
    Candidates are chosen deterministically: `accept_tree_sampling` relies on that.
    """
    dev = logits.device
    K = min(top_k, logits.shape[-1])
    logq = logits[0, -1].float().log_softmax(-1)  # [Vd]
    score, ids = logq.topk(K)  # level 1: [K]
    cand_ids, cand_score = [ids], [score]  # draft ids and scores of every candidate, level by level
    cand_parent = [torch.full((K,), -1, device=dev)]  # candidate index of the parent; -1 = the root
    cand_depth = [torch.full((K,), 1, device=dev)]
    frontier = torch.arange(K, device=dev)  # candidate indices of the nodes to expand
    front_hidden = hidden.expand(1, K, -1)  # [1, K, H]: every level-1 node's parent is the root
    front_slots = torch.zeros(K, 0, dtype=torch.bool, device=dev)  # [K, S]: ancestors' draft-cache tree slots
    eye = torch.eye(K, dtype=torch.bool, device=dev)
    for level in range(2, depth + 1):
        # the frontier is at depth level-1: token x_{n+level-1}, read at rope position n+level-2
        x = drafter.to_target_ids(torch.cat(cand_ids)[frontier])[None]  # [1, K]
        positions = torch.full((1, K), n + level - 2, device=dev)
        # each frontier node sees the step-0 entries (< n), its ancestors' tree entries, and itself
        assert cache.length == n + front_slots.shape[1]
        mask = torch.cat([torch.ones(K, n, dtype=torch.bool, device=dev), front_slots, eye], dim=1)
        logits, h = drafter(front_hidden, x, positions, cache=cache, attn_mask=mask[None])
        logq = logits[0].float().log_softmax(-1)  # [K, Vd]
        child_logq, child_ids = logq.topk(K, dim=-1)  # [K, K]: top_k children of each frontier node
        child_score = torch.cat(cand_score)[frontier][:, None] + child_logq  # [K, K]
        n_cand = sum(len(c) for c in cand_ids)
        cand_ids.append(child_ids.flatten())
        cand_score.append(child_score.flatten())
        cand_parent.append(frontier.repeat_interleave(K))  # row r holds the children of frontier[r]
        cand_depth.append(torch.full((K * K,), level, device=dev))
        best = child_score.flatten().topk(K).indices  # [K]: the next frontier
        rows = best // K  # their parents' rows in this level
        front_hidden = h[:, rows]  # a child reads its parent's next hidden
        front_slots = torch.cat([front_slots, eye], dim=1)[rows]  # the parent's ancestors + the parent
        frontier = n_cand + best
    # keep the `budget` best: a stable sort on -score keeps creation order among equal scores
    keep = torch.sort(-torch.cat(cand_score), stable=True).indices[:budget]
    keep = keep.sort().values.tolist()  # creation order: parents before children
    node_of = {c: i + 1 for i, c in enumerate(keep)}  # candidate index -> tree node (root = 0)
    all_parents = torch.cat(cand_parent).tolist()
    parents = [-1] + [0 if all_parents[c] == -1 else node_of[all_parents[c]] for c in keep]
    keep_t = torch.tensor(keep, device=dev)
    tokens = drafter.to_target_ids(torch.cat(cand_ids)[keep_t])  # [N]
    depths = [0] + torch.cat(cand_depth)[keep_t].tolist()
    return DraftTree(torch.cat([root, tokens]), parents, depths)


# --- verification ------------------------------------------------------------------------------


def tree_attention_mask(tree: DraftTree, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Additive mask [1, 1, N+1, n+N+1]: node i sees the n cached positions and its ancestors (itself
    included); -inf (dtype min) elsewhere. The verify forward's queries are the tree nodes."""
    N1 = len(tree.parents)
    ancestors = torch.eye(N1, dtype=torch.bool)  # [N+1, N+1]
    for i in range(1, N1):  # parents come first, so their rows are complete
        ancestors[i] |= ancestors[tree.parents[i]]
    allowed = torch.cat([torch.ones(N1, n, dtype=torch.bool), ancestors], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def verify(target: Target, tree: DraftTree, cache, n: int, capture: Sequence[int]):
    """Score every node in ONE target forward: node i at position n + depth(i), seeing the cache and
    its ancestors. A chain needs no mask (causal is the ancestor relation). Logits [1, N+1, V]:
    row i is the target's next-token distribution after node i's path."""
    ids = tree.tokens[None]  # [1, N+1]
    positions = (n + torch.tensor(tree.depths, device=ids.device))[None]  # [1, N+1]
    mask = None if tree.is_chain else tree_attention_mask(tree, n, target.model.dtype, ids.device)
    return target.forward(ids, capture, past_key_values=cache, attention_mask=mask, position_ids=positions)


def accept_greedy(tree: DraftTree, logits: Tensor) -> tuple[list[int], int]:
    """Greedy verification: follow the child equal to the target's argmax while there is one.

    logits [N+1, V]. Returns (accepted nodes, root excluded; the next token = argmax at the last
    accepted node). The output is the target's own greedy continuation, token for token.
    """
    best = logits.argmax(dim=-1).tolist()  # [N+1]: the target's choice after each node
    tokens = tree.tokens.tolist()
    path, node = [], 0
    while True:
        match = [c for c in tree.children(node) if tokens[c] == best[node]]
        if not match:
            return path, best[node]
        node = match[0]
        path.append(node)


def accept_chain_sampling(tree: DraftTree, p: Tensor, s: Sampling) -> tuple[list[int], int]:
    """Speculative sampling (Leviathan et al. 2023, Theorem 1): the output is distributed as p.

    p [k+1, V]: target distributions after the root and after each draft token; tree.q[j] [V]: the
    draft distribution d_j was drawn from. For j = 1..k: accept d_j w.p. min(1, p_{j-1}(d_j) /
    q_j(d_j)) (q >= p: accept w.p. p/q; q < p: always). At the first rejection the next token is
    drawn from normalize(max(p_{j-1} - q_j, 0)); if all k are accepted, a bonus token from p_k.
    """
    assert tree.q is not None and tree.is_chain
    tokens = tree.tokens.tolist()
    path = []
    for j in range(1, len(tokens)):
        x = tokens[j]
        if uniform(s, p.device) < float(p[j - 1, x] / tree.q[j, x]):
            path.append(j)
            continue
        residual = (p[j - 1] - tree.q[j]).clamp(min=0)  # [V]
        if float(residual.sum()) <= 0.0:
            # Only reachable through rounding: p(x) < q(x) implies positive residual mass elsewhere.
            residual = p[j - 1]
        return path, draw(residual, s)
    return path, draw(p[len(tokens) - 1], s)


def accept_tree_sampling(tree: DraftTree, p: Tensor, s: Sampling) -> tuple[list[int], int]:
    """Lossless sampling over a tree of deterministically chosen candidates (EAGLE-2).

    p [N+1, V]: target distribution after each node. At the current node, with residual r = p:
    try each child c (distinct tokens) in turn: accept w.p. r(c) / sum(r); on rejection r(c) = 0.
    Accepted: move to c and start over with r = p_c. No child accepted (or a leaf): the next token
    is drawn from r / sum(r).

    Why this is exact: it is speculative sampling with q = a point mass on the candidate. At a
    node, P(emit c_1) = p(c_1). Given c_1 rejected (prob 1 - p(c_1)), r is p without c_1,
    renormalised, so P(emit c_2) = (1 - p(c_1)) * p(c_2) / (1 - p(c_1)) = p(c_2), and so on; a token
    y that is no candidate is emitted w.p. (1 - sum_j p(c_j)) * p(y) / (1 - sum_j p(c_j)) = p(y).
    So every emitted token is drawn from p given the tokens before it, with fresh randomness, as in
    plain sampling; the candidates depend only on the prefix, never on these draws. By induction
    over depth the whole sequence is distributed as under plain sampling. (sum(r) is computed from
    r itself, so the last candidate holding all remaining mass is accepted with probability 1.)
    """
    tokens = tree.tokens.tolist()
    path, node = [], 0
    while True:
        r = p[node].clone()  # [V]
        for c in tree.children(node):
            x = tokens[c]
            if uniform(s, p.device) < float(r[x] / r.sum()):
                break
            r[x] = 0.0
        else:
            return path, draw(r, s)
        node = c
        path.append(node)


# --- the target cache ---------------------------------------------------------------------------


def keep_accepted_kv(cache, n: int, nodes: list[int]) -> None:
    """Keep the target k/v of positions < n and of `nodes` (root first, then the accepted path).

    The verify forward appended one entry per tree node at n + node index. A path that is a prefix
    of the node order (always, for a chain) is a crop; otherwise the path's entries are gathered.
    Both are exact: a node's k/v depend only on its own ancestors, which is the accepted path.
    """
    m = len(nodes)
    index = None if nodes == list(range(m)) else torch.tensor(nodes) + n
    for layer in cache.layers:
        if index is None:
            layer.keys, layer.values = layer.keys[..., : n + m, :], layer.values[..., : n + m, :]
        else:
            idx = index.to(layer.keys.device)
            layer.keys = torch.cat([layer.keys[..., :n, :], layer.keys[..., idx, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :n, :], layer.values[..., idx, :]], dim=-2)


def _check_cache(cache) -> None:
    """keep_accepted_kv edits DynamicLayer keys/values; sliding-window or quantized layers differ."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or []})
        raise EyasError(
            f"the target's KV cache has layers {kinds or [type(cache).__name__]}; speculative decoding "
            "needs full-attention DynamicLayer caches to drop rejected draft tokens",
            "use a target without sliding-window attention",
        )


# --- the loop ----------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock timings are attributed to the right phase."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Stats:
    """Counters for one generate call; `result()` is the stats dict."""

    def __init__(self, max_draft: int):
        self.accept_counts = [0] * (max_draft + 1)  # accepted draft tokens per round (gpt-fast)
        self.tried = [0] * max_draft  # rounds in which depth j+1 was verified with all shallower accepted
        self.accepted = [0] * max_draft
        self.time = {"prefill": 0.0, "draft": 0.0, "verify": 0.0}
        self.start = time.perf_counter()

    def round(self, tree: DraftTree, path: list[int]) -> None:
        a = len(path)
        self.accept_counts[a] += 1
        for j in range(a):
            self.tried[j] += 1
            self.accepted[j] += 1
        if tree.children(path[-1] if path else 0):  # the first rejected depth had candidates
            self.tried[a] += 1

    def result(self, new_tokens: int) -> dict:
        total = time.perf_counter() - self.start
        rounds = sum(self.accept_counts)
        produced = sum((a + 1) * c for a, c in enumerate(self.accept_counts))
        return {
            "accept_counts": list(self.accept_counts),
            "tau": produced / rounds if rounds else None,
            "acceptance_by_depth": [a / t if t else None for a, t in zip(self.accepted, self.tried)],
            "rounds": rounds,
            "new_tokens": new_tokens,
            "time_prefill_s": self.time["prefill"],
            "time_draft_s": self.time["draft"],
            "time_verify_s": self.time["verify"],
            "time_other_s": total - sum(self.time.values()),
            "time_total_s": total,
            "tokens_per_s": new_tokens / total if total > 0 else None,
        }


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
        shape = tuple(int(v) for v in tree)
        if len(shape) != 3 or min(shape) < 1:
            raise EyasError(f"tree={tree!r}: expected (depth, top_k, budget), all >= 1", "e.g. tree=(5, 8, 48)")
        return shape[0], shape
    k = DEFAULT_DRAFT_TOKENS if draft_tokens is None else int(draft_tokens)
    if k < 1:
        raise EyasError(f"draft_tokens={k}: a chain needs at least 1 draft token", "e.g. draft_tokens=4")
    return k, None


def _check_request(target: Target, prompt_len: int, max_new_tokens: int, temperature, top_p, top_k) -> None:
    if max_new_tokens < 1:
        raise EyasError(f"max_new_tokens={max_new_tokens}: nothing to generate", "pass max_new_tokens >= 1")
    context = getattr(target.config, "max_position_embeddings", None)
    if context is not None and prompt_len + max_new_tokens > context:
        raise EyasError(
            f"the prompt has {prompt_len} tokens and max_new_tokens is {max_new_tokens}: "
            f"{prompt_len + max_new_tokens} positions, but the target's context is {context}",
            f"shorten the prompt to at most {context - max_new_tokens} tokens or lower max_new_tokens",
        )
    if temperature < 0 or not 0 < top_p <= 1 or top_k < 0:
        raise EyasError(
            f"temperature={temperature}, top_p={top_p}, top_k={top_k}",
            "temperature >= 0 (0 = greedy), 0 < top_p <= 1, top_k >= 0 (0 = off)",
        )


@torch.no_grad()
def generate(
    target: Target,
    drafter: Drafter | None,
    input_ids: Tensor | Sequence[int],
    *,
    max_new_tokens: int,
    draft_tokens: int | None = None,
    tree: tuple[int, int, int] | None = None,
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

    temperature 0 is greedy: the output is the target's own greedy decoding (token for token, up to
    floating-point ties). Otherwise tokens follow the target distribution under temperature / top_k
    / top_p exactly (lossless rejection sampling), reproducibly for a given `seed`. Generation stops
    after a token in `stop_ids` (which is kept) or after `max_new_tokens`. `on_tokens` receives each
    batch of newly accepted ids as soon as they are known.

    Returns (output_ids [1, T + new] on the target's device, stats) with stats keys:
    accept_counts (histogram over rounds of accepted draft tokens, length max path + 1), tau (mean
    tokens per target verify round = accepted + 1, before truncation by stop/max), acceptance_by_depth
    (P(draft token at depth j accepted | all shallower accepted and a candidate at depth j existed),
    None where never tried), rounds (verify forwards, the prefill excluded), new_tokens, time_prefill_s,
    time_draft_s, time_verify_s, time_other_s, time_total_s, tokens_per_s (new tokens / total time).
    """
    device = target.model.device
    prompt = _prompt(input_ids, device)  # [1, T]
    T = prompt.shape[1]
    _check_request(target, T, max_new_tokens, temperature, top_p, top_k)
    max_draft, tree_shape = _draft_plan(drafter, draft_tokens, tree)
    capture: tuple[int, ...] = ()
    if drafter is not None:
        check_fits(drafter.contract, target)
        capture = drafter.contract.capture_layers or default_capture_layers(target.num_layers)
        vocab_map = drafter.to_target_ids(torch.arange(drafter.contract.draft_vocab_size, device=device))
        spare = max(max_draft, tree_shape[1] * max_draft) if tree_shape else max_draft
        dcache = DraftCache(drafter, 1, max_len=T + max_new_tokens + spare)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    s = Sampling(temperature, top_p, top_k, generator)
    stops = {int(x) for x in stop_ids}
    stats = _Stats(max_draft)
    out_ids: list[int] = []

    def emit(tokens: list[int]) -> bool:
        """Append accepted tokens up to a stop id or the limit; True when generation is over."""
        fresh = []
        for x in tokens:
            fresh.append(x)
            if x in stops or len(out_ids) + len(fresh) == max_new_tokens:
                break
        out_ids.extend(fresh)
        if on_tokens is not None:
            on_tokens(fresh)
        return fresh[-1] in stops or len(out_ids) == max_new_tokens

    # Prefill: the target reads the prompt; its last logits give the first new token x_T.
    t0 = time.perf_counter()
    out = target.forward(prompt, capture)
    _sync(device)
    stats.time["prefill"] += time.perf_counter() - t0
    cache = out.past_key_values
    _check_cache(cache)
    token = choose(out.logits[0, -1], s)
    done = emit([token])
    # What the draft has not read yet: features g_t and tokens x_{t+1}, t = dcache.length .. n-1.
    pending_features = out.features  # [1, T, A*H_t]
    pending_ids = torch.cat([prompt[:, 1:], prompt.new_tensor([[token]])], dim=1)  # [1, T]: x_1 .. x_T

    while not done:
        n = cache.get_seq_length()  # x_0..x_{n-1} are cached; `token` is x_n
        room = max_new_tokens - len(out_ids)  # this round may emit at most `room` tokens
        root = torch.tensor([token], device=device)

        # 1. draft (at most room - 1 draft tokens: a round emits the accepted ones plus one)
        t0 = time.perf_counter()
        if drafter is not None and room > 1:
            logits, hidden = draft_step0(drafter, dcache, pending_features, pending_ids, n)
            pending_features, pending_ids = pending_features[:, :0], pending_ids[:, :0]
            depth = min(max_draft, room - 1)
            if tree_shape is None:
                draft = propose_chain(drafter, dcache, logits, hidden, root, n, depth, s, vocab_map, target.vocab_size)
            else:
                draft = propose_tree(drafter, dcache, logits, hidden, root, n, depth, *tree_shape[1:])
            dcache.crop(n)  # drop the speculative entries; only verified positions stay
        else:
            draft = root_only(token, device)
        _sync(device)
        stats.time["draft"] += time.perf_counter() - t0

        # 2. verify: one target forward over the root and every draft node
        t0 = time.perf_counter()
        out = verify(target, draft, cache, n, capture)
        _sync(device)
        stats.time["verify"] += time.perf_counter() - t0

        # 3. accept
        logits = out.logits[0]  # [N+1, V]
        if s.greedy:
            path, token = accept_greedy(draft, logits)
        elif draft.q is not None:
            path, token = accept_chain_sampling(draft, warp_probs(logits, s), s)
        else:
            path, token = accept_tree_sampling(draft, warp_probs(logits, s), s)
        stats.round(draft, path)

        # 4. commit: the target cache and the draft's pending inputs follow the accepted path
        nodes = [0] + path
        keep_accepted_kv(cache, n, nodes)
        accepted = draft.tokens[path].tolist() + [token]  # x_{n+1} .. x_{n+a+1}
        new_features = out.features[:, torch.tensor(nodes, device=device)]  # g_n .. g_{n+a}
        pending_features = torch.cat([pending_features, new_features], dim=1)
        pending_ids = torch.cat([pending_ids, prompt.new_tensor([accepted])], dim=1)
        done = emit(accepted)

    output = torch.cat([prompt, prompt.new_tensor([out_ids])], dim=1)  # [1, T + new]
    return output, stats.result(len(out_ids))
