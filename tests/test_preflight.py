"""Every verb refuses bad flags and bad input files before it loads a target or a draft
(eyas.cli.preflight): the `error:` line comes first on stderr, exit 2, and nothing is loaded.

Loading is made impossible here (`Target.load`, the target's weights and the draft reader raise
AssertionError), so a check that happened only after a load fails the test with that error instead
of passing late. A tiny random target and a draft for it make the command lines real.
"""

from __future__ import annotations

import codecs
import importlib
import json
import pkgutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from test_data import LAYERS, PROMPTS, save_tiny_target

import cache_writers

import eyas.data.textfile as textfile
from eyas.cli import build_parser, main, preflight
from eyas.errors import EyasError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("preflight")
    target = save_tiny_target(root / "target")
    draft = root / "draft"
    assert main(["init", str(draft), "--target", str(target), "--capture-layers", ",".join(map(str, LAYERS))]) == 0
    good = root / "good.jsonl"
    good.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {"root": root, "target": target, "draft": draft, "prompts": good}


@pytest.fixture
def no_loading(monkeypatch):
    """Any load of a target or a draft fails the test. Every eyas module is imported first and the
    loaders are replaced in each module that imported them by name: a module first imported while they
    were replaced would otherwise keep the replacement for the rest of the session, and one imported
    before would keep the real loader out of this guard."""
    import eyas.drafter_loading
    import eyas.formats
    import eyas.target

    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    for info in pkgutil.walk_packages(eyas.__path__, "eyas."):
        if info.name != "eyas.__main__":  # running it would run the CLI
            importlib.import_module(info.name)
    monkeypatch.setattr(eyas.target.Target, "load", classmethod(refuse))
    monkeypatch.setattr(eyas.target.TargetRef, "tensors", refuse)
    loaders = {getattr(eyas.drafter_loading, n) for n in ("load_drafter", "load_drafter_and_config")}
    loaders.add(eyas.formats.read_checkpoint)
    for module in [m for name, m in sys.modules.items() if name == "eyas" or name.startswith("eyas.")]:
        for name, value in list(vars(module).items()):
            if any(value is f for f in loaders):
                monkeypatch.setattr(module, name, refuse)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def refused(capsys, argv: list[str], *names: str) -> str:
    """Run; assert exit 2 with the error first, one `error:` and one `hint:` line naming `names`."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert lines and lines[0].startswith("error:"), err  # before any progress bar or log line
    assert sum(x.startswith("error:") for x in lines) == 1 and sum(x.startswith("hint:") for x in lines) == 1, err
    assert "Traceback" not in err
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def bad_prompt_files(root: Path) -> dict[str, tuple[Path, str]]:
    """Prompt files each reader must refuse, with what the error says."""
    deep = b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n"
    return {
        "binary": (write(root / "binary.txt", b"hello\n\x89PNG\r\n\x1a\n\x00\x00"), "byte 6"),
        "nul": (write(root / "nul.txt", b"hello\x00world\n"), "byte 5: a NUL byte"),
        "latin1": (write(root / "latin1.jsonl", '{"prompt": "caf\xe9"}\n'.encode("latin-1")), "byte 15"),
        "utf32": (write(root / "utf32.txt", codecs.BOM_UTF32_LE + "hi\n".encode("utf-32-le")), "UTF-32"),
        "odd utf16": (write(root / "odd.txt", codecs.BOM_UTF16_LE + "hi\n".encode("utf-16-le") + b"x"), "byte 8"),
        "deep": (write(root / "deep.jsonl", deep), "nested too deeply"),
        "deep array": (write(root / "deep.json", b"[" + deep[:-1] + b"]"), "nested too deeply"),
        "empty record": (write(root / "empty.jsonl", b'{"prompt": "hi"}\n{}\n'), "line 2: no usable prompt"),
        # MT-bench records said "no usable prompt (found ['turns'])", the hint naming `turns` as the way out
        "turns": (write(root / "turns.jsonl", b'{"turns": ["hi"]}\n{"turns": [5]}\n'), "line 2: `turns[0]` is int"),
        "no turns": (write(root / "noturns.jsonl", b'{"turns": []}\n'), "line 1: `turns` is empty"),
        "empty file": (write(root / "empty.txt", b"\n \n"), "no prompts found"),
        "missing": (root / "missing.txt", "does not exist"),
    }


@pytest.mark.parametrize("kind", ["binary", "nul", "latin1", "utf32", "odd utf16", "deep", "deep array",
                                  "empty record", "turns", "no turns", "empty file", "missing"])
def test_bad_prompt_files_are_refused_before_any_model_loads(world, capsys, no_loading, kind):
    path, says = bad_prompt_files(world["root"])[kind]
    t, d = world["target"], world["draft"]
    out = world["root"] / "never-written"
    for argv in (
        ["capture", "--prompts", path, "--out", out, "--target", t, "--no-progress"],
        ["eval", d, "--prompts", path, "--target", t, "--no-progress"],
        ["doctor", d, "--prompts", path, "--target", t, "--no-progress"],
        ["bench", d, "--prompts", path, "--target", t, "--no-progress"],
        ["serve-check", d, "--prompts", path, "--target", t, "--no-progress"],
    ):
        refused(capsys, argv, path.name, says)
    assert not out.exists()


def test_bench_keeps_the_hint_that_mends_a_prompt_files_content(world, capsys, no_loading):
    """bench replaced every prompt-file hint with its list of sets: a file in Latin-1 lost "save prompts as UTF-8"."""
    path, _ = bad_prompt_files(world["root"])["latin1"]
    hints = []
    for verb in ("eval", "bench"):
        assert main([verb, str(world["draft"]), "--prompts", str(path), "--target", str(world["target"])]) == 2
        hints.append(capsys.readouterr().err.splitlines()[-1])
    assert hints[0] == hints[1] and hints[0].startswith("hint: save prompts as UTF-8 text")


def test_text_in_utf8_with_bom_and_utf16_is_read(world, tmp_path):
    from eyas.data import read_prompts

    text = "héllo wörld\r\nsecond ☃\n"
    for name, data in (("bom8.txt", codecs.BOM_UTF8 + text.encode()),
                       ("le.txt", codecs.BOM_UTF16_LE + text.encode("utf-16-le")),
                       ("be.txt", codecs.BOM_UTF16_BE + text.encode("utf-16-be")),
                       ("le.jsonl", codecs.BOM_UTF16_LE + '{"prompt": "héllo"}\n'.encode("utf-16-le")),
                       ("bom.json", codecs.BOM_UTF8 + b'[{"prompt": "h\xc3\xa9llo"}]')):
        got = [p.text for p in read_prompts(write(tmp_path / name, data))]
        assert got[0] == "héllo wörld" if name.endswith(".txt") else got == ["héllo"], (name, got)


def test_a_huge_line_is_refused_naming_it(world, tmp_path, capsys, no_loading, monkeypatch):
    monkeypatch.setattr(textfile, "MAX_LINE_CHARS", 1000)
    for name, data in (("long.txt", b"short\n" + b"x" * 5000 + b"\n"),
                       ("long.jsonl", b'{"prompt": "a"}\n{"prompt": "' + b"x" * 5000 + b'"}\n'),
                       ("long.json", b'[{"prompt": "a"},\n {"prompt": "' + b"x" * 5000 + b'"}]')):
        path = write(tmp_path / name, data)
        refused(capsys, ["eval", world["draft"], "--prompts", path, "--target", world["target"]],
                name, "line 2: longer than 1,000 characters")


def dump(path: Path, ids: torch.Tensor, feats: torch.Tensor) -> Path:
    save_file({"input_ids": ids.contiguous(), "features": feats.contiguous()}, path)
    return path


def test_bad_dumps_are_refused_before_the_target_loads(world, tmp_path, capsys, no_loading):
    T, W = 8, 3 * 32
    ids, feats = torch.arange(4, 4 + T), torch.randn(T, W)
    nan = feats.clone()
    nan[5, 7] = float("nan")
    cases = {
        write(tmp_path / "empty.safetensors", b""): "not a readable safetensors file",
        dump(tmp_path / "nan.safetensors", ids, nan): "features[5, 7] is nan",
        dump(tmp_path / "inf.safetensors", ids, feats.clamp(max=1).index_fill(0, torch.tensor([2]), float("inf"))):
            "features[2, 0] is inf (and 95 more)",
        dump(tmp_path / "vocab.safetensors", ids.index_fill(0, torch.tensor([3]), 999), feats): "input_ids[3] is 999",
        dump(tmp_path / "negative.safetensors", ids.index_fill(0, torch.tensor([0]), -1), feats): "input_ids[0] is -1",
        dump(tmp_path / "width.safetensors", ids, feats[:, :40]): "not a multiple of the target's hidden size 32",
        dump(tmp_path / "short.safetensors", ids[:2], feats[:2]): "at least 4",
    }
    for path, says in cases.items():
        refused(capsys, ["doctor", world["draft"], "--features", path, "--target", world["target"]], path.name, says)
        if path.name != "empty.safetensors":  # eval --data reads them as the doctor does (it found them under its bar)
            refused(capsys, ["eval", world["draft"], "--data", path, "--target", world["target"]], path.name, says)
    weights = world["target"] / "model.safetensors"  # named by a few of its tensors, not all (an 11 KB line)
    err = refused(capsys, ["eval", world["draft"], "--data", weights, "--target", world["target"]],
                  "not an engine dump (input_ids, features): it holds")
    assert err.splitlines()[0].endswith(" more") and len(err.splitlines()[0]) < 400


@pytest.mark.parametrize(("argv", "says"), [
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens 0: must be >= 1"),
    (["generate", "--prompt", "hi", "--draft-tokens", "-2"], "--draft-tokens -2"),
    (["generate", "--prompt", "hi", "--top-p", "0"], "--top-p 0.0"),
    (["generate", "--prompt", "hi", "--temperature", "nan"], "--temperature nan"),
    (["generate", "--prompt", "hi", "--tree", "5,0,16"], "--tree 5,0,16: expected"),
    (["bench", "--tree", "3,4,2"], "--tree 3,4,2: a budget of 2 nodes keeps none past depth 2"),
    (["bench", "--limit", "-1"], "--limit -1"),
    (["bench", "--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["eval", "--limit", "0"], "--limit 0"),
    (["eval", "--depth", "0"], "--depth 0"),
    (["doctor", "--limit", "-3"], "--limit -3"),
    (["eval", "--prompts", "mtbench", "--against", ""], "--against is empty"),  # Path("") is the current folder
    (["doctor", "--limit", str(2**64)], f"--limit {2**64}: must be at most {2**63 - 1}"),  # islice crashed
    (["eval", "--limit", str(2**64)], f"--limit {2**64}: must be at most"),
    (["capture", "--out", "OUT", "--skip", str(2**63)], f"--skip {2**63}: must be at most"),
    (["doctor", "--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["serve-check", "--limit", "0"], "--limit 0"),
    (["serve-check", "--prompts", "no-such-prompts.txt"], "no-such-prompts.txt does not exist"),
    (["serve-check", "--max-new-tokens", "1"], "--max-new-tokens 1: must be >= 2"),
    (["serve-check", "--temperature", "-0.5"], "--temperature -0.5: must be a number >= 0"),
    (["capture", "--out", "OUT", "--limit", "-1"], "--limit -1"),
    (["capture", "--out", "OUT", "--skip", "-1"], "--skip -1"),
    (["capture", "--out", "OUT", "--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["capture", "--out", "OUT", "--capture-layers", "1,-2"], "--capture-layers 1,-2"),
    (["capture", "--out", "OUT", "--batch-size", "0"], "--batch-size 0"),
    (["capture", "--out", "OUT", "--temperature", "1", "--seed", str(2**64)], "--seed 18446744073709551616"),
    (["generate", "--prompt", "hi", "--seed", "-1"], "--seed -1: must be from 0"),
    (["generate", "--prompt", "hi", "--draft-tokens", "4", "--tree", "3,2,4"], "--draft-tokens 4 and --tree 3,2,4"),
    (["bench", "--plot", "OUT.txt"], "matplotlib writes no .txt files"),
    (["eval", "--plot", "OUT.txt"], "matplotlib writes no .txt files"),
    (["eval", "--plot", "/proc/x.png"], "cannot write into /proc"),  # os.access says yes to root
    (["bench", "--prompts", "copy,"], "prompts 'copy,': an empty name (a comma too many?)"),
    (["generate", "--prompt", "hi", "--draft-tokens", "100000000"], "--draft-tokens 100000000: not below the "
                                                                     "target's context of 64 tokens"),
    (["generate", "--prompt", "hi", "--tree", "6,4,64"], "--tree budget 64: not below the target's context"),
    (["eval", "--prompts", "mtbench", "--max-new-tokens", "64"], "--max-new-tokens 64: not below the target's "
                                                                  "context of 64 tokens"),
    (["capture", "--out", "OUT", "--capture-layers", "1,2,3", "--max-new-tokens", "100"], "--max-new-tokens 100: "
                                                                                         "not below"),
    (["bench", "--tree", "2,48,4"], "--tree top_k 48: not below the target's vocabulary of 48"),
    (["eval", "--depth", "1000"], "--depth 1000: not below the target's context of 64"),
    (["serve-check", "--draft-tokens", "64"], "--draft-tokens 64: not below"),
])
def test_bad_flags_are_refused_before_any_model_loads(world, capsys, no_loading, argv, says):
    argv = [a.replace("OUT", str(world["root"] / "never-written")) for a in argv]
    verb, rest = argv[0], argv[1:]
    drafter = [] if verb in ("capture",) else [str(world["draft"])]
    prompts = ["--prompts", str(world["prompts"])] if verb in ("capture", "serve-check") and "--prompts" not in rest \
        else []
    refused(capsys, [verb, *drafter, *rest, *prompts, "--target", str(world["target"])], says)
    assert not list(world["root"].glob("never-written*"))


def test_a_hint_never_suggests_a_value_that_is_refused_in_turn():
    """--tree 8192,4,24 was told "e.g. --tree 8192,4,16384", itself refused (past any context)."""
    from eyas.decode.loop import tree_shape

    for tree, suggested in (((3, 4, 2), "--tree 3,4,6"), ((8192, 4, 24), "--tree 5,4,16 ")):
        with pytest.raises(EyasError) as e:
            tree_shape(tree, "--tree")
        assert suggested in e.value.hint
        tree_shape([int(v) for v in suggested.split()[1].split(",")], "--tree")  # the suggestion holds


def test_bad_data_and_outputs_are_refused_before_any_model_loads(world, tmp_path, capsys, no_loading):
    t, d = str(world["target"]), str(world["draft"])
    a_file = write(tmp_path / "a-file", b"x")
    refused(capsys, ["eval", d, "--data", tmp_path / "nowhere", "--target", t], "nowhere does not exist")
    broken = tmp_path / "broken"
    broken.mkdir()
    write(broken / "manifest.json", b'{"format": "eyas-capture", "format_version": 1}')
    refused(capsys, ["eval", d, "--data", broken, "--target", t], "manifest.json", "field 'target'")
    refused(capsys, ["eval", d, "--prompts", world["prompts"], "--plot", tmp_path / "no" / "x.png", "--target", t],
            "does not exist (--plot)")
    refused(capsys, ["eval", d, "--prompts", world["prompts"], "--plot", a_file / "x.png", "--target", t],
            f"{a_file} is a file, not a folder (--plot)")
    if Path("/dev/null").exists():  # a run as root renamed its plot over the device node
        refused(capsys, ["eval", d, "--prompts", world["prompts"], "--plot", "/dev/null", "--target", t],
                "/dev/null is not a regular file")
    refused(capsys, ["capture", "--prompts", world["prompts"], "--out", a_file, "--target", t],
            "a-file is a file, not a folder")
    refused(capsys, ["train", "--data", tmp_path / "nowhere", "--out", tmp_path / "run", "--target", t],
            "nowhere does not exist")
    refused(capsys, ["doctor", d, "--prompts", world["prompts"], "--features", broken, "--target", t],
            "(a feature cache) both given", "measures the cache's own samples")
    refused(capsys, ["train", "--data", broken, "--out", tmp_path / "run", "--target", t, "--epochs", "0"],
            "--epochs 0")
    assert not (tmp_path / "run").exists()


def test_a_cache_format_named_for_a_dump_file_is_refused(world, tmp_path, capsys, no_loading):
    (tmp_path / "dump.safetensors").write_bytes(b"x")
    refused(capsys, ["doctor", str(world["draft"]), "--features", str(tmp_path / "dump.safetensors"), "--data-format",
                     "specforge", "--target", str(world["target"])], "--data-format specforge reads a feature cache")


def test_train_data_that_is_a_file_is_named_a_file(world, tmp_path, capsys, no_loading):
    (tmp_path / "afile").write_text("x")
    refused(capsys, ["train", "--data", str(tmp_path / "afile"), "--out", str(tmp_path / "run"), "--target",
                     str(world["target"])], "afile is a file, not a folder written by `eyas capture`")


def test_a_capture_is_not_written_among_a_drafts_files(world, tmp_path, capsys, no_loading):
    """Shards beside a draft's config and weights made the folder both a draft and a feature cache."""
    import shutil

    shutil.copytree(world["draft"], tmp_path / "draft")
    before = sorted(p.name for p in (tmp_path / "draft").iterdir())
    refused(capsys, ["capture", "--prompts", str(world["prompts"]), "--out", str(tmp_path / "draft"), "--target",
                     str(world["target"])],
            "is a draft's, a model's or a training run's folder (config.json, model.safetensors)")
    assert sorted(p.name for p in (tmp_path / "draft").iterdir()) == before
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "train_log.jsonl").write_text("")
    refused(capsys, ["capture", "--prompts", str(world["prompts"]), "--out", str(tmp_path / "run" / "checkpoints"),
                     "--target", str(world["target"])], "a training run's folder")


