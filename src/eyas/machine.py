"""The machine eyas measures on, and what it measured there, cached.

What decodes fastest (a dtype, a draft shape) depends on the CPU's instruction sets more than on
anything else: bf16 products are fast where the CPU has bf16 dot products (avx512_bf16, AMX) and
slow where it must convert (AVX2 only), so a shape measured on one machine can be the slowest on
another. Measurements are therefore cached keyed by `machine_key` (architecture, core count, the
instruction sets that matter and the one torch dispatches to, torch's thread count) and never reused
elsewhere.

    cpu_flags / cpu_model  what /proc/cpuinfo says about the CPU (recorded in bench reports)
    cpu_class              that in a few words (AVX2 only, AVX-512 + AMX, ...), as bench tables name it
    machine_key            the part of a cache key that names this machine
    read_measured / save_measured   per kind of measurement, a JSON file under $XDG_CACHE_HOME/eyas
                                    of entries keyed by what the measurement depends on
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import sys
from functools import cache
from pathlib import Path

import torch

from eyas.atomic import write_json
from eyas.embedded import cache_dir

# Instruction sets that change which kernels run (x86: vector width, bf16/fp16/int8 dot products,
# AMX tiles; Arm: SVE, bf16, int8 matmul).
ISA_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "asimd", "asimddp", "sve", "sve2", "bf16", "i8mm",
)


@cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        name, _, value = line.partition(":")
        fields[name.strip()] = value.strip()
    return fields


def cpu_flags() -> list[str]:
    """The instruction sets of ISA_FLAGS this CPU has (x86 `flags`, Arm `Features`)."""
    info = _cpuinfo()
    present = set((info.get("flags") or info.get("Features") or "").split())
    return [f for f in ISA_FLAGS if f in present]


def cpu_model() -> str:
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine()


def bf16_dot_products() -> bool:
    """Whether this CPU multiplies bf16 natively (x86 avx512_bf16 or AMX, Arm bf16): where it does not
    (AVX2-only CPUs), bf16 products are emulated and run several times slower than fp32."""
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & set(cpu_flags()))


def cpu_class() -> str:
    """The kind of CPU in a few words, as bench tables name it: its widest vector instruction set,
    its bf16 dot products, and whether torch's dispatch is capped below what the CPU has."""
    flags = set(cpu_flags())
    dispatch = torch.backends.cpu.get_cpu_capability()  # e.g. AVX512, AVX2, DEFAULT (aarch64: SVE256, ...)
    if "asimd" in flags or platform.machine() in ("aarch64", "arm64"):
        return "Arm " + ("SVE" if "sve" in flags else "NEON") + (" + bf16" if "bf16" in flags else "")
    if "avx512f" in flags:
        kind = "AVX-512 + AMX" if "amx_bf16" in flags else "AVX-512 + avx512_bf16, no AMX" if "avx512_bf16" in flags \
            else "AVX-512, no bf16 dot products"
    else:
        kind = "AVX2 only" if "avx2" in flags else "no AVX2"
    if "avx512f" in flags and dispatch == "AVX2":
        return f"AVX2 (emulated: torch capped to AVX2 on an {kind} CPU)"
    return kind


def machine_key() -> list:
    """[architecture, logical CPUs, instruction sets, the set torch dispatches to, torch threads]: what
    a timing depends on here. The dispatched set differs from the CPU's flags when it is capped
    (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU): then other kernels run, and other shapes win."""
    return [platform.machine(), os.cpu_count(), cpu_flags(), torch.backends.cpu.get_cpu_capability(),
            torch.get_num_threads()]


# --- measured results, cached per key -----------------------------------------------------------

CACHE_FILES = {"shape": "best_shape.json", "dtype": "fastest_dtype.json"}  # kind of measurement -> file


def measured_file(kind: str) -> Path:
    return cache_dir() / CACHE_FILES[kind]


def _read_file(kind: str) -> dict:
    """All entries of one kind; an unreadable file is reported and treated as empty (it is a cache)."""
    path = measured_file(kind)
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"warning: ignoring the {kind} cache {path}: {e}", file=sys.stderr)
        return {}
    return entries if isinstance(entries, dict) else {}


def read_measured(kind: str, key: list) -> dict | None:
    """The `kind` entry ("shape", "dtype") stored under `key` (a JSON-able list), or None."""
    entry = _read_file(kind).get(json.dumps(key))
    return entry if isinstance(entry, dict) else None


def save_measured(kind: str, key: list, entry: dict) -> Path:
    """Store `entry` under `key`, atomically and under a lock (two processes at once keep both)."""
    path = measured_file(kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        entries = _read_file(kind)
        entries[json.dumps(key)] = entry
        write_json(path, entries)
    return path
