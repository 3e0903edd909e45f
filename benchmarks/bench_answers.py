"""Capture's answering: eyas's lean batched loop against Hugging Face `generate`, the same batches.

Capture spends most of its time having the target answer batches of prompts (eyas.data.answers).
This times both engines on the same chat-templated training prompts (ShareGPT first turns, sorted
by length as capture sorts them), batch by batch, alternating which engine goes first, and counts
the answers' tokens up to their end-of-turn token. It also says how many answers the two engines
agree on: in fp32 they are the same computation; in bf16 they round differently (eyas attends in
fp32 on a CPU), so a near-tie can go the other way and the answer differs from there on.

    .venv/bin/python benchmarks/bench_answers.py [--batch-sizes 8,32] [--batches 2] [--max-new-tokens 128]
        [--max-length 512] [--dtype bfloat16] [--device cpu] [--temperature 0]

Prints answer tokens/s per engine and batch size, the ratio to `generate` measured in the same run,
and the report as JSON on the last line. On a GPU (`--device cuda`) it measures what the GPU recipe's
captures would gain.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from eyas.bench import git_commit
from eyas.machine import runs_on
from eyas.data import answer, encode_prompts, read_prompts
from eyas.devices import parse_device, synchronize
from eyas.dtypes import to_dtype
from eyas.target import Target
import flags

ENGINES = ("generate", "eyas")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-sizes", type=flags.counts, default="8,32", help="comma-separated batch sizes")
    p.add_argument("--batches", type=flags.count, default=2, help="batches timed per batch size")
    p.add_argument("--max-new-tokens", type=flags.count, default=128)
    p.add_argument("--max-length", type=flags.count, default=512, help="prompt + answer; longer prompts are left out "
                   "(default: 512, the GPU recipe's)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", type=flags.device, default="cpu")
    p.add_argument("--temperature", type=flags.temperature, default=0.0, help="0: greedy; else sampled (top-p 1)")
    flags.add_threads(p)
    a = p.parse_args()
    flags.use_threads(a.threads)
    device, dtype = parse_device(a.device), to_dtype(a.dtype)
    target = Target.load(None, dtype=dtype, device=device)
    sizes = a.batch_sizes
    prompts = read_prompts(None)[: 2 * max(sizes) * a.batches]  # room for the prompts left out
    ids, _ = encode_prompts(target, prompts, a.max_new_tokens, a.max_length, skip_long=True)
    ids = sorted((i for i in ids if i is not None), key=len)  # as capture sorts them: little padding
    sampling = dict(do_sample=a.temperature > 0, temperature=a.temperature or 1.0, top_p=1.0, top_k=0,
                    max_new_tokens=a.max_new_tokens)
    report = {}
    for size in sizes:
        seconds, tokens, same, rows = dict.fromkeys(ENGINES, 0.0), dict.fromkeys(ENGINES, 0), 0, 0
        answer(target, ids[:size], {**sampling, "max_new_tokens": 4})  # packs the weights, warms the kernels
        for b in range(a.batches):
            batch = ids[b * size : (b + 1) * size]
            got = {}
            for engine in ENGINES[b % 2 :] + ENGINES[: b % 2]:
                torch.manual_seed(b)
                synchronize(device)
                t0 = time.perf_counter()
                got[engine] = answer(target, batch, sampling, lean=engine == "eyas")
                synchronize(device)
                seconds[engine] += time.perf_counter() - t0
                tokens[engine] += sum(map(len, got[engine]))
            same += sum(x == y for x, y in zip(got["eyas"], got["generate"]))
            rows += len(batch)
        rate = {e: tokens[e] / seconds[e] for e in ENGINES}
        report[size] = {"tokens_per_s": rate, "tokens": tokens, "seconds": seconds, "same_answers": same, "rows": rows}
        print(f"batch {size:>4}: generate {rate['generate']:8.1f} tok/s, eyas {rate['eyas']:8.1f} tok/s "
              f"({rate['eyas'] / rate['generate']:.2f}x generate); {same}/{rows} answers identical", file=sys.stderr)
    where = runs_on(device)
    print(f"{where}, {dtype}, {a.max_new_tokens} new tokens at most, "
          f"prompt + answer <= {a.max_length}, "
          f"temperature {a.temperature}", file=sys.stderr)
    flags.emit({"bench": "answers", "device": where, "dtype": str(dtype), "threads": torch.get_num_threads(),
          "temperature": a.temperature, "max_new_tokens": a.max_new_tokens, "max_length": a.max_length,
          "commit": git_commit(), "batch_sizes": report})


if __name__ == "__main__":
    sys.exit(flags.run(main))
