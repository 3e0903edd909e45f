"""Inputs eyas reads as data, refused on one line naming what is wrong: a capture shard given as an
engine dump, devices and pipes, prompt paths that are not files, captures whose prompts cannot fit;
and `eval --json` printing JSON that parses where a depth has no positions."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from test_data import LAYERS, PROMPTS, WORDS, save_tiny_target

from eyas.cli import main
from eyas.data import Prompt, capture, read_prompts
from eyas.data.caches import detect_format, open_cache
from eyas.data.dumps import read_dump
from eyas.data.prompts import _prompts_from_records, check_prompts
from eyas.errors import EyasError, FormatError
from eyas.target import Target

pytestmark = pytest.mark.usefixtures("one_thread")
LONG = Prompt(" ".join(WORDS * 3), "long.txt line 1", "long.txt")  # > 64 tokens: the tiny target's context


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(target folder, draft folder, capture folder): 2 prompts, 4 answer tokens each, fp32."""
    root = tmp_path_factory.mktemp("inputs")
    folder = save_tiny_target(root / "target")
    assert main(["init", str(root / "draft"), "--target", str(folder), "--capture-layers", ",".join(map(str, LAYERS))
                 ]) == 0
    capture(Target.load(folder), PROMPTS[:2], LAYERS, root / "cap", max_new_tokens=4, dtype="float32", progress=False)
    return folder, root / "draft", root / "cap"


