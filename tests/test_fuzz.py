"""Bad input, fuzzed: mutated configs, safetensors headers, prompt files, engine dumps and capture
shards never crash eyas.

Every case copies a valid tiny draft (both on-disk formats), mutates one thing (a config value's
type, a missing key, a wrong-length list, a huge or negative number, bad UTF-8, truncation; a
safetensors header's length prefix, JSON, dtype, shape or offsets; the file cut short), then runs
inspect, check, convert and eval on it through `eyas.cli.main`. Whatever the mutation, eyas either
accepts the input (a mutation can be harmless) or refuses it the documented way: exit 2, exactly
one `error:` line that names the file it could not use, no traceback (no exception leaves `main`),
nothing written, the input untouched. `check` may also exit 1 (problems found, as a report).

The run verbs' other inputs (the end of this file) are fuzzed the same way: prompt files (.txt, .json,
.jsonl: bad bytes, UTF-16/32, deep nesting, huge lines, empty records, truncation), engine dumps for
`doctor --features` (NaN/Inf, ids outside the vocabulary, lengths and widths that disagree) and the
shards and manifest of a capture for `eval --data`; prompt files and dumps are refused before any
model loads (eyas.cli.preflight).

Hypothesis runs derandomized, so CI sees the same few hundred cases on every machine.
"""

from __future__ import annotations

import codecs
import copy
import hashlib
import json
import math
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save

from eyas.cli import main
from eyas.data import capture
from eyas.target import Target
from test_data import LAYERS, PROMPTS, save_tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")

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


# --- mutations -------------------------------------------------------------------------------------

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


# --- running eyas on a mutated copy ------------------------------------------------------------------


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _mutated_copy(world: dict, fmt: str, case: Path, file: str, data: bytes) -> Path:
    if case.exists():
        shutil.rmtree(case)
    shutil.copytree(world[fmt], case)
    (case / file).write_bytes(data)
    return case


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)  # an exception escaping here is a crash: the test fails with its traceback
    out, err = capsys.readouterr()
    return rc, out, err


def _assert_handled(rc: int, err: str, ok: tuple[int, ...], file: str, argv: list[str]) -> None:
    assert rc in ok + (2,), f"{argv}: exit {rc}\n{err}"
    assert "Traceback" not in err, err
    if rc == 2:
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, f"{argv}: expected one error line\n{err}"
        assert file in errors[0], f"{argv}: the error does not name {file}: {errors[0]}"


def _exercise(world: dict, case: Path, file: str, capsys) -> None:
    before = _digest(case)
    for argv, ok in (
        (["inspect", str(case), "--json"], (0,)),
        (["check", str(case), "--json", "--target", str(world["target"])], (0, 1)),
        (["eval", str(case), "--target", str(world["target"]), "--data", str(world["shards"]), "--json",
          "--depth", "2", "--dtype", "fp32", "--no-progress"], (0,)),
    ):
        rc, out, err = _run(argv, capsys)
        _assert_handled(rc, err, ok, file, argv)
        if rc in (0, 1):
            json.loads(out)
    dst = case.parent / f"{case.name}-converted"
    shutil.rmtree(dst, ignore_errors=True)
    argv = ["convert", str(case), str(dst), "--format", "eagle"]
    rc, _, err = _run(argv, capsys)
    _assert_handled(rc, err, (0,), file, argv)
    if rc != 0:
        assert not dst.exists(), "a refused convert left its output behind"
    leftovers = [p.name for p in case.parent.iterdir() if p.name.startswith(".")]
    assert not leftovers, f"temp files left behind: {leftovers}"
    assert _digest(case) == before, "the input was modified"


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_mutated_configs_are_read_or_refused_cleanly(world, fmt, data, capsys):
    cfg = json.loads((world[fmt] / "config.json").read_text())
    mutated = data.draw(config_mutation(cfg))
    case = _mutated_copy(world, fmt, world["root"] / f"case-{fmt}", "config.json", mutated)
    _exercise(world, case, "config.json", capsys)


@pytest.mark.parametrize("fmt", FORMATS)
@FUZZ
@given(data=st.data())
def test_mutated_safetensors_are_read_or_refused_cleanly(world, fmt, data, capsys):
    raw = (world[fmt] / "model.safetensors").read_bytes()
    mutated = data.draw(safetensors_mutation(raw))
    case = _mutated_copy(world, fmt, world["root"] / f"case-st-{fmt}", "model.safetensors", mutated)
    _exercise(world, case, "model.safetensors", capsys)


