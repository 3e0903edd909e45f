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
    Contention / settled / quietest  whether other processes took the CPU while something was timed:
                                    such a result is provisional, timed again at the next runs
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import sys
import warnings
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


# Environment variables that cap the instruction sets kernels use below what the CPU has: torch's own
# dispatch (read back by get_cpu_capability), oneDNN's (its bf16 products) and MKL's.
ISA_CAPS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
# oneDNN ISA caps below its first bf16 dot-product level (avx512_core_bf16): bf16 products are emulated
_ONEDNN_NO_BF16 = {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}


def isa_caps() -> dict[str, str]:
    """The ISA caps set in the environment (ISA_CAPS), by name: they change which kernels run (oneDNN's
    ALL and DEFAULT cap nothing)."""
    return {name: os.environ[name] for name in ISA_CAPS
            if os.environ.get(name) and os.environ[name].upper() not in ("ALL", "DEFAULT")}


def _onednn_cap() -> str | None:
    caps = isa_caps()
    return (caps.get("ONEDNN_MAX_CPU_ISA") or caps.get("DNNL_MAX_CPU_ISA") or "").upper() or None


def _dispatch_capped() -> bool:
    """torch's dispatch capped to AVX2 or to no vector set at all on an x86 CPU (ATEN_CPU_CAPABILITY)."""
    return platform.machine() in ("x86_64", "AMD64") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT")


def bf16_dot_products() -> bool:
    """Whether this CPU multiplies bf16 natively (x86 avx512_bf16 or AMX, Arm bf16) and torch may use it:
    where it does not (AVX2-only CPUs, torch capped to AVX2 as `cpu_class` says "emulated", or oneDNN
    capped below its bf16 level by ONEDNN_MAX_CPU_ISA), bf16 products are emulated and run several
    times slower than fp32."""
    capped = _dispatch_capped() or _onednn_cap() in _ONEDNN_NO_BF16
    return not capped and bool({"avx512_bf16", "amx_bf16", "bf16"} & set(cpu_flags()))


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
    caps = isa_caps()
    others = [f"{lib} capped to {caps[name].upper()}" for lib, name in (("oneDNN", "ONEDNN_MAX_CPU_ISA"),
              ("oneDNN", "DNNL_MAX_CPU_ISA"), ("MKL", "MKL_ENABLE_INSTRUCTIONS")) if name in caps]
    if _dispatch_capped() and ("avx512f" in flags or dispatch == "DEFAULT"):
        width = "AVX2" if dispatch == "AVX2" else "no vector set"
        return f"{width} (emulated: torch capped to {dispatch}{''.join(', ' + o for o in others)} on an {kind} CPU)"
    return ", ".join([kind, *others])


