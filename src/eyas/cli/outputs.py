"""Every place a verb writes, checked before anything heavy runs (`eyas.cli.preflight` calls these):
writable, never an input nor inside one, never inside a feature cache, never among a draft's or a
model's files, and a plot in a format matplotlib writes. Nothing is created here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from eyas.errors import EyasError


def _writable_above(path: Path, flag: str) -> None:
    """The nearest existing folder above `path` can take new entries."""
    above = path.absolute().parent
    while not above.exists():
        above = above.parent
    if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
        raise EyasError(f"{path}: cannot write into {above} ({flag})", f"choose a {flag} where you can write")
    try:  # os.access says yes to root everywhere, /proc and read-only mounts included: try an unnamed file
        with tempfile.TemporaryFile(dir=above):
            pass
    except OSError as e:
        raise EyasError(f"{path}: cannot write into {above} ({flag}: {e.strerror or e})",
                        f"choose a {flag} where you can write") from None


def _given(path: str | Path | None, flag: str, kind: str) -> Path | None:
    """The path `flag` names (None: not given); an empty one is refused, naming the `kind` it wants."""
    if path is None:
        return None
    if str(path) == "":
        raise EyasError(f"{flag} is an empty path",
                        f"give {flag} a {kind} path" + (" ('.' for this one)" if kind == "folder" else ""))
    _linked_to_nothing(Path(path), flag)
    _up_from_nothing(Path(path), flag)
    return Path(path)


def _up_from_nothing(path: Path, flag: str) -> None:
    """Refuse `..` out of a folder that does not exist (`c/new/..`): the system follows no such path, so
    writing it made c/new first and left it behind."""
    for i, part in enumerate(path.parts):
        above = Path(*path.parts[:i])
        if part == ".." and i and not above.exists():
            raise EyasError(f"{path} ({flag}) goes up (..) out of {above}, which does not exist",
                            f"give {flag} as {os.path.normpath(path)}, or create {above} first")


def _linked_to_nothing(path: Path, flag: str) -> None:
    """Refuse a link that names nothing or loops: writing through a dangling one made the missing folders
    of wherever it pointed (/nonexistent/x), and a folder's rename replaced the link instead."""
    if path.is_symlink() and not path.exists():
        raise EyasError(f"{path} ({flag}) is a link to nothing (or to itself): {os.readlink(path)}",
                        f"give {flag} the path itself, or remove the link")


def output_folder(path: str | Path | None, flag: str) -> None:
    """A folder to write: absent (made later) or a folder, in a place that can be written."""
    path = _given(path, flag, "folder")
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise EyasError(f"{path} is a file, not a folder ({flag})", f"give {flag} a folder path")
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        raise EyasError(f"{path}: cannot write into it ({flag})", f"choose a {flag} where you can write")
    _writable_above(path, flag)


def draft_folder(path: str, force: bool, inputs: dict[str, str | None]) -> None:
    """A DST a draft is written to: a writable folder apart from the verb's inputs (the target, convert's
    SRC), new or empty, or a draft that --force replaces."""
    from eyas.formats.write import check_destination

    output_folder(path, "DST")
    apart(path, "DST", inputs, holds=True)
    check_destination(path, force)


def output_file(path: str | Path | None, flag: str) -> None:
    """A file to write (atomically, beside itself): its folder exists and can be written."""
    path = _given(path, flag, "file")
    if path is None:
        return
    if path.is_dir():
        raise EyasError(f"{path} is a folder ({flag})", f"give {flag} a file path")
    if path.exists() and not path.is_file():  # the write renames a new file over it: as root, /dev/null's node
        raise EyasError(f"{path} is not a regular file (a device, a pipe, a socket): writing {flag} would replace "
                        "it", f"give {flag} a path to a regular file, or a new one")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise EyasError(f"{path}: {parent} " + ("is a file, not a folder" if parent.exists() else "does not exist")
                        + f" ({flag})", "create the folder first, or choose another path")
    _writable_above(path, flag)


def _region(path: str | Path) -> Path:
    """What writing into `path` could change: a file, or the model folder a config file stands for."""
    from eyas.weights import find_weights

    path = Path(path).resolve()
    return path.parent if path.is_file() and find_weights(path.parent) is not None else path


def _on_disk(name: str, given: str | Path | None, target: str | Path | None) -> str | Path | None:
    """Where an input named by default lives: the embedded default target's cache folder, the shipped
    draft's folder (a DRAFTER or --against left out, or "default"); any other input as given."""
    from eyas.drafter_loading import shipped_draft
    from eyas.embedded import EMBEDDED_DIR, EMBEDDED_NAME, cache_dir, is_default

    if name == "--target" and is_default(given):
        return cache_dir() / EMBEDDED_DIR
    if name in ("DRAFTER", "--against") and given in (None, "default"):
        return shipped_draft(EMBEDDED_NAME) if is_default(target) else None
    return given


