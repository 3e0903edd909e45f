"""The benchmark scripts stay runnable as eyas changes under them (each imports, and builds its flags), and
refuse a bad flag in argparse's one line before anything loads. Nothing here times anything."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from eyas.errors import EyasError

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name != "flags.py")
sys.path.insert(0, str(BENCHMARKS))
import flags  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)


def _run(script: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCHMARKS / script), *argv], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_imports_and_lists_its_flags(script):
    out = _run(script, "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


@pytest.mark.parametrize("script,argv,says", [
    ("bench_capture.py", ["--repeats", "0"], "--repeats: 0: must be >= 1"),
    ("bench_linears.py", ["--sizes", "1,x"], "--sizes: 'x' is not a whole number"),
    ("bench_answers.py", ["--temperature", "nan"], "--temperature: nan: must be a finite number >= 0"),
    ("bench_real_sizes.py", ["--device", "banana"], "--device: --device 'banana' is not a device"),
    ("learning_curve.py", ["/no/such/train_log.jsonl", "--out", "x.png"], "error: /no/such/train_log.jsonl: No such"),
])
def test_a_bad_flag_is_one_line_and_exit_2(script, argv, says):
    out = _run(script, *argv)
    assert out.returncode == 2 and says in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_flag_types():
    assert flags.count("3") == 3 and flags.natural("0") == 0 and flags.counts("1,2,17") == [1, 2, 17]
    assert flags.temperature("0") == 0.0 and flags.device("cpu") == "cpu"
    for bad_type, text in ((flags.count, "0"), (flags.natural, "-1"), (flags.count, "2.5"), (flags.counts, "1,,2"),
                           (flags.temperature, "inf"), (flags.temperature, "-0.5"), (flags.device, "mps")):
        with pytest.raises(argparse.ArgumentTypeError):
            bad_type(text)


def test_the_json_line_has_no_bare_nan_and_refused_input_exits_2(capsys):
    flags.emit({"ratio": float("inf"), "tau": [1.5, float("nan")]})
    assert json.loads(capsys.readouterr().out) == {"ratio": None, "tau": [1.5, None]}

    def refused() -> int:
        raise EyasError("prompts 'x.jsonl': no such file", "pass a .jsonl file")

    assert flags.run(refused) == 2 and flags.run(lambda: None) == 0
    assert capsys.readouterr().err == "error: prompts 'x.jsonl': no such file\nhint: pass a .jsonl file\n"
