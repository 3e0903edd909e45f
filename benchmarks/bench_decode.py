"""Decoding speed on the embedded default target: HF greedy, HF prompt lookup, eyas target-only, eyas
chain and eyas tree, on the same prompts in one run (see eyas.bench.run_bench for what is measured).

The table goes to stderr, one JSON line (the whole report: methods, categories, per-prompt numbers,
shapes, environment) to stdout. On a shared machine pass `--threads 1`: OpenMP workers spinning
against other processes make single decode steps vary by several x. Without a drafter, the draft
eyas ships for the target; without `--dtype`, the dtype measured fastest on this machine (`auto`).

    .venv/bin/python benchmarks/bench_decode.py --threads 1                        # MT-bench, shipped draft
    .venv/bin/python benchmarks/bench_decode.py ./draft --prompts copy --dtype fp32 --plot speedup.png
    .venv/bin/python benchmarks/bench_decode.py --prompts mtbench,copy --limit 16 --sweep
"""

from __future__ import annotations

import argparse
import sys

from eyas.bench import format_bench, run_bench
from eyas.drafter_loading import resolve_drafter
from eyas.dtype_choice import DECODE_DTYPES
from eyas.dtypes import AUTO, choices
from eyas.generate import NGRAM_TOKENS
import flags


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafter", nargs="?", help="a draft folder for the target (default: the draft eyas ships for it)")
    p.add_argument("--target", help="a local target folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--prompts", default="mtbench", help="mtbench, humaneval, copy, a .jsonl file, or a comma list")
    p.add_argument("--limit", type=flags.count, help="N prompts, spread evenly over the categories")
    p.add_argument("--max-new-tokens", type=flags.count, default=128)
    p.add_argument("--dtype", choices=(AUTO, *choices(DECODE_DTYPES)), default=AUTO,
                   help="auto (the faster on this machine, measured once), or bf16 / fp32 in eyas's or "
                   "transformers' spelling (bfloat16, float32)")
    p.add_argument("--ngram-tokens", type=flags.natural, default=NGRAM_TOKENS,
                   help=f"the n-gram branch of every round's tree, in tokens; 0: off (default {NGRAM_TOKENS})")
    p.add_argument("--draft-tokens", type=flags.count, help="chain length (default: the cached best, else 4)")
    p.add_argument("--tree", metavar="DEPTH,TOP_K,BUDGET", help="tree shape (default: the cached best)")
    p.add_argument("--sweep", action="store_true", help="time chain lengths and tree shapes first; cache the fastest")
    p.add_argument("--plot", metavar="PNG", help="speedup per method and category")
    flags.add_threads(p)
    args = p.parse_args(argv)
    flags.use_threads(args.threads)
    report = run_bench(resolve_drafter(args.drafter, args.target), target=args.target, prompts=args.prompts,
                       limit=args.limit, max_new_tokens=args.max_new_tokens, dtype=args.dtype,
                       draft_tokens=args.draft_tokens, tree=args.tree, ngram_tokens=args.ngram_tokens,
                       sweep=args.sweep, plot=args.plot)
    print(format_bench(report), file=sys.stderr)
    flags.emit(report)
    return 0


if __name__ == "__main__":
    sys.exit(flags.run(main))
