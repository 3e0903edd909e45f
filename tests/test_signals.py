"""Ctrl-C (SIGINT) and SIGTERM during `eyas capture` and `eyas train` (eyas.interrupt), and during
any other verb's write.

Each capture and train run is a real `python -m eyas` process on a tiny random target, the signal
sent once the run is visibly mid-way (a shard or some steps written); the convert runs in-process,
its signal sent from inside its write. The process must exit 130 / 143 with one
`interrupted by ...` line saying how to resume, no traceback and no temp files, and the resumed
runs must end exactly where one uninterrupted run ends.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_data import WORDS, save_tiny_target
from test_train import captured, config, draft_tensors, env, flags, log_records, target_dir  # noqa: F401

from eyas.cli import main
from eyas.train import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def signals_as_a_terminal_leaves_them():
    """Each test (and the eyas processes it starts) begins with SIGINT and SIGTERM at Python's defaults: a suite
    started in the background (`pytest &`) ignores SIGINT, and eyas keeps an ignored signal ignored."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def test_a_signal_the_process_was_started_ignoring_stays_ignored():
    """A job started in the background with `&` ignores SIGINT; inside a verb it still does (eyas.__main__ left
    it so before the CLI ran), where the block took it and Ctrl-C meant for the foreground stopped the job."""
    from eyas.interrupt import Interrupted, on_signals

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with on_signals(lambda: "nothing kept"):
        os.kill(os.getpid(), signal.SIGINT)  # ignored: the block runs on
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)  # not ignored: taken
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
PYTHON = sys.executable


def run_until(argv: list[str], ready, sig: int, timeout: float = 300) -> tuple[int, str]:
    """Start `python -m eyas ARGV`, send `sig` once `ready()` holds; (exit code, stderr)."""
    proc = subprocess.Popen([PYTHON, "-m", "eyas", *argv], env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while proc.poll() is None and not ready() and time.monotonic() - t0 < timeout:
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def assert_interrupted(code: int, err: str, sig: int, resume: str) -> None:
    assert code == 128 + sig, f"exit {code}\n{err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("interrupted by")]
    assert len(lines) == 1 and signal.Signals(sig).name in lines[0] and resume in lines[0], err[-3000:]


def no_temp_files(folder: Path) -> None:
    left = [p.name for p in folder.rglob(".*")]
    assert not left, f"temp files left behind: {left}"


def test_capture_interrupted_twice_resumes_to_the_uninterrupted_shards(tmp_path):
    target = save_tiny_target(tmp_path / "target")
    rnd = random.Random(0)
    prompts = tmp_path / "prompts.txt"  # 5 shards of 64 prompts: long enough to stop mid-way
    prompts.write_text("".join(" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 6))) + "\n"
                               for _ in range(320)))

    def argv(out: Path) -> list[str]:
        return ["capture", "--prompts", str(prompts), "--out", str(out), "--target", str(target), "--batch-size", "64",
                "--max-new-tokens", "24", "--dtype", "fp32", "--capture-layers", "1,2,4", "--no-progress"]

    out = tmp_path / "interrupted"
    code, err = run_until(argv(out), lambda: (out / "shard_00000.safetensors").exists(), signal.SIGINT)
    assert_interrupted(code, err, signal.SIGINT, "rerun the same `eyas capture` command to resume")
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    code, err = run_until(argv(out), lambda: (out / "shard_00002.safetensors").exists(), signal.SIGTERM)
    assert_interrupted(code, err, signal.SIGTERM, "rerun the same `eyas capture` command to resume")
    no_temp_files(out)
    assert subprocess.run([PYTHON, "-m", "eyas", *argv(out)], env=env(), capture_output=True).returncode == 0

    whole = tmp_path / "whole"
    assert main(argv(whole)) == 0
    a, b = json.loads((whole / "manifest.json").read_text()), json.loads((out / "manifest.json").read_text())
    assert a == b and a["complete"] and len(a["shards"]) == 5
    for entry in a["shards"]:
        x, y = load_file(whole / entry["file"]), load_file(out / entry["file"])
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), entry["file"]


