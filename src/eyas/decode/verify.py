"""The target's side of decoding: the prefill, one forward over every draft node per round, then a
cache that keeps only the accepted path.

Two forwards do this. The lean one (eyas.decode.lean_forward, a StaticKV cache) runs every target it
supports; any other target runs through transformers with its DynamicCache, which eyas edits in
place and therefore accepts only in the form it knows how to edit (`check_cache`). The functions
below take either (`decoder` picks it) and dispatch on it, so the decode loop is the same for both.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from eyas.decode.lean_forward import LeanTarget, lean_target
from eyas.decode.static_cache import StaticKV
from eyas.decode.tree import DraftTree, tree_ancestors, tree_attention_mask
from eyas.errors import EyasError
from eyas.target import Target, TargetOutput


def decoder(target: Target) -> Target | LeanTarget:
    """What runs the target's forwards while decoding: the lean forward where it supports the target."""
    return lean_target(target) or target


def prefill(model: Target | LeanTarget, prompt: Tensor, capture: Sequence[int], max_len: int) -> TargetOutput:
    """The target reads the prompt [1, T]: its features, the LAST position's logits and the KV cache
    (`past_key_values`). The lean forward allocates its cache for `max_len` positions (prompt, new
    tokens and one round's draft); transformers' cache grows as needed."""
    if isinstance(model, LeanTarget):
        positions = torch.arange(prompt.shape[1], device=prompt.device)[None]
        out = model.forward(prompt, positions, model.new_cache(max_len), capture, logit_rows=slice(-1, None))
    else:  # a sliding-window or chunked target's own cache drops keys past the window (chunk): a full one eyas
        # can trim instead, the window kept by the masks (transformers' own for chains, `_tree_masks` for trees)
        full = DynamicCache() if model.window is not None or model.chunk is not None else None
        out = model.forward(prompt, capture, past_key_values=full)
        check_cache(out.past_key_values)
        out.logits = out.logits[:, -1:]
    # NaN's argmax is token 0 (an answer of nothing, exit 0); an inf is refused too: logits overflow only
    # where the weights or the dtype are wrong, and every later token would be chosen from them
    if not bool(torch.isfinite(out.logits).all()):
        raise EyasError("the target's logits on the prompt are not finite (NaN or inf)",
                        "check the target's weights for NaN/inf, or run it in bf16 or fp32 (fp16 overflows)")
    return out


def verify(model: Target | LeanTarget, tree: DraftTree, cache, n: int, capture: Sequence[int]) -> TargetOutput:
    """Score every node in ONE target forward: node i at position n + depth(i), seeing the cache and
    its ancestors. A chain needs no mask (causal is the ancestor relation). Logits [1, N+1, V]:
    row i is the target's next-token distribution after node i's path."""
    ids = tree.tokens[None]  # [1, N+1]
    positions = (n + torch.tensor(tree.depths, device=ids.device))[None]  # [1, N+1]
    if isinstance(model, LeanTarget):
        mask = None
        if not tree.is_chain:
            ancestors = tree_ancestors(tree).to(ids.device)
            mask = torch.cat([ancestors.new_ones(len(tree.parents), n), ancestors], dim=1)
        return model.forward(ids, positions, cache, capture, mask=mask)
    mask = None if tree.is_chain else _tree_masks(model, tree, n)
    return model.forward(ids, capture, past_key_values=cache, attention_mask=mask, position_ids=positions)


def _tree_masks(model: Target, tree: DraftTree, n: int) -> Tensor | dict[str, Tensor]:
    """A tree's mask as transformers' forward takes it: one 4D mask for every layer, or, for a target whose
    layers differ in kind (Qwen2 with `max_window_layers`, gpt-oss, Gemma 3, Llama 4), one per `layer_types`
    kind, the sliding layers' with the window applied, the chunked ones' with the chunk: a prepared mask
    bypasses transformers' own, window and all. (A chain needs none: transformers builds the causal, sliding
    and chunked masks from its positions.)"""
    window, chunk, dtype, device = model.window, model.chunk, model.model.dtype, tree.tokens.device
    if window is None and chunk is None:
        return tree_attention_mask(tree, n, dtype, device)
    kinds = set(getattr(model.config, "layer_types", None) or ["sliding_attention"])
    if kinds == {"sliding_attention"}:
        return tree_attention_mask(tree, n, dtype, device, window)
    made = {"full_attention": lambda: tree_attention_mask(tree, n, dtype, device),
            "sliding_attention": lambda: tree_attention_mask(tree, n, dtype, device, window),
            "chunked_attention": lambda: tree_attention_mask(tree, n, dtype, device, chunk=chunk)}
    return {kind: made[kind]() for kind in kinds}


def placed_nodes(model: Target | LeanTarget, tree: DraftTree, n: int) -> DraftTree:
    """The tree's first nodes (a tree still: parents come first) that transformers scales for their own
    positions: all of it, but where Llama 4's NoPE layers would count a node at n + i, not n + depth(i)
    (eyas.target_context.scale_floor), on the other side of a multiple of the floor. A chain is always
    placed so; a tree loses nodes once per floor (8192 positions)."""
    floor = getattr(model, "scale_floor", None)
    if floor is None or tree.is_chain:
        return tree
    placed = [(n + i + 1) // floor == (n + d + 1) // floor for i, d in enumerate(tree.depths)]
    m = placed.index(False) if False in placed else len(placed)
    return tree if m == len(placed) else DraftTree(tree.tokens[:m], tree.parents[:m], tree.depths[:m])


def keep_accepted_kv(cache, n: int, nodes: list[int]) -> None:
    """Keep the target k/v of positions < n and of `nodes` (root first, then the accepted path).

    The verify forward appended one entry per tree node at n + node index. A path that is a prefix
    of the node order (always, for a chain) is a crop; otherwise the path's entries are gathered.
    Both are exact: a node's k/v depend only on its own ancestors, which is the accepted path.
    """
    if isinstance(cache, StaticKV):
        cache.keep(n, nodes)
        return
    m = len(nodes)
    index = None if nodes == list(range(m)) else torch.tensor(nodes) + n
    for layer in cache.layers:
        if index is None:
            layer.keys, layer.values = layer.keys[..., : n + m, :], layer.values[..., : n + m, :]
        else:
            idx = index.to(layer.keys.device)
            layer.keys = torch.cat([layer.keys[..., :n, :], layer.keys[..., idx, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :n, :], layer.values[..., idx, :]], dim=-2)


def check_cache(cache) -> None:
    """keep_accepted_kv edits DynamicLayer keys/values; other layers (linear attention's, Mamba's, quantized
    ones) differ. A sliding-window or chunked target gets a full cache from `prefill`."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        kinds = sorted({type(layer).__name__ for layer in layers or []})
        raise EyasError(
            f"the target's KV cache has layers {kinds or [type(cache).__name__]}; speculative decoding "
            "needs full-attention DynamicLayer caches to drop rejected draft tokens",
            "eyas decodes targets whose layers are full, sliding-window or chunked attention (measure this one's "
            "captured features with eyas eval --data)",
        )
