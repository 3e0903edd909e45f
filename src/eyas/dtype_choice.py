"""`--dtype auto`: the dtype a target decodes fastest in on this machine, measured once and cached.

bf16 halves the bytes every forward reads, but whether it is faster depends on the CPU: with bf16
dot products (avx512_bf16, AMX) it wins at every size; on AVX2-only CPUs a forward over one token
may still win while one over the 16 nodes of a tree costs several times its fp32 equivalent. So
`auto` times the target's decode forward (eyas.decode.cost) in each dtype over the sizes decoding
runs (one token: plain decoding and HF greedy; a chain's and a tree's verify) and keeps the dtype
with the smaller total. The result is cached per target and machine (eyas.machine: instruction
sets, cores, threads) and torch version, in `$XDG_CACHE_HOME/eyas/fastest_dtype.json`.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch

from eyas.decode import target_forward_ms
from eyas.dtypes import short_name, to_dtype
from eyas.machine import machine_key, read_measured, save_measured
from eyas.target import Target, target_name

AUTO = "auto"
DECODE_DTYPES = (torch.bfloat16, torch.float32)  # what `eyas generate` and `eyas bench` decode in
PROBE_SIZES = (1, 5, 17)  # new tokens per forward: plain decoding, a chain of 4, a tree of 16 (+ the root)


def _key(target: str | Path | None) -> list:
    return [target_name(target), *machine_key(), torch.__version__]


def measure_dtypes(target: str | Path | None, *, sizes: tuple[int, ...] = PROBE_SIZES, repeats: int = 3) -> dict:
    """Time the target's decode forward in every dtype of DECODE_DTYPES: {"dtype": fastest,
    "forward_ms": {dtype: {size: ms}}, "sizes", "measured"}. Loads the target once per dtype."""
    costs = {}
    for dtype in DECODE_DTYPES:
        model = Target.load(target, dtype=dtype)
        costs[short_name(dtype)] = target_forward_ms(model, sizes, repeats=repeats)
        del model
    fastest = min(costs, key=lambda d: sum(costs[d].values()))
    return {"dtype": fastest, "forward_ms": costs, "sizes": list(sizes),
            "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def resolve_dtype(dtype: str | torch.dtype, target: str | Path | None) -> tuple[torch.dtype, str]:
    """(the dtype to decode in, where it came from): `dtype` itself, or for "auto" the fastest dtype
    measured for this target on this machine (measured now if no measurement is cached)."""
    if not (isinstance(dtype, str) and dtype.lower() == AUTO):
        return to_dtype(dtype, DECODE_DTYPES), "given"
    key = _key(target)
    entry = read_measured("dtype", key)
    if entry is not None and entry.get("dtype") in [short_name(d) for d in DECODE_DTYPES]:
        return to_dtype(entry["dtype"]), "auto: measured on this machine (cached)"
    print("eyas: timing the target in bf16 and fp32 to pick the faster (once per machine)", file=sys.stderr)
    entry = measure_dtypes(target)
    save_measured("dtype", key, entry)
    return to_dtype(entry["dtype"]), "auto: measured on this machine"