def runs_on(device: torch.device) -> str:
    """What a speed figure was measured on, in a few words: the GPU's name, or the CPU's kind and the
    threads torch used (every speed figure eyas prints names it)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU {cpu_class()}, {torch.get_num_threads()} threads"


def machine_key() -> list:
    """[architecture, logical CPUs, instruction sets, the set torch dispatches to, torch threads, and the
    ISA caps where any is set]: what a timing depends on here. The dispatched set differs from the CPU's
    flags when it is capped (ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU), and oneDNN's or MKL's own caps
    change their kernels without changing it: then other kernels run, and other shapes win."""
    key = [platform.machine(), os.cpu_count(), cpu_flags(), torch.backends.cpu.get_cpu_capability(),
           torch.get_num_threads()]
    caps = isa_caps()
    return key + [caps] if caps else key  # uncapped: the key cached results were made under


# --- measured results, cached per key -----------------------------------------------------------

CACHE_FILES = {"shape": "best_shape.json", "dtype": "fastest_dtype.json"}  # kind of measurement -> file


def measured_file(kind: str) -> Path:
    return cache_dir() / CACHE_FILES[kind]


def _read_file(kind: str, *, saving: bool = False) -> dict:
    """All entries of one kind; an unreadable file is reported and treated as empty (it is a cache). Before
    a save replaces it (`saving`), it is kept beside as `<name>.unreadable`: an entry edited by hand into
    broken JSON took every other entry with it, unsaid."""
    path = measured_file(kind)
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(entries, dict):
            raise ValueError(f"a JSON {type(entries).__name__}, not an object of entries")
    except (OSError, UnicodeDecodeError, ValueError) as e:  # JSONDecodeError is a ValueError
        kept = path.with_name(path.name + ".unreadable")
        if saving:
            path.replace(kept)
        warnings.warn(f"ignoring the {kind} cache {path}: {e}" + (f" (kept as {kept}; replaced by a new one)"
                                                                   if saving else ""), stacklevel=2)
        return {}
    return entries


def read_measured(kind: str, key: list) -> dict | None:
    """The `kind` entry ("shape", "dtype") stored under `key` (a JSON-able list), or None: also where its
    record of the load it was timed under (`busy`, `attempts`, `others_cpu_share`) is not as eyas writes it
    (edited by hand), so such an entry is measured again. The callers check what they read of the rest."""
    entry = _read_file(kind).get(json.dumps(key))
    if not isinstance(entry, dict):
        return None
    share, attempts = entry.get("others_cpu_share"), entry.get("attempts", 1)
    kept = (type(entry.get("busy", False)) is bool and type(attempts) is int and attempts >= 1
            and (share is None or type(share) in (int, float) and 0 <= share <= 1))
    return entry if kept else None


def save_measured(kind: str, key: list, entry: dict) -> Path | None:
    """Store `entry` under `key`, atomically and under a lock (two processes at once keep both); the file, or
    None where it cannot be written (said on stderr)."""
    path = measured_file(kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / f".{path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            entries = _read_file(kind, saving=True)
            entries[json.dumps(key)] = entry
            write_json(path, entries)
    except OSError as e:  # a cache: the run goes on with what it measured, and measures again next time
        warnings.warn(f"cannot record the {kind} measurement in {path} ({type(e).__name__}: {e.strerror or e}); "
                      "it is measured again at the next run (set XDG_CACHE_HOME to a writable folder)", stacklevel=2)
        return None
    return path


# --- other processes on the machine while something is timed -------------------------------------

BUSY_SHARE = 0.25  # others took more than this share of the cores a timing used: it is provisional
MEASURE_ATTEMPTS = 3  # a provisional timing is made again at most this often in all; the quietest stays


def _machine_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot (/proc/stat; steal counts as busy),
    or None where unknown, or where /proc/stat counts other CPUs than this process may use (a
    container sees its host's)."""
    try:
        lines = Path("/proc/stat").read_text(encoding="ascii").splitlines()
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        ticks = [int(v) for v in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    except (OSError, ValueError, IndexError):
        return None
    if cpus != len(os.sched_getaffinity(0)) or len(ticks) < 5:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, sum(ticks) / hz


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class Contention:
    """How much of the CPU this process needs other processes took, from construction to `others()`.

    A timing made while they took much of it says how fast this machine is under that load, not
    what it does quiet, and decisions cached from it (a dtype, a draft shape) would outlive the
    load: under load a speculative round's many small products wait on busy cores more than plain
    decoding's few, so the draft can look slower than the target alone although it is not. Other
    processes on the cores this process's `threads` leave free take nothing from it.
    """

    def __init__(self, threads: int | None = None, cpus: int | None = None) -> None:
        self.cpus = cpus or len(os.sched_getaffinity(0))
        self.threads = min(self.cpus, threads or torch.get_num_threads())
        self._machine, self._own = _machine_seconds(), _own_seconds()

    def others(self) -> float | None:
        """The share, 0..1, of the `threads` cores others kept busy since construction: the cores
        they used beyond those left free, over `threads` (None where /proc/stat cannot say)."""
        now = _machine_seconds()
        if self._machine is None or now is None or now[1] <= self._machine[1]:
            return None
        busy, total = now[0] - self._machine[0], now[1] - self._machine[1]
        cores = self.cpus * (busy - (_own_seconds() - self._own)) / total  # cores others kept busy, on average
        return round(min(1.0, max(0.0, (cores - (self.cpus - self.threads)) / self.threads)), 3)


def settled(entry: dict) -> bool:
    """Whether a cached timing stands: made on a quiet machine, or provisional but made as often as allowed."""
    return not entry.get("busy") or int(entry.get("attempts", 1)) >= MEASURE_ATTEMPTS


def quietest(entry: dict, previous: dict | None) -> dict:
    """A new timing's entry (with `others_cpu_share`, from Contention), marked provisional when others
    took much of the CPU, or the `previous` provisional one it replaces where that was made quieter;
    either counts the attempts so far."""
    others = entry.get("others_cpu_share")
    entry = {**entry, "busy": others is not None and others > BUSY_SHARE}
    attempts = 1
    if previous is not None and previous.get("busy"):
        attempts = int(previous.get("attempts", 1)) + 1
        if (previous.get("others_cpu_share") or 0.0) < (others or 0.0):
            entry = previous
    return {**entry, "attempts": attempts}


def say_if_busy(entry: dict) -> None:
    """Print `busy_note` on stderr for a provisional timing; nothing for a quiet one."""
    note = busy_note(entry)
    if note:
        print(note, file=sys.stderr)


def busy_note(entry: dict) -> str:
    """One stderr line for a provisional timing ('' for a settled one)."""
    if not entry.get("busy"):
        return ""
    share = f"{100 * entry['others_cpu_share']:.0f}%"
    if settled(entry):
        return (f"eyas: other processes took {share} of the cores timed on, at the quietest of {entry['attempts']} timings; "
                "kept (re-measure on a quiet machine with `eyas bench --sweep`)")
    return (f"eyas: other processes took {share} of the cores this was timed on: used now, timed again at the "
            f"next run (attempt {entry['attempts']} of {MEASURE_ATTEMPTS})")
