"""The n-gram branch's length: fixed lengths against the length that follows its own acceptance.

Every round's verify carries the n-gram branch's tokens (eyas.decode.ngram). eyas sizes the branch by
its recent acceptance (`BranchLength`, up to a cap); this benchmark also times fixed lengths (the
policy eyas had before, kept here only to compare) and no branch, all with the shipped draft at
chain k=1 (the fastest chain on both CPU kinds here), greedy, in the dtype `auto` picks. Every prompt
runs every variant, in an order rotated per prompt, so drifting load spreads over all of them.

    .venv/bin/python benchmarks/bench_ngram.py [--prompts copy,mtbench] [--limit 16] [--max-new-tokens 128]

Prints tokens/s per variant and prompt set, and each variant's ratio to no branch measured in the
same run; the last line is the report as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import eyas.decode.loop as loop
from eyas.bench import git_commit
from eyas.machine import cpu_class
from eyas.bench.prompts import bench_prompts
from eyas.data import eos_ids
from eyas.decode.ngram import BranchLength
from eyas.drafter_loading import resolve_drafter
from eyas.dtype_choice import resolve_dtype
from eyas.generate import chat_ids, load_models
import flags


class FixedLength(BranchLength):
    """The branch at its cap every round, whatever was accepted."""

    def update(self, proposed: list[int], accepted: list[int]) -> None:
        pass


VARIANTS = {"none": (BranchLength, 0), "fixed 2": (FixedLength, 2), "fixed 4": (FixedLength, 4),
            "fixed 8": (FixedLength, 8), "adaptive 4": (BranchLength, 4), "adaptive 8": (BranchLength, 8)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="copy,mtbench", help="prompt sets, timed separately")
    p.add_argument("--limit", type=flags.count, default=16, help="prompts per set, spread over its categories")
    p.add_argument("--max-new-tokens", type=flags.count, default=128)
    flags.add_threads(p)
    a = p.parse_args()
    flags.use_threads(a.threads)
    dtype = resolve_dtype("auto", None)[0]
    target, draft = load_models(resolve_drafter(None), None, dtype)
    stops = eos_ids(target)
    names = list(VARIANTS)
    sets = a.prompts.split(",")
    totals = {v: {s: [0.0, 0] for s in sets} for v in names}  # seconds, new tokens
    for name in sets:
        for i, bp in enumerate(bench_prompts(name, limit=a.limit)):
            ids = chat_ids(target, bp.prompt, max_new_tokens=a.max_new_tokens)
            for v in names[i % len(names):] + names[: i % len(names)]:
                loop.BranchLength, cap = VARIANTS[v]
                t0 = time.perf_counter()
                _, stats = loop.generate(target, draft, ids, max_new_tokens=a.max_new_tokens, stop_ids=stops,
                                         draft_tokens=1, ngram_tokens=cap)
                totals[v][name][0] += time.perf_counter() - t0
                totals[v][name][1] += stats["new_tokens"]
    loop.BranchLength = BranchLength
    rate = {v: {s: n / t for s, (t, n) in totals[v].items()} for v in names}
    print(f"CPU {cpu_class()}, {torch.get_num_threads()} threads, {dtype}, chain k=1, "
          f"{a.limit} prompts per set x {a.max_new_tokens} tokens", file=sys.stderr)
    for v in names:
        print(f"{v:>11}: " + "; ".join(f"{s} {rate[v][s]:.1f} tok/s ({rate[v][s] / rate['none'][s]:.2f}x no branch)"
                                       for s in sets), file=sys.stderr)
    flags.emit({"bench": "ngram", "cpu_class": cpu_class(), "dtype": str(dtype), "threads": torch.get_num_threads(),
                "commit": git_commit(), "tokens_per_s": rate,
                "new_tokens": {v: {s: totals[v][s][1] for s in sets} for v in names}})


if __name__ == "__main__":
    sys.exit(flags.run(main))
