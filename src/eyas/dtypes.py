"""The one map from dtype names to torch dtypes.

Users type what their other tools taught them: eyas's short names (`bf16`, `fp32`, `fp16`),
the names vLLM and transformers use (`bfloat16`, `float32`, `float16`, `half`, `float`), or
`torch.bfloat16` itself. Every `--dtype`, `--export-dtype` and config `dtype` goes through here.
"""

from __future__ import annotations

import torch

from eyas.errors import EyasError

SHORT = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}
_NAMES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
}
CHOICES = tuple(_NAMES)  # what argparse accepts for a --dtype flag
AUTO = "auto"  # generate, bench and eval: a dtype chosen for this machine (eyas.dtype_choice, eyas.evaluate)


def choices(allowed: tuple[torch.dtype, ...]) -> tuple[str, ...]:
    """Every spelling of the `allowed` dtypes, for a flag that takes only those."""
    return tuple(name for name, d in _NAMES.items() if d in allowed)


def to_dtype(dtype: str | torch.dtype, allowed: tuple[torch.dtype, ...] = tuple(SHORT)) -> torch.dtype:
    """A dtype name (any spelling above, any case, with or without `torch.`) -> torch dtype."""
    d = dtype if isinstance(dtype, torch.dtype) else _NAMES.get(str(dtype).lower().removeprefix("torch."))
    if d is None or d not in allowed:
        names = " or ".join(f"{SHORT[a]} ({str(a).removeprefix('torch.')})" for a in allowed)
        raise EyasError(f"dtype {dtype!r} is not supported here", f"use {names}")
    return d


def is_auto(dtype: str | torch.dtype) -> bool:
    return isinstance(dtype, str) and dtype.lower() == AUTO


def short_name(dtype: str | torch.dtype) -> str:
    """`bf16` / `fp32` / `fp16`: the name eyas prints and records."""
    return SHORT[to_dtype(dtype)]
