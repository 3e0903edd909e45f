"""How every verb prints: one JSON object on stdout under `--json`, everything else for people;
progress and logs on stderr, so stdout stays parseable."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


def print_json(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, indent=2))



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
