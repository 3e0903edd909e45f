"""Feature capture vs a plain target forward over the same tokens (issue bar: capture <= 1.10x).

Variants, all one prefill of the same prompt, timed back to back (in a rotating order) in one run so
machine noise hits them alike. A ratio is the median over (prompt, repeat) of the variant's time
over the plain forward's time in the same round; the seconds are the fastest of `repeats` runs per
prompt (interference only ever adds time), summed over prompts:
  plain       target.model(ids): the HF forward a user would run anyway (logits for every position)
  capture     Target.forward(ids, default_capture_layers(N)): features + last hidden + logits
  capture_nl  the same with with_logits=False (what offline feature capture needs)
  hidden      target.model(ids, output_hidden_states=True): the alternative eyas does not use

Prompts are seeded random token ids: the cost of a forward does not depend on which tokens.
On a shared machine pass `--threads 1`: with 2 threads, OpenMP workers spin against other
processes and single forwards vary by 3x.

    .venv/bin/python benchmarks/bench_capture.py --threads 1   # embedded default, fp32 and bf16
    .venv/bin/python benchmarks/bench_capture.py --dtypes bfloat16 --prompts 2 --repeats 2
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time

import torch

from eyas.bench import git_commit
from eyas.machine import cpu_class
from eyas.contract import default_capture_layers
from eyas.target import Target
import flags



def _ratio(times: list[list[float]], plain: list[list[float]]) -> float:
    """Median over rounds of time / plain time in the same round: cancels slow drifts in load."""
    rounds = zip(sum(times, []), sum(plain, []))
    return round(statistics.median(a / b for a, b in rounds), 3)


def bench_capture(target: str | None = None, *, dtypes=("float32", "bfloat16"), prompts: int = 3,
                  tokens: int = 512, repeats: int = 5) -> dict:
    """Per dtype: prefill seconds per variant (best of `repeats` per prompt, summed over prompts)
    and each variant's time relative to `plain` (median of same-round ratios)."""
    results, name = {}, None
    for dtype_name in dtypes:
        t = Target.load(target, dtype=getattr(torch, dtype_name))
        name = t.name
        layers = default_capture_layers(t.num_layers)
        g = torch.Generator().manual_seed(0)
        batch = [torch.randint(0, t.vocab_size, (1, tokens), generator=g) for _ in range(prompts)]
        variants = {
            "plain": lambda ids: t.model(ids),
            "capture": lambda ids: t.forward(ids, layers),
            "capture_nl": lambda ids: t.forward(ids, layers, with_logits=False),
            "hidden": lambda ids: t.model(ids, output_hidden_states=True),
        }
        times = {v: [[] for _ in batch] for v in variants}  # variant -> prompt -> seconds per repeat
        with torch.no_grad():
            for fn in variants.values():  # warm up every path once
                fn(batch[0])
            for r in range(repeats):
                order = list(variants)[r % len(variants):] + list(variants)[: r % len(variants)]
                for i, ids in enumerate(batch):
                    for v in order:  # one round: every variant on this prompt, back to back
                        t0 = time.perf_counter()
                        variants[v](ids)
                        times[v][i].append(time.perf_counter() - t0)
        best = {v: sum(min(runs) for runs in per_prompt) for v, per_prompt in times.items()}
        results[dtype_name] = {
            "capture_layers": list(layers),
            **{f"{v}_s": round(s, 4) for v, s in best.items()},
            **{f"{v}_ratio": _ratio(times[v], times["plain"]) for v in variants if v != "plain"},
            "plain_tokens_per_s": round(len(batch) * tokens / best["plain"], 1),
        }
    return {
        "bench": "capture",
        "target": name,
        "prompts": prompts,
        "tokens": tokens,
        "repeats": repeats,
        "results": results,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "cpu_class": cpu_class(),
        "commit": git_commit(),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", default=None, help="target folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--prompts", type=flags.count, default=3)
    p.add_argument("--tokens", type=flags.count, default=512)
    p.add_argument("--repeats", type=flags.count, default=5)
    flags.add_threads(p)
    a = p.parse_args(argv)
    flags.use_threads(a.threads)
    out = bench_capture(a.target, dtypes=tuple(a.dtypes.split(",")), prompts=a.prompts, tokens=a.tokens,
                        repeats=a.repeats)
    print(f"CPU {out['cpu_class']}, {out['threads']} threads", file=sys.stderr)
    for dtype, r in out["results"].items():
        print(f"{dtype}: plain {r['plain_s']:.3f} s for {out['prompts']} prompts ({r['plain_tokens_per_s']} tok/s), "
              "capture "
              f"{r['capture_ratio']:.3f}x, capture without logits {r['capture_nl_ratio']:.3f}x, "
              f"output_hidden_states {r['hidden_ratio']:.3f}x", file=sys.stderr)
    flags.emit(out)


if __name__ == "__main__":
    sys.exit(flags.run(main))
