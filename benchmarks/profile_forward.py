"""Where a decode step's time goes on this machine: target forwards and draft steps, by dtype and size.

Prints (stderr) and returns as one JSON line (stdout):

- the memory bandwidth (numpy: a 256 MiB copy and a read), the ceiling of a forward over one token,
  which must read every weight once;
- ms per target forward over 1, 2, 4, ... new tokens on a cache of `--context` positions, in bf16
  and fp32, through transformers' forward (`hf`, what eyas decoded with before) and eyas's lean
  forward (`lean`, eyas.decode.lean_forward: what decoding uses now), and the weight bytes read per
  ms of the one-token forward (GB/s) beside the bandwidth;
- ms per draft step (the shipped draft, or `--drafter`) over 1 position (a chain step) and a tree
  level's positions: `plain` (plain linears, the training-time DraftCache: decoding before) and
  `lean` (packed linears, the static fp32-attention cache: decoding now);
- with `--decode N`: generate's tokens/s on N MT-bench prompts, target alone and chain k=4, before
  (transformers' forward, plain draft) and after, prompt by prompt back to back;
- the top operators of a lean one-token forward, a lean tree forward and a draft step
  (torch.profiler, self CPU time per call).

Sizes are interleaved and each keeps its fastest of `--repeats` (eyas.decode.cost), so a load spike
on a shared machine rarely survives; with one torch thread the clock is this thread's CPU time
(eyas.decode.cost.clock), which other processes barely move. Compare numbers from the same run only.

    .venv/bin/python benchmarks/profile_forward.py --threads 1 --decode 4
    .venv/bin/python benchmarks/profile_forward.py --threads 1 --sizes 1,5,17 --dtypes bf16 --no-profile
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from unittest import mock

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from eyas.bench import bench_prompts, git_commit
from eyas.data import eos_ids
from eyas.decode import (
    chain_tree,
    generate,
    decoder,
    draft_cache,
    draft_step0,
    draft_step_ms,
    packed_linears,
    prefill,
    target_forward_ms,
    verify,
)
from eyas.decode.cost import clock
from eyas.drafter import DraftCache
from eyas.drafter_loading import load_drafter
from eyas.dtypes import short_name, to_dtype
from eyas.generate import chat_ids
from eyas.machine import cpu_class, cpu_flags, cpu_model
from eyas.target import Target
import flags


def bandwidth_gbs() -> dict:
    """GB/s of a numpy copy (read + write counted) and of a read (sum), fastest of 5 (on `clock`)."""
    a = np.ones(32 * 1024 * 1024)  # 256 MiB of float64
    b = np.empty_like(a)

    def fastest(f) -> float:
        best = float("inf")
        for _ in range(5):
            t0 = clock()
            f()
            best = min(best, clock() - t0)
        return best

    return {"copy": 2 * a.nbytes / fastest(lambda: np.copyto(b, a)) / 1e9,
            "read": a.nbytes / fastest(lambda: a.sum()) / 1e9}


def weight_bytes(target: Target) -> int:
    """Bytes a forward over one token reads: every weight but the embedding (one row is read),
    with a tied lm_head counted once."""
    embed = target.model.get_input_embeddings().weight
    lm_head = target.model.get_output_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in target.model.parameters())
    return total - (0 if lm_head is embed else embed.numel() * embed.element_size())


def top_ops(run, calls: int, k: int = 6) -> list[dict]:
    """The k operators with the most self CPU time over `calls` runs of `run`, in ms per run."""
    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            run()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return [{"op": e.key, "ms": e.self_cpu_time_total / 1000 / calls, "share": e.self_cpu_time_total / total,
             "calls": e.count // calls} for e in events[:k]]


def profiles(target: Target, drafter, context: int, tree_nodes: int, top_k: int) -> dict:
    """The top operators of a lean forward over 1 and over `tree_nodes` new tokens, and of one draft
    step over `top_k` positions (a tree level), each after `context` cached positions."""
    model = decoder(target)
    capture = drafter.contract.capture_layers
    ids = torch.randint(0, target.vocab_size, (1, context + tree_nodes), generator=torch.Generator().manual_seed(0))
    cache = prefill(model, ids[:, :context], capture, context + tree_nodes).past_key_values

    def forward(size: int):
        def run():
            verify(model, chain_tree(ids[0, context : context + size]), cache, context, capture)
            cache.crop(context)
        return run

    with packed_linears(drafter):
        dcache = draft_cache(drafter, context + top_k)
        features = torch.randn(1, context, drafter.contract.fc_in_features).to(drafter.norm.weight.dtype)
        _, hidden = draft_step0(drafter, dcache, features, ids[:, :context], context)
        positions = torch.full((1, top_k), context)

        def draft_step():
            drafter(hidden.expand(1, top_k, -1), ids[:, context : context + top_k], positions, cache=dcache)
            dcache.crop(context)

        draft = top_ops(draft_step, 5)
    return {"lean_1": top_ops(forward(1), 5), f"lean_{tree_nodes}": top_ops(forward(tree_nodes), 5),
            "draft_step": draft}


@contextmanager
def decoding_before() -> Iterator[None]:
    """Decoding as it ran before the lean forward: transformers' forward and DynamicCache for the
    target, plain linears over the training-time DraftCache for the drafter."""
    with (mock.patch.object(sys.modules["eyas.decode.verify"], "lean_target", lambda target: None),
          mock.patch.object(sys.modules["eyas.decode.loop"], "packed_linears", lambda drafter: nullcontext()),
          mock.patch.object(sys.modules["eyas.decode.propose"], "draft_cache",
                            lambda drafter, max_len: DraftCache(drafter, 1, max_len))):
        yield


def decode_before_after(target: Target, drafter, prompts: int, max_new_tokens: int) -> dict:
    """Tokens per second (CPU time with one thread, else wall) of generate, before and after, target
    alone and chain k=4 (no n-grams), prompt by prompt back to back."""
    ids = [chat_ids(target, it.prompt, max_new_tokens=max_new_tokens) for it in bench_prompts("mtbench", limit=prompts)]
    stops = eos_ids(target)
    runs = {(when, how): [0, 0.0] for when in ("before", "after") for how in ("target", "chain4")}
    for i, prompt in enumerate([ids[0]] + ids):  # the first pass warms up
        for (when, how), total in runs.items():
            with decoding_before() if when == "before" else nullcontext():
                t0 = clock()
                out, _ = generate(target, drafter if how == "chain4" else None, prompt, max_new_tokens=max_new_tokens,
                                  stop_ids=stops, **({"draft_tokens": 4} if how == "chain4" else {}))
                seconds = clock() - t0
            if i:
                total[0] += out.shape[1] - len(prompt)
                total[1] += seconds
    return {f"{how} {when}": n / s for (when, how), (n, s) in runs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="a local target folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", help="a draft folder (default: the draft eyas ships for the target)")
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--sizes", type=flags.counts, default="1,2,4,8,16,32", help="new tokens per target forward")
    p.add_argument("--context", type=flags.natural, default=256, help="cached positions before the new tokens")
    p.add_argument("--repeats", type=flags.count, default=5)
    p.add_argument("--no-profile", action="store_true", help="skip the torch.profiler tables")
    p.add_argument("--decode", type=flags.natural, default=0, metavar="N",
                   help="also time generate before / after on N MT-bench prompts (target alone, chain k=4)")
    p.add_argument("--decode-tokens", type=flags.count, default=64, metavar="M",
                   help="new tokens per prompt for --decode")
    flags.add_threads(p)
    args = p.parse_args(argv)
    flags.use_threads(args.threads)
    sizes = args.sizes
    report = {"bandwidth_gbs": bandwidth_gbs(), "cpu": cpu_model(), "cpu_class": cpu_class(), "cpu_flags": cpu_flags(),
              "commit": git_commit(), "threads": torch.get_num_threads(), "torch": torch.__version__,
              "context": args.context, "dtypes": {}}
    for name in args.dtypes.split(","):
        dtype = to_dtype(name)
        target = Target.load(args.target, dtype=dtype)
        drafter = load_drafter(args.drafter, target=args.target, dtype=dtype)
        hf = {s: float("inf") for s in sizes}
        lean = dict(hf)
        for _ in range(args.repeats):  # the two forwards alternate, each keeps its fastest
            for s, ms in target_forward_ms(target, sizes, context=args.context, repeats=1, lean=False).items():
                hf[s] = min(hf[s], ms)
            for s, ms in target_forward_ms(target, sizes, context=args.context, repeats=1).items():
                lean[s] = min(lean[s], ms)
        levels = (1, 4, 8)
        draft = {"plain": draft_step_ms(drafter, levels, context=args.context, repeats=args.repeats, lean=False),
                 "lean": draft_step_ms(drafter, levels, context=args.context, repeats=args.repeats)}
        entry = {"target_ms": {"hf": hf, "lean": lean}, "draft_step_ms": draft,
                 "weights_gb_per_s_1token": {k: weight_bytes(target) / v[1] / 1e6 for k, v in
                                             (("hf", hf), ("lean", lean)) if 1 in v}}
        if not args.no_profile:
            entry["top_ops"] = profiles(target, drafter, args.context, 17, 4)
        if args.decode:
            entry["decode_tokens_per_s"] = decode_before_after(target, drafter, args.decode, args.decode_tokens)
        report["dtypes"][short_name(dtype)] = entry
    print(format_report(report, sizes), file=sys.stderr)
    flags.emit(report)
    return 0


def format_report(report: dict, sizes: list[int]) -> str:
    bw = report["bandwidth_gbs"]
    lines = [f"{report['cpu']}, {report['threads']} threads, torch {report['torch']}; "
             f"flags {' '.join(report['cpu_flags'])}",
             f"memory bandwidth: copy {bw['copy']:.1f} GB/s, read {bw['read']:.1f} GB/s",
             f"target forward, ms by new tokens on a {report['context']}-token cache:",
             f"{'dtype':<6}{'forward':<8}" + "".join(f"{s:>8}" for s in sizes) + "   GB/s at 1"]
    for dtype, e in report["dtypes"].items():
        for kind in ("hf", "lean"):
            row = "".join(f"{e['target_ms'][kind][s]:>8.1f}" for s in sizes)
            gbs = e["weights_gb_per_s_1token"].get(kind)
            lines.append(f"{dtype:<6}{kind:<8}{row}   {'-' if gbs is None else f'{gbs:.1f}'}")
    lines.append("draft step, ms by new positions (1: a chain step, 4 / 8: a tree level):")
    for dtype, e in report["dtypes"].items():
        for kind, row in e["draft_step_ms"].items():
            lines.append(f"{dtype:<6}{kind:<8}" + "".join(f"{s:>6}: {ms:.1f}" for s, ms in row.items()))
    for dtype, e in report["dtypes"].items():
        if "decode_tokens_per_s" in e:
            lines.append(f"generate, {dtype}, tokens/s: " + ", ".join(f"{k} {v:.1f}" for k, v in
                                                               e["decode_tokens_per_s"].items()))
    for dtype, e in report["dtypes"].items():
        for what, ops in e.get("top_ops", {}).items():
            cells = ", ".join(f"{o['op']} {o['ms']:.1f} ms ({o['share']:.0%}, {o['calls']}x)" for o in ops)
            lines.append(f"top ops {dtype} {what}: {cells}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(flags.run(main))