def test_no_output_overwrites_an_input(world, tmp_path, capsys, no_loading):
    """A plot, a dump or an output folder is none of the verb's inputs and overwrites nothing inside one,
    and a folder --force replaces holds none; a new file beside an input's files is fine."""
    t, d, prompts = world["target"], world["draft"], world["prompts"]
    before = {p: p.read_bytes() for p in (t / "config.json", d / "model.safetensors", prompts)}
    refused(capsys, ["eval", d, "--prompts", prompts, "--plot", d / "model.safetensors", "--target", t],
            "model.safetensors (--plot) is already inside", "(DRAFTER)")
    refused(capsys, ["eval", d, "--prompts", prompts, "--plot", t / "config.json", "--target", t / "config.json"],
            "(--target)")
    refused(capsys, ["eval", d, "--prompts", prompts, "--plot", prompts, "--target", t], "(--plot) is", "(--prompts)")
    refused(capsys, ["bench", d, "--prompts", prompts, "--plot", prompts, "--target", t], "(--prompts")
    refused(capsys, ["serve-check", d, "--prompts", prompts, "--dump", d / "config.json", "--target", t], "(DRAFTER)")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    refused(capsys, ["serve-check", d, "--prompts", prompts, "--dump", notes, "--target", t],
            "the dump is a safetensors")
    assert notes.read_text() == "mine"
    refused(capsys, ["capture", "--prompts", prompts, "--out", t, "--target", t], "(--out) is", "(--target)")
    box = tmp_path / "box"
    (box / "tgt").mkdir(parents=True)
    for f in t.iterdir():
        (box / "tgt" / f.name).write_bytes(f.read_bytes())
    refused(capsys, ["init", box, "--target", box / "tgt", "--force"], "(DST) holds", "(--target)")
    refused(capsys, ["convert", d, box / "tgt", "--format", "eagle", "--target", box / "tgt", "--force"], "(DST) is")
    assert all(p.read_bytes() == b for p, b in before.items()) and (box / "tgt" / "config.json").is_file()
    (tmp_path / "work" / "shards").mkdir(parents=True)  # --force replaces a draft, not a working folder
    refused(capsys, ["init", tmp_path / "work", "--force", "--target", t], "replaces only a draft folder",
            "holds folders (shards)")
    refused(capsys, ["convert", d, "", "--format", "eagle"], "DST is an empty path")
    assert (tmp_path / "work" / "shards").is_dir()


