"""From parsed flags to the library's arguments, the same way for every verb: the target, the draft,
capture layers, dtype."""

from __future__ import annotations

import argparse
from pathlib import Path

from eyas.errors import EyasError


def target_of(args: argparse.Namespace, *, weights: bool) -> Path | None:
    """`--target` checked before any work (eyas.target.resolve_target: a folder, or a config file).

    Verbs that run the target (`weights`) keep the embedded default as None, so what they record
    names it by its hub id, not by its cache folder. Verbs that only compare configs get None when
    `--target` is not given: they then read the draft alone. `--device`, where the verb has it, is
    checked here too: it says where the target runs.
    """
    from eyas.devices import parse_device
    from eyas.embedded import is_default
    from eyas.target import resolve_target

    if getattr(args, "device", None) is not None:
        parse_device(args.device)  # a device this machine lacks is refused before anything loads
    if weights and is_default(args.target) or args.target is None:
        return None
    return resolve_target(args.target, weights=weights, needed_by=f"eyas {args.command}")


def drafter_of(args: argparse.Namespace) -> Path:
    """The DRAFTER positional, or the draft eyas ships for `--target` when it is left out."""
    from eyas.drafter_loading import resolve_drafter

    return resolve_drafter(args.drafter, args.target)


def capture_layers_of(text: str | None) -> tuple[int, ...] | None:
    """`--capture-layers 2,15,27` -> (2, 15, 27); None when the flag is not given."""
    if text is None:
        return None
    try:
        return tuple(int(k) for k in text.split(","))
    except ValueError:
        raise EyasError(f"--capture-layers {text!r} is not a comma-separated list of integers",
                        "write e.g. --capture-layers 2,15,27") from None
