"""The feature inputs a verb reads, checked before anything loads (`eyas.cli.preflight` calls these): an
eyas capture down to its shards' headers, another trainer's cache named by its format where only an eyas
capture will do, an engine dump read in full. `existing` is every input path's first check."""

from __future__ import annotations

import argparse
from pathlib import Path

from eyas.errors import EyasError, FormatError


def existing(path: str | Path, flag: str) -> Path:
    """An input path that must exist (an empty one is not the current folder, which Path("") names)."""
    if not str(path).strip():
        raise EyasError(f"{flag} is empty", f"give {flag} a path")
    path = Path(path)
    if not path.exists():
        raise FormatError(f"{path} does not exist ({flag})", f"check the path given to {flag}")
    return path


def capture_folder(path: str | Path, flag: str, data_format: str | None = None) -> None:
    """A feature folder: an eyas capture down to its shards' headers; another trainer's cache only exists here."""
    from eyas.data.shards import MANIFEST, check_capture

    path = existing(path, flag)
    if data_format == "eyas" or data_format is None and (path / MANIFEST).is_file():
        check_capture(path)


def training_capture(path: str | Path) -> None:
    """train's --data: an eyas capture (its shards keep the target's answers and their masks); another
    trainer's cache is named as one, not as a folder without manifest.json."""
    from eyas.data.caches import detect_format
    from eyas.data.shards import MANIFEST

    path = existing(path, "--data")
    if path.is_dir() and not (path / MANIFEST).is_file():
        try:
            found = detect_format(path)
        except FormatError:
            found = None
        if found is not None and found != "eyas":
            raise FormatError(f"{path} (--data) is a {found} feature cache: eyas train reads the captures `eyas "
                              "capture` writes", "capture training data with `eyas capture`; eval and doctor read "
                              "this cache with --data")
    capture_folder(path, "--data", "eyas")


def dump_file(path: str | Path, target: str | None, flag: str = "--features") -> None:
    """An engine dump read in full, its ids and width held against --target's config (the default's: loaded)."""
    from eyas.data.dumps import read_dump
    from eyas.embedded import is_default
    from eyas.target import TargetRef

    vocab = hidden = None
    if not is_default(target):
        ref = TargetRef.resolve(target, weights=False)
        vocab, hidden = ref.vocab_size, ref.hidden_size
    read_dump(existing(path, flag), vocab_size=vocab, hidden_size=hidden)


def data_file(path: str | Path, target: str | None, data_format: str | None) -> None:
    """`eval --data FILE`: what the file is, from its name and header (a model's weights are refused naming a
    few of its tensors), and an engine dump read in full, as the doctor's --features is: its NaN was found
    after the draft loaded, under the progress bar."""
    from eyas.data.caches import detect_format
    from eyas.data.caches.native import DUMP

    if (data_format or detect_format(path)) == DUMP:
        dump_file(path, target, "--data")


def features(args: argparse.Namespace) -> None:
    """`eyas doctor --features`: an engine dump (a file) or a feature cache (a folder)."""
    path, data_format = getattr(args, "features", None), getattr(args, "data_format", None)
    if path is None:
        format_without_data(data_format, "--features")
        return
    if Path(path).is_dir():
        capture_folder(path, "--features", data_format)
    elif data_format in (None, "eyas-dump"):
        dump_file(path, args.target)
    else:  # a file is read as an engine dump: the format named would be ignored unsaid
        existing(path, "--features")
        raise EyasError(f"--data-format {data_format} reads a feature cache folder; --features {path} is a file",
                        "leave --data-format out (or pass eyas-dump) for an engine dump, or pass the cache's folder")


def format_without_data(data_format: str | None, flag: str) -> None:
    """--data-format names how to read a cache: without one to read, it would be ignored unsaid."""
    if data_format is not None:
        raise EyasError(f"--data-format {data_format} without {flag}: there is no cache to read",
                        f"pass {flag} CACHE_FOLDER, or leave --data-format out")
