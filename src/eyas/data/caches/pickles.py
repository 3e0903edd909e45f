"""Loading `torch.save` files written by other trainers, safely: `weights_only=True`, always.

SpecForge, ModelOpt and speculators' legacy generator store each sample as a pickled dict of
tensors (and a few plain values). `torch.load(weights_only=True)` reads those; a pickle that needs
anything more (a class, a function) is refused in one line naming the file and the global it asked
for: eyas never executes code from a data file. Plain files are memory-mapped so a sample's tensors
are paged in only as they are read; a `.gz` (SpecForge's `--compress`) is decompressed in memory.
"""

from __future__ import annotations

import gzip
import io
import pickle
import re
import zipfile
from abc import abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eyas.data.caches.base import FeatureCache
from eyas.errors import FormatError

_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_REFUSED_HINT = ("eyas loads data files with torch.load(weights_only=True) and never runs pickled code: "
                 "re-save the sample as a plain dict of tensors")


def _reason(e: BaseException) -> str:
    text = str(e)
    found = _GLOBAL.search(text)
    if found:
        return f"it asks for {found.group(1)}"
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else type(e).__name__)[:200]


def _load(source: Path | io.BytesIO, mmap: bool) -> Any:
    return torch.load(source, weights_only=True, map_location="cpu", mmap=mmap)


def _intact(path: Path) -> None:
    """torch.load reads a zip's members without checking their CRC-32s, so a flipped bit in a sample
    changes the figures silently; zipfile checks them (one more read of the file, from the page cache
    when torch.load maps it next). A .gz is checked by gzip itself."""
    if not zipfile.is_zipfile(path):  # the legacy (pre-zip) torch.save format carries no checksums
        return
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return  # torch.load names what is wrong with it
    if bad is not None:
        raise FormatError(f"{path}: corrupted: its member {bad} fails its CRC-32 check",
                          "copy the file again from where it was written, or write it again")


def load_record(path: Path, fmt: str) -> dict[str, Any]:
    """One `torch.save` file as a dict, loaded with weights_only=True (mmap when it can be), its
    checksums verified first."""
    if not path.name.endswith(".gz"):
        _intact(path)
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                obj = _load(io.BytesIO(f.read()), mmap=False)
        else:
            try:
                obj = _load(path, mmap=True)
            except RuntimeError as e:  # the pre-zip (legacy) torch.save format cannot be mapped
                if "mmap" not in str(e):
                    raise
                obj = _load(path, mmap=False)
    except pickle.UnpicklingError as e:
        raise FormatError(f"{path}: refused: the pickle needs more than torch.load(weights_only=True) "
                          f"allows ({_reason(e)})", _REFUSED_HINT) from None
    except Exception as e:  # truncated zip, bad gzip, not a torch file at all: a bad input, not a bug
        raise FormatError(f"{path}: not a readable torch.save file ({type(e).__name__}: {_reason(e)})",
                          f"the file is truncated or not a {fmt} sample: write it again") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{path}: holds a {type(obj).__name__}, expected a dict of tensors",
                          f"point at a {fmt} cache, or name the format with --data-format")
    return obj


class FileCache(FeatureCache):
    """A cache of one pickled sample per file (SpecForge, ModelOpt, legacy speculators), read in `files` order.

    Subclasses set `files` (via `first_record`, which also loads the first sample to size the
    cache) and `info`, and read one file in `read_sample`.
    """

    files: list[Path]

    def first_record(self, path: Path, files: list[Path], fmt: str, hint: str) -> dict[str, Any]:
        """Keep `files` and return the first one's record; refuse a cache without any."""
        if not files:
            raise FormatError(f"{path}: no sample files of the {fmt} format", hint)
        self.files = files
        return load_record(files[0], fmt)

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        for path in self.files:
            yield self.read_sample(path)

    @abstractmethod
    def read_sample(self, path: Path) -> dict[str, Tensor]: ...