def error_line(capsys) -> str:
    """The one `error:` line a refused command printed (a traceback would fail here)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


# --- a shard is not a dump ----------------------------------------------------------------------


def test_a_capture_shard_is_refused_as_an_engine_dump(made, capsys):
    folder, draft, cap = made
    shard = cap / "shard_00000.safetensors"
    says = f"one shard of an eyas capture: pass its folder ({cap})"
    with pytest.raises(FormatError, match=r"one shard of an eyas capture: pass its folder"):
        read_dump(shard)
    with pytest.raises(FormatError, match=r"one shard of an eyas capture"):
        open_cache(shard, format="eyas-dump")  # a forced format is refused too
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(shard), "--target", str(folder), "--no-progress"]) == 2
    assert says in error_line(capsys)
    assert main(["doctor", str(draft), "--features", str(shard), "--target", str(folder), "--no-progress"]) == 2
    assert says in error_line(capsys)


# --- neither a file nor a folder ----------------------------------------------------------------


def test_a_device_or_a_pipe_is_not_read_as_data(made, tmp_path, capsys):
    folder, draft, _ = made
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for path in (Path("/dev/null"), pipe):
        with pytest.raises(FormatError, match="not a file or folder eyas reads"):
            detect_format(path)
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(pipe), "--target", str(folder), "--no-progress"]) == 2
    assert "not a file or folder eyas reads" in error_line(capsys)
    with pytest.raises(FormatError, match="not a regular file"):
        read_dump("/dev/null")  # a pipe too: refused before its read would block
    assert main(["eval", str(draft), "--data", str(tmp_path), "--data-format", "eyas-dump", "--target", str(folder),
                 "--no-progress"]) == 2  # a folder forced to be read as one dump
    assert f"{tmp_path}: not a regular file, so not a dump" in error_line(capsys)


# --- prompt paths --------------------------------------------------------------------------------


@pytest.mark.parametrize("source, says", [
    ("", "the prompt file is an empty path"),
    ("FOLDER", "is a folder, not a file"),
    ("/dev/null", "is not a regular file"),
    ("FOLDER/missing.txt", "does not exist"),
    ("FOLDER/loop.txt", r"is a link to nothing \(or to itself\)"),
])
def test_a_prompt_path_that_is_not_a_file_says_what_it_is(tmp_path, source, says):
    (tmp_path / "loop.txt").symlink_to("loop.txt")
    source = source.replace("FOLDER", str(tmp_path))
    for read in (read_prompts, check_prompts):
        with pytest.raises(FormatError, match=says) as e:
            read(source)
        assert "packaged sets" in e.value.hint


# --- prompts that do not fit ---------------------------------------------------------------------


def run_capture(folder: Path, out: Path, prompts, **kw):
    return capture(Target.load(folder), prompts, LAYERS, out, **{"dtype": "float32", "progress": False, **kw})


def test_max_length_caps_the_context_and_the_error_names_what_set_the_limit(made, tmp_path):
    folder = made[0]
    with pytest.raises(EyasError, match=r"it needs \d+ > 64, the context of ") as e:  # not raised to 1000
        run_capture(folder, tmp_path / "a", PROMPTS[:1], max_new_tokens=60, max_length=1000)
    room = 64 - int(str(e.value).split(" is ")[1].split()[0])  # the context less the templated prompt
    assert e.value.hint == f"lower --max-new-tokens to {room} or less"  # one prompt: nothing to drop
    with pytest.raises(EyasError) as e:
        run_capture(folder, tmp_path / "a", PROMPTS[:2], max_new_tokens=64)
    assert re.fullmatch(r"shorten or remove it, lower --max-new-tokens to \d+ or less, or drop such prompts "
                        r"\(capture: --skip-long\)", e.value.hint)
    with pytest.raises(EyasError, match=r"it needs \d+ > 10, the --max-length given"):
        run_capture(folder, tmp_path / "a", PROMPTS[:1], max_new_tokens=4, max_length=10)
    assert not (tmp_path / "a").exists()


def test_skip_long_that_skips_every_prompt_writes_nothing(made, tmp_path, capsys):
    folder = made[0]
    with pytest.raises(EyasError, match=r"all 2 prompts are too long: .* none fits in 64 tokens.*nothing to capture"):
        run_capture(folder, tmp_path / "a", [LONG, LONG], max_new_tokens=4, skip_long=True)
    assert not (tmp_path / "a").exists()
    src = tmp_path / "long.txt"
    src.write_text(LONG.text + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["capture", "--target", str(folder), "--prompts", str(src), "--out", str(tmp_path / "b"),
                 "--max-new-tokens", "4", "--skip-long", "--no-progress", "--capture-layers", "1,2,3"]) == 2
    assert "nothing to capture" in error_line(capsys)
    assert not (tmp_path / "b").exists()


# --- eval --json ---------------------------------------------------------------------------------


def _no_bare_constants(name: str) -> None:
    raise AssertionError(f"{name} is not JSON")


def test_eval_json_writes_null_where_a_depth_has_no_positions(made, capsys):
    folder, draft, cap = made
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(cap), "--target", str(folder), "--json", "--depth", "8",
                 "--dtype", "fp32", "--no-progress"]) == 0
    rep = json.loads(capsys.readouterr().out, parse_constant=_no_bare_constants)
    assert rep["acceptance_by_depth"][-1] is None  # 4 answer tokens: nothing reaches depth 8
    assert isinstance(rep["acceptance_by_depth"][0], float) and rep["tokens"] > 0


# --- a capture read once, as it was written --------------------------------------------------------


def _edited_copy(cap: Path, dst: Path, **changes) -> Path:
    dst.mkdir()
    for f in cap.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((cap / "manifest.json").read_text())
    (dst / "manifest.json").write_text(json.dumps({**manifest, **{k: v(manifest) for k, v in changes.items()}}))
    return dst


@pytest.mark.parametrize("field, change, says", [
    ("shards", lambda m: m["shards"] * 2, "lists shard_00000.safetensors twice"),
    ("generation", lambda m: None, "field 'generation' is None"),
    ("capture_layers", lambda m: m["capture_layers"][::-1], "strictly increasing"),
])
def test_a_manifest_that_would_count_samples_twice_or_misread_is_refused(made, tmp_path, capsys, field, change,
                                                                          says):
    target, draft, cap = made
    bad = _edited_copy(cap, tmp_path / "bad", **{field: change})
    assert main(["eval", str(draft), "--target", str(target), "--data", str(bad), "--no-progress"]) == 2
    line = error_line(capsys)
    assert str(bad / "manifest.json") in line and says in line, line


def test_a_capture_given_twice_is_refused(made, tmp_path, capsys):
    target, _, cap = made
    copy = _edited_copy(cap, tmp_path / "copy")
    for data in (f"{cap},{cap}", f"{cap},{copy}"):
        assert main(["train", "--data", data, "--out", str(tmp_path / "run"), "--target", str(target),
                     "--max-steps", "1", "--no-progress"]) == 2
        assert "pass each capture once" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_capture_layers_that_no_draft_reads_are_refused_before_capturing(made, tmp_path, capsys):
    target = made[0]
    for layers in ("1,1,2", "4,2,1"):
        assert main(["capture", "--prompts", "mtbench", "--limit", "1", "--target", str(target),
                     "--capture-layers", layers, "--out", str(tmp_path / "cap")]) == 2
        assert "strictly increasing" in error_line(capsys)
    assert not (tmp_path / "cap").exists()


def test_a_lone_surrogate_is_refused_naming_the_line_and_skipped_in_a_corpus(made, tmp_path, capsys):
    """JSON's \\ud800 escape decodes to no Unicode text; no tokenizer takes it."""
    target, draft, _ = made
    bad = tmp_path / "surrogate.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": "\\ud800 hello"}\n')
    assert main(["eval", str(draft), "--target", str(target), "--prompts", str(bad), "--no-progress"]) == 2
    assert "surrogate.jsonl line 2: character 1 ('\\ud800') is a lone surrogate" in error_line(capsys)
    assert main(["generate", "--prompt", "caf\udce9", "--target", str(target), str(draft)]) == 2
    assert error_line(capsys).startswith("error: --prompt: character 4")
    for blank in ("", " \n", "\u200b"):  # as a blank record in a prompt file (a zero-width space was answered)
        assert main(["generate", "--prompt", blank, "--target", str(target), str(draft)]) == 2
        assert error_line(capsys) == "error: --prompt is empty"
    records = [(1, {"prompt": "fine"}), (2, {"prompt": "\ud800"})]
    assert [p.text for p in _prompts_from_records(records, "corpus", "corpus", strict=False)] == ["fine"]


def test_eyas_warnings_print_as_one_warning_line(made, tmp_path, capsys):
    target, draft, cap = made
    partial = _edited_copy(cap, tmp_path / "partial", complete=lambda m: False)
    assert main(["eval", str(draft), "--target", str(target), "--data", str(partial), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"warning: {partial / 'manifest.json'}: the capture is incomplete (1 shards finished)")
    assert "UserWarning" not in err
