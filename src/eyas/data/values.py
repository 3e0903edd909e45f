"""Numbers checked where they enter: NaN/Inf in stored features, token ids outside the vocabulary,
lengths that disagree, each refused naming the file, the key and the first bad position.

Captured features, engine dumps and other trainers' caches are read from disk; a NaN there (an fp16
overflow in the target, a half-written file) otherwise surfaces much later as a NaN loss, an
`argmax` of garbage or a formatting TypeError deep in a report, and an id past the vocabulary as an
index error inside an embedding. Every reader of stored tensors calls `check_tensors` (or the single
checks) on what it loaded, before using it.

Tensors are scanned in blocks of rows, so checking a multi-GB shard never allocates a mask as large
as the shard itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor

from eyas.errors import FormatError

_BLOCK_ELEMENTS = 1 << 24  # elements scanned at a time


def _blocks(t: Tensor) -> Iterable[tuple[int, Tensor]]:
    """(first row, rows) blocks of `t` along dim 0 (a 0-d tensor is one block)."""
    if t.ndim == 0:
        yield 0, t.reshape(1)
        return
    per_row = max(1, t[0].numel()) if t.shape[0] else 1
    step = max(1, _BLOCK_ELEMENTS // per_row)
    for a in range(0, t.shape[0], step):
        yield a, t[a : a + step]


def _position(flat: int, shape: tuple[int, ...], row0: int) -> list[int]:
    """Index of the `flat`-th element of a block whose first row is `row0` (row-major)."""
    pos = []
    for n in reversed(shape):
        pos.append(flat % n if n else 0)
        flat //= max(n, 1)
    pos.reverse()
    if pos:
        pos[0] += row0
    return pos


def first_bad(t: Tensor, bad) -> tuple[list[int], int] | None:
    """The first position where `bad(block)` is True, and how many positions are bad; None when none."""
    found, count = None, 0
    for row0, block in _blocks(t):
        mask = bad(block)
        n = int(mask.sum())
        if n and found is None:
            flat = int(mask.reshape(-1).nonzero()[0, 0])
            found = _position(flat, tuple(block.shape) if t.ndim else (), row0)
        count += n
    return None if found is None else (found, count)


def _where(file: str | Path, key: str, pos: list[int], count: int) -> tuple[str, str]:
    """("FILE: key[i, j] ", " (and N more)"): the first bad position and how many others."""
    more = f" (and {count - 1} more)" if count > 1 else ""
    return (f"{file}: {key}{pos} " if pos else f"{file}: {key} "), more


def check_finite(t: Tensor, *, file: str | Path, key: str, hint: str | None = None) -> None:
    """Refuse NaN or +-Inf in a floating tensor, naming the first bad position."""
    if not t.is_floating_point():
        return
    hit = first_bad(t, lambda b: ~torch.isfinite(b))
    if hit is not None:
        pos, count = hit
        value = float(t[tuple(pos)]) if pos else float(t)
        head, more = _where(file, key, pos, count)
        raise FormatError(f"{head}is {value}{more}: stored features must be finite numbers",
                          hint or "recapture in bf16 or fp32 (fp16 overflows on large activations), or "
                          "remove the file so the capture redoes it")


def check_ids(ids: Tensor, vocab_size: int | None, *, file: str | Path, key: str, hint: str | None = None,
              what: str = "the vocabulary") -> None:
    """Refuse token ids below 0 or (when `vocab_size` is known) at or past the vocabulary's end
    (`what` names the range for indices of other things)."""
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.is_complex():
        raise FormatError(f"{file}: {key} is {str(ids.dtype).removeprefix('torch.')}; token ids are integers",
                          hint or "store token ids as int64")
    high = vocab_size
    hit = first_bad(ids, lambda b: (b < 0) | (b >= high) if high is not None else b < 0)
    if hit is not None:
        pos, count = hit
        value = int(ids[tuple(pos)]) if pos else int(ids)
        head, more = _where(file, key, pos, count)
        allowed = f"0..{high - 1}" if high is not None else ">= 0"
        raise FormatError(f"{head}is {value}{more}, outside {what} ({allowed})",
                          hint or "use data made with this target's tokenizer, or pass the --target it came from")


def check_lengths(file: str | Path, lengths: Mapping[str, int], *, hint: str | None = None) -> None:
    """Refuse tensors (or counts) whose lengths along the token axis disagree, naming each."""
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{k} {n}" for k, n in lengths.items())
        raise FormatError(f"{file}: lengths disagree ({shown})",
                          hint or "every per-token tensor needs one row per token: the file is damaged or "
                          "was written by another tool")


def check_tensors(file: str | Path, tensors: Mapping[str, Tensor], *, floats: Iterable[str] = (),
                  ids: Iterable[str] = (), vocab_size: int | None = None, same_length: Iterable[str] = (),
                  hint: str | None = None) -> None:
    """The one call for a reader of stored tensors: the `floats` keys finite, the `ids` keys inside
    `vocab_size`, the `same_length` keys with one row per token. Keys not present are skipped."""
    rows = {k: int(tensors[k].shape[0]) for k in same_length if k in tensors and tensors[k].ndim}
    check_lengths(file, rows, hint=hint)
    for k in ids:
        if k in tensors:
            check_ids(tensors[k], vocab_size, file=file, key=k, hint=hint)
    for k in floats:
        if k in tensors:
            check_finite(tensors[k], file=file, key=k, hint=hint)