def test_an_output_that_is_a_link_to_nothing_is_refused(world, tmp_path, capsys, no_loading):
    """A link loop as an output crashed the output check with a traceback (exit 1); a dangling link led
    convert to make the folders it pointed at (/nonexistent/x) and write the draft there."""
    t, d, prompts = world["target"], world["draft"], world["prompts"]
    (tmp_path / "loop1").symlink_to("loop2")
    (tmp_path / "loop2").symlink_to("loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone" / "x")
    for link in ("loop1", "dangling"):
        out = tmp_path / link
        refused(capsys, ["convert", d, out, "--format", "eagle", "--force"], "(DST) is a link to nothing")
        refused(capsys, ["init", out, "--target", t, "--force"], "(DST) is a link to nothing")
        refused(capsys, ["capture", "--prompts", prompts, "--out", out, "--target", t], "(--out) is a link to nothing")
        refused(capsys, ["eval", d, "--prompts", prompts, "--plot", out, "--target", t], "(--plot) is a link to nothing")
    assert not (tmp_path / "gone").exists() and (tmp_path / "dangling").is_symlink()


def test_an_output_going_up_out_of_a_missing_folder_is_refused(world, tmp_path, capsys, no_loading):
    """`--out c/new/..` names c, but the system follows no `..` out of a folder that does not exist: the write
    made c/new and left it there. Refused before anything is made, naming the path to give instead."""
    t, d, prompts = world["target"], world["draft"], world["prompts"]
    (tmp_path / "c").mkdir()
    up = tmp_path / "c" / "new" / ".." / "out"
    refused(capsys, ["capture", "--prompts", prompts, "--out", up, "--target", t], "(--out) goes up (..) out of",
            "new, which does not exist")
    refused(capsys, ["convert", d, up, "--format", "eagle"], "(DST) goes up (..)")
    assert [p.name for p in (tmp_path / "c").iterdir()] == []


