"""What a verify's products cost by kernel: the target's linear layers alone, over M new tokens.

Speculation pays when a round's verify over M tokens costs less than tau one-token steps, so the
ratio T(M) / T(1) caps it: speedup <= tau x T(1) / T(M). On a CPU with bf16 dot products a bf16
product over M <= 17 rows costs little more than over one; on an AVX2-only CPU oneDNN cannot pack
bf16, and torch's plain bf16 product is fast for one row (a memory-bound matrix-vector kernel
reading half of fp32's bytes) but costs about one more such step per extra row. This benchmark
times each way eyas can multiply the target's weights (their real shapes, fused as the lean forward
fuses them; random values: the time does not depend on them):

    fp32 packed    fp32 weights in oneDNN's packed layout (what eyas decodes fp32 with)
    bf16 torch     bf16 weights, packed where oneDNN can, else torch's plain kernel
    bf16 eyas      eyas's AVX2 kernel (eyas.decode.bf16_kernel: what eyas decodes bf16 with where
                   oneDNN cannot pack it); absent where it cannot be built

For each it prints ms per forward's products by M and, in brackets, T(M) / the fastest T(1): the
tau a round over M tokens needs to break even with the fastest plain decoding step here.

    .venv/bin/python benchmarks/bench_linears.py --threads 1
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python benchmarks/bench_linears.py --threads 1     # AVX2 emulated (say so)
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from eyas.bench import git_commit
from eyas.decode import bf16_kernel
from eyas.decode.cost import clock
from eyas.decode.packed import pack
from eyas.machine import cpu_class, cpu_model
from eyas.target import target_config
import flags

def linear_shapes(config: dict) -> list[tuple[int, int]]:
    """[out, in] of one forward's products, fused as eyas's lean forward fuses them (q/k/v, gate/up)."""
    h, i = config["hidden_size"], config["intermediate_size"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    d = config.get("head_dim") or h // heads
    layer = [((heads + 2 * kv) * d, h), (h, heads * d), (2 * i, h), (h, i)]
    return layer * config["num_hidden_layers"] + [(config["vocab_size"], h)]


def kernels(shapes: list[tuple[int, int]]) -> dict:
    """{name: function of M running every product once over M rows}; "bf16 packed": whether oneDNN packs bf16 here."""
    g = torch.Generator().manual_seed(0)
    w32 = [torch.randn(o, i, generator=g) * 0.02 for o, i in shapes]
    w16 = [w.bfloat16() for w in w32]
    p32, p16 = [pack(w) for w in w32], [pack(w) for w in w16]
    inputs: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}

    def x(m: int, features: int, dtype: torch.dtype) -> torch.Tensor:
        if (m, features, dtype) not in inputs:
            inputs[m, features, dtype] = torch.randn(m, features, generator=g).to(dtype)
        return inputs[m, features, dtype]

    def products(weights, packs, dtype):
        def run(m: int) -> None:
            for w, p in zip(weights, packs):
                if p is None:
                    F.linear(x(m, w.shape[1], dtype), w)
                else:
                    torch.ops.mkldnn._linear_pointwise(x(m, w.shape[1], dtype), p, None, "none", [], "")
        return run

    def eyas_kernel(m: int) -> None:
        for w in w16:
            bf16_kernel.matmul(x(m, w.shape[1], torch.bfloat16), w).bfloat16()

    runs = {"fp32 packed": products(w32, p32, torch.float32), "bf16 torch": products(w16, p16, torch.bfloat16)}
    if all(bf16_kernel.usable(w) for w in w16):
        runs["bf16 eyas"] = eyas_kernel
    return {"runs": runs, "bf16 packed": all(p is not None for p in p16)}


def time_ms(run, sizes: list[int], repeats: int) -> dict[int, float]:
    """ms per call by M, sizes interleaved, the fastest of `repeats` each (a first pass warms up)."""
    best = {m: float("inf") for m in sizes}
    for r in range(repeats + 1):
        for m in sizes:
            t0 = clock()
            run(m)
            if r:
                best[m] = min(best[m], 1000 * (clock() - t0))
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="a local target folder or its config.json (default: the embedded SmolLM2-135M)")
    p.add_argument("--sizes", type=flags.counts, default="1,2,3,5,9,17", help="new tokens per forward")
    p.add_argument("--repeats", type=flags.count, default=5)
    flags.add_threads(p)
    args = p.parse_args(argv)
    flags.use_threads(args.threads)
    sizes = args.sizes
    found = kernels(linear_shapes(target_config(args.target)))
    bf16_packed = found["bf16 packed"]
    ms = {name: time_ms(run, sizes, args.repeats) for name, run in found["runs"].items()}
    t1 = min(row[1] for row in ms.values()) if 1 in sizes else None
    report = {"cpu": cpu_model(), "cpu_class": cpu_class(), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "bf16_packed": bf16_packed, "ms": ms, "best_T1_ms": t1,
              "commit": git_commit()}
    lines = [f"{report['cpu']} ({report['cpu_class']}), {report['threads']} threads, torch {report['torch']}; "
             f"bf16 {'packed by oneDNN' if bf16_packed else 'not packable by oneDNN here'}",
             "ms per forward's products by new tokens M  (T(M) / fastest T(1): the tau to break even)",
             f"{'kernel':<13}" + "".join(f"{m:>14}" for m in sizes)]
    for name, row in ms.items():
        cells = "".join(f"{row[m]:>7.1f}" + (f" ({row[m] / t1:4.2f})" if t1 else "") for m in sizes)
        lines.append(f"{name:<13}{cells}")
    print("\n".join(lines), file=sys.stderr)
    flags.emit(report)
    return 0


if __name__ == "__main__":
    sys.exit(flags.run(main))
