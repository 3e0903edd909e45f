"""Where a model runs, and whether it fits there: the one reading of every `--device`.

A device is refused in one line before anything loads when it does not exist (`cuda` on a machine
without CUDA, `cuda:3` on a machine with two GPUs). A model is refused before loading when its
weights would not fit the memory the device has free: the kernel's OOM killer gives no message,
and a half-loaded 400 GB target wastes an hour. Nothing here needs a GPU to be imported or tested.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from eyas.errors import EyasError

# What a model needs beyond its weights to run: activations, the KV cache, allocator slack.
RUN_OVERHEAD = 1.2
_MEMINFO = Path("/proc/meminfo")


def parse_device(spec: str | torch.device | None) -> torch.device:
    """`cpu`, `cuda`, `cuda:N` (None: cpu) as a torch.device that exists on this machine."""
    if isinstance(spec, str) and not spec.strip():
        raise EyasError("--device is empty", "use cpu, cuda or cuda:N (or leave the flag out: cpu)")
    try:
        device = _as_torch(spec)
    except RuntimeError:
        raise EyasError(f"--device {spec!r} is not a device", "use cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return torch.device("cpu")  # one CPU device: torch keeps an index (cpu:3) that names nothing
    if device.type != "cuda":
        raise EyasError(f"--device {spec!r}: eyas runs on cpu or cuda", "use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise EyasError(f"--device {spec}: no CUDA GPU on this machine (torch {torch.__version__})",
                        "run on --device cpu, or on a machine with a GPU and a CUDA build of torch")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise EyasError(f"--device {spec}: this machine has {count} GPU(s) (cuda:0..cuda:{count - 1})",
                        f"use cuda:0..cuda:{count - 1}")
    return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())


def on_gpu(device: str | torch.device | None) -> bool:
    """Whether `device` (None: cpu) names a GPU, read as `parse_device` reads it (`--device CPU` is the cpu;
    it crashed torch.device), whether or not this machine has one."""
    try:
        return _as_torch(device).type == "cuda"
    except RuntimeError:  # not a device: parse_device says so where the flag is read
        return False


def _as_torch(spec: str | torch.device | None) -> torch.device:
    """`spec` as torch names it, in eyas's spelling rules (any case, spaces around; None: cpu); torch's
    RuntimeError where it names no device."""
    return spec if isinstance(spec, torch.device) else torch.device((spec or "cpu").strip().lower())


def free_bytes(device: torch.device) -> int:
    """Memory free on `device` now: MemAvailable for the CPU; for a GPU the driver's free bytes plus what
    PyTorch's allocator holds cached but unused (the driver counts that as taken: after one large batch,
    every later size check would read the earlier peak as spent)."""
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0]) + cached
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def room_for_a_copy(model: torch.nn.Module, extra: int = 0, *, made: bool = False) -> bool:
    """Whether a second copy of `model`'s weights plus `extra` bytes would take at most half the
    memory free on its device: the price of eyas's packed and lean forwards, paid where it leaves room.
    `made`: the copy exists already (it is in the free memory's count), so only `extra` must fit."""
    weights = 0 if made else sum(p.numel() * p.element_size() for p in model.parameters())
    return weights + extra <= free_bytes(next(model.parameters()).device) / 2


def synchronize(device: torch.device) -> None:
    """Wait for the GPU work queued on `device` (nothing on a CPU), so that a wall clock times it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gib(nbytes: float) -> str:
    """A size as people read it: GiB for models, MiB or KiB for what is smaller."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes / 2**10:.1f} KiB"


def check_fits_memory(nbytes: int, device: torch.device, what: str, *, overhead: float = RUN_OVERHEAD) -> None:
    """Refuse (one line, sizes named) to load `nbytes` of weights onto `device` when it would not fit."""
    need = int(nbytes * overhead)
    free = free_bytes(device)
    if need > free:
        where = "this machine's free memory" if device.type == "cpu" else f"free memory on {device}"
        raise EyasError(
            f"{what} needs about {gib(need)} ({gib(nbytes)} of weights) but {where} is {gib(free)}",
            "use a smaller dtype (--dtype bf16), another device (--device cuda), or a machine with more memory",
        )
