"""Ctrl-C (SIGINT) and SIGTERM during a long run: stop where the output can be resumed, say how.

`eyas capture` and `eyas train` run for hours on real targets and are stopped by people (Ctrl-C)
and by schedulers (SIGTERM, before a kill). Python's default is a KeyboardInterrupt traceback for
the first and death without cleanup for the second: temp files are left behind and nobody is told
that the run can be resumed. Inside `on_signals(note)` both signals raise `Interrupted`, a
KeyboardInterrupt carrying the signal and `note()` (what was kept, how to resume), so every
`finally` runs (atomic writes remove their temp files) and the CLI prints that one line and exits
128 + the signal number (130 for SIGINT, 143 for SIGTERM), as a shell reports a killed process.
The CLI runs every verb inside one `on_signals` (a convert stopped mid-write removes its temp
folder too); capture's and train's own blocks, inside it, say how to resume.

A run whose in-memory state must not be cut mid-update (a training step) calls `Guard.hold(True)`:
a signal is then held (a second one stops at once) and the run checks `Guard.pending` where its
state is whole, saves it, and raises `Guard.stop()`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM; str() says what was kept and how to resume."""

    def __init__(self, signum: int, note: str):
        super().__init__(f"interrupted by {signal.Signals(signum).name}: {note}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Guard:
    """The state of one `on_signals` block: whether a signal is held, and how to stop for it."""

    def __init__(self, note: Callable[[], str]):
        self.note = note
        self.pending: int | None = None  # a signal received while held
        self._deferring = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self._deferring and self.pending is None:
            self.pending = signum  # stop at the end of the stretch
            return
        raise self.stop(signum)

    def stop(self, signum: int | None = None) -> Interrupted:
        """The exception to raise for `signum` (default: the held one)."""
        return Interrupted(signum or self.pending or signal.SIGINT, self.note())

    def hold(self, on: bool) -> None:
        """Between `hold(True)` and `hold(False)` a signal is held (the run checks `pending` where
        its state is whole, and stops there); a second one stops at once."""
        self._deferring = on


@contextmanager
def on_signals(note: Callable[[], str]) -> Iterator[Guard]:
    """SIGINT and SIGTERM raise `Interrupted(note())` inside the block; the previous handlers come
    back after it. A signal the process was started ignoring stays ignored (a job started in the
    background with `&` ignores SIGINT, as eyas.__main__ leaves it). Outside the main thread (where
    Python cannot take signals) it does nothing."""
    guard = Guard(note)
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    taken = [s for s, handler in previous.items() if handler is not signal.SIG_IGN]
    for s in taken:
        signal.signal(s, guard.handle)
    try:
        yield guard
    finally:
        for s in taken:
            signal.signal(s, previous[s])
