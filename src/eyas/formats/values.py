"""The rules one config value must meet before eyas uses it: its JSON type, its range, finiteness.

A config file is untrusted input. A size of 0 or 2**62, a NaN epsilon, a name that is a number or a
rope factor that is a list would otherwise reach shape arithmetic, torch, a regular expression or
`json.dump` and fail there with a traceback (or be written back out as it came). Each check here
returns the value in the type eyas uses (sizes as int, numbers as float) or raises a FormatError that
names the file, the field and the fix.
"""

from __future__ import annotations

import math
from typing import Any

from eyas.errors import FormatError

MAX_SIZE = 2**31 - 1  # no model dimension comes near; bigger values only overflow shape arithmetic
MAX_LAYERS = 1024  # draft layers: deeper than any target, and each one is a loop over its tensors
_SHOWN = 60  # characters of a bad value quoted in an error (a 400-digit number stays on one line)

# rope_scaling / rope_parameters keys the drafter reads (eyas.rope), by the kind of value each must be
_ROPE_NAMES = ("rope_type", "type")
_ROPE_SIZES = ("original_max_position_embeddings",)
_ROPE_POSITIVE = ("factor", "low_freq_factor", "high_freq_factor", "attention_factor", "beta_fast", "beta_slow",
                  "partial_rotary_factor", "alpha")
_ROPE_NUMBERS = ("mscale", "mscale_all_dim")  # may be 0 or negative: only finite


def show(value: Any) -> str:
    """A value as quoted in an error: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def refuse(file: str, field: str, value: Any, expected: str) -> FormatError:
    """The error for a field whose value breaks its rule."""
    return FormatError(f"{file}: field '{field}' is {show(value)}, expected {expected}", f"fix {field} in {file}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not 1


def finite(value: Any) -> float | None:
    """A JSON number as a finite float; None for anything else (bool, NaN, inf, an int past float range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def size(file: str, field: str, value: Any, high: int = MAX_SIZE) -> int:
    """A dimension, count or length: an integer from 1 to `high`."""
    if not _is_int(value) or not 1 <= value <= high:
        raise refuse(file, field, value, f"an integer from 1 to {high}")
    return value


def layer_count(file: str, field: str, value: Any) -> int:
    """num_hidden_layers of a draft."""
    return size(file, field, value, MAX_LAYERS)


def positive(file: str, field: str, value: Any) -> float:
    """An epsilon or a rope factor: a finite number above 0."""
    number = finite(value)
    if number is None or number <= 0:
        raise refuse(file, field, value, "a finite number above 0")
    return number


def rope_base(file: str, field: str, value: Any) -> float:
    """rope_theta: the base of the rotation frequencies, a finite number above 1 (at 1 no pair of dims
    turns slower than another: no position information at long range, and yarn's ramp divides by log(1))."""
    number = finite(value)
    if number is None or number <= 1:
        raise refuse(file, field, value, "a finite number above 1")
    return number


def flag(file: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise refuse(file, field, value, "true or false")
    return value


def text(file: str, field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise refuse(file, field, value, "a string")
    return value


def texts(file: str, field: str, value: Any) -> tuple[str, ...]:
    """A list of strings (architecture names)."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise refuse(file, field, value, "a list of strings")
    return tuple(value)


def layer_ids(file: str, field: str, value: Any) -> list[int]:
    """A non-empty list of layer numbers (0 included: the embeddings' output is a capture point)."""
    if not isinstance(value, list) or not value or not all(_is_int(i) and 0 <= i <= MAX_SIZE for i in value):
        raise refuse(file, field, value, "a list of layer numbers")
    return value


def rope_dict(file: str, field: str, value: Any) -> dict[str, Any]:
    """rope_scaling or rope_parameters: an object whose keys the drafter reads have usable values.

    Keys eyas does not read are kept as they are (they are the engines' business).
    """
    if not isinstance(value, dict):
        raise refuse(file, field, value, "an object")
    for key, v in value.items():
        where = f"{field}.{key}"
        if v is None:
            continue
        if key in _ROPE_NAMES:
            text(file, where, v)
        elif key in _ROPE_SIZES:
            size(file, where, v)
        elif key == "rope_theta":
            rope_base(file, where, v)
        elif key in _ROPE_POSITIVE:
            positive(file, where, v)
        elif key in _ROPE_NUMBERS and finite(v) is None:
            raise refuse(file, where, v, "a finite number")
        elif key == "truncate":
            flag(file, where, v)
    return value
