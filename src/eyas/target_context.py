"""How a target is decoded, from its config alone: the length its rope allows, and what its attention sees.

A longrope target (Phi-3 and its kin) turns otherwise past its original length, so eyas decodes it within
that (`decode_context`, `decode_bound`). A sliding-window or chunked target (Llama 4) is decoded over its whole
context with a full cache and the window or chunk in its masks (`sliding_window`, `attention_chunk`:
`Target.window`, `Target.chunk`, eyas.decode.verify); Llama 4's NoPE query scale steps at `scale_floor`. Read by
the decoding loop, the preflight (before anything loads) and `Target`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def longrope_length(text: Mapping[str, Any]) -> int | None:
    """For a longrope target (Phi-3 and its kin), its original_max_position_embeddings: the length eyas decodes
    it within. transformers rotates with the short factors while a forward's positions stay within that length
    and with the long ones past it, so an answer growing past it would rotate its cached positions one way and
    the rest the other, and a verify reaching past it rotates a round's tokens otherwise than one-token steps
    would (transformers' own generate recomputes the cache there). None for every other rope."""
    rope = text.get("rope_parameters") or text.get("rope_scaling")
    if not isinstance(rope, Mapping) or (rope.get("rope_type") or rope.get("type")) != "longrope":
        return None
    length = rope.get("original_max_position_embeddings") or text.get("original_max_position_embeddings")
    return length if isinstance(length, int) and length > 0 else None


def sliding_window(text: Mapping[str, Any]) -> int | None:
    """The window a target attends through in some layer, as transformers reads its config (`layer_types` where
    it has them, else every layer where `sliding_window` is set: Phi-3's 2047, Mistral v0.1's 4096), or None;
    None too for a model whose layers are other kinds still (linear attention, Mamba: their caches are their own).
    eyas decodes such a target with a full cache it can trim (`eyas.decode.verify.prefill`) and the window in its
    masks (`eyas.decode.verify._tree_masks`)."""
    window, kinds = text.get("sliding_window"), text.get("layer_types")
    if not isinstance(window, int) or window <= 0 or text.get("use_sliding_window") is False:
        return None
    if isinstance(kinds, list) and ("sliding_attention" not in kinds or set(kinds) - {"full_attention",
                                                                                    "sliding_attention"}):
        return None
    return window


def attention_chunk(text: Mapping[str, Any]) -> int | None:
    """The chunk Llama 4's chunked-attention layers attend within (`attention_chunk_size`, where `layer_types` names
    chunked_attention), or None. Decoded as a window is: a full cache eyas can trim, the chunk in the masks."""
    chunk, kinds = text.get("attention_chunk_size"), text.get("layer_types")
    if not isinstance(chunk, int) or chunk <= 0 or not isinstance(kinds, list) or "chunked_attention" not in kinds:
        return None
    return chunk


def scale_floor(text: Mapping[str, Any]) -> int | None:
    """Llama 4's NoPE layers scale their queries by log1p(floor((p + 1) / floor_scale)) * attn_scale + 1, p
    counted by transformers from the cache's length, not read from position_ids: a tree node at index i is
    scaled for position n + i, not its n + depth. The scale steps only where p + 1 reaches a multiple of the
    floor (8192): that floor, where some layer scales so (a 0 in `no_rope_layers`), else None."""
    floor, rope = text.get("floor_scale"), text.get("no_rope_layers")
    if not text.get("attn_temperature_tuning") or not isinstance(rope, list) or 0 not in rope:
        return None
    return floor if isinstance(floor, int) and floor > 0 else None


def decode_context(text: Mapping[str, Any], context: int | None = None) -> int | None:
    """The longest sequence eyas decodes the target of config `text` in: its max_position_embeddings (`context`
    where a config object read it through an alias), or for longrope the shorter original length."""
    if context is None:
        context = text.get("max_position_embeddings") if isinstance(text.get("max_position_embeddings"), int) else None
    original = longrope_length(text)
    return context if original is None else min(original, context or original)


def decode_bound(text: Mapping[str, Any], context: int | None = None) -> tuple[int | None, str]:
    """The longest sequence eyas decodes the target of config `text` in (`decode_context`), and why, where it is
    shorter than the target's max_position_embeddings (`context`): a few words for an error, else ""."""
    bound, plain = decode_context(text, context), context or text.get("max_position_embeddings")
    return bound, "" if bound == plain else " (longrope: its original length)"