def test_capture_without_layers_on_a_shallow_target_is_refused_before_it_loads(world, tmp_path, capsys, no_loading):
    """The engines' default (2, N//2, N-3) on this 4-layer target is [2, 2, 1]: said from its config."""
    refused(capsys, ["capture", "--prompts", world["prompts"], "--out", tmp_path / "out", "--target", world["target"]],
            "the default capture layers (2, N//2, N-3) for 4 layers: capture_layers [2, 2, 1] are not strictly")
    assert not (tmp_path / "out").exists()


def test_no_output_lands_inside_eyas_own_files(world, tmp_path, capsys, monkeypatch, no_loading):
    """The installed package (the shipped drafts) and the embedded target's cache are every run's
    defaults: a new file there is refused, whether or not the verb reads them."""
    from eyas.drafter_loading import resolve_drafter
    from eyas.embedded import EMBEDDED_DIR, cache_dir

    t, d, prompts = world["target"], world["draft"], world["prompts"]
    shipped = resolve_drafter(None)
    refused(capsys, ["eval", d, "--prompts", prompts, "--plot", shipped / "p.png", "--target", t],
            "(--plot) is inside eyas's installed package")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (cache_dir() / EMBEDDED_DIR).mkdir(parents=True)
    refused(capsys, ["serve-check", d, "--prompts", prompts, "--dump", cache_dir() / EMBEDDED_DIR / "x.safetensors",
                     "--target", t], "(--dump) is inside the embedded target's cache")
    assert not (shipped / "p.png").exists()


