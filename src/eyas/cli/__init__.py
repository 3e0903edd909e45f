"""The `eyas` command line: parse arguments, call one library function, print. Nothing else.

- `parser`: the one grammar (build_parser), every flag built by a shared helper.
- `inputs`: flags -> library arguments, the same for every verb (target, draft, capture layers).
- `preflight`: every verb's flags and input files checked before anything loads (`preflight.check`).
- `output`: JSON on stdout, logs on stderr, the text of a finding.
- `checkpoint`: inspect, check, convert, init, and the inspect report.
- `measure`: capture, eval, train.
- `decoding`: generate, bench.
- `doctor`: doctor.
- `examples`: the examples each verb's --help ends with.

Every command prints one JSON object on stdout under `--json` (logs go to stderr) and exits 0 (ok),
1 (`check` found problems, `doctor` found a fault) or 2 (the input cannot be used: one `error:` and
one `hint:` line, and under `--json` `{"error", "hint", "exit_code"}` on stdout; `EYAS_DEBUG=1`
shows the traceback instead); SIGINT / SIGTERM exit 130 / 143 with one `interrupted by ...` line
(eyas.interrupt: capture and train say how to resume, every verb removes what it was writing); a
reader of stdout that leaves early (`| head`) ends it quietly with 141, as SIGPIPE ends `cat`.
`python -m eyas` is the same command.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import warnings
from collections.abc import Callable
from typing import Any

from eyas.cli.output import new_command, print_json, progress_bars, warning_said
from eyas.cli.parser import UsageError, build_parser
from eyas.errors import EyasError
from eyas.interrupt import Interrupted, on_signals

__all__ = ["build_parser", "main"]


def _warning_line(other: Callable[..., None]) -> Callable[..., None]:
    """eyas's own warnings (a skipped shard, an incomplete capture) as one `warning:` line on stderr,
    as every other warning eyas prints; a library's keep Python's form (`other`)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if os.path.abspath(filename).startswith(package + os.sep):
            warning_said(str(message))
        else:
            other(message, category, filename, lineno, file, line)

    return show


def _stopped(args: argparse.Namespace) -> str:
    """What every verb says when stopped by SIGINT / SIGTERM (capture and train say how to resume)."""
    if any(getattr(args, name, None) for name in ("dst", "out", "plot", "dump")):
        return "stopped before the end; files are written whole or not at all, so none was left half-written"
    return "stopped before the end; this command writes no output files"


def _json_error(message: str, hint: str | None) -> None:
    """The object `--json` prints on stdout for unusable input (exit 2), beside the stderr lines."""
    print_json({"error": message, "hint": hint, "exit_code": 2})


class StdoutRefused(Exception):
    """A write to standard output that the machine refused (`> /dev/full`, a full disk): not a file eyas
    opened, whose writes say their own errors (EyasError), nor a reader gone (BrokenPipeError)."""


class _GuardedStdout:
    """sys.stdout for the length of one command: its refused writes raise StdoutRefused."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return _refused(self._stream.write, text)

    def flush(self) -> None:
        _refused(self._stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _refused(call: Callable[..., Any], *args: Any) -> Any:
    """`call(*args)` on the real stdout, its OSError a StdoutRefused (a reader gone stays BrokenPipeError)."""
    try:
        return call(*args)
    except BrokenPipeError:
        raise
    except OSError as e:
        raise StdoutRefused(e.strerror or str(e)) from None


def _silence_stdout() -> None:
    """Point standard output at /dev/null: the interpreter's exit would flush it, and fail, again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's capture): nothing is flushed at exit
        pass


def _said_on_stdout(say: Callable[..., None], *args: Any) -> None:
    """A reader of stdout gets one JSON object on every exit, where stdout takes it (the error itself is
    on stderr already)."""
    try:
        say(*args)
    except (StdoutRefused, BrokenPipeError):
        _silence_stdout()


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`eyas`); returns the exit code."""
    stdout, sys.stdout = sys.stdout, _GuardedStdout(sys.stdout)
    try:
        return _main(argv)
    finally:
        sys.stdout = stdout


def _main(argv: list[str] | None) -> int:
    new_command()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as e:  # printed already; under --json stdout gets its one JSON object too
        if "--json" in (sys.argv[1:] if argv is None else argv):
            _said_on_stdout(_json_error, e.message, e.hint)
        return 2
    except SystemExit as e:  # --help (0)
        return int(e.code or 0)
    try:
        stopped = functools.partial(_stopped, args)  # what a signal's line says, built when one comes
        with progress_bars(getattr(args, "progress", True)), warnings.catch_warnings(), on_signals(stopped):
            warnings.showwarning = _warning_line(warnings.showwarning)
            # eyas's warnings are messages to the user: shown once each, whatever PYTHONWARNINGS says of others
            warnings.filterwarnings("default", module=r"eyas(\.|$)")
            code = args.func(args)
        sys.stdout.flush()  # a closed pipe fails here, where it is handled, not in the interpreter's exit
        return code
    except EyasError as e:
        if os.environ.get("EYAS_DEBUG") == "1":
            raise
        print(f"error: {e}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        if getattr(args, "json", False):
            _said_on_stdout(_json_error, str(e), e.hint)
        return 2
    except Interrupted as e:  # SIGINT / SIGTERM: what was kept (capture, train: how to resume)
        if os.environ.get("RANK", "0") == "0":  # under torchrun every rank is told; rank 0 says it once
            print(e, file=sys.stderr)
            if getattr(args, "json", False):
                _said_on_stdout(print_json, {"interrupted": signal.Signals(e.signum).name, "note": str(e),
                                             "exit_code": e.exit_code})
        return e.exit_code
    except BrokenPipeError:  # the reader of stdout left (`eyas inspect | head`): stop quietly, as `cat` does
        _silence_stdout()
        return 128 + signal.SIGPIPE
    except StdoutRefused as e:  # one line, as for a file eyas writes
        _silence_stdout()
        print(f"error: cannot write the output: {e}", file=sys.stderr)
        print("hint: free space where standard output goes, or send it elsewhere", file=sys.stderr)
        return 2
