"""The verbs that decode speculatively with the target: generate (one answer, streamed) and bench
(timed against Hugging Face baselines on prompt sets).

Each verb imports the library code it runs (the decoder, the target, transformers), so `eyas --help`
and the other verbs load only what they need.
"""

from __future__ import annotations

import argparse
import sys

from eyas.cli import preflight
from eyas.cli.inputs import drafter_of, target_of
from eyas.cli.output import log, print_json, print_report


def _stream(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def cmd_generate(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.generate import format_generate, run_generate

    streamed: list[str] = []

    def stream(text: str) -> None:
        streamed.append(text)
        _stream(text)

    try:
        result = run_generate(drafter_of(args), args.prompt, draft_tokens=args.draft_tokens, tree=args.tree,
                              temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                              max_new_tokens=args.max_new_tokens, seed=args.seed,
                              target=target_of(args, weights=True), dtype=args.dtype,
                              layer_convention=args.layer_convention, device=args.device,
                              stream=None if args.json else stream, progress=args.progress)
    except BaseException:  # stopped mid-answer (Ctrl-C, an error): the line the answer was on ends first
        if streamed and not streamed[-1].endswith("\n"):
            _stream("\n")
        raise
    if args.json:
        print_json(result)
    else:
        print()
        log(format_generate(result))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.bench import format_bench, run_bench

    report = run_bench(drafter_of(args), prompts=args.prompts, target=target_of(args, weights=True),
                       dtype=args.dtype, max_new_tokens=args.max_new_tokens, limit=args.limit,
                       draft_tokens=args.draft_tokens, tree=args.tree, sweep=args.sweep, plot=args.plot,
                       layer_convention=args.layer_convention, device=args.device, progress=args.progress)
    print_report(report, args.json, format_bench)
    return 0