def test_no_output_lands_inside_a_feature_cache(world, tmp_path, capsys, no_loading):
    """A feature cache is read by listing its folder: a new file there (a plot named like a sample) would
    be read as one, so an output inside it is refused even where nothing exists yet."""
    t, d = world["target"], world["draft"]
    H, T = json.loads((t / "config.json").read_text())["hidden_size"], 6
    cache = tmp_path / "specforge"
    cache_writers.write_specforge_records(cache, [{
        "input_ids": torch.arange(T), "loss_mask": torch.ones(T, dtype=torch.long),
        "aux_hidden_state": torch.randn(1, T, 3 * H), "hidden_state": torch.randn(1, T, H)}])
    before = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    refused(capsys, ["eval", d, "--data", cache, "--plot", cache / "rows_0-2000" / "data_9.ckpt", "--target", t],
            "data_9.ckpt (--plot) is inside", "(--data)")
    # train reads eyas captures alone: another trainer's cache is named as one before its --out is looked at
    refused(capsys, ["train", "--data", cache, "--out", cache / "run", "--target", t],
            f"{cache} (--data) is a specforge feature cache")
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == before


def test_no_output_lands_in_any_feature_cache(world, tmp_path, capsys, no_loading):
    """Not the verb's input, a cache is still read by listing it: no output lands in an eyas capture, a
    speculators dataset or a SpecForge cache, nor is one (but a capture resumed into its own folder);
    a manifest.json or state.json of anything else marks no cache."""
    t, d, p = world["target"], world["draft"], world["prompts"]
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "manifest.json").write_text(json.dumps({"format": "eyas-capture"}))
    speculators = tmp_path / "speculators"
    (speculators / "hidden_states").mkdir(parents=True)
    (speculators / "state.json").write_text("{}")
    specforge = tmp_path / "specforge"
    (specforge / "rows_0-2000").mkdir(parents=True)
    for cache, fmt in ((capture, "eyas"), (speculators, "speculators"), (specforge, "specforge")):
        refused(capsys, ["capture", "--prompts", p, "--out", cache / "sub", "--target", t],
                f"(--out) is inside the {fmt} feature cache {cache}")
        refused(capsys, ["convert", d, cache / "sub2", "--format", "eagle"], "(DST) is inside the")
        with pytest.raises(EyasError, match=rf"\(--out\) is the {fmt} feature cache"):
            preflight.apart(cache, "--out", {})  # train's run folder, say
    refused(capsys, ["eval", d, "--prompts", p, "--plot", specforge / "rows_0-2000" / "a.png", "--target", t],
            f"(--plot) is inside the specforge feature cache {specforge}:")
    preflight.apart(capture, "--out", {}, resumes=True)  # capture resumes into its own folder
    other = tmp_path / "project"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"name": "a web app"}))
    (other / "state.json").write_text("{}")
    (other / "last.ckpt").write_bytes(b"a Lightning checkpoint")
    preflight.apart(other / "out.png", "--plot", {})


