"""The folder training pipelines export: a flat config.json beside config_speculators.json. It is never
refused; each disagreement is a finding graded by what it changes. And unreadable weights exit 2."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files

import pytest

from conftest import random_tensors, tiny_contract
from eyas.check import check_checkpoint
from eyas.cli import main
from eyas.errors import FormatError
from eyas.formats import convert_checkpoint, read_checkpoint, write_checkpoint

SHIPPED = files("eyas") / "drafts" / "smollm2-135m-instruct"


@pytest.fixture
def two_files(tmp_path):
    """The shipped draft as a flat export leaves it: its eagle config as config.json with another context
    length and a rounded epsilon, its speculators config as config_speculators.json."""
    d = tmp_path / "draft"
    d.mkdir()
    shutil.copy(SHIPPED / "model.safetensors", d / "model.safetensors")
    shutil.copy(SHIPPED / "config.json", d / "config_speculators.json")
    flat = json.loads((SHIPPED / "config_eagle.json").read_text())
    flat["max_position_embeddings"] = 2048
    flat["rms_norm_eps"] = 1e-05  # the shipped 9.999999747378752e-06 is float32's 1e-5
    (d / "config.json").write_text(json.dumps(flat, indent=2))
    return d


def test_the_shipped_draft_as_two_files_is_read(two_files, capsys):
    ck = read_checkpoint(two_files)
    assert ck.files == {"config.json": "eagle", "config_speculators.json": "speculators"}
    assert ck.config_used == "config_speculators.json" and "unambiguous" in ck.reason
    assert "config.json disagrees on max_position_embeddings, rms_norm_eps" in ck.reason
    assert [(d["code"], d["field"]) for d in ck.disagreements] == [
        ("config_files_disagree_context", "max_position_embeddings"),
        ("config_files_disagree_eps_rounding", "rms_norm_eps"),
    ]
    assert ck.problems == [] and ck.contract.max_position_embeddings == 8192
    assert "2048" in ck.disagreements[0]["warning"] and "8192" in ck.disagreements[0]["warning"]
    rep = check_checkpoint(two_files, target="default")
    assert rep.ok and {"config_files_disagree_context", "config_files_disagree_eps_rounding"} <= {
        w["code"] for w in rep.warnings
    }
    assert main(["inspect", str(two_files)]) == 0
    out = capsys.readouterr().out
    assert "max_position_embeddings" in out and "config_speculators.json" in out
    assert main(["inspect", str(two_files), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config_used"] == "config_speculators.json"
    assert main(["check", str(two_files), "--target", "default"]) == 0
    capsys.readouterr()
    _, written = convert_checkpoint(two_files, two_files.parent / "out", "both")  # converted from the one used
    assert written.contract == ck.contract


def test_a_disagreement_that_changes_the_draft_is_a_problem(two_files, capsys):
    flat = json.loads((two_files / "config.json").read_text())
    flat["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 14, 27]  # SGLang's rule: capture [2, 15, 28]
    del flat["eagle_aux_hidden_state_layer_ids"]
    (two_files / "config.json").write_text(json.dumps(flat))
    ck = read_checkpoint(two_files)  # still read
    assert [p["code"] for p in ck.problems] == ["config_files_disagree_capture_layers"]
    assert ck.contract.capture_layers == (2, 15, 27)
    assert main(["inspect", str(two_files)]) == 0
    capsys.readouterr()
    assert main(["check", str(two_files), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert "config_files_disagree_capture_layers" in [p["code"] for p in rep["problems"]]


def test_check_on_unreadable_weights_exits_2(tmp_path, capsys):
    c = tiny_contract(capture_layers=(2, 3, 5))
    write_checkpoint(tmp_path / "ck", c, random_tensors(c), "speculators")
    data = (tmp_path / "ck" / "model.safetensors").read_bytes()
    (tmp_path / "ck" / "model.safetensors").write_bytes(data[:-7])
    with pytest.raises(FormatError, match="not a readable safetensors file"):
        check_checkpoint(tmp_path / "ck")
    assert main(["check", str(tmp_path / "ck")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "model.safetensors" in err and "Traceback" not in err