def test_train_interrupted_twice_resumes_to_the_uninterrupted_weights(target_dir, captured, tmp_path):  # noqa: F811
    c = config(captured, tmp_path / "interrupted", target_dir, epochs=20, max_steps=60, save_every=50)
    log = tmp_path / "interrupted" / "train_log.jsonl"

    def steps() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0

    code, err = run_until(["train", *flags(c)], lambda: steps() >= 5, signal.SIGINT)
    assert_interrupted(code, err, signal.SIGINT, "with --resume")
    saved = sorted(p.name for p in (tmp_path / "interrupted" / "checkpoints").glob("step_*.pt"))
    assert saved and saved[-1] != "step_00000050.pt" and saved[-1] in err  # the step it stopped at, named
    resume = [*flags(TrainConfig(**{**vars(c), "resume": True}))]
    code, err = run_until(["train", *resume], lambda: steps() >= 25, signal.SIGTERM)
    assert_interrupted(code, err, signal.SIGTERM, "with --resume")
    no_temp_files(tmp_path / "interrupted")
    done = subprocess.run([PYTHON, "-m", "eyas", "train", *resume], env=env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    from eyas.train import train

    whole = train(config(captured, tmp_path / "whole", target_dir, epochs=20, max_steps=60, save_every=50))
    assert whole["steps"] == 60
    a, b = draft_tensors(tmp_path / "whole"), draft_tensors(tmp_path / "interrupted")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in log_records(tmp_path / "interrupted")] == list(range(1, 61))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_any_verb_stopped_mid_write_leaves_nothing_and_says_so_in_one_line(sig, tmp_path, monkeypatch, capsys):
    """A signal while `eyas convert` writes its folder (here sent from inside the write): exit 128 + N,
    one `interrupted by` line, no traceback, and neither DST nor its temp folder left."""
    from conftest import random_tensors, tiny_contract

    import eyas.formats.write as write_module
    from eyas.formats import write_checkpoint

    c = tiny_contract()
    src = write_checkpoint(tmp_path / "src", c, random_tensors(c), "eagle")
    real = write_module.write_tensors

    def signalled(*args, **kwargs):
        real(*args, **kwargs)
        os.kill(os.getpid(), sig)  # the handler raises here, inside the temp folder's block

    monkeypatch.setattr(write_module, "write_tensors", signalled)
    code = main(["convert", str(src), str(tmp_path / "dst"), "--format", "speculators", "--json"])
    out, err = capsys.readouterr()
    assert code == 128 + sig and "Traceback" not in err
    assert json.loads(out) == {"interrupted": signal.Signals(sig).name, "exit_code": code,  # one object on stdout
                               "note": err.splitlines()[-1]}
    assert [line for line in err.splitlines() if line.startswith("interrupted by")] == [
        f"interrupted by {signal.Signals(sig).name}: stopped before the end; files are written whole or not at all, "
        "so none was left half-written"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert signal.getsignal(sig) is not None and signal.getsignal(sig) in (signal.default_int_handler, signal.SIG_DFL)


def test_generate_stopped_mid_answer_ends_its_line(monkeypatch, capsys):
    """The streamed answer's line ends before the `interrupted by` line, which says nothing was written
    (generate writes no files)."""
    import eyas.generate

    def stopped_mid_answer(*args, stream, **kwargs):
        stream("The hawk")
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(eyas.generate, "run_generate", stopped_mid_answer)
    assert main(["generate", "--prompt", "hi", "--no-progress"]) == 130
    out, err = capsys.readouterr()
    assert out == "The hawk\n"
    assert err.splitlines()[-1] == "interrupted by SIGINT: stopped before the end; this command writes no output files"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_cli_imports_is_one_line_too(sig, capsys, monkeypatch):
    """The console script (`eyas.__main__.run`) answers a signal during the second the CLI takes to
    import (torch) with one line and 128 + the signal, where Python printed a KeyboardInterrupt
    traceback; the handlers it set are the previous ones again before the verb runs."""
    import eyas.cli
    from eyas.__main__ import _before_the_cli, run

    with pytest.raises(SystemExit) as e:
        _before_the_cli(sig, None)
    assert e.value.code == 128 + sig
    assert capsys.readouterr().err == (f"interrupted by {signal.Signals(sig).name}: stopped before the command began; "
                                       "nothing was written\n")
    monkeypatch.setattr(sys, "argv", ["eyas", "generate", "--json"])  # --json: one object on stdout too
    with pytest.raises(SystemExit):
        _before_the_cli(sig, None)
    assert json.loads(capsys.readouterr().out)["exit_code"] == 128 + sig
    before = signal.getsignal(sig)
    seen = []
    monkeypatch.setattr(eyas.cli, "main", lambda: seen.append(signal.getsignal(sig)) or 0)
    assert run() == 0 and seen == [before] and signal.getsignal(sig) == before
