"""The shape of one engine's view of a draft, and the facts every view derives the same way.

A view is a dict (eyas.check.consumers documents its keys). Each engine's statements are made in
that engine's view and nowhere else; the helpers here only compute what several engines share
(the default capture layers, which embedding table is fed, an identity vocab map).
"""

from __future__ import annotations

from typing import Any

from eyas.codes import finding
from eyas.contract import IDS, DraftContract, default_capture_layers


def new_view(reads: str) -> dict[str, Any]:
    """An empty view of the engine that reads config file `reads`."""
    return {
        "reads": reads,
        "loads": True,
        "capture_layers": None,
        "norm_before_residual": None,
        "norm_flags": None,
        "embeddings": None,
        "notes": [],
        "refused": [],  # why it cannot load the draft, each also a note
        "mismatches": [],
    }


def refuse(r: dict[str, Any], why: str, field: str | None = None) -> None:
    """The engine cannot load the draft, for `why` (a note). With the config `field` at fault, `eyas check`
    warns too (`consumer_cannot_load`): a draft that an engine reading its format refuses is a hazard even
    where eyas runs it. Refusals that other findings already name (a format the engine does not read, a
    layer kind eyas has no code for, a verifier name) or that hold for old versions only pass no field."""
    r["loads"] = False
    r["notes"].append(why)
    r["refused"].append(why)
    if field is not None:
        r["mismatches"].append(finding("consumer_cannot_load", field, f"cannot load {r['reads']}: {why}",
                                       "make the change named at the end of the reason, or serve the draft with an "
                                       "engine that loads it (eyas inspect DIR shows every engine's view)"))


def layer_ids(cfg: Any) -> list[int] | None:
    """A non-empty list of layer ids under IDS in `cfg`, or None."""
    ids = cfg.get(IDS) if isinstance(cfg, dict) else None
    return list(ids) if isinstance(ids, list) and ids else None


def default_layers(n: int | None) -> list[int] | None:
    return None if n is None else list(default_capture_layers(n))


def default_note(n: int | None) -> str:
    """How an engine that reads no layer ids picks them."""
    if n is None:
        return "the target default (2, N//2, N-3), N = the served target's depth"
    return f"the target default (2, N//2, N-3) = {default_layers(n)} for N = {n}"


def embeddings(c: DraftContract, replaces_own: bool) -> str:
    """Which embedding table an engine feeds the draft. Engines share the target's only at equal width."""
    if c.target_hidden_size != c.hidden_size:
        return (
            "draft's own"
            if c.has_embeddings
            else "draft's own, but the checkpoint has none (widths differ, the target's cannot be shared)"
        )
    if c.has_embeddings and not replaces_own:
        return "draft's own"
    return "shares target's"


def identity_vocab(c: DraftContract, how: str) -> list[dict[str, str]]:
    """A reduced vocab without d2t: the engine takes draft ids for target ids."""
    if c.reduced_vocab and not c.has_vocab_map:
        return [
            finding("consumer_no_vocab_map", "d2t", f"no d2t: {how}", "add the d2t/t2d vocab map from the training run")
        ]
    return []


def full_attention(c: DraftContract, how: str) -> list[dict[str, str]]:
    """A draft layer with a sliding window in an engine that builds full attention for it: every token
    is attended to, where the draft was trained to see its last `sliding_window`."""
    if c.sliding_window is None:
        return []
    w = c.sliding_window
    return [finding("consumer_full_attention", "sliding_window", f"attends over every token: {how}, where the "
                    f"contract's layer attends over its last {w} token{'s' * (w != 1)}", "serve the draft with vLLM, "
                    "which applies the window (eyas serve-check measures it), or train one without sliding_attention")]