def test_the_fuzzer_reaches_both_outcomes(world, capsys):
    """The cases above are not all harmless: a known-bad and a known-good input behave as documented."""
    case = _mutated_copy(world, "eagle", world["root"] / "sanity", "model.safetensors", b"\x00" * 5)
    rc, _, err = _run(["inspect", str(case)], capsys)
    assert rc == 2 and "model.safetensors" in err
    assert _run(["inspect", str(world["eagle"])], capsys)[0] == 0


@pytest.mark.parametrize(
    ("edit", "also"),
    [
        (lambda c: c.update(hidden_act="tanh"), "hidden_act"),  # read fine; the drafter implements no tanh
        (lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "dynamic"),
        (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 9]), "does not fit"),  # past the target
        (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 3]), "manifest.json"),  # not the data's
    ],
)
def test_errors_found_after_reading_name_the_config(world, capsys, edit, also):
    """What only the drafter, the target or the data can refuse still names the draft's config file."""
    cfg = json.loads((world["eagle"] / "config.json").read_text())
    edit(cfg)
    case = _mutated_copy(world, "eagle", world["root"] / "after-reading", "config.json", json.dumps(cfg).encode())
    rc, _, err = _run(["eval", str(case), "--target", str(world["target"]), "--data", str(world["shards"]),
                       "--dtype", "fp32", "--no-progress"], capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1, err
    assert str(case / "config.json") in errors[0] and also in errors[0], errors[0]


# --- the run verbs' other inputs: prompt files, engine dumps, capture shards -------------------------
#
# Each case is one mutation of a valid input; `must` says whether it has to be refused (a NUL byte, a
# NaN, an id past the vocabulary) or may turn out harmless (random bytes that decode as text, a header
# edit safetensors accepts). Refused means exit 2, one `error:` line naming the file, before any model
# loads (loading raises `Reached`: an accepted input gets that far, a refused one never does).

INPUT_FUZZ = settings(FUZZ, max_examples=int(os.environ.get("EYAS_FUZZ_INPUT_EXAMPLES", "100")))
SMALL_LINE = 2000  # eyas.data.textfile.MAX_LINE_CHARS while fuzzing: huge lines stay cheap to write
VOCAB = 48  # the tiny target's (test_data.save_tiny_target)


class Reached(Exception):
    """A model load: the input passed every check before it."""


@pytest.fixture
def no_loading(monkeypatch):
    import eyas.data.textfile

    def reached(*a, **k):
        raise Reached

    monkeypatch.setattr(Target, "load", classmethod(reached))
    monkeypatch.setattr(eyas.data.textfile, "MAX_LINE_CHARS", SMALL_LINE)


def _refused_or_reached(argv: list[str], capsys, file: str, must: bool, ok: tuple[int, ...] = ()) -> int | None:
    """Run one verb; a refusal must be the documented one. Returns the exit code (None: reached a load)."""
    try:
        rc = main(argv)
    except Reached:
        assert not must, f"{argv}: a bad input reached a model load"
        capsys.readouterr()
        return None
    out, err = capsys.readouterr()
    _assert_handled(rc, err, ok if not must else (), file, argv)
    assert rc == 2 or not must, f"{argv}: exit {rc} on a bad input\n{err}"
    if rc in (0, 1) and "--json" in argv:
        json.loads(out)
    return rc


def _render(suffix: str, records: list) -> str:
    if suffix == ".txt":
        return "".join(f"{r}\n" for r in records)
    if suffix == ".jsonl":
        return "".join((r if isinstance(r, str) and r.startswith("{") else json.dumps(r)) + "\n" for r in records)
    return "[\n" + ",\n".join(r if isinstance(r, str) and r.startswith("{") else json.dumps(r) for r in records) + "\n]"


EMPTY_RECORDS = [{}, {"prompt": ""}, {"prompt": "  "}, None, [], {"conversations": []}, 3, "a string",
                 {"messages": [{"role": "assistant", "content": "no user turn"}]}, {"turns": []}, {"prompt": 7}]
BAD_BYTES = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80", b"\xf8\x88\x80\x80\x80", b"\x00", b"\xe2\x82"]


@st.composite
def prompt_mutation(draw, suffix: str) -> tuple[bytes, bool]:
    """(a prompt file's bytes after one mutation, whether it must be refused)."""
    records: list = list(PROMPTS) if suffix == ".txt" else \
        [{"prompt": p} if i % 2 else {"conversations": [{"from": "human", "value": p}]} for i, p in enumerate(PROMPTS)]
    kinds = ["byte", "utf32", "utf16", "huge", "empty", "random"] + (["deep", "truncate", "number"] if suffix != ".txt"
                                                                        else [])
    kind = draw(st.sampled_from(kinds))
    at = draw(st.integers(0, len(records)))
    if kind == "huge":
        long = "x" * draw(st.integers(SMALL_LINE + 1, 3 * SMALL_LINE))
        records.insert(at, long if suffix == ".txt" else {"prompt": long})
    elif kind == "empty":
        if suffix == ".txt":
            return draw(st.sampled_from([b"", b"\n", b"  \n\t\n", b"\r\n\r\n"])), True
        records.insert(at, draw(st.sampled_from(EMPTY_RECORDS)))
    elif kind == "deep":
        depth = draw(st.sampled_from([3000, 60_000]))
        records.insert(at, '{"prompt": ' + "[" * depth + "]" * depth + "}")
    elif kind == "number":
        records.insert(at, '{"prompt": 1' + "0" * draw(st.integers(4400, 6000)) + "}")
    text = _render(suffix, records)
    raw = text.encode()
    if kind == "byte":
        i = draw(st.integers(0, len(raw)))
        return raw[:i] + draw(st.sampled_from(BAD_BYTES)) + raw[i:], True
    if kind == "utf32":
        return codecs.BOM_UTF32_LE + text.encode("utf-32-le"), True
    if kind == "utf16":
        body = text.encode("utf-16-le")
        i = 2 * draw(st.integers(0, len(text)))
        stray = draw(st.sampled_from([b"\x00\xdc", b"\x00\xd8"]))  # a lone surrogate (a high one ends the text)
        return codecs.BOM_UTF16_LE + (body + b"A" if draw(st.booleans()) else body[:i] + stray + body[i:]), True
    if kind == "truncate":  # inside the last record: never valid JSON
        start = text.rstrip().rfind("\n") + 2 if suffix == ".jsonl" else 2
        return raw[: draw(st.integers(start, len(raw.rstrip()) - 2))], True
    if kind == "random":
        return draw(st.binary(min_size=1, max_size=64)), False
    return raw, True


def _unchanged_and_nothing_written(case: Path, before: str, out: Path) -> None:
    assert hashlib.sha256(case.read_bytes()).hexdigest() == before, "the input was modified"
    assert not out.exists(), "a refused command wrote its output"
    leftovers = [p.name for p in case.parent.iterdir() if p.name.startswith(".")]
    assert not leftovers, f"temp files left behind: {leftovers}"


@pytest.mark.parametrize("suffix", [".txt", ".json", ".jsonl"])
@INPUT_FUZZ
@given(data=st.data())
def test_mutated_prompt_files_are_refused_before_any_model_loads(world, no_loading, suffix, data, capsys):
    raw, must = data.draw(prompt_mutation(suffix))
    folder = world["root"] / f"prompts{suffix}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    case, out = folder / f"prompts{suffix}", folder / "out"
    case.write_bytes(raw)
    before = hashlib.sha256(raw).hexdigest()
    t, d = str(world["target"]), str(world["eagle"])
    argv = data.draw(st.sampled_from([  # one verb a case (test_preflight runs every verb on each kind)
        ["capture", "--prompts", str(case), "--out", str(out), "--target", t, "--no-progress"],
        ["eval", d, "--prompts", str(case), "--target", t, "--no-progress"],
        ["doctor", d, "--prompts", str(case), "--target", t, "--no-progress"],
        ["bench", d, "--prompts", str(case), "--target", t, "--no-progress"]]))
    _refused_or_reached(argv, capsys, case.name, must)
    _unchanged_and_nothing_written(case, before, out)


@st.composite
def dump_mutation(draw, ids: torch.Tensor, feats: torch.Tensor) -> tuple[bytes, bool]:
    """(an engine dump's bytes after one mutation, whether it must be refused)."""
    T, W = feats.shape
    kind = draw(st.sampled_from(["header", "nonfinite", "ids", "rows", "width", "short", "dtype", "missing", "vllm"]))
    t = {"input_ids": ids.clone(), "features": feats.clone()}
    if kind == "header":
        return draw(safetensors_mutation(save(t))), False
    i, j = draw(st.integers(0, T - 1)), draw(st.integers(0, W - 1))
    if kind in ("nonfinite", "vllm"):
        t["features"][i, j] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    if kind == "ids":
        t["input_ids"][i] = draw(st.sampled_from([-1, -(2**40), VOCAB, 10**6]))
    elif kind == "rows":
        t["features"] = torch.cat([feats, feats[:1]]) if draw(st.booleans()) else feats[:-1].clone()
    elif kind == "width":
        t["features"] = feats[:, : draw(st.integers(1, W - 1).filter(lambda w: w % 32))].clone()
    elif kind == "short":
        n = draw(st.integers(0, 3))
        t = {k: v[:n].clone() for k, v in t.items()}
    elif kind == "dtype":
        key, dtype = draw(st.sampled_from([("input_ids", torch.float32), ("input_ids", torch.bool),
                                           ("features", torch.int32), ("features", torch.bool)]))
        t[key] = t[key].to(dtype)
    elif kind == "missing":
        del t[draw(st.sampled_from(sorted(t)))]
    elif kind == "vllm":  # ExampleHiddenStatesConnector's names, [T, L, H], with a NaN or a flat shape
        flat = draw(st.booleans())
        t = {"token_ids": t["input_ids"], "hidden_states": t["features"] if flat else t["features"].view(T, 3, 32)}
        if flat:
            t["hidden_states"] = feats.reshape(-1).clone()
    return save(t), True


def test_dump_fuzzer_base_case_is_accepted(world, no_loading, capsys):
    """The dump every mutation starts from passes the checks (and so reaches the target's load)."""
    ids, feats = _dump_base()
    case = world["root"] / "dump-ok.safetensors"
    case.write_bytes(save({"input_ids": ids, "features": feats}))
    with pytest.raises(Reached):
        main(["doctor", str(world["eagle"]), "--features", str(case), "--target", str(world["target"])])


def _dump_base() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, VOCAB, (8,), generator=g), torch.randn(8, 3 * 32, generator=g)