_LISTED = ("--data", "--features")  # inputs read by listing their folder: a feature cache


def apart(out: str | Path | None, flag: str, inputs: dict[str, str | Path | None], *, holds: bool = False,
          resumes: bool = False) -> None:
    """An output is none of the verb's inputs, nor anything already inside one (a plot over the draft's
    weights, a capture into the target's folder); with `holds` (a folder --force replaces) it holds
    none either. A new file or folder beside an input's files changes none of them, except in a
    feature cache (`_LISTED`), whose reader takes what it finds there (a plot named data_9.ckpt
    became a SpecForge sample): no output lands in one, the verb's input or not (`_in_a_cache`)."""
    if out is None:
        return
    _linked_to_nothing(Path(out), flag)
    o = Path(out).resolve()
    for name, given in inputs.items():
        given = _on_disk(name, given, inputs.get("--target"))
        if given is None or not Path(given).exists():  # a named prompt set
            continue
        i = _region(given)
        listed = name.split()[0] in _LISTED and i.is_dir()
        how = ("is" if o == i else "is already inside" if i in o.parents and o.exists()
               else "is inside" if i in o.parents and listed else "holds" if holds and o in i.parents else None)
        if how is not None:
            raise EyasError(f"{out} ({flag}) {how} {given} ({name}): writing it would change an input",
                            f"choose a {flag} outside the verb's inputs")
    _in_a_cache(o, out, flag, resumes)
    _in_eyas_own(o, out, flag)


def _in_eyas_own(o: Path, out: str | Path, flag: str) -> None:
    """Refuse an output inside eyas's own files: its installed package (the shipped drafts) or the
    embedded target's cache. A new file there changes what every later run reads as the default."""
    from importlib.resources import files

    from eyas.embedded import EMBEDDED_DIR, cache_dir

    for own, what in ((Path(str(files("eyas"))).resolve(), "eyas's installed package (the shipped drafts)"),
                      ((cache_dir() / EMBEDDED_DIR).resolve(), "the embedded target's cache")):
        if o == own or own in o.parents:
            raise EyasError(f"{out} ({flag}) is inside {what}, {own}: writing there changes the defaults every "
                            "run reads", f"choose a {flag} outside it")


def _in_a_cache(o: Path, out: str | Path, flag: str, resumes: bool) -> None:
    """Refuse an output inside a feature cache, or one that is a cache (but an eyas capture that
    `resumes` into its own folder): its reader would take the output for samples, or trip on it."""
    from eyas.data.caches.detect import marked_cache
    from eyas.data.caches.native import SHARDS

    for folder in [o, *o.parents]:
        fmt = marked_cache(folder)
        if fmt is not None and not (resumes and folder == o and fmt == SHARDS):
            how = "is" if folder == o else "is inside"
            raise EyasError(f"{out} ({flag}) {how} the {fmt} feature cache {folder}: outputs stay out of feature "
                            "caches, which their readers list", f"choose a {flag} outside every feature cache")


def plot_format(path: str | None) -> None:
    """`--plot`: a suffix matplotlib writes (none: PNG), checked before the measurement runs."""
    if path is None or not Path(path).suffix:
        return
    from matplotlib.figure import Figure

    known = Figure().canvas.get_supported_filetypes()
    if Path(path).suffix.lstrip(".").lower() not in known:
        raise EyasError(f"--plot {path}: matplotlib writes no {Path(path).suffix} files",
                        f"end it in one of {', '.join('.' + k for k in sorted(known))} (or none: PNG)")


def capture_out(path: str) -> None:
    """`eyas capture --out`: writable, a capture's own folder readable (resumed), and not a draft's, a
    model's or a training run's folder: shards among its files would make it both, for every reader (a
    run whose folder is a feature cache can no longer be resumed: its outputs would land in a cache)."""
    from eyas.data.shards import MANIFEST, read_manifest
    from eyas.train.checkpoint import RunFiles
    from eyas.weights import model_files

    output_folder(path, "--out")
    if (Path(path) / MANIFEST).is_file():
        read_manifest(Path(path))
    runs = (RunFiles.of(path), RunFiles.of(Path(path).absolute().parent))  # a run, or a folder of one
    held = model_files(Path(path)) + [str(p) for run in runs for p in (run.checkpoints, run.log) if p.exists()]
    if held:
        raise EyasError(f"{path} (--out) is a draft's, a model's or a training run's folder ({', '.join(held)}): a "
                        "capture is not written among its files", "choose a new --out")
