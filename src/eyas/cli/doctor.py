"""`eyas doctor`: name the wiring fault behind a low acceptance, and its fix (exit 1 when faulty).

eyas.doctor (the measuring harness) is imported inside the verb, so `eyas --help` does not load it.
"""

from __future__ import annotations

import argparse

from eyas.cli import preflight
from eyas.cli.inputs import drafter_of, target_of
from eyas.cli.output import print_report


def cmd_doctor(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.doctor import diagnose, format_report

    report = diagnose(drafter_of(args), target=target_of(args, weights=True), prompts=args.prompts,
                      features=args.features, data_format=args.data_format, device=args.device,
                      layer_convention=args.layer_convention,
                      limit=args.limit, max_new_tokens=args.max_new_tokens, progress=args.progress)
    print_report(report, args.json, format_report)
    return 1 if report["verdict"] == "faulty" else 0  # inconclusive: nothing found, and the report says why
