"""One draft training step at the embedded default's size: bf16 autocast vs fp32, and the two TTT
attentions (EAGLE's diagonal, the default, vs the steps^2 x T^2 mask), all in the same run.

The draft mirrors SmolLM2-135M-Instruct (H=576, 9 heads / 3 kv, I=1536, V=49152, 3 capture layers)
with a reduced draft vocab (default 8192). A step is exactly what `eyas.train` does per optimizer
step: target probabilities from the stored final hidden state (the full-vocab matmul included),
the TTT unroll, soft cross-entropy, backward, grad clipping, AdamW. The batch is one packed
row of `tokens` positions made of 4 documents. Weights, features and ids are seeded random: the cost
does not depend on their values, so no target weights are read (only its config.json).

Variants (dtype x attention) are timed interleaved (fp32/masked, fp32/diagonal, bf16/masked, ...) so
machine noise hits all alike; the median step is reported with the bf16/fp32 and masked/diagonal
ratios.

    .venv/bin/python benchmarks/bench_train.py                        # 1024 tokens, 7 TTT steps
    .venv/bin/python benchmarks/bench_train.py --tokens 512 --repeats 2 --dtypes bf16
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time

import torch

from eyas.bench import git_commit
from eyas.machine import cpu_class
from eyas.contract import contract_for_target
from eyas.drafter import Drafter
from eyas.shift import label_ids
from eyas.target import target_config, target_name
from eyas.train import ADAM_BETAS, TTTUnroll, build_vocab_map, forward_backward
import flags

DTYPES = {"fp32": None, "bf16": torch.bfloat16}
ATTENTIONS = {"masked": True, "diagonal": False}  # forward_ttt(masked=...)


def _batch(contract, tokens: int, docs: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One packed row [1, tokens] of `docs` equal documents, every position a loss position."""
    ids = torch.randint(0, contract.vocab_size, (1, tokens), generator=g)
    doc = torch.arange(tokens) * docs // tokens
    starts = torch.searchsorted(doc, doc)  # first position of each position's document
    return {
        "features": torch.randn(1, tokens, contract.fc_in_features, generator=g),
        "target_hidden": torch.randn(1, tokens, contract.hidden_size, generator=g),
        "input_ids": ids,
        "next_ids": label_ids(ids),
        "position_ids": (torch.arange(tokens) - starts)[None],
        "loss_mask": torch.ones(1, tokens, dtype=torch.bool),
        "document_ids": doc[None],
    }


def bench_train(target: str | None = None, *, draft_vocab: int = 8192, tokens: int = 1024, ttt_steps: int = 7,
                repeats: int = 3, warmup: int = 1, dtypes: tuple[str, ...] = tuple(DTYPES),
                attentions: tuple[str, ...] = tuple(ATTENTIONS)) -> dict:
    """Median step time and tokens/s per variant `{dtype}_{attention}`, and the speedups between them."""
    g = torch.Generator().manual_seed(0)
    contract = contract_for_target(target_config(target), draft_vocab_size=draft_vocab, name=target_name(target))
    V, H = contract.vocab_size, contract.hidden_size
    lm_head = 0.02 * torch.randn(V, H, generator=g)  # [V, H], the target's output matrix (random)
    used, d2t, t2d = build_vocab_map(torch.randint(0, 1000, (V,), generator=g), draft_vocab)
    drafter = Drafter(contract, embed_tokens=0.02 * torch.randn(V, H, generator=g)).init_weights(0)
    drafter.set_vocab_map(d2t, t2d)
    models = {a: TTTUnroll(drafter, ttt_steps, 0.8, masked=ATTENTIONS[a]) for a in attentions}
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-5, betas=ADAM_BETAS)
    batch = _batch(contract, tokens, 4, g)
    heads = {d: lm_head.to(DTYPES[d] or torch.float32) for d in dtypes}  # as eyas.train: cast once
    variants = [(d, a) for d in dtypes for a in attentions]

    def step(dtype: str, attention: str) -> float:
        t0 = time.perf_counter()
        forward_backward(models[attention], batch, heads[dtype], used, denom=float(tokens), autocast=DTYPES[dtype])
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    for variant in variants:
        for _ in range(warmup):
            step(*variant)
    times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
    for _ in range(repeats):
        for variant in variants:  # interleaved
            times[variant].append(step(*variant))
    med = {f"{d}_{a}": statistics.median(s) for (d, a), s in times.items()}
    speedups = {}
    if "fp32" in dtypes and "bf16" in dtypes:
        speedups.update({f"bf16_speedup_{a}": round(med[f"fp32_{a}"] / med[f"bf16_{a}"], 3) for a in attentions})
    if set(ATTENTIONS) <= set(attentions):
        speedups.update({f"diagonal_speedup_{d}": round(med[f"{d}_masked"] / med[f"{d}_diagonal"], 3) for d in dtypes})
    return {
        "bench": "train",
        "target": contract.verifier.name_or_path,
        "draft": {"hidden_size": H, "intermediate_size": contract.intermediate_size, "draft_vocab_size": draft_vocab,
                  "vocab_size": V, "capture_layers": list(contract.capture_layers),
                  "parameters": sum(p.numel() for p in drafter.parameters())},
        "tokens": tokens,
        "ttt_steps": ttt_steps,
        "repeats": repeats,
        **{f"{v}_step_time_ms": round(1000 * s, 1) for v, s in med.items()},
        **{f"{v}_tokens_per_s": round(tokens / s, 1) for v, s in med.items()},
        **speedups,
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_class": cpu_class(),
        "commit": git_commit(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="target folder whose config sizes the draft (default: SmolLM2)")
    p.add_argument("--draft-vocab", type=flags.count, default=8192)
    p.add_argument("--tokens", type=flags.count, default=1024)
    p.add_argument("--ttt-steps", type=flags.count, default=7)
    p.add_argument("--repeats", type=flags.count, default=3)
    flags.add_threads(p)
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated subset of fp32,bf16")
    p.add_argument("--attentions", default=",".join(ATTENTIONS), help="comma-separated subset of masked,diagonal")
    args = p.parse_args(argv)
    flags.use_threads(args.threads)
    dtypes, attentions = tuple(args.dtypes.split(",")), tuple(args.attentions.split(","))
    if not (set(dtypes) <= set(DTYPES) and set(attentions) <= set(ATTENTIONS)):
        p.error(f"--dtypes takes {','.join(DTYPES)}, --attentions {','.join(ATTENTIONS)}")
    r = bench_train(args.target, draft_vocab=args.draft_vocab, tokens=args.tokens, ttt_steps=args.ttt_steps,
                    repeats=args.repeats, dtypes=dtypes, attentions=attentions)
    print(f"CPU {r['cpu_class']}, {r['threads']} threads", file=sys.stderr)
    for d in dtypes:
        for a in attentions:
            v = f"{d}_{a}"
            print(f"{v}: {r[f'{v}_step_time_ms']:.0f} ms/step, {r[f'{v}_tokens_per_s']:.1f} tokens/s", file=sys.stderr)
    for k in (k for k in r if "_speedup_" in k):
        print(f"{k}: {r[k]:.2f}x ({r['threads']} threads)", file=sys.stderr)
    flags.emit(r)
    return 0


if __name__ == "__main__":
    sys.exit(flags.run(main))
