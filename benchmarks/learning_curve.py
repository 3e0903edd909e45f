"""Held-out tau against training time (processor-hours) from one or more train_log.jsonl files, as a PNG.

Each log is one curve (`eyas.train.curve`); `--chain` places each log after the one before it on the
time axis (a warm-started run continuing the previous draft). Prints the points as one JSON line.

    .venv/bin/python benchmarks/learning_curve.py src/eyas/drafts/smollm2-135m-instruct/train_log.jsonl \\
        --out src/eyas/drafts/smollm2-135m-instruct/heldout_tau.png
    .venv/bin/python benchmarks/learning_curve.py runs/a/train_log.jsonl runs/b/train_log.jsonl --label a,b --out ab.png
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from eyas.train import heldout_curve, plot_heldout
import flags


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", type=Path, metavar="LOG", help="train_log.jsonl files")
    p.add_argument("--out", type=Path, required=True, metavar="PNG")
    p.add_argument("--label", help="comma-separated curve labels (default: each log's folder name)")
    p.add_argument("--cpus", type=flags.count, help="CPU cores (processes x threads) of the logs whose records do "
                   "not say what they ran on (older logs, such as the previous CPU-trained draft's: 2; the shipped "
                   "draft's records say they ran on a GPU)")
    p.add_argument("--chain", action="store_true", help="each log continues the one before it on the time axis")
    p.add_argument("--title", default="held-out greedy chain")
    args = p.parse_args(argv)
    labels = args.label.split(",") if args.label else [None] * len(args.logs)
    if len(labels) != len(args.logs):
        p.error(f"{len(labels)} labels for {len(args.logs)} logs")
    curves, offset = [], 0.0
    for log, label in zip(args.logs, labels):
        curves.append(heldout_curve(log, label, cpus=args.cpus, offset=offset))
        offset = curves[-1].total_hours if args.chain else 0.0
    plot_heldout(curves, args.out, title=args.title)
    for c in curves:
        print(f"{c.label}: tau {c.tau[0]:.3f} -> {c.tau[-1]:.3f} over {c.total_hours:.2f} {c.unit}-hours",
              file=sys.stderr)
    flags.emit({"png": str(args.out), "curves": [dataclasses.asdict(c) for c in curves]})  # NaN: null
    return 0


if __name__ == "__main__":
    sys.exit(flags.run(main))
