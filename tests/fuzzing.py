"""What the fuzz tests share: a small world of valid inputs, the safetensors mutation, and the check
that a refusal is the documented one (exit 2, one `error:` line naming the file, no traceback).

tests/test_fuzz.py fuzzes the draft checkpoints (configs, weights); tests/test_fuzz_inputs.py the run
verbs' other inputs (prompt files, engine dumps, capture shards).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from eyas.cli import main
from eyas.data import capture
from eyas.target import Target
from test_data import LAYERS, PROMPTS, save_tiny_target

FORMATS = ("speculators", "eagle")
# CI sees the same cases on every machine; EYAS_FUZZ_EXAMPLES=2000 EYAS_FUZZ_RANDOM=1 explores further.
FUZZ = settings(max_examples=int(os.environ.get("EYAS_FUZZ_EXAMPLES", "200")), deadline=None,
                derandomize=os.environ.get("EYAS_FUZZ_RANDOM") != "1", database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A tiny target, a few captured samples, and a fitting random draft in each format."""
    root = tmp_path_factory.mktemp("fuzz")
    target = save_tiny_target(root / "target")
    shards = root / "shards"
    capture(Target.load(target), PROMPTS[:2], LAYERS, shards, max_new_tokens=6, batch_size=2, dtype="float32",
            progress=False)
    layers = ",".join(str(i) for i in LAYERS)
    drafts = {}
    for fmt in FORMATS:
        drafts[fmt] = root / f"draft-{fmt}"
        assert main(["init", str(drafts[fmt]), "--target", str(target), "--capture-layers", layers,
                     "--format", fmt]) == 0
    return {"target": target, "shards": shards, "root": root, **drafts}


ODD_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2**63, 10**30, -(10**9), 0]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.lists(st.integers(-2, 40), max_size=5),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path in a JSON object (lists by index), the object itself excluded."""
    out = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


def _set(obj: Any, path: tuple, value: Any, delete: bool = False) -> None:
    for k in path[:-1]:
        obj = obj[k]
    if delete:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


@st.composite
def config_mutation(draw, cfg: dict) -> bytes:
    """The config's bytes after one mutation."""
    kind = draw(st.sampled_from(["value", "delete", "list_length", "number", "bytes", "truncate", "not_object"]))
    cfg = copy.deepcopy(cfg)
    paths = _paths(cfg)
    path = draw(st.sampled_from(paths))
    if kind == "value":
        _set(cfg, path, draw(ODD_VALUES))
    elif kind == "delete" and not isinstance(path[-1], int):
        _set(cfg, path, None, delete=True)
    elif kind == "list_length":
        lists = [p for p in paths if isinstance(_get(cfg, p), list)] or [path]
        p = draw(st.sampled_from(lists))
        _set(cfg, p, draw(st.lists(st.integers(-1, 64), max_size=6)))
    elif kind == "number":
        nums = [p for p in paths if isinstance(_get(cfg, p), (int, float)) and not isinstance(_get(cfg, p), bool)]
        p = draw(st.sampled_from(nums or [path]))
        _set(cfg, p, draw(st.sampled_from([-1, 0, -(2**40), 2**62, 10**400, 1e308, 0.5, -0.0])))
    elif kind == "not_object":
        return json.dumps(draw(ODD_VALUES)).encode()
    text = json.dumps(cfg, indent=2).encode()
    if kind == "bytes":
        at = draw(st.integers(0, len(text) - 1))
        return text[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\x00", b"{", b'"'])) + text[at + 1:]
    if kind == "truncate":
        return text[: draw(st.integers(0, len(text) - 1))]
    return text


def _get(obj: Any, path: tuple) -> Any:
    for k in path:
        obj = obj[k]
    return obj


@st.composite
def safetensors_mutation(draw, data: bytes) -> bytes:
    """The weights file's bytes after one mutation of its header (or the file cut short)."""
    n = struct.unpack("<Q", data[:8])[0]
    header, body = json.loads(data[8: 8 + n]), data[8 + n:]
    kind = draw(st.sampled_from(["truncate", "length", "header_bytes", "dtype", "shape", "offsets", "drop"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "length":
        lie = draw(st.sampled_from([0, 1, n - 1, n + 1, len(data), 2**63, 2**64 - 1]))
        return struct.pack("<Q", lie) + data[8:]
    if kind == "header_bytes":
        raw = bytearray(data[8: 8 + n])
        at = draw(st.integers(0, n - 1))
        raw[at] = draw(st.sampled_from([0xFF, 0x00, ord("{"), ord('"'), ord("]")]))
        return data[:8] + bytes(raw) + body
    names = sorted(k for k in header if k != "__metadata__")
    name = draw(st.sampled_from(names))
    entry = header[name]
    if kind == "dtype":
        entry["dtype"] = draw(st.sampled_from(["F16", "BF16", "I32", "U32", "I64", "BOOL", "U8", "F64", "XYZ", 7]))
    elif kind == "shape":
        entry["shape"] = draw(st.one_of(st.lists(st.integers(-2, 300), max_size=3), st.just([2**40, 2**40]),
                                        st.just("64")))
    elif kind == "offsets":
        s, e = entry["data_offsets"]
        entry["data_offsets"] = draw(st.sampled_from([[e, s], [s, e + 4], [0, len(body) + 8], [-1, e],
                                                      [s, s], [s, 2**63]]))
    else:
        del header[name]
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def run_main(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)  # an exception escaping here is a crash: the test fails with its traceback
    out, err = capsys.readouterr()
    return rc, out, err


def assert_handled(rc: int, err: str, ok: tuple[int, ...], file: str, argv: list[str]) -> None:
    assert rc in ok + (2,), f"{argv}: exit {rc}\n{err}"
    assert "Traceback" not in err, err
    if rc == 2:
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, f"{argv}: expected one error line\n{err}"
        assert file in errors[0], f"{argv}: the error does not name {file}: {errors[0]}"


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}
