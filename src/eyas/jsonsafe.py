"""JSON that any parser reads: Python's json writes NaN and Infinity bare, which JSON has no words for
(jq, JavaScript and strict readers refuse the whole document). Every JSON eyas writes, on stdout, in a
file or a log line, goes through `dumps`: a NaN or infinity (a depth no position reached, an interval
from one sample) becomes null."""

from __future__ import annotations

import json
import math
from typing import Any


def json_ready(value: Any) -> Any:
    """`value` with every NaN or infinity as None (null), in dicts, lists and tuples at any depth."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def dumps(value: Any, **kw: Any) -> str:
    """`json.dumps` of `json_ready(value)`; refuses (rather than writes) anything still not JSON."""
    return json.dumps(json_ready(value), allow_nan=False, **kw)
