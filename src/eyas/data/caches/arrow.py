"""Rows of a Hugging Face `datasets` folder (`Dataset.save_to_disk`), read with pyarrow alone.

`save_to_disk` writes `state.json` (its `_data_files` list the shards, in row order),
`dataset_info.json` and `data-0000k-of-0000n.arrow` files in Arrow's IPC *stream* format (datasets'
`ArrowWriter` uses `pa.RecordBatchStreamWriter`). eyas reads the integer list columns it needs one
record batch at a time from memory-mapped files: no `datasets` import, no copy of the table.
`datasets` (5.1.0, as installed here) stores a column named `input_ids` as int32 even when it was
given int64 tensors (its optimised type for that name); rows come back as int64 tensors whatever
the stored integer width.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from eyas.errors import FormatError

STATE = "state.json"
_HINT = "point at the folder `Dataset.save_to_disk` wrote (it holds state.json and data-*.arrow)"


def is_dataset(folder: Path) -> bool:
    return (folder / STATE).is_file()


def data_files(folder: Path) -> list[Path]:
    """The Arrow shards `state.json` lists, in order."""
    path = folder / STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
        files = [folder / entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FormatError(f"{path}: no readable `_data_files` list ({type(e).__name__}: {e})", _HINT) from None
    if state.get("_indices_data_files"):
        raise FormatError(f"{path}: the dataset is an index over other files", "save it again with "
                          "`dataset.flatten_indices().save_to_disk(...)`")
    return files


def _batches(path: Path) -> Iterator[pa.RecordBatch]:
    try:
        reader = pa.ipc.open_stream(pa.memory_map(str(path)))
        yield from reader
    except (OSError, pa.ArrowInvalid) as e:
        raise FormatError(f"{path}: not a readable Arrow stream ({e})", _HINT) from None


def num_rows(folder: Path) -> int:
    return sum(batch.num_rows for path in data_files(folder) for batch in _batches(path))


def _int_lists(batch: pa.RecordBatch, name: str, path: Path, mask: bool) -> list[torch.Tensor]:
    """One list-of-integers column of a record batch as int64 tensors, one per row; a `mask` column may
    hold bools too (0/1, as the other caches' readers take a bool loss mask)."""
    if name not in batch.schema.names:
        raise FormatError(f"{path}: no column {name!r} (found {batch.schema.names})", _HINT)
    column = batch.column(name)
    kind = column.type
    lists = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if not lists or not (pa.types.is_integer(kind.value_type) or mask and pa.types.is_boolean(kind.value_type)):
        raise FormatError(f"{path}: column {name!r} is {kind}, expected a list of integers per row", _HINT)
    if column.null_count:
        raise FormatError(f"{path}: column {name!r} has {column.null_count} empty (null) rows", _HINT)
    offsets = column.offsets.to_numpy()
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.int64, copy=False)  # from offsets[0]
    base = int(offsets[0])
    return [torch.from_numpy(values[a - base:b - base].copy()) for a, b in zip(offsets[:-1], offsets[1:])]


def rows(folder: Path, columns: Sequence[str],
         masks: Sequence[str] = ()) -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
    """(arrow file, {column: int64 [T]}) for every row, in dataset order; `masks`: columns that may be bools."""
    for path in data_files(folder):
        for batch in _batches(path):
            cols = [_int_lists(batch, name, path, name in masks) for name in columns]
            for values in zip(*cols):
                yield path, dict(zip(columns, values))
