"""`--dtype auto`: the dtype a target decodes fastest in on this machine, measured once and cached.

bf16 halves the bytes every forward reads, but whether it is faster depends on the CPU: with bf16
dot products (avx512_bf16, AMX) it wins at every size; on AVX2-only CPUs torch's bf16 product over
the 16 nodes of a tree costs several times its fp32 equivalent, and only eyas's own kernel
(eyas.decode.bf16_kernel, built where a C compiler is) keeps it near one step. So `auto` times the
target's decode forward (eyas.decode.cost) in each dtype over the sizes decoding runs (one token:
plain decoding and HF greedy; a chain's and a tree's verify) and keeps the dtype whose cheapest way
of decoding costs least per token: plain decoding at T(1), or a verify over n nodes at
T(n) / TYPICAL_TAU[n], the tokens such a round typically yields (the draft's own cost, a tenth of a
round, left out). A CPU can then keep bf16 for plain decoding where its bf16 verify is too slow for
speculation to pay, and the shape sweep turns the draft off there. The result is cached per target,
machine (eyas.machine: instruction sets, cores, threads), torch version and kernel, in
`$XDG_CACHE_HOME/eyas/fastest_dtype.json`; one timed while other processes took much of the CPU is
provisional and timed again at the next runs (eyas.machine.Contention).

The same measurement times transformers' own forward (what `eyas bench`'s Hugging Face baselines
run) over one token (greedy decoding) and over 11 (a prompt-lookup verify of 10 candidates), so
that each baseline runs in ITS fastest dtype here, as a user would run it: `hf_dtypes`.
"""

from __future__ import annotations

import datetime
import sys
import time
from pathlib import Path

import torch

from eyas.decode import bf16_kernel, target_forward_ms
from eyas.devices import on_gpu
from eyas.dtypes import is_auto, short_name, to_dtype
from eyas.machine import (Contention, machine_key, quietest, read_measured, runs_on, save_measured, say_if_busy,
                          settled)
from eyas.target import Target, TargetRef
from eyas.weights import written

DECODE_DTYPES = (torch.bfloat16, torch.float32)  # what `eyas generate` and `eyas bench` decode in
PROBE_SIZES = (1, 5, 17)  # new tokens per forward: plain decoding, a chain of 4, a tree of 16 (+ the root)
HF_SIZES = {"hf_greedy": (1,), "hf_prompt_lookup": (1, 11)}  # transformers' forwards each baseline runs
# tokens a round yields with a verify over n new tokens (the shipped draft, MT-bench: a chain of 2-4
# yields about 2, a tree of 8-16 nodes about 2.4; bench tables in benchmarks/README.md)
TYPICAL_TAU = {1: 1.0, 5: 2.0, 17: 2.4}


def per_token_ms(forward_ms: dict) -> float:
    """The cheapest per-token cost of decoding with these forward times ({new tokens: ms})."""
    return min(ms / TYPICAL_TAU.get(int(n), 2.0) for n, ms in forward_ms.items())


def _key(target: str | Path | None) -> list:
    """What the fastest dtype depends on: the target (its weights as written: another model at the same
    path is timed again), the machine, torch, and eyas's bf16 kernel."""
    ref = TargetRef.resolve(target, weights=False)
    return [ref.name, written(ref.path), *machine_key(), torch.__version__, bf16_kernel.available()]