def test_no_output_overwrites_the_embedded_default_or_the_shipped_draft(world, tmp_path, capsys, no_loading,
                                                                        monkeypatch):
    """The target left out (or "default") is the embedded default's cache folder, and DRAFTER left out
    the shipped draft: outputs are held apart from those as from any named input."""
    from eyas.drafter_loading import SHIPPED_DRAFTS, resolve_drafter, shipped_draft
    from eyas.embedded import EMBEDDED_DIR, EMBEDDED_NAME, is_default
    from eyas.target import TargetRef

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = tmp_path / "eyas" / EMBEDDED_DIR
    cached.mkdir(parents=True)
    for f in world["target"].iterdir():
        (cached / f.name).write_bytes(f.read_bytes())
    before = {p: p.read_bytes() for p in cached.iterdir()}
    d, prompts = world["draft"], world["prompts"]
    refused(capsys, ["serve-check", d, "--prompts", prompts, "--dump", cached / "model.safetensors"], "(--target)")
    refused(capsys, ["eval", d, "--prompts", prompts, "--plot", cached / "config.json", "--target", "default"],
            "(--plot) is already inside", "(--target)")
    refused(capsys, ["init", cached, "--force", "--capture-layers", "1,2,3"], "(DST) is", "(--target)")
    refused(capsys, ["convert", d, cached, "--format", "eagle", "--force"], "(DST) is", "(--target)")
    shipped = shipped_draft(EMBEDDED_NAME)
    assert shipped is not None and str(shipped).endswith(SHIPPED_DRAFTS[EMBEDDED_NAME])
    refused(capsys, ["eval", "--prompts", prompts, "--plot", shipped / "heldout_tau.png"], "(DRAFTER)")
    refused(capsys, ["eval", d, "--prompts", prompts, "--against", "default", "--plot", shipped / "heldout_tau.png"],
            "(--against)")
    assert all(p.read_bytes() == b for p, b in before.items())
    # the cache folder named as a path is the embedded default, under its own identity
    assert is_default(cached) and is_default(cached / "config.json") and is_default(None) and is_default("smollm2")
    assert not is_default(world["target"]) and not is_default(tmp_path / "nowhere")
    assert TargetRef.resolve(cached / "config.json", weights=False).name == EMBEDDED_NAME
    assert resolve_drafter(None, cached) == shipped


def test_sampling_knobs_at_temperature_0_are_named_and_an_empty_verifier_name_refused(world, capsys, no_loading):
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--top-p", "0.5", "--top-k", "3"])
    preflight.sampling(args)
    assert capsys.readouterr().err == ("warning: --top-p 0.5 and --top-k 3 do nothing at --temperature 0 (greedy); "
                                       "pass a temperature to sample\n")
    preflight.sampling(build_parser().parse_args(["generate", "--prompt", "hi", "--seed", "3"]))
    assert capsys.readouterr().err.startswith("warning: --seed 3 does nothing at --temperature 0 (greedy)")
    preflight.sampling(build_parser().parse_args(["generate", "--prompt", "hi", "--temperature", "0.7",
                                                  "--top-p", "0.5", "--seed", "3"]))
    assert capsys.readouterr().err == ""
    preflight.sampling(build_parser().parse_args(["capture", "--out", "x"]))  # its --seed 0 is a default
    assert capsys.readouterr().err == ""
    # through the verb: a refusal is one error line (the warning said before it is dropped); input that passes
    # the checks gets the warning
    argv = ["generate", world["draft"], "--prompt", "hi", "--top-k", "3", "--max-new-tokens", "8", "--dtype", "fp32",
            "--target"]
    refused(capsys, [*argv, world["root"] / "nowhere"], "nowhere")
    with pytest.raises(AssertionError, match="a model was loaded"):
        main([str(a) for a in [*argv, world["target"]]])
    assert capsys.readouterr().err.startswith("warning: --top-k 3 does nothing at --temperature 0")
    refused(capsys, ["convert", world["draft"], world["root"] / "out", "--format", "eagle", "--verifier-name", " "],
            "--verifier-name is empty")


def test_a_draft_passed_as_the_target_is_named(world, capsys, no_loading):
    d = world["draft"]
    refused(capsys, ["init", world["root"] / "never", "--target", d], "is an EAGLE-3 draft's config", "not a model's")
    refused(capsys, ["generate", "--prompt", "hi", "--target", d], "is an EAGLE-3 draft's config")
    refused(capsys, ["generate", world["root"] / "no-draft", "--prompt", "hi", "--target", world["target"]],
            "no-draft does not exist (DRAFTER)")
    broken = world["root"] / "no-heads"
    broken.mkdir()
    for f in world["target"].iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((broken / "config.json").read_text())
    del cfg["num_attention_heads"]
    (broken / "config.json").write_text(json.dumps(cfg))
    assert main(["init", str(world["root"] / "never"), "--target", str(broken)]) == 2  # read once the target is
    assert "field 'num_attention_heads' is None" in capsys.readouterr().err  # (a head-only target has no heads)
    del cfg["hidden_size"]
    (broken / "config.json").write_text(json.dumps(cfg))
    refused(capsys, ["init", world["root"] / "never", "--target", broken], "field 'hidden_size' is None")
    assert not (world["root"] / "never").exists()


