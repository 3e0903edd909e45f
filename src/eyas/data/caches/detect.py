"""Which trainer wrote a cache, from what is on disk, and the reader that opens it.

Detection looks only at names and headers, and at most one sample file: a cache can hold millions
of files, so nothing is listed whole to recognise it. Marker files come first (eyas's manifest,
the Arrow dataset's state.json, speculators' legacy data_config.json), then SpecForge's
`*.ckpt[.gz]`, then the keys of the first `*.pt` (ModelOpt vs legacy speculators).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

from eyas.data.caches import arrow, modelopt, native, specforge, speculators, speculators_legacy
from eyas.data.caches.base import FeatureCache, safetensors_shapes
from eyas.data.caches.pickles import load_record
from eyas.data.shards import FORMAT as CAPTURE_FORMAT, MANIFEST
from eyas.errors import FormatError

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
        raise FormatError(f"{path}: a safetensors file with {sorted(keys)}, not an engine dump (input_ids, features)",
                          "point at the folder of an eyas capture or speculators cache, not one of its files")
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
    if native.is_shards(folder):
        return native.SHARDS
    if speculators.is_cache(folder):
        return speculators.FORMAT
    if arrow.is_dataset(folder):
        raise FormatError(f"{folder}: an Arrow dataset without {speculators.HS_DIR}/",
                          "generate its hidden states with speculators' scripts/data_generation_offline.py first")
    if speculators_legacy.is_cache(folder):
        return speculators_legacy.FORMAT
    if specforge.has_files(folder):
        return specforge.FORMAT
    first = _first_pt(folder)
    if first is not None:
        return _detect_pt(first)
    raise FormatError(f"{folder}: no feature cache found ({_contents(folder)})", formats_hint())


# SpecForge's sample groups and samples (specforge.py); not any *.ckpt: Lightning writes those anywhere
_SPECFORGE_NAME = re.compile(r"rows_\d+-\d+|data_\d+\.ckpt(\.gz)?")


def marked_cache(folder: Path) -> str | None:
    """The format of the feature cache `folder` is, by its markers one listing deep, or None: an eyas
    capture's manifest, a speculators dataset with its hidden states, SpecForge's sample groups or
    samples (by their names). Every folder above an output is asked (`eyas.cli.preflight.apart`), so
    nothing is walked, and a manifest.json, state.json or last.ckpt of anything else is no cache."""
    if not folder.is_dir():
        return None
    if native.is_shards(folder):
        try:
            manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            manifest = None
        if isinstance(manifest, dict) and manifest.get("format") == CAPTURE_FORMAT:
            return native.SHARDS
    if speculators.is_cache(folder):
        return speculators.FORMAT
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    if any(_SPECFORGE_NAME.fullmatch(n) for n in names):
        return specforge.FORMAT
    return None


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
               layer_ids: Sequence[int] | None = None) -> FeatureCache:
    """Open the cache at `path` (its format detected, or forced with `format`).

    `num_layers` (the target's num_hidden_layers) lets a reader state its trainer's default layers;
    `layer_ids` (eyas's capture convention) are the layers the caller knows the cache was taken
    with, and override that assumption where the cache records none.
    """
    fmt = format or detect_format(path)
    if fmt not in READERS:
        raise FormatError(f"unknown cache format {fmt!r} for {path}", formats_hint())
    return READERS[fmt](Path(path), num_layers=num_layers, layer_ids=layer_ids)