def measure_dtypes(target: str | Path | None, *, sizes: tuple[int, ...] = PROBE_SIZES, repeats: int = 3) -> dict:
    """Time the target's decode forward in every dtype of DECODE_DTYPES: {"dtype": fastest,
    "forward_ms": {dtype: {size: ms}}, "sizes", "measured"}. Loads the target once per dtype."""
    costs, hf = {}, {}
    hf_sizes = sorted({n for v in HF_SIZES.values() for n in v})
    for dtype in DECODE_DTYPES:
        model = Target.load(target, dtype=dtype)
        costs[short_name(dtype)] = target_forward_ms(model, sizes, repeats=repeats)
        hf[short_name(dtype)] = target_forward_ms(model, hf_sizes, repeats=repeats, lean=False)
        del model
    fastest, hf_fastest = _fastest(costs, hf)
    return {"dtype": fastest, "forward_ms": costs, "sizes": list(sizes), "hf_forward_ms": hf, "hf_dtypes": hf_fastest,
            "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def _fastest(costs: dict, hf: dict) -> tuple[str, dict[str, str]]:
    """The dtype eyas decodes cheapest in, and each Hugging Face baseline's, from their timings ({dtype: {new
    tokens: ms}}, the sizes as ints or as the strings a cached entry holds)."""
    def total(d: str, sizes: tuple[int, ...]) -> float:
        return sum(ms for n, ms in hf[d].items() if int(n) in sizes)

    return (min(costs, key=lambda d: per_token_ms(costs[d])),
            {m: min(hf, key=lambda d: total(d, sizes)) for m, sizes in HF_SIZES.items()})


def check_dtype(dtype: str | torch.dtype) -> None:
    """A given dtype eyas cannot decode in, refused before anything loads ("auto" is resolved later: it times
    the target, which must load)."""
    if not is_auto(dtype):
        to_dtype(dtype, DECODE_DTYPES)


def resolve_dtype(dtype: str | torch.dtype, target: str | Path | None,
                  device: str | torch.device | None = None, *, again: bool = False) -> tuple[torch.dtype, str]:
    """(the dtype to decode in, where it came from): `dtype` itself, or for "auto" the fastest dtype
    measured for this target on this machine's CPU (measured now if no measurement is cached, or `again`:
    `eyas bench --sweep` times what "auto" decides anew); on a GPU `device`, bf16 (what every GPU since
    Ampere computes at full rate; the CPU timings say nothing about it)."""
    if not is_auto(dtype):
        return to_dtype(dtype, DECODE_DTYPES), "given"
    if on_gpu(device):
        return torch.bfloat16, "GPU"
    entry, source = _measured(target, again)
    return to_dtype(entry["dtype"]), source


def hf_dtypes(dtype: str | torch.dtype, target: str | Path | None) -> dict[str, tuple[torch.dtype, str]]:
    """{baseline method: (dtype, where it came from)} for `eyas bench`'s Hugging Face baselines: a
    given dtype for all of them, or for "auto" each one's fastest in transformers' forward here."""
    if not is_auto(dtype):
        return {m: (to_dtype(dtype, DECODE_DTYPES), "given") for m in HF_SIZES}
    entry, source = _measured(target)
    return {m: (to_dtype(entry["hf_dtypes"][m]), source) for m in HF_SIZES}


# Provisional timings (eyas.machine.settled) and timings made anew on request, made by this process, by key:
# one serves the whole run; it is made again at the next run, not at the next call.
_THIS_RUN: dict[str, dict] = {}


def _measured(target: str | Path | None, again: bool = False) -> tuple[dict, str]:
    """The cached measurement for this target and machine, else (or `again`) one made now (said on stderr)."""
    key = _key(target)
    if str(key) in _THIS_RUN:
        return _THIS_RUN[str(key)], "auto: measured on this machine"
    names = [short_name(d) for d in DECODE_DTYPES]
    entry = read_measured("dtype", key)
    try:  # an entry from an older eyas (no Hugging Face timings), or whose choices its own timings do not make
        usable = (entry["dtype"] in names and all(entry["hf_dtypes"][m] in names for m in HF_SIZES)  # (edited)
                  and _fastest(entry["forward_ms"], entry["hf_forward_ms"]) == (entry["dtype"], entry["hf_dtypes"]))
    except (TypeError, KeyError, ValueError, AttributeError):  # a field out of shape: measured again too
        usable = False
    if usable and settled(entry) and not again:
        return entry, "auto: measured on this machine (cached)"
    print("eyas: timing the target's forward in bf16 and fp32 to pick the faster (once per machine and target: "
          "it loads the target in each dtype)", file=sys.stderr)
    t0 = time.perf_counter()
    others = Contention()
    measured = measure_dtypes(target)
    entry = quietest({**measured, "others_cpu_share": others.others()}, entry if usable and not again else None)
    path = save_measured("dtype", key, entry)
    ms = entry["forward_ms"]
    print(f"eyas: {entry['dtype']} is faster here (ms per forward over {', '.join(map(str, entry['sizes']))} "
          "new tokens: " + "; ".join(f"{d} " + " / ".join(f"{v:.1f}" for v in ms[d].values()) for d in ms)
          + f") on {runs_on(torch.device('cpu'))}; measured in {time.perf_counter() - t0:.0f} s"
          + (f", cached in {path}" if path else ""),
          file=sys.stderr)
    say_if_busy(entry)
    if entry["busy"] or again:
        _THIS_RUN[str(key)] = entry
    return entry, "auto: measured on this machine"