def test_a_bench_prompt_file_that_is_not_there_names_benchs_sets(world, capsys, no_loading):
    assert main(["bench", str(world["draft"]), "--prompts", "mtbench,no-such.jsonl", "--target",
                 str(world["target"])]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "no-such.jsonl does not exist" in err[0] and err[1] == (
        "hint: pass a .jsonl of {prompt, category}, or one of bench's sets: mtbench, humaneval, copy")


def test_a_target_that_cannot_answer_chat_prompts_is_refused_before_it_loads(world, tmp_path, capsys, no_loading):
    """No tokenizer, or no chat template: every verb that answers prompts says so from the files, in
    its own words (it said "capture needs" for generate, eval and bench too, after loading the weights)."""
    import shutil

    bare, plain = tmp_path / "bare", save_tiny_target(tmp_path / "plain", chat_template=None)
    shutil.copytree(world["target"], bare)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / f).unlink(missing_ok=True)
    capsys.readouterr()
    for target, says in ((bare, "has no tokenizer"), (plain, "has no chat template")):
        for argv in (["generate", world["draft"], "--prompt", "hi"], ["capture", "--out", tmp_path / "c"],
                     ["eval", world["draft"], "--prompts", world["prompts"]]):
            verb = argv[0]
            refused(capsys, [*argv, "--target", target], f"eyas {verb} answers prompts as a chat model's", says)
    assert not (tmp_path / "c").exists()


def test_a_target_of_another_family_is_named_not_sent_after_missing_layers(world, tmp_path, capsys, no_loading):
    """A GPT-NeoX target (Llama's config field names, its layers under gpt_neox.layers) was "hold 52 tensors and no
    decoder layer 3", hinting at an incomplete folder."""
    import shutil

    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    neox = tmp_path / "neox"
    GPTNeoXForCausalLM(GPTNeoXConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64)).save_pretrained(neox)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(world["target"] / f, neox / f)
    capsys.readouterr()
    for argv in (["generate", world["draft"], "--prompt", "hi"],
                 ["eval", world["draft"], "--prompts", world["prompts"]]):
        refused(capsys, [*argv, "--target", neox], "holds its decoder layers as gpt_neox.layers.3.* (model_type "
                "'gpt_neox'), not model.layers.*: eyas runs Llama-style decoders")


def test_a_garbled_tokenizer_is_one_line(world, tmp_path, capsys):
    import shutil

    garbled = tmp_path / "garbled"
    shutil.copytree(world["target"], garbled)
    (garbled / "tokenizer.json").write_text("{bad")
    refused(capsys, ["generate", world["draft"], "--prompt", "hi", "--target", garbled, "--dtype", "fp32",
                     "--max-new-tokens", "8"],
            f"target {garbled}: its tokenizer cannot be read")  # read before the weights: seconds, not minutes


@pytest.fixture(scope="module")
def a_capture(world) -> Path:
    out = world["root"] / "a-capture"
    assert main(["capture", "--target", str(world["target"]), "--prompts", str(world["prompts"]), "--out", str(out),
                 "--capture-layers", ",".join(map(str, LAYERS)), "--max-new-tokens", "4", "--dtype", "fp32",
                 "--no-progress"]) == 0
    return out


def test_train_init_default_without_a_shipped_draft_is_refused(world, a_capture, tmp_path, capsys, no_loading):
    """--init default is the shipped draft, which this tiny target has none of."""
    refused(capsys, ["train", "--data", a_capture, "--out", tmp_path / "run", "--target", world["target"], "--init",
                     "default"], f"--init default: eyas ships no draft for the target {world['target']}")


def test_resuming_a_capture_under_other_settings_is_refused_before_the_target_loads(world, a_capture, capsys,
                                                                                    no_loading):
    """Other dtype, layers or answer length than the folder's capture: said from the flags and the config,
    every difference named (it was said after the weights had loaded)."""
    before = (a_capture / "manifest.json").read_bytes()
    line = refused(capsys, ["capture", "--target", world["target"], "--prompts", world["prompts"], "--out", a_capture,
                            "--capture-layers", "1,2,3", "--max-new-tokens", "5", "--dtype", "bf16"],
                   f"{a_capture}/manifest.json describes a different capture")
    for said in ('capture_layers: [1, 2, 4] there, [1, 2, 3] now', 'dtype: "float32" there, "bfloat16" now',
                 "generation.max_new_tokens: 4 there, 5 now"):
        assert said in line, line
    other = write(world["root"] / "other-prompts.txt", b"why is the sky blue\nhello world\n")  # other prompts,
    line = refused(capsys, ["capture", "--target", world["target"], "--prompts", other, "--out", a_capture,  # the same
                            "--capture-layers", "1,2,4", "--max-new-tokens", "4", "--dtype", "fp32"],  # flags: said
                   f"{a_capture}/manifest.json describes a different capture (prompts.")  # once read, not loaded
    assert "prompts.count: 5 there, 2 now" in line and "eval_only" not in line  # the parts that differ, not all
    same = ["capture", "--target", world["target"], "--prompts", world["prompts"], "--out", a_capture,
            "--capture-layers", "1,2,4", "--max-new-tokens", "4", "--dtype", "fp32"]
    # sampled answers and a larger shard were refused only after the target loaded, naming internal fields
    line = refused(capsys, [*same, "--temperature", "0.8", "--batch-size", "128"], "describes a different capture")
    for said in ("shard_size (--batch-size): 64 there, 128 now", "generation.do_sample: false there, true now",
                 "generation.temperature: 0.0 there, 0.8 now"):
        assert said in line, line
    assert "top_k" not in line  # greedy records two settings: three nulls more said nothing
    assert (a_capture / "manifest.json").read_bytes() == before