@INPUT_FUZZ
@given(data=st.data())
def test_mutated_engine_dumps_are_refused_before_the_target_loads(world, no_loading, data, capsys):
    raw, must = data.draw(dump_mutation(*_dump_base()))
    folder = world["root"] / "dumps"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    case = folder / "dump.safetensors"
    case.write_bytes(raw)
    before = hashlib.sha256(raw).hexdigest()
    _refused_or_reached(["doctor", str(world["eagle"]), "--features", str(case), "--target", str(world["target"]),
                         "--no-progress"], capsys, case.name, must, ok=(0, 1))
    _unchanged_and_nothing_written(case, before, folder / "out")


@st.composite
def shard_mutation(draw, shard: Path, manifest: dict) -> tuple[str, bytes, bool]:
    """(the file mutated, its bytes, whether it must be refused): the shard's header or numbers, its
    metadata, or the manifest."""
    kind = draw(st.sampled_from(["header", "nonfinite", "ids", "prompt_index", "offsets", "entry", "manifest"]))
    if kind == "manifest":
        return "manifest.json", draw(config_mutation(manifest)), False
    raw = shard.read_bytes()
    if kind == "header":
        return shard.name, draw(safetensors_mutation(raw)), False
    with safe_open(shard, "pt") as f:
        t, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    T = t["input_ids"].shape[0]
    i = draw(st.integers(0, T - 1))
    if kind == "nonfinite":
        key = draw(st.sampled_from(["features", "last_hidden"]))
        t[key][i, draw(st.integers(0, t[key].shape[1] - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    elif kind == "ids":
        t["input_ids"][i] = draw(st.sampled_from([-1, VOCAB, 2**40]))
    elif kind == "prompt_index":
        t["prompt_index"][draw(st.integers(0, len(t["prompt_index"]) - 1))] = draw(st.sampled_from([-1, 2, 10**9]))
    elif kind == "offsets":
        o = t["offsets"]
        o[draw(st.integers(0, len(o) - 1))] = draw(st.sampled_from([-1, 0, T + 1, 2**40]))
        if bool((o.diff() > 0).all()) and o[0] == 0 and o[-1] == T:  # the edit happened to be a no-op
            o[-1] = T + 1
    else:
        meta = {**meta, "entry": draw(st.sampled_from(["{broken", "[]", '{"samples": "2"}', json.dumps(
            {**json.loads(meta["entry"]), "tokens": T + 1})]))}
    return shard.name, save(t, metadata=meta), True


@INPUT_FUZZ
@given(data=st.data())
def test_mutated_shards_are_read_or_refused_cleanly(world, data, capsys):
    src = world["shards"]
    manifest = json.loads((src / "manifest.json").read_text())
    name, raw, must = data.draw(shard_mutation(src / "shard_00000.safetensors", manifest))
    case = world["root"] / "shards-case"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(src, case)
    (case / name).write_bytes(raw)
    before = _digest(case)
    argv = ["eval", str(world["eagle"]), "--target", str(world["target"]), "--data", str(case), "--json",
            "--depth", "2", "--dtype", "fp32", "--no-progress"]
    _refused_or_reached(argv, capsys, name, must, ok=(0,))
    assert _digest(case) == before, "the input was modified"
    leftovers = [p.name for p in case.parent.iterdir() if p.name.startswith(".")]
    assert not leftovers, f"temp files left behind: {leftovers}"
