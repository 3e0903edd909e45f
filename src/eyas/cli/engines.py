"""`eyas serve-check`: serve a draft in a real engine and hold what it does against eyas's prediction.

eyas.engines (which starts the engine's own process) is imported inside the verb, so `eyas --help`
does not load it. Exit 0 when served and predicted agree, 1 when they disagree or the engine refuses
the draft, 2 when the engine is not installed (the error names the install command).
"""

from __future__ import annotations

import argparse

from eyas.cli import preflight
from eyas.cli.inputs import drafter_of, target_of
from eyas.cli.output import print_report


def cmd_serve_check(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.engines import format_serve_check, serve_check

    report = serve_check(drafter_of(args), engine=args.engine, target=target_of(args, weights=True),
                         prompts=args.prompts, limit=args.limit, draft_tokens=args.draft_tokens,
                         max_new_tokens=args.max_new_tokens, dump=args.dump, device=args.device,
                         temperature=args.temperature, progress=args.progress)
    print_report(report, args.json, format_serve_check)
    return 0 if report["agree"] else 1
