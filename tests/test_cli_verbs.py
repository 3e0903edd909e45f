"""Every verb run the way users run it, through `eyas.cli.main`, on a tiny random target built here:
exit codes, `--json` parsed, and the one grammar (`--target` folder or config file, the shipped-draft
default, `--dtype` spellings, `--format`, help and choices on every flag)."""

from __future__ import annotations

import argparse
import json
import warnings
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_data import PROMPTS, save_tiny_target

from eyas.cli import build_parser, main
from eyas.dtypes import CHOICES as DTYPE_CHOICES

pytestmark = pytest.mark.usefixtures("one_thread")
LAYERS = "1,2,3"  # the tiny target has 4 layers; the engines' default (2, 2, 1) is not increasing
VERBS = ("inspect", "check", "convert", "init", "capture", "eval", "train", "generate", "bench", "doctor", "serve-check")


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """bench and generate remember the best decoding shape in the cache: never the user's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv, code: int = 0) -> dict:
    got, out, err = run(capsys, *argv, "--json")
    assert got == code, err
    return json.loads(out)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return save_tiny_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def draft(target, tmp_path_factory) -> Path:
    """A random draft for the tiny target, made by `eyas init` itself."""
    dst = tmp_path_factory.mktemp("init") / "draft"
    assert main(["init", str(dst), "--target", str(target), "--capture-layers", LAYERS]) == 0
    return dst


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


@pytest.fixture(scope="module")
def shards(target, prompts, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("capture") / "shards"
    argv = ["capture", "--target", target, "--prompts", prompts, "--out", out, "--capture-layers", LAYERS,
            "--max-new-tokens", "6", "--dtype", "float32", "--no-progress"]
    assert main([str(a) for a in argv]) == 0
    return out


# --- checkpoint verbs ---------------------------------------------------------------------------------


def test_init_writes_the_format_asked_for(target, tmp_path, capsys):
    rep = run_json(capsys, "init", tmp_path / "d", "--target", target, "--capture-layers", LAYERS, "--format", "eagle")
    assert rep["format"] == "eagle" and rep["contract"]["capture_layers"] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["config.json", "model.safetensors"]
    code, out, err = run(capsys, "init", tmp_path / "d", "--target", target)
    assert code == 2 and err.startswith("error: ")  # DST not empty, no --force


def test_init_from_a_local_target_is_check_clean_with_the_verifier_name(target, tmp_path, capsys):
    """A local --target is recorded as the verifier unless --verifier-name names its hub id: then the
    fresh draft passes `check` (a local path is `verifier_not_portable`)."""
    run_json(capsys, "init", tmp_path / "local", "--target", target, "--capture-layers", LAYERS)
    assert run(capsys, "check", tmp_path / "local", "--target", target)[0] == 1
    rep = run_json(capsys, "init", tmp_path / "d", "--target", target, "--capture-layers", LAYERS,
                   "--verifier-name", "org/tiny")
    assert rep["contract"]["verifier"]["name_or_path"] == "org/tiny"
    assert run(capsys, "check", tmp_path / "d", "--target", target)[0] == 0
    code, _, err = run(capsys, "init", tmp_path / "e", "--target", target, "--verifier-name", " ")
    assert code == 2 and "--verifier-name is empty" in err and not (tmp_path / "e").exists()
    # the default layers this 4-layer target cannot take: the error names the target, not the verifier name
    code, _, err = run(capsys, "init", tmp_path / "f", "--target", target, "--verifier-name", "org/tiny")
    assert code == 2 and err.startswith(f"error: {target}: the default (2, N//2, N-3) for 4 layers"), err


def test_convert_then_check_against_a_target_folder_or_config_file(draft, target, tmp_path, capsys):
    rep = run_json(capsys, "convert", draft, tmp_path / "s", "--format", "speculators", "--verifier-name", "org/tiny")
    assert rep["format"] == "speculators" and rep["files"] == ["config.json", "model.safetensors"]
    assert rep["contract"]["capture_layers"] == [1, 2, 3] and rep["contract"]["verifier"]["name_or_path"] == "org/tiny"
    lone = tmp_path / "target.json"  # a config with no model around it is enough to compare configs
    shutil.copy(target / "config.json", lone)
    for spec in (target, target / "config.json", lone):
        rep = run_json(capsys, "inspect", tmp_path / "s", "--target", spec)
        assert rep["contract"]["capture_layers"] == [1, 2, 3] and rep["tensors"]["count"] > 0
        rep = run_json(capsys, "check", tmp_path / "s", "--target", spec)
        assert rep["ok"] is True and rep["target"]["num_hidden_layers"] == 4
    rep = run_json(capsys, "check", draft, "--target", target / "config.json", code=1)  # init records the local path
    assert [p["field"] for p in rep["problems"]] == ["speculators_config.verifier.name_or_path"]


def test_shipped_draft_is_the_default_for_inspect_and_check(capsys):
    inspected = run_json(capsys, "inspect")
    assert Path(inspected["path"]).parts[-2:] == ("drafts", "smollm2-135m-instruct")
    checked = run_json(capsys, "check")
    assert checked["ok"] is True and checked["path"] == inspected["path"]


# --- verbs that need the target's weights ---------------------------------------------------------


@pytest.mark.parametrize("verb", ["capture", "eval", "train", "generate", "bench", "doctor", "init"])
def test_a_lone_config_is_refused_where_weights_are_needed(verb, draft, target, tmp_path, capsys):
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(target / "config.json", lone / "config.json")
    argv = {
        "capture": ["capture", "--out", tmp_path / "out"],
        "eval": ["eval", draft, "--data", tmp_path / "none"],
        "train": ["train", "--data", tmp_path / "none", "--out", tmp_path / "out"],
        "generate": ["generate", draft, "--prompt", "hi"],
        "bench": ["bench", draft],
        "doctor": ["doctor", draft],
        "init": ["init", tmp_path / "out"],
    }[verb]
    code, out, err = run(capsys, *argv, "--target", lone / "config.json")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and "Traceback" not in err
    want = f"error: eyas {verb} needs the target's weights: {lone / 'config.json'} has no weight files beside it"
    assert lines[-2] == want
    assert lines[-1].startswith("hint: ") and not (tmp_path / "out").exists()


def test_capture_then_eval_and_train(target, draft, shards, prompts, tmp_path, capsys):
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["num_samples"] == len(PROMPTS) and manifest["capture_layers"] == [1, 2, 3]
    code, out, err = run(capsys, "capture", "--target", target, "--prompts", prompts, "--out", tmp_path / "more",
                         "--capture-layers", LAYERS, "--max-new-tokens", "3", "--limit", "2", "--dtype", "fp32",
                         "--no-progress", "--json")
    assert code == 0 and json.loads(out)["num_samples"] == 2 and "stderr_warnings" not in json.loads(out)
    assert "Loading weights" not in err and "capture" not in err  # no bar at all, transformers' included
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PYTHONWARNINGS=error: eyas's own warnings are still one line each
        code, out, err = run(capsys, "capture", "--target", target, "--prompts", prompts, "--out", tmp_path / "all",
                             "--capture-layers", LAYERS, "--max-new-tokens", "3", "--limit", "99", "--dtype", "fp32",
                             "--no-progress", "--json")  # fewer prompts than asked: said on stderr and in the object
    said = f"--limit 99: {prompts} has {len(PROMPTS)} prompts; capturing those"
    assert code == 0 and json.loads(out)["stderr_warnings"] == [said] and f"warning: {said}" in err

    rep = run_json(capsys, "eval", draft, "--data", shards, "--target", target / "config.json", "--dtype", "float32",
                   "--depth", "3", "--no-progress")
    assert rep["tokens"] > 0 and len(rep["acceptance_by_depth"]) == 3 and set(rep["tau_chain"]) == {"1", "2", "3"}
    code, out, _ = run(capsys, "eval", draft, "--data", shards, "--target", target, "--dtype", "float32", "--depth",
                       "3", "--no-progress")  # the text names the chain starts tau is over, as the JSON counts them
    cut = rep["chains_cut"]
    assert code == 0 and rep["chain_starts"] == rep["tokens"] and f"tau_chain over all {rep['tokens']} chain" in out
    assert (f"; {cut} chain{'s' * (cut != 1)} cut short where" in out) == (cut > 0)

    run_flags = ["--data", shards, "--out", tmp_path / "run", "--target", target, "--epochs", "4", "--max-steps", "2",
                 "--batch-tokens", "32", "--no-progress"]
    summary = run_json(capsys, "train", *run_flags, "--dtype", "float32")
    assert summary["steps"] == 2 and summary["capture_layers"] == [1, 2, 3]
    assert Path(summary["draft"], "config.json").is_file()
    code, out, err = run(capsys, "train", *run_flags, "--dtype", "fp32", "--resume")  # the same dtype, spelt anew
    assert code == 0 and out.startswith("trained 2 steps") and "{" not in out, err  # text, not JSON, without --json


@pytest.mark.usefixtures("private_cache")
def test_generate_and_bench_with_a_config_path_and_vllm_dtype_names(target, draft, prompts, capsys):
    rep = run_json(capsys, "generate", draft, "--target", target / "config.json", "--prompt", "hello world",
                   "--max-new-tokens", "4", "--draft-tokens", "2", "--dtype", "bfloat16")
    assert rep["dtype"] == "bf16" and 0 < len(rep["tokens"]) <= 4 and rep["shape"] == {"draft_tokens": 2}
    rep = run_json(capsys, "bench", draft, "--target", target, "--prompts", prompts, "--limit", "1",
                   "--max-new-tokens", "3", "--draft-tokens", "2", "--tree", "2,2,4", "--dtype", "float32",
                   "--no-progress")
    assert rep["dtype"] == "fp32" and rep["num_prompts"] == 1 and "hf_greedy" in rep["methods"]
    rep = run_json(capsys, "bench", draft, "--target", target, "--prompts", prompts, "--limit", "99",
                   "--max-new-tokens", "2", "--draft-tokens", "2", "--tree", "2,2,4", "--dtype", "float32",
                   "--no-progress")  # fewer prompts than asked: said, as capture says it
    assert rep["stderr_warnings"] == [f"--limit 99: {prompts} has {rep['num_prompts']} prompts; measuring those"]
    rep = run_json(capsys, "eval", draft, "--target", target, "--prompts", prompts, "--limit", "99",
                   "--max-new-tokens", "2", "--dtype", "float32", "--no-progress")
    assert rep["stderr_warnings"] == [f"--limit 99: {prompts} has {len(PROMPTS)} prompts; measuring those"]


@pytest.mark.usefixtures("private_cache")
def test_doctor_exit_code_follows_the_verdict(target, draft, prompts, capsys):
    code, out, err = run(capsys, "doctor", draft, "--target", target, "--prompts", prompts, "--limit", "2",
                         "--max-new-tokens", "4", "--no-progress", "--json")
    rep = json.loads(out)
    assert code == (1 if rep["verdict"] == "faulty" else 0), err
    assert rep["drafter"] == str(draft) and rep["contract"]["capture_layers"] == [1, 2, 3]
    assert "stderr_warnings" not in rep  # 5 prompts under the default --limit 8: nothing was asked of them
    rep = run_json(capsys, "doctor", draft, "--target", target, "--prompts", prompts, "--limit", "99",
                   "--max-new-tokens", "4", "--no-progress", code=code)  # asked for more than the file has: said
    assert rep["stderr_warnings"] == [f"--limit 99: {prompts} has {len(PROMPTS)} prompts; measuring those"]


def test_serve_check_says_a_limit_its_prompts_fall_short_of(draft, target, prompts, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EYAS_ENGINES", str(tmp_path / "no-engines"))  # the warning comes before the engine starts
    flags = ("serve-check", draft, "--target", target, "--prompts", prompts, "--max-new-tokens", "8")
    assert "warning" not in run(capsys, *flags)[2]  # 5 prompts, the default --limit 10: nothing asked of them
    code, _out, err = run(capsys, *flags, "--limit", "99")
    assert code == 2 and f"warning: --limit 99: {prompts} has {len(PROMPTS)} prompts; serving those" in err


def test_serve_check_without_the_engine_names_the_install_command(draft, target, tmp_path, monkeypatch, capsys):
    """The engine run itself is tests/test_engine_vllm.py; here: a missing engine is one error line, exit 2."""
    monkeypatch.setenv("EYAS_ENGINES", str(tmp_path / "no-engines"))
    code, out, err = run(capsys, "serve-check", draft, "--target", target, "--limit", "1", "--max-new-tokens", "8",
                          "--json")
    assert code == 2 and json.loads(out)["exit_code"] == 2
    assert "vllm is not installed" in err and "bash scripts/install-engines.sh" in err
    assert not (tmp_path / "no-engines").exists()


@pytest.mark.slow
def test_generate_defaults_to_the_shipped_draft_on_the_embedded_default(capsys):
    rep = run_json(capsys, "generate", "--prompt", "What is the capital of France?", "--max-new-tokens", "8",
                   "--draft-tokens", "3", "--dtype", "float32")
    assert Path(rep["drafter"]).parts[-2:] == ("drafts", "smollm2-135m-instruct")
    assert rep["target"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and rep["shape"] == {"draft_tokens": 3}
    assert len(rep["tokens"]) == 8 or rep["stopped"]
    assert "Paris" in rep["text"]


# --- the grammar ----------------------------------------------------------------------------------------


def _verb_parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_the_doctors_and_serve_checks_defaults_in_their_help_are_the_librarys():
    from eyas.doctor import DEFAULT_LIMIT, DEFAULT_MAX_NEW_TOKENS

    from eyas.engines import DEFAULT_LIMIT as SERVED

    args = build_parser().parse_args(["doctor"])  # --limit left out: None, the library's default (said only if given)
    assert (args.limit, args.max_new_tokens) == (None, DEFAULT_MAX_NEW_TOKENS)
    shown = " ".join(_verb_parsers()["doctor"].format_help().split())  # wrapped at any terminal width
    assert f"(default: {DEFAULT_LIMIT};" in shown and f"(default: {DEFAULT_MAX_NEW_TOKENS})" in shown
    assert "eyas.doctor." not in shown
    assert f"prompts served (default: {SERVED})" in " ".join(_verb_parsers()["serve-check"].format_help().split())


def test_evals_answer_length_in_its_help_is_the_librarys_and_unused_with_data_is_said(draft, shards, target,
                                                                                    tmp_path, capsys):
    import inspect

    from eyas.evaluate import evaluate

    default = inspect.signature(evaluate).parameters["max_new_tokens"].default
    assert f"(default: {default};" in " ".join(_verb_parsers()["eval"].format_help().split())
    assert build_parser().parse_args(["eval"]).max_new_tokens is None  # so that a given one is told apart
    code, _, err = run(capsys, "eval", "--data", tmp_path / "nowhere", "--max-new-tokens", "4")
    assert code == 2 and err.startswith("error:") and "warning" not in err  # refused: one error line
    rep = run_json(capsys, "eval", draft, "--data", shards, "--target", target, "--max-new-tokens", "4", "--no-progress")
    assert rep["stderr_warnings"][0].startswith("--max-new-tokens 4 does nothing with --data")


def test_every_verb_every_flag_has_help_and_closed_sets_have_choices():
    parsers = _verb_parsers()
    assert set(parsers) == set(VERBS)
    for verb, p in parsers.items():
        flags = {}
        for a in p._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            assert a.help, (verb, a.dest)
            flags.update(dict.fromkeys(a.option_strings, a))
        assert "--json" in flags, verb
        closed = {"--layer-convention": ("input", "output"), "--format": ("speculators", "eagle", "both")}
        for name, choices in closed.items():
            if name in flags:
                assert tuple(flags[name].choices) == choices, (verb, name)
        if "--dtype" in flags:  # eyas's names and vLLM's / transformers' (+ auto where eyas decodes or evaluates: the default)
            auto = {"auto"} if verb in ("generate", "bench", "eval") else set()
            assert {"bf16", "bfloat16", "fp32", "float32"} | auto <= set(flags["--dtype"].choices) <= set(DTYPE_CHOICES) | auto, verb
            assert flags["--dtype"].type("BFloat16") == "bfloat16", verb  # any case, as eyas.dtypes reads names
        if verb in ("inspect", "check", "convert", "eval", "generate", "bench", "doctor"):
            assert "--layer-convention" in flags, verb
        if verb in ("capture", "eval", "train", "generate", "bench", "doctor", "serve-check"):
            assert "--no-progress" in flags, verb
        assert "--target" in flags, verb


@pytest.mark.parametrize("argv, named", [
    (["capture", "--out", "x", "--dtype", "fp8"], "--dtype"),
    (["init", "x", "--format", "gguf"], "--format"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "many"], "--max-new-tokens"),
    (["check", "--layer-convention", "sideways"], "--layer-convention"),
    (["convert", "a", "b", "--format", "eagle", "--to", "eagle"], "--to"),  # the old name of --format is gone
])
def test_a_bad_flag_value_exits_2_with_an_error_line(argv, named, capsys):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert any(line.startswith("error: eyas") and named in line for line in err.splitlines()), err
    assert err.splitlines()[-1] == f"hint: `eyas {argv[0]} --help` lists its flags and their values"


def test_json_readers_get_the_error_as_json_too(tmp_path, capsys):
    code, out, err = run(capsys, "check", tmp_path / "nowhere", "--json")
    assert code == 2 and err.startswith("error: ")
    assert json.loads(out) == {"error": f"{tmp_path / 'nowhere'}: no such file or folder",
                               "hint": "pass a draft folder or a draft config .json file", "exit_code": 2}
    code, out, err = run(capsys, "generate", "--json", "--prompt", "x", "--draft-tokens", "abc")  # argparse's own
    assert code == 2 and "error: eyas generate: argument --draft-tokens: invalid int value: 'abc'" in err
    assert json.loads(out) == {"error": "eyas generate: argument --draft-tokens: invalid int value: 'abc'",
                               "hint": "`eyas generate --help` lists its flags and their values", "exit_code": 2}


def test_a_flag_the_verb_lacks_is_refused_by_the_verb(capsys):
    """Named with the verb, not the top level (argparse leaves unknown flags to the top), in one error line and
    a hint, as every other error: no usage block above it."""
    code, out, err = run(capsys, "init", "x", "--device", "cuda")
    assert code == 2 and out == "" and err.splitlines() == [
        "error: eyas init: unrecognized arguments: --device cuda", "hint: `eyas init --help` lists its flags and their values"]
    code, _, err = run(capsys, "sideways")
    assert code == 2 and err.splitlines()[-1] == "hint: `eyas --help` lists the verbs"
    # the verb's own flag before the verb: "unrecognized" alone sent the user to a --help that lists it
    code, out, _ = run(capsys, "--json", "check")
    assert code == 2 and json.loads(out)["error"] == ("eyas check: unrecognized arguments: --json (--json: a flag of "
                                                      "`eyas check`, given before the verb: put it after)")


def test_python_m_eyas_and_a_light_help():
    """`python -m eyas` is the CLI, and `--help` loads no model code (doctor, bench, transformers)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "eyas", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and all(f"\n    {verb}" in done.stdout for verb in VERBS)
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"eyas.cli", "eyas.cli.parser"} <= imported
    assert not imported & {"eyas.doctor", "eyas.bench", "eyas.generate", "transformers", "matplotlib"}


def test_a_negative_number_in_exponent_form_is_a_value():
    """`--lr -1e-3` was taken for a flag ("expected one argument"), never reaching --lr's own check; -0.001 was not."""
    from eyas.cli.parser import build_parser

    for given in ("-1e-3", "-1E+2", "-.5", "-2"):
        assert build_parser().parse_args(["train", "--data", "d", "--out", "o", "--lr", given]).lr == float(given)
