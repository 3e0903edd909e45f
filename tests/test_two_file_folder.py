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
    assert main(["inspect", str(two_files)]) == 1  # shown, and graded as check grades it
    capsys.readouterr()
    assert main(["check", str(two_files), "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert "config_files_disagree_capture_layers" in [p["code"] for p in rep["problems"]]


SILENT = {  # field: (what the speculators file drops, what the flat file then states)
    "norm_before_residual": ((), {"norm_before_residual": True}),
    "rms_norm_eps": (("transformer_layer_config", "rms_norm_eps"), {}),
    "capture_layers": (("eagle_aux_hidden_state_layer_ids",), {"eagle_aux_hidden_state_layer_ids": [3, 15, 27]}),
}


@pytest.mark.parametrize("field", SILENT)
def test_a_value_one_file_leaves_to_its_default_is_compared(two_files, field):
    """One file states a value, the other is silent and so reads a default: a reader of either file
    builds another draft. Not "agrees with", and convert refuses (it would keep the default)."""
    spec, flat = (json.loads((two_files / n).read_text()) for n in ("config_speculators.json", "config.json"))
    path, stated = SILENT[field]
    (spec["transformer_layer_config"] if len(path) == 2 else spec).pop(path[-1] if path else field)
    flat.update(stated)
    flat["eagle_config"].update({k: v for k, v in stated.items() if k in flat["eagle_config"]})  # nested copies too
    for name, cfg in (("config_speculators.json", spec), ("config.json", flat)):
        (two_files / name).write_text(json.dumps(cfg))
    ck = read_checkpoint(two_files)
    found = [d for d in ck.disagreements if d["field"] == field]
    assert found and found[0]["code"].startswith("config_files_disagree") and "write " in found[0]["fix"]
    assert "agrees with" not in ck.reason
    if field != "rms_norm_eps":  # 1e-6 vs 1e-5: rounding it is not
        assert ck.problems
        with pytest.raises(FormatError, match=field):
            convert_checkpoint(two_files, two_files.parent / "out", "both")
        assert not (two_files.parent / "out").exists()


def test_equivalent_rope_spellings_agree(two_files):
    """rope_scaling's legacy `type` key is `rope_type`, and {"rope_type": "default"} is no scaling."""
    spec, flat = (json.loads((two_files / n).read_text()) for n in ("config_speculators.json", "config.json"))
    yarn = {"factor": 4.0, "original_max_position_embeddings": 2048}
    spec["transformer_layer_config"]["rope_scaling"] = {"rope_type": "yarn", **yarn}
    spec["transformer_layer_config"].pop("rope_parameters", None)
    flat.pop("rope_parameters", None)
    flat["rope_scaling"] = {"type": "yarn", **yarn}
    for name, cfg in (("config_speculators.json", spec), ("config.json", flat)):
        (two_files / name).write_text(json.dumps(cfg))
    assert not [d for d in read_checkpoint(two_files).disagreements if d["field"] == "rope_scaling"]
    spec["transformer_layer_config"]["rope_scaling"], flat["rope_scaling"] = {"rope_type": "default"}, None
    for name, cfg in (("config_speculators.json", spec), ("config.json", flat)):
        (two_files / name).write_text(json.dumps(cfg))
    ck = read_checkpoint(two_files)
    assert not [d for d in ck.disagreements if d["field"] == "rope_scaling"] and ck.contract.rope_scaling is None


def test_weights_that_fit_the_other_file_are_refused_naming_the_disagreement(two_files, capsys):
    """The vocab written larger in config_speculators.json (the file read): the weights that do not fit
    it, which inspect refused, are the disagreement's symptom, and its fix is the files'."""
    spec = json.loads((two_files / "config_speculators.json").read_text())
    spec["transformer_layer_config"]["vocab_size"] += 1
    (two_files / "config_speculators.json").write_text(json.dumps(spec))
    capsys.readouterr()
    assert main(["convert", str(two_files), str(two_files.parent / "out"), "--format", "eagle", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config.json and config_speculators.json disagree on vocab_size")
    assert "; and so " in err
    assert "hint: fix the wrong file, or delete it" in err
    assert main(["inspect", str(two_files)]) == 1  # shown, the problem listed
    out = capsys.readouterr().out
    assert "problem [vocab_size] config.json and config_speculators.json disagree on vocab_size" in out


def test_weights_that_fit_neither_file_are_not_blamed_on_an_unrelated_disagreement(two_files, capsys):
    spec = json.loads((two_files / "config_speculators.json").read_text())
    flat = json.loads((two_files / "config.json").read_text())
    spec["transformer_layer_config"]["intermediate_size"] += 1
    flat["intermediate_size"] += 1  # the files agree on the wrong size
    flat["rms_norm_eps"] = 1e-3  # and disagree on something else
    (two_files / "config_speculators.json").write_text(json.dumps(spec))
    (two_files / "config.json").write_text(json.dumps(flat))
    capsys.readouterr()
    assert main(["convert", str(two_files), str(two_files.parent / "out"), "--format", "eagle", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "mlp.gate_proj.weight" in err and "config files" not in err and "disagree on" not in err, err
    assert main(["inspect", str(two_files)]) == 1
    problems = capsys.readouterr().out.split("problems (", 1)[1].split("warnings:")[0]
    assert "mlp.gate_proj.weight" in problems and "disagree on" not in problems, problems


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
