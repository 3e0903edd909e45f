"""`eyas eval` throughput: target tokens evaluated per second, at depth k, on stored shards.

    .venv/bin/python benchmarks/bench_eval.py --data SHARDS [--drafter DIR] [--depth 5] [--limit 32]

Times `evaluate_samples` (the target's greedy tokens from the stored final hidden state, then one
teacher-forced draft unroll of `depth` steps per sample, at the chain starts, pruned where chain and
tree have ended) after a warm-up sample, each timed sample once as `eyas eval` runs it, in bf16 and
fp32, and prints tokens/s and answer positions/s for each plus their ratio measured in the same run.
A token is a stored position of a sample (prompt and answer), as `eyas eval`'s progress bar counts
them; an answer position is one `eyas eval` measures (its report's `tokens`, plus one per sample).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch

from eyas.bench import git_commit
from eyas.machine import cpu_class
from eyas.data import open_shards
from eyas.drafter_loading import load_drafter
from eyas.evaluate import evaluate_samples
from eyas.target import target_tensors
import flags


def bench_eval(data: str, drafter: str | None, depth: int, limit: int, dtype: torch.dtype) -> dict:
    samples = list(itertools.islice(open_shards(data), limit + 1))
    draft = load_drafter(drafter, dtype=dtype)
    lm_head = target_tensors(None, ["lm_head.weight"])["lm_head.weight"].to(dtype)
    evaluate_samples(draft, samples[:1], lm_head, depth=depth)  # warm-up
    tokens = sum(int(s["input_ids"].shape[0]) for s in samples[1:])
    answer = sum(int(s["loss_mask"].sum()) for s in samples[1:])
    start, cpu = time.perf_counter(), time.process_time()
    rep = evaluate_samples(draft, samples[1:], lm_head, depth=depth)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"dtype": str(dtype).removeprefix("torch."), "tokens": tokens, "answer_positions": answer,
            "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3), "tokens_per_s": round(tokens / seconds, 1),
            "answer_positions_per_s": round(answer / seconds, 1), f"tau_{depth}": rep["tau_chain"][str(depth)],
            "tau_tree": rep["tau_tree"]["tau"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a capture folder for the embedded default")
    p.add_argument("--drafter", help="draft folder (default: the shipped draft)")
    p.add_argument("--depth", type=flags.count, default=5)
    p.add_argument("--limit", type=flags.count, default=32, help="samples timed (after one warm-up sample)")
    flags.add_threads(p)
    args = p.parse_args()
    flags.use_threads(args.threads)
    runs = {name: bench_eval(args.data, args.drafter, args.depth, args.limit, dt)
            for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32))}
    for name, r in runs.items():
        print(f"{name}: {r['tokens']} tokens ({r['answer_positions']} answer positions) in {r['seconds']} s "
              f"(CPU {r['cpu_seconds']} s) = {r['tokens_per_s']} tokens/s, {r['answer_positions_per_s']} answer "
              "positions/s", file=sys.stderr)
    ratio = runs["bf16"]["tokens_per_s"] / runs["fp32"]["tokens_per_s"]
    print(f"bf16 / fp32 throughput: {ratio:.2f}x on CPU {cpu_class()}, {torch.get_num_threads()} threads",
          file=sys.stderr)
    flags.emit({"bench": "eval", **runs, "bf16_over_fp32": round(ratio, 3), "depth": args.depth,
                "cpu_class": cpu_class(), "threads": torch.get_num_threads(), "torch": torch.__version__,
                "commit": git_commit()})


if __name__ == "__main__":
    sys.exit(flags.run(main))
