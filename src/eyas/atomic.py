"""Writing outputs so that a crash or a kill leaves the old file or the new one, never half of one.

One rule for every file eyas writes (checkpoints, configs, shards, manifests, logs, plots, caches):
write into a temp file beside the destination, flush and fsync it, give it an ordinary mode
(`mkstemp`/`mkdtemp` make private files; outputs follow the umask like any other file), rename it
into place, then fsync the folder so the rename itself survives a power cut. A write the machine
refuses (a full disk, a quota, a file-size limit, a read-only or forbidden folder) is one `error:`
line naming the file, and leaves nothing behind: not the temp file, nor folders made for it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

from safetensors import SafetensorError

from eyas.errors import EyasError
from eyas.jsonsafe import dumps


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_path(path: str | Path) -> None:
    """Flush a file (or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ordinary_modes(path: Path) -> None:
    """Give a temp file or folder (and what it holds) the modes a plain `open`/`mkdir` would."""
    mask = _umask()
    if path.is_dir():
        path.chmod(0o777 & ~mask)
        for p in path.rglob("*"):
            p.chmod((0o777 if p.is_dir() else 0o666) & ~mask)
    else:
        path.chmod(0o666 & ~mask)


def _os_error(e: BaseException | None) -> OSError | None:
    """The OSError behind `e`: itself, or the one it was raised from or while handling (torch.save's
    writer reports a full disk as a RuntimeError raised while handling the OSError)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """The machine's refusals to write `path` as the user's error (exit 2), not eyas's traceback.
    safetensors reports them as a SafetensorError saying "I/O error", torch.save as a RuntimeError
    over the OSError; any other is a bug, and rises."""
    try:
        yield
    except FileExistsError:
        raise
    except (OSError, SafetensorError, RuntimeError) as e:
        if isinstance(e, SafetensorError) and "I/O error" not in str(e):
            raise
        os_error = _os_error(e)
        if isinstance(e, RuntimeError) and os_error is None:
            raise
        why = os_error.strerror if os_error is not None and os_error.strerror else str(e)
        raise EyasError(f"{path}: cannot write it ({why})",
                        "free space on its disk, check the folder's permissions, or write somewhere else") from e


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """`write(f)` into a temp file beside `path`, then fsync and rename it over `path`."""
    path = Path(path)
    with writing(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            ordinary_modes(Path(tmp))
            os.replace(tmp, path)
            fsync_path(path.parent)
        finally:
            Path(tmp).unlink(missing_ok=True)  # gone already when the rename succeeded
        return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    return write_atomic(path, lambda f: f.write(data))


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


def write_figure(path: str | Path, figure: Any, dpi: int) -> Path:
    """A matplotlib figure in the format its suffix names (none: PNG), as `savefig(path)` infers it,
    written atomically (`--plot` checks the suffix first: eyas.cli.outputs.plot_format)."""
    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    return write_atomic(path, lambda f: figure.savefig(f, format=fmt, dpi=dpi))


def write_json(path: str | Path, obj: Any) -> Path:
    """Pretty JSON with a final newline (NaN as null: eyas.jsonsafe), written atomically."""
    return write_text(path, dumps(obj, indent=2) + "\n")


@contextmanager
def temp_file(path: str | Path) -> Iterator[Path]:
    """A temp path beside `path` for writers that want a file name (safetensors' `save_file`).

    On a clean exit the file is fsynced, given an ordinary mode and renamed over `path`;
    on an error it is removed and `path` is untouched.
    """
    path = Path(path)
    with writing(path):
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            yield tmp
            fsync_path(tmp)
            ordinary_modes(tmp)
            os.replace(tmp, path)
            fsync_path(path.parent)
        finally:
            tmp.unlink(missing_ok=True)


@contextmanager
def temp_folder(dst: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """A temp folder beside `dst`; on a clean exit it becomes `dst`, on an error nothing is left.

    With `replace`, an existing non-empty `dst` is moved aside first and removed only once the new
    folder is in place (if the final rename fails, the old folder is put back).
    """
    dst, done, made = Path(dst), False, []
    try:
        with writing(dst):
            made = make_folders(dst.parent)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
        try:
            yield tmp
            with writing(dst):
                for f in tmp.rglob("*"):
                    if f.is_file():
                        fsync_path(f)
                ordinary_modes(tmp)
                _install(tmp, dst, replace)
            done = True
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded
    finally:
        if not done:
            remove_empty(made)


def make_folders(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; those it made, innermost first (for `remove_empty`)."""
    made = list(itertools.takewhile(lambda p: not p.exists(), [folder, *folder.parents]))
    with writing(folder):  # a folder the machine will not make (/proc/x, a read-only mount) is one line
        folder.mkdir(parents=True, exist_ok=True)
    return made


def remove_empty(folders: list[Path]) -> None:
    """Remove each of `folders` (innermost first) that is empty: what a failed write made, not what it found."""
    for folder in folders:
        with suppress(OSError):  # not empty, or gone
            folder.rmdir()


def _install(tmp: Path, dst: Path, replace: bool) -> None:
    old = None
    if dst.is_dir() and any(dst.iterdir()):
        if not replace:
            raise FileExistsError(f"{dst}: not empty")
        old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
        os.replace(dst, old / dst.name)
    try:
        os.replace(tmp, dst)  # replaces an empty folder too
    except OSError:
        if old is not None:
            os.replace(old / dst.name, dst)
            old.rmdir()
        raise
    fsync_path(dst.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
