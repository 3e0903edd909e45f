"""Which trainer wrote a cache, from what is on disk, and the reader that opens it.

Detection looks only at names and headers, and at most two sample files: a cache can hold millions
of files, so nothing is walked whole to recognise it. The markers one listing deep come first
(eyas's manifest, then `_marks`: the Arrow dataset's state.json with its hidden_states/, speculators'
legacy data_config.json, SpecForge's sample groups, the keys of the folder's first `*.pt`), and a
folder marked as two caches is refused rather than read as one; a folder marked as none is walked
for SpecForge's `*.ckpt[.gz]`, then for the first `*.pt` (ModelOpt vs legacy speculators).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from eyas.data.caches import arrow, modelopt, native, specforge, speculators, speculators_legacy
from eyas.data.caches.base import FeatureCache, safetensors_shapes
from eyas.data.caches.pickles import load_record
from eyas.data.shards import FORMAT as CAPTURE_FORMAT, MANIFEST
from eyas.errors import FormatError
from eyas.weights import tensor_list

READERS: dict[str, Callable[..., FeatureCache]] = {
    native.SHARDS: native.ShardsCache,
    native.DUMP: native.DumpCache,
    specforge.FORMAT: specforge.SpecForgeCache,
    speculators.FORMAT: speculators.SpeculatorsCache,
    speculators_legacy.FORMAT: speculators_legacy.SpeculatorsLegacyCache,
    modelopt.FORMAT: modelopt.ModelOptCache,
}
CACHE_FORMATS: tuple[str, ...] = tuple(READERS)


def formats_hint() -> str:
    return f"the formats eyas reads: {', '.join(CACHE_FORMATS)}; name one with --data-format"


def detect_format(path: str | Path) -> str:
    """The name (one of CACHE_FORMATS) of the cache at `path`; FormatError naming what is there otherwise."""
    path = Path(path)
    if not path.exists():
        raise FormatError(f"{path} does not exist", formats_hint())
    if path.is_file():
        return _detect_file(path)
    if path.is_dir():
        return _detect_folder(path)
    raise FormatError(f"{path}: not a file or folder eyas reads (a device, pipe or socket)", formats_hint())


def _detect_file(path: Path) -> str:
    name = path.name
    if name.endswith(specforge.SUFFIXES):
        return specforge.FORMAT
    if name.endswith(".safetensors"):
        _refuse_one_row(path)
        keys = set(safetensors_shapes(path, formats_hint()))
        if {"input_ids", "features"} <= keys or {"token_ids", "hidden_states"} <= keys:
            return native.DUMP
        raise FormatError(f"{path}: not an engine dump (input_ids, features): it holds {tensor_list(keys)}",
                          "point at an engine dump (docs/engine-dumps.md) or the folder of a feature cache (eyas "
                          "capture, SpecForge, speculators), not one of its files; a model's weights go to --target")
    if name.endswith(".pt"):
        return _detect_pt(path)
    raise FormatError(f"{path}: a file eyas does not read as a feature cache", formats_hint())


def _refuse_one_row(path: Path) -> None:
    """A speculators row's file has an engine dump's keys, but its last slot is the target's last hidden
    state and its loss mask lives in the Arrow rows beside it: read alone it would be refused for its
    layer count, so name the cache it belongs to instead."""
    cache = path.parent.parent
    if path.parent.name == speculators.HS_DIR and speculators.is_cache(cache):
        raise FormatError(f"{path}: one row of the speculators cache {cache}, not a cache of its own",
                          f"point at the cache folder: {cache}")


def _detect_pt(path: Path) -> str:
    record = load_record(path, "feature cache")
    if modelopt.is_record(record):
        return modelopt.FORMAT
    if speculators_legacy.is_record(record):
        return speculators_legacy.FORMAT
    raise FormatError(f"{path}: a torch.save dict with {sorted(record)}, which no known trainer writes",
                      formats_hint())


def _detect_folder(folder: Path) -> str:
    found = ([native.SHARDS] if native.is_shards(folder) else []) + _marks(folder, _names(folder))
    if len(found) > 1:
        raise _mixed(folder, found)
    if found:
        return found[0]
    inner = sorted(n for n in _names(folder) if marked_cache(folder / n) is not None)
    if len(inner) > 1:  # a folder of caches: read as one, the walk below would take one format's and skip the rest
        raise FormatError(f"{folder}: holds {len(inner)} feature caches in its folders ({', '.join(inner[:3])}"
                          f"{', ...' if len(inner) > 3 else ''}), not one", "point --data at one of them")
    if arrow.is_dataset(folder):
        raise FormatError(f"{folder}: an Arrow dataset without {speculators.HS_DIR}/",
                          "generate its hidden states with speculators' scripts/data_generation_offline.py first")
    if specforge.has_files(folder):  # sample groups further down
        return specforge.FORMAT
    first = _first_pt(folder)
    if first is not None:
        return _detect_pt(first)
    raise FormatError(f"{folder}: no feature cache found ({_contents(folder)})", formats_hint())


# what marks each format in a folder, as a refusal names it
_MARKERS = {
    native.SHARDS: MANIFEST,
    speculators.FORMAT: f"{arrow.STATE} and {speculators.HS_DIR}/",
    specforge.FORMAT: "rows_*/ or data_*.ckpt",
    speculators_legacy.FORMAT: "data_*.pt",
    modelopt.FORMAT: "*.pt holding aux_hidden_states",
}


def _mixed(folder: Path, found: list[str]) -> FormatError:
    """Each reader takes only its own files: read as one format, the other cache would be skipped unsaid."""
    caches = " and ".join(f"{fmt} ({_MARKERS[fmt]})" for fmt in found)
    return FormatError(f"{folder}: holds the files of {len(found)} feature caches, {caches}: read as one, the "
                       "rest would be skipped", f"name the one to read with --data-format {found[0]} or "
                       f"--data-format {found[1]}, or move each cache into a folder of its own")


# SpecForge's sample groups and samples (specforge.py); not any *.ckpt: Lightning writes those anywhere
_SPECFORGE_NAME = re.compile(r"rows_\d+-\d+|data_\d+\.ckpt(\.gz)?")


def _names(folder: Path) -> list[str]:
    """The folder's entries (none where it cannot be listed)."""
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _marks(folder: Path, names: list[str]) -> list[str]:
    """The formats other than eyas's whose markers `names` (the folder's listing) hold: a speculators
    dataset with its hidden states, SpecForge's sample groups or samples (by their names), a legacy
    speculators data_config.json beside its data_{i}.pt, and what the keys of the first `*.pt` say."""
    found = [speculators.FORMAT] if speculators.is_cache(folder) else []
    if any(_SPECFORGE_NAME.fullmatch(n) for n in names):
        found.append(specforge.FORMAT)
    if speculators_legacy.CONFIG in names and speculators_legacy.is_cache(folder):
        found.append(speculators_legacy.FORMAT)
    first = min((n for n in names if n.endswith(".pt")), default=None)  # not sorted: a flat cache is large
    peeked = None if first is None else _peek_pt(folder / first)
    if peeked is not None and peeked not in found:
        found.append(peeked)
    return found


