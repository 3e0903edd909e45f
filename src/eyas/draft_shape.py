"""A draft shape (a chain of k tokens, or an EAGLE-2 tree depth,top_k,budget) and the fastest one
measured on this machine.

The fastest shape depends on the target, the drafter, the dtype and the machine (what a verify
forward over many tokens costs against one over a single token, which the CPU's instruction sets
decide), so `eyas bench --sweep` times them and records the winner in
`$XDG_CACHE_HOME/eyas/best_shape.json`, keyed by all four (eyas.machine); `eyas generate` and
`eyas bench` use it when no shape is given. A shape is a dict, as in the JSON
reports: {"draft_tokens": k} or {"tree": [depth, top_k, budget]}, with "ngram_tokens" where the sweep
timed it with another n-gram branch than the default (eyas.decode.ngram).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from eyas.decode import bf16_kernel
from eyas.decode.loop import tree_shape
from eyas.dtypes import short_name
from eyas.errors import EyasError
from eyas.machine import machine_key, read_measured, save_measured, settled
from eyas.weights import written


def parse_tree(tree: str | Sequence[int] | None, what: str = "tree") -> tuple[int, int, int] | None:
    """"depth,top_k,budget" (the --tree flag) or a 3-sequence -> a checked tuple (eyas.decode.loop.tree_shape,
    its errors naming `what`); None stays None."""
    if tree is None:
        return None
    return tree_shape(tree.split(",") if isinstance(tree, str) else tree, what)


def shape_label(shape: dict) -> str:
    """{"draft_tokens": 4} -> "chain k=4"; {"tree": [5, 4, 16]} -> "tree 5,4,16"; a shape swept with
    its own n-gram branch says so: "chain k=1 without n-grams" (0), "chain k=1 + up to 2 n-gram tokens"
    (the branch's cap: eyas.decode.ngram.BranchLength)."""
    label = "tree " + ",".join(str(v) for v in shape["tree"]) if "tree" in shape else f"chain k={shape['draft_tokens']}"
    ngram = shape.get("ngram_tokens")
    return label + ("" if ngram is None else " without n-grams" if ngram == 0 else f" + up to {ngram} n-gram tokens")


def decode_shape(shape: dict, ngram_tokens: int) -> dict:
    """A shape as eyas.decode.generate's keywords, with the n-gram branch it was swept with, else
    `ngram_tokens` (the caller's default)."""
    return {"ngram_tokens": ngram_tokens, **{k: tuple(v) if k == "tree" else v for k, v in shape.items()}}


# --- the cache of the best shape, per target, drafter, dtype and machine ---------------------------


def shape_key(target_name: str, drafter: str | Path, dtype: str | torch.dtype) -> list:
    """What a measured shape depends on: the models (the weights as written, eyas.weights.written: a draft
    trained again into its folder, or another target at the same path, is measured again; the embedded
    default, named by its hub id, is eyas's own), the dtype, the machine (eyas.machine), torch (its kernels)
    and whether bf16 products run on eyas's AVX2 kernel (eyas.decode.bf16_kernel)."""
    folder, target = Path(drafter).resolve(), Path(target_name)
    return [target_name, written(target) if target.is_absolute() else [], str(folder), written(folder),
            short_name(dtype), *machine_key(), torch.__version__, bf16_kernel.available()]


# the most a cached shape may draft: past what any sweep times (eyas.bench.sweep), an entry was edited by hand
MOST_CACHED = 64


def _count(value: object, low: int, high: int = MOST_CACHED) -> bool:
    return type(value) is int and low <= value <= high


def _cached_shape(shape: object) -> bool:
    """A shape as a sweep records it: a chain or a tree (not both), with its n-gram branch where it has one."""
    if not isinstance(shape, dict) or ("tree" in shape) == ("draft_tokens" in shape) \
            or not set(shape) <= {"tree", "draft_tokens", "ngram_tokens"}:
        return False
    if "ngram_tokens" in shape and not _count(shape["ngram_tokens"], 0):
        return False
    if "draft_tokens" in shape:
        return _count(shape["draft_tokens"], 1)
    tree = shape["tree"]
    try:
        return isinstance(tree, list) and all(_count(v, 1, 4 * MOST_CACHED) for v in tree) and bool(parse_tree(tree))
    except EyasError:
        return False


def read_best_shape(target_name: str, drafter: str | Path, dtype: str | torch.dtype) -> dict | None:
    """The cached sweep entry for this target / drafter / dtype / machine, or None.

    The entry's `best` is {"draft_tokens": k} or {"tree": [depth, top_k, budget]}; `best_chain` and
    `best_tree` are the fastest of each kind (`best_chain_ngram` with `ngram_tokens`: the n-gram branch it
    was timed with, and the sweep's default); `beats_target` says whether `best` was faster than the target
    decoding alone in the same sweep (entries from older sweeps lack it: None). An entry from another eyas
    version or edited by hand, any field of it out of shape, is ignored (measured again), never half-used.
    """
    entry = read_measured("shape", shape_key(target_name, drafter, dtype))
    if entry is None:
        return None
    ngram = "best_chain_ngram" in entry
    usable = (all(_cached_shape(s) for s in (entry.get("best"), {"draft_tokens": entry.get("best_chain")},
                                            {"tree": entry.get("best_tree")}))
              and (not ngram or _count(entry["best_chain_ngram"], 0) and _count(entry.get("ngram_tokens"), 0))
              and entry.get("beats_target") in (None, True, False))
    return entry if usable else None


def needs_sweep(entry: dict | None) -> bool:
    """Whether a quick sweep is due: no shape cached, or a provisional one (timed under load, eyas.machine)."""
    return entry is None or not settled(entry)


def save_best_shape(target_name: str, drafter: str | Path, dtype: str | torch.dtype, entry: dict) -> Path | None:
    """Record a sweep's entry (atomically; two sweeps at once keep both): the file, None where it cannot be."""
    return save_measured("shape", shape_key(target_name, drafter, dtype), entry)
