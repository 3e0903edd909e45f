"""`python -m eyas VERB ...` is `eyas VERB ...`; so `torchrun --nproc_per_node=N -m eyas train ...`
runs one training process per rank.

`run` is the console script too: it answers Ctrl-C or SIGTERM while the CLI is still importing (about
a second: torch) with one line and 130/143, as the CLI does once it runs (`eyas.interrupt`); Python's
default was a KeyboardInterrupt traceback."""

import signal
import sys


def _before_the_cli(signum: int, _frame) -> None:
    note = f"interrupted by {signal.Signals(signum).name}: stopped before the command began; nothing was written"
    print(note, file=sys.stderr)
    if "--json" in sys.argv[1:]:  # one JSON object on stdout on every exit, as the CLI prints it
        import json

        print(json.dumps({"interrupted": signal.Signals(signum).name, "note": note, "exit_code": 128 + signum}))
    sys.exit(128 + signum)


def run() -> int:
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:  # a job started with the signal ignored keeps it ignored
            signal.signal(s, _before_the_cli)
    from eyas.cli import main

    for s, handler in previous.items():  # the CLI installs its own around the verb
        signal.signal(s, handler)
    return main()


if __name__ == "__main__":
    sys.exit(run())