def _peek_pt(path: Path) -> str | None:
    """The format the keys of a `*.pt` name (ModelOpt's or legacy speculators'), or None for any other
    file. Only its pickle is read, its tensors mapped, not loaded, nor their checksums verified: every
    folder above an output is asked, and one may hold a model's checkpoint of many gigabytes (or a FIFO,
    which would block: only regular files are opened)."""
    if not path.is_file():
        return None
    try:
        record = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except Exception:  # not a file, not torch's zip format, not a plain dict of tensors: no sample
        return None
    if not isinstance(record, dict):
        return None
    if modelopt.is_record(record):
        return modelopt.FORMAT
    return speculators_legacy.FORMAT if speculators_legacy.is_record(record) else None


def marked_cache(folder: Path) -> str | None:
    """The format of the feature cache `folder` is, by its markers one listing deep (`_marks`), or None.
    Every folder above an output is asked (`eyas.cli.outputs.apart`), so nothing is walked, and a
    manifest.json, state.json, last.ckpt or *.pt of anything else is no cache."""
    if not folder.is_dir():
        return None
    if native.is_shards(folder):
        try:
            manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = None
        if isinstance(manifest, dict) and manifest.get("format") == CAPTURE_FORMAT:
            return native.SHARDS
    found = _marks(folder, _names(folder))
    return found[0] if found else None


def _first_pt(folder: Path) -> Path | None:
    """The first `*.pt` of a sorted walk, stopping there (never the whole tree)."""
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            if name.endswith(".pt"):
                return Path(root) / name
    return None


def _contents(folder: Path, shown: int = 4) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    if not names:
        return "an empty folder"
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"it holds {', '.join(names[:shown])}{more}"


def open_cache(path: str | Path, *, format: str | None = None, num_layers: int | None = None,
               layer_ids: Sequence[int] | None = None, vocab_size: int | None = None) -> FeatureCache:
    """Open the cache at `path` (its format detected, or forced with `format`).

    `num_layers` (the target's num_hidden_layers) lets a reader state its trainer's default layers;
    `layer_ids` (eyas's capture convention) are the layers the caller knows the cache was taken
    with, and override that assumption where the cache records none. `vocab_size` (the target's):
    each sample's ids are checked against it as it is read, the error naming the sample's own file.
    """
    fmt = format or detect_format(path)
    if fmt not in READERS:
        raise FormatError(f"unknown cache format {fmt!r} for {path}", formats_hint())
    cache = READERS[fmt](Path(path), num_layers=num_layers, layer_ids=layer_ids)
    cache.info = dataclasses.replace(cache.info, vocab_size=vocab_size)
    return cache
