"""The run verbs' other inputs, fuzzed: prompt files (.txt, .json, .jsonl: bad bytes, UTF-16/32, deep
nesting, huge lines, empty records, truncation), engine dumps for `doctor --features` (NaN/Inf, ids
outside the vocabulary, lengths and widths that disagree) and the shards and manifest of a capture
for `eval --data`. A refusal is the documented one (tests/fuzzing.py: exit 2, one `error:` line
naming the file, no traceback); prompt files and dumps are refused before any model loads
(eyas.cli.preflight), and inputs are never modified.

Hypothesis runs derandomized, so CI sees the same cases on every machine.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save

from eyas.cli import main
from eyas.target import Target
from fuzzing import FUZZ, assert_handled, config_mutation, digest, safetensors_mutation, world  # noqa: F401
from test_data import PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")


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
    assert_handled(rc, err, ok if not must else (), file, argv)
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
        main(["doctor", str(world["eagle"]), "--features", str(case), "--target", str(world["target"]),
              *_fitting_prompts(world)])


def _fitting_prompts(world) -> list[str]:
    """--prompts and --max-new-tokens that fit the tiny target's context: with a dump the doctor also answers
    prompts, and MT-bench's do not fit in 64 tokens (refused up front, before the load the fuzzers reach)."""
    path = world["root"] / "short-prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return ["--prompts", str(path), "--max-new-tokens", "8"]


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
                         "--no-progress", *_fitting_prompts(world)], capsys, case.name, must, ok=(0, 1))
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
    before = digest(case)
    argv = ["eval", str(world["eagle"]), "--target", str(world["target"]), "--data", str(case), "--json",
            "--depth", "2", "--dtype", "fp32", "--no-progress"]
    _refused_or_reached(argv, capsys, name, must, ok=(0,))
    assert digest(case) == before, "the input was modified"
    leftovers = [p.name for p in case.parent.iterdir() if p.name.startswith(".")]
    assert not leftovers, f"temp files left behind: {leftovers}"
