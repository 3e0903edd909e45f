"""How every verb prints: one JSON object on stdout under `--json`, everything else for people;
progress and logs on stderr, so stdout stays parseable."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from eyas.jsonsafe import dumps


# eyas's `warning:` lines said on stderr during this command (eyas.cli._warning_line records them), so the
# one JSON object carries them too: a reader of stdout learns of a skipped shard or a shortened --limit
_said: list[str] = []


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


def new_command() -> None:
    """Forget the warnings of an earlier command run in this process (tests call main() many times)."""
    _said.clear()


_held: list[str] | None = None  # warnings said inside `warnings_held`, printed when it ends well


def warning_said(message: str) -> None:
    """Print eyas's warning as one `warning:` line on stderr, and keep it for the JSON object; said once
    (a deprecated flag given twice is one line). Inside `warnings_held`, printed when it ends."""
    if message in _said or (_held is not None and message in _held):
        return
    if _held is not None:
        _held.append(message)
        return
    _said.append(message)
    from tqdm import tqdm

    tqdm.write(f"warning: {message}", file=sys.stderr)  # on its own line, above a progress bar being drawn


@contextmanager
def warnings_held() -> Iterator[None]:
    """The warnings said inside are printed when the block ends, and dropped where it raises: the checks of
    a verb's input refuse it in one `error:` line, not after a warning about another flag (`--limit 2: the
    file has 1 prompt`) that the refusal makes moot until the input is fixed."""
    global _held
    outer, _held = _held, []
    try:
        yield
        held = _held
    finally:
        _held = outer
    for message in held:
        warning_said(message)


def print_json(obj: dict[str, Any]) -> None:
    """`obj` as JSON that any parser reads (eyas.jsonsafe: NaN and infinities become null), with the
    warnings said on stderr so far as `stderr_warnings` where there were any."""
    print(dumps({**obj, "stderr_warnings": list(_said)} if _said else obj, indent=2))


def print_report(report: dict[str, Any], as_json: bool, for_people: Callable[[dict[str, Any]], str]) -> None:
    """A verb's report on stdout: the JSON itself under `--json`, else `for_people(report)`."""
    if as_json:
        print_json(report)
    else:
        print(for_people(report))


@contextmanager
def progress_bars(enabled: bool) -> Iterator[None]:
    """`--no-progress` silences transformers' weight-loading bar too, not only eyas's own bars;
    the setting is restored afterwards (it is process-wide)."""
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
