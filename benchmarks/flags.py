"""What the benchmark scripts share around their measurements: flags that argparse checks before any
model loads (a `--repeats 0` or `--threads -1` used to fail minutes in, with a traceback), the one JSON
line each prints on stdout (a NaN or infinity as null, as everything eyas writes), and the `error:` line
that input eyas refuses gets (exit 2), as the eyas CLI prints it."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import torch

from eyas.devices import parse_device
from eyas.errors import EyasError
from eyas.jsonsafe import dumps


def count(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    return _at_least(text, 1)


def natural(text: str) -> int:
    """An argparse type: a whole number >= 0."""
    return _at_least(text, 0)


def counts(text: str) -> list[int]:
    """An argparse type: a comma-separated list of whole numbers >= 1 (`1,2,4`)."""
    return [count(part) for part in text.split(",")]


def temperature(text: str) -> float:
    """An argparse type: a finite number >= 0 (0: greedy)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number >= 0 (0: greedy)")
    return value


def device(text: str) -> str:
    """An argparse type: a device this machine has (`cpu`, `cuda`, `cuda:1`), refused before any load."""
    try:
        return str(parse_device(text))
    except EyasError as e:
        raise argparse.ArgumentTypeError(f"{e}" + (f" ({e.hint})" if e.hint else "")) from None


def add_threads(p: argparse.ArgumentParser) -> None:
    """`--threads N`: torch's intra-op threads for the run (default: torch's choice)."""
    p.add_argument("--threads", type=count, help="torch intra-op threads (default: torch's choice)")


def use_threads(threads: int | None) -> None:
    """Set torch's intra-op threads when `--threads` was given."""
    if threads:
        torch.set_num_threads(threads)


def emit(report: dict[str, Any]) -> None:
    """The benchmark's one JSON line on stdout: any JSON reader takes it (no bare NaN or Infinity)."""
    print(dumps(report), flush=True)


def run(main: Callable[[], int | None]) -> int:
    """`main()`'s exit code; input eyas refuses is its `error:` and `hint:` lines and exit 2, no traceback,
    and so is a file the script cannot open (a log or a prompt file that is not there)."""
    try:
        return main() or 0
    except EyasError as e:
        print(f"error: {e}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2


def _at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value}: must be >= {minimum}")
    return value
