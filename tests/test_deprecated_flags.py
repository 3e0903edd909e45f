"""Renamed flags keep working under their old names for a release, with one stderr line saying so.

`convert --to` became `--format`, `inspect/convert --verifier-config` became `--target`: scripts written
against the last release must still run (eyas.cli.parser.add_deprecated_alias).
"""

from __future__ import annotations

import argparse
import json

import pytest

from conftest import random_tensors, tiny_contract
from eyas.cli import main
from eyas.cli.parser import add_deprecated_alias
from eyas.formats import read_checkpoint, write_checkpoint


@pytest.fixture
def draft(tmp_path):
    c = tiny_contract()
    return write_checkpoint(tmp_path / "draft", c, random_tensors(c), "speculators")


def test_convert_to_still_works_with_one_warning(tmp_path, draft, capsys):
    assert main(["convert", str(draft), str(tmp_path / "out"), "--to", "eagle"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: --to is deprecated; use --format") == 1
    assert read_checkpoint(tmp_path / "out").files == {"config.json": "eagle"}
    assert main(["convert", str(draft), str(tmp_path / "again"), "--to", "eagle", "--to", "both"]) == 0  # the last
    assert capsys.readouterr().err.count("warning: --to is deprecated; use --format") == 1  # one line, given twice


def test_verifier_config_is_target(tmp_path, draft, capsys):
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 6, "hidden_size": 64,
                                  "vocab_size": 256, "max_position_embeddings": 2048}))
    assert main(["inspect", str(draft), "--target", str(target), "--json"]) == 0
    new = json.loads(capsys.readouterr().out)
    assert main(["inspect", str(draft), "--verifier-config", str(target), "--json"]) == 0
    out = capsys.readouterr()
    said = "--verifier-config is deprecated; use --target"
    assert json.loads(out.out) == {**new, "stderr_warnings": [said]} and f"warning: {said}" in out.err
    for flag, out in (("--target", "a"), ("--verifier-config", "b")):
        assert main(["convert", str(draft), str(tmp_path / out), "--format", "eagle", flag, str(target)]) == 0
    assert (tmp_path / "a" / "config.json").read_text() == (tmp_path / "b" / "config.json").read_text()


def test_old_and_new_name_together_or_neither_is_a_usage_error(tmp_path, draft, capsys):
    assert main(["convert", str(draft), str(tmp_path / "o"), "--to", "eagle", "--format", "both"]) == 2
    assert "not allowed with argument --to" in capsys.readouterr().err
    assert main(["convert", str(draft), str(tmp_path / "o")]) == 2
    assert "--format is required" in capsys.readouterr().err
    for verb in (["inspect", str(draft)], ["convert", str(draft), str(tmp_path / "o"), "--format", "eagle"]):
        assert main([*verb, "--target", str(draft), "--verifier-config", str(draft)]) == 2  # not: the last one wins
        assert "not allowed with argument --target" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_helper_keeps_type_choices_and_hides_the_alias(capsys):
    p = argparse.ArgumentParser(prog="x")
    new = p.add_argument("--limit", type=int, choices=(1, 2))
    add_deprecated_alias(p, "--max", new)
    assert p.parse_args(["--max", "2"]).limit == 2
    assert "warning: --max is deprecated; use --limit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        p.parse_args(["--max", "3"])  # the new flag's choices hold for the old name
    assert "--max" not in p.format_help()
