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

The target's forwards run through `eyas.decode.lean_forward` where it supports the target (the
Llama family): oneDNN-packed products, a preallocated KV cache edited in place, fp32 attention;
other targets run through transformers with the same loop. Each round's tree may also carry an
n-gram branch: text the context already holds, proposed where the answer copies it.

Where each part lives:

    eyas.decode.loop          generate: the round loop, request checks, DEFAULT_DRAFT_TOKENS
    eyas.decode.propose       drafting: Drafting (the draft's side of a generation), draft_step0, chain, tree
    eyas.decode.ngram         NgramIndex (prompt lookup over the context) and add_branch (into the tree)
    eyas.decode.tree          DraftTree (one round's candidates) and the verify forward's ancestor mask
    eyas.decode.verify        prefill, the verify forward over the tree, the KV cache kept after acceptance
    eyas.decode.lean_forward  the target's decode forward (batch 1, static cache, few operators)
    eyas.decode.static_cache  StaticKV: the preallocated KV cache of the target and the drafter
    eyas.decode.packed        linears in oneDNN's packed layout (the target's, and the drafter's while decoding)
    eyas.decode.cost          forward and draft-step costs: the terms of the speedup
    eyas.decode.accept        greedy and lossless sampling acceptance
    eyas.decode.sampling      Sampling, the warp (temperature, top-k, top-p) and the random draws
    eyas.decode.stats         DecodeStats: what one generate call measured
"""

from eyas.decode.accept import accept_chain_sampling, accept_greedy, accept_tree_sampling
from eyas.decode.cost import draft_step_ms, target_forward_ms
from eyas.decode.lean_forward import LeanTarget, lean_target
from eyas.decode.loop import DEFAULT_DRAFT_TOKENS, generate
from eyas.decode.ngram import NgramIndex, add_branch
from eyas.decode.packed import PackedLinear, packed_linears
from eyas.decode.propose import Drafting, draft_cache, draft_step0, propose_chain, propose_tree
from eyas.decode.sampling import Sampling, choose, draw, uniform, warp_probs
from eyas.decode.static_cache import StaticKV
from eyas.decode.stats import DecodeStats
from eyas.decode.tree import DraftTree, chain_tree, root_only, tree_ancestors, tree_attention_mask
from eyas.decode.verify import check_cache, decoder, keep_accepted_kv, prefill, verify

__all__ = [
    "DEFAULT_DRAFT_TOKENS",
    "DecodeStats",
    "DraftTree",
    "Drafting",
    "LeanTarget",
    "NgramIndex",
    "PackedLinear",
    "Sampling",
    "StaticKV",
    "accept_chain_sampling",
    "accept_greedy",
    "accept_tree_sampling",
    "add_branch",
    "chain_tree",
    "check_cache",
    "choose",
    "decoder",
    "draft_cache",
    "draft_step0",
    "draft_step_ms",
    "draw",
    "generate",
    "keep_accepted_kv",
    "lean_target",
    "packed_linears",
    "prefill",
    "propose_chain",
    "propose_tree",
    "root_only",
    "target_forward_ms",
    "tree_ancestors",
    "tree_attention_mask",
    "uniform",
    "verify",
    "warp_probs",
]