def test_a_prompt_too_long_for_the_target_is_refused_before_the_dtype_timing_and_the_weights(world, capsys,
                                                                                              no_loading):
    """From the tokenizer alone: generate, bench, capture and eval loaded the weights first (generate and bench
    after timing them, under --dtype auto)."""
    t, d, long = world["target"], world["draft"], " ".join(["hello world"] * 40)
    refused(capsys, ["generate", d, "--target", t, "--prompt", long, "--max-new-tokens", 4],
            "the prompt: it is ", "with the chat template", f"the context of {t}")
    prompts = write(world["root"] / "long.txt", f"hi\n{long}\n".encode())
    refused(capsys, ["bench", d, "--target", t, "--prompts", prompts, "--max-new-tokens", 4],
            "long.txt line 2:", "with the chat template")
    refused(capsys, ["capture", "--out", world["root"] / "never", "--target", t, "--prompts", prompts,
                     "--capture-layers", "1,2,4", "--max-new-tokens", 4], "long.txt line 2:", "with the chat template")
    assert not (world["root"] / "never").exists()
    refused(capsys, ["eval", d, "--target", t, "--prompts", prompts, "--max-new-tokens", 4], "long.txt line 2:")
    refused(capsys, ["doctor", d, "--target", t, "--prompts", prompts, "--max-new-tokens", 4], "long.txt line 2:")
    hidden = json.loads((t / "config.json").read_text())["hidden_size"]  # an engine dump is measured on answers too
    dump = world["root"] / "dump.safetensors"
    save_file({"input_ids": torch.arange(8), "features": torch.randn(8, 3 * hidden)}, dump)
    refused(capsys, ["doctor", d, "--target", t, "--features", dump, "--prompts", prompts, "--max-new-tokens", 4],
            "long.txt line 2:")


@pytest.fixture(scope="module")
def hybrid_target(world) -> Path:
    """The tiny target's tokenizer beside a tiny Qwen3-Next: three linear-attention layers, one full."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    folder = world["root"] / "qwen3-next"
    folder.mkdir()
    for f in world["target"].iterdir():
        if f.name != "model.safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    torch.manual_seed(0)
    Qwen3NextForCausalLM(Qwen3NextConfig(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_value_heads=2,
        linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, tie_word_embeddings=False,
    )).save_pretrained(folder)
    return folder


def test_a_target_whose_cache_eyas_cannot_trim_is_refused_before_it_loads(world, hybrid_target, capsys, no_loading):
    """Linear attention's state (Qwen3-Next, Jamba, Mamba) cannot be cut back to the accepted tokens: generate
    and bench refused such a target only after loading it (minutes, for the 80B one); now from its config, as
    transformers reads its layer kinds. Capture and eval run it through transformers and go on."""
    for verb in (["generate", world["draft"], "--prompt", "hi"], ["bench", world["draft"]]):
        line = refused(capsys, [*verb, "--target", hybrid_target], "its layers include linear_attention",
                       "(model_type 'qwen3_next')")
        assert "full, sliding-window or chunked attention" in line
    preflight.check(build_parser().parse_args(["eval", str(world["draft"]), "--target", str(hybrid_target),
                                               "--prompts", str(world["prompts"])]))


def test_the_loaded_hybrid_target_is_refused_in_one_line_too(hybrid_target):
    """The library's own check, after the load, for callers who skip the command line."""
    from eyas.decode import generate
    from eyas.target import Target

    with pytest.raises(EyasError, match=r"\['DynamicLayer', 'LinearAttentionLayer'\]"):
        generate(Target.load(hybrid_target), None, torch.tensor([[1, 2, 3]]), max_new_tokens=4)


def test_serve_check_says_how_it_read_the_draft_before_the_engine_starts(world, monkeypatch, capsys):
    """serve-check held the draft's warnings back (inspect, check and convert say them): a map completed on
    read, ids that differ between places. They are the first things to know when served and predicted differ."""
    from eyas.target import Target

    sc = importlib.import_module("eyas.engines.serve_check")  # the module (the package exports a function so named)

    def stop(*a, **k):
        raise EyasError("the target would load here", "nothing")

    monkeypatch.setattr(sc, "engine_python", lambda name: None)  # installed or not, this test starts no engine
    monkeypatch.setattr(Target, "load", classmethod(stop))
    capsys.readouterr()
    assert main(["serve-check", str(world["draft"]), "--target", str(world["target"]), "--prompts",
                 str(world["prompts"]), "--max-new-tokens", "8", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "warning: " in err and "config_eagle.json: the capture layers [1, 2, 4] start at 1" in err, err
    assert err.index("warning: ") < err.index("error: the target would load here")
