"""Engine dumps on disk: what an engine fed the draft, read and checked (layout: docs/engine-dumps.md).

Read here, below both its users: the doctor matches a dump against the target's states
(eyas.doctor.dumps), and `eyas eval --data` reads one as a feature cache (eyas.data.caches.native).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from eyas.data.shards import FORMAT as CAPTURE_FORMAT
from eyas.data.values import check_tensors
from eyas.errors import FormatError
from eyas.weights import tensor_list

MIN_POSITIONS = 4
_HINT = "a dump is a safetensors file with input_ids [T] (int64) and features [T, W]: see docs/engine-dumps.md"


def check_dump_file(path: Path) -> None:
    """FormatError when `path` cannot be a dump: not a regular file (a folder given with --data-format
    eyas-dump; a pipe would block the read), or one shard of an `eyas capture` (its header says so).

    A shard also holds input_ids and features, but several samples end to end (split by its
    `offsets`): read as one dump, its samples would run together unnoticed. Both `eyas eval --data`
    and `eyas doctor --features` read a file as a dump through here. An unreadable file passes: the
    reader that opens it next names that.
    """
    if path.exists() and not path.is_file():
        raise FormatError(f"{path}: not a regular file, so not a dump eyas reads", _HINT)
    try:
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
    except Exception:  # safetensors' own error types; reported by the caller's read
        return
    if meta.get("format") == CAPTURE_FORMAT:
        raise FormatError(f"{path} is one shard of an eyas capture: pass its folder ({path.parent})",
                          "an eyas capture is read whole, through its manifest.json")


def _read_named(path: Path) -> dict[str, Tensor]:
    """The dump's two tensors, eyas's names or vLLM's, read by name: a model's weights passed by mistake
    is refused from its header, before gigabytes are read, naming a few of its tensors, not all."""
    try:
        with safe_open(path, "pt") as f:
            names = set(f.keys())
            vllm = "input_ids" not in names and {"token_ids", "hidden_states"} <= names
            wanted = ("token_ids", "hidden_states") if vllm else ("input_ids", "features")
            tensors = {k: f.get_tensor(k) for k in wanted if k in names}
    except Exception as e:  # safetensors raises its own error types for missing or garbled files
        raise FormatError(f"{path}: not a readable safetensors file ({e})", _HINT) from None
    missing = sorted(set(wanted) - set(tensors))
    if missing:
        raise FormatError(f"{path}: no {', '.join(missing)} (it holds {tensor_list(names)})", _HINT)
    return tensors


def read_dump(path: str | Path, *, vocab_size: int | None = None, hidden_size: int | None = None,
              min_positions: int = MIN_POSITIONS) -> tuple[Tensor, Tensor]:
    """`input_ids` [T] and `features` [T, W] (fp32) from an engine dump (docs/engine-dumps.md).

    vLLM's ExampleHiddenStatesConnector files (`token_ids` [T], `hidden_states` [T, L, H]) are read
    as they are written: their layers are concatenated in the order vLLM stored them. Every number
    is checked as it enters (eyas.data.values): features finite, ids >= 0 and, given the target's
    `vocab_size` and `hidden_size`, inside its vocabulary and a whole number of states wide, so
    that `eyas doctor` can refuse a bad dump before it loads the target. The doctor compares shifts
    t-1, t, t+1, so by default a dump needs `min_positions` (4).

    A shard of an `eyas capture`, or what is not a regular file, is refused (`check_dump_file`).
    """
    path = Path(path)
    check_dump_file(path)
    t = _read_named(path)
    if "hidden_states" in t:
        states = t["hidden_states"]
        if states.ndim != 3:
            raise FormatError(f"{path}: hidden_states is {list(states.shape)}; expected [T, L, H]", _HINT)
        t = {"input_ids": t["token_ids"], "features": states.flatten(1)}  # [T, L, H] -> [T, L*H]
    ids, feats = t["input_ids"], t["features"]
    if ids.ndim != 1 or ids.is_floating_point() or ids.dtype == torch.bool or feats.ndim != 2 \
            or not feats.is_floating_point() or feats.shape[0] != ids.shape[0] or feats.shape[1] == 0:
        raise FormatError(f"{path}: input_ids is {ids.dtype} {list(ids.shape)} and features {feats.dtype} "
                          f"{list(feats.shape)}; expected int64 [T] and float [T, W]", _HINT)
    if ids.shape[0] < min_positions:
        raise FormatError(f"{path}: {ids.shape[0]} positions; at least {min_positions} are needed to compare shifts",
                          _HINT)
    check_tensors(path, t, floats=["features"], ids=["input_ids"], vocab_size=vocab_size,
                  hint="dump with the target's tokenizer and the target the draft serves (or pass that --target)")
    if hidden_size is not None and feats.shape[1] % hidden_size:
        raise FormatError(f"{path}: features are {feats.shape[1]} wide, not a multiple of the target's hidden size "
                          f"{hidden_size}", "dump the target the draft serves, or pass --target")
    return ids.long(), feats.float()
