"""bf16 weights times a few rows on AVX2-only CPUs: the product torch does not ship there.

Why: where the CPU has no bf16 dot products (AVX2 only), oneDNN cannot pack bf16 weights and
torch's plain bf16 product is fast for one row (a matrix-vector kernel reading half of fp32's bytes)
but costs about one more such step per extra row, so a verify over 5 tokens costs 4.5 one-token
steps and speculation cannot pay (benchmarks/bench_linears.py, AVX2 emulated on an AVX-512 EPYC).
`bf16_avx2.c`, beside this file, streams each weight row once, widens it to fp32 in registers and
multiplies it with up to 6 rows at a time, summing in fp32. Its products are the ones torch's bf16
kernels compute (a bf16 times a bf16 is exact in fp32); only the order of the sum differs, and it
does not depend on how many rows are multiplied at once: a verify's products give each token what a
one-token step's give it. The attention between them does not: it sums over the keys a forward
passes (a verify's row sees masked keys beyond its own), which changes the last bit in fp32 and,
once rounded to bf16, sometimes an argmax. So greedy bf16 decoding is the target's own up to such
near-ties, as on every CPU; fp32 is token for token (measured on SmolLM2: benchmarks/README.md).

The kernel is compiled once per machine with the system's C compiler (cc, -O3 -mavx2 -mfma
-fopenmp, under a second on a 2-core AVX-512 EPYC) into `$XDG_CACHE_HOME/eyas/kernels/`, and loaded with ctypes. Its OpenMP
runtime is torch's (the same soname, already loaded), so torch.set_num_threads applies to it. Where
the CPU lacks AVX2 and FMA, there is no compiler, or EYAS_BF16_KERNEL=0 is set (to time the
difference), `available()` is False and bf16 products stay on torch's kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from eyas.embedded import cache_dir
from eyas.machine import cpu_flags

SOURCE = Path(__file__).with_name("bf16_avx2.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
LANES = 8  # fp32 lanes of an AVX2 register: the kernel needs in_features % LANES == 0


def _compile(source: Path, out: Path) -> None:
    """Compile `source` into the shared library `out` (written to a temporary name, then renamed)."""
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler (cc or gcc) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        built = Path(tmp) / out.name
        subprocess.run([compiler, *FLAGS, str(source), "-o", str(built)], check=True, capture_output=True, text=True)
        built.replace(out)


@cache
def _library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot run here (said once on stderr
    when only the compiler is missing or fails: the CPU would gain from it)."""
    if _switched_off() or platform.machine() not in ("x86_64", "AMD64"):
        return None
    if not {"avx2", "fma"} <= set(cpu_flags()):
        return None
    text = SOURCE.read_bytes()
    out = cache_dir() / "kernels" / f"bf16_avx2-{hashlib.sha256(text + str(FLAGS).encode()).hexdigest()[:16]}.so"
    try:
        if not out.is_file():
            _compile(SOURCE, out)
        lib = ctypes.CDLL(str(out))
    except (OSError, subprocess.CalledProcessError) as e:
        why = getattr(e, "stderr", None) or str(e)
        warnings.warn(f"eyas's bf16 kernel for AVX2 could not be built ({why.strip().splitlines()[-1]}); bf16 "
                      "products run on torch's kernels, which are slow over several rows on CPUs without bf16 dot "
                      "products", stacklevel=2)
        return None
    lib.bf16_weight_mm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                                   ctypes.c_void_p]
    lib.bf16_weight_mm.restype = None
    return lib


def available() -> bool:
    """Whether the kernel runs on this machine (built now if it was not yet)."""
    return _library() is not None


def usable(weight: Tensor) -> bool:
    """Whether `weight` [out, in] can be multiplied by the kernel: bf16, on the CPU, `in` a multiple of 8.
    Asked where torch has no packed product for it, so a kernel switched off here is said (once)."""
    fits = (weight.dtype == torch.bfloat16 and weight.device.type == "cpu" and weight.dim() == 2
            and weight.shape[1] % LANES == 0)
    if fits and _switched_off():
        _said_off()
    return fits and available()


def _switched_off() -> bool:
    """EYAS_BF16_KERNEL=0: the kernel is not used (to time the difference)."""
    return os.environ.get("EYAS_BF16_KERNEL") == "0"


@cache
def _said_off() -> None:
    warnings.warn("EYAS_BF16_KERNEL=0: bf16 products run on torch's kernels, which are slow over several rows on "
                  "CPUs without bf16 dot products", stacklevel=3)


def matmul(x: Tensor, weight: Tensor) -> Tensor:
    """x [..., in] @ weight.T in fp32: [..., out]. `weight` must be `usable`; it is read in place."""
    lib = _library()
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    w = weight.contiguous()
    y = rows.new_empty(rows.shape[0], w.shape[0])
    lib.bf16_weight_mm(rows.data_ptr(), rows.shape[0], rows.shape[1], w.data_ptr(), w.shape[0], y.data_ptr())
    return y.view(*x.shape[:-1], w.shape[0])
