"""The one vocab-map rule: `eyas check` (formats.vocab_map_problems) and the drafter
(drafter.check_vocab_map) accept and refuse the same d2t/t2d, for the same reason."""

from __future__ import annotations

import json

import pytest
import torch

from safetensors.torch import load_file, save_file

from conftest import random_tensors, tiny_contract
from eyas.cli import main
from eyas.drafter import check_vocab_map
from eyas.errors import ContractError
from eyas.formats import convert_checkpoint, read_checkpoint, vocab_map_problems, write_checkpoint
from eyas.formats.validate import VOCAB_MAP_COMPLETED


def vocab_map_cases() -> dict[str, dict[str, torch.Tensor]]:
    """Vocab maps for tiny_contract() (Vd 64 of V 256): valid, and one per way to break the rule."""
    t = random_tensors(tiny_contract())
    d2t, t2d = t["d2t"], t["t2d"]
    targets = torch.arange(64) + d2t
    swapped = targets.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    moved = t2d.clone()
    moved[int(torch.nonzero(~t2d)[0])] = True
    moved[int(targets[10])] = False
    return {
        "valid": {"d2t": d2t, "t2d": t2d},
        "unsorted": {"d2t": swapped - torch.arange(64), "t2d": t2d},  # the same set, two draft ids swapped
        "out of range": {"d2t": targets, "t2d": t2d},  # target ids stored instead of offsets
        "d2t int32": {"d2t": d2t.int(), "t2d": t2d},
        "t2d uint8": {"d2t": d2t, "t2d": t2d.to(torch.uint8)},
        "t2d disagrees": {"d2t": d2t, "t2d": moved},  # same count, one id moved
        "t2d count": {"d2t": d2t, "t2d": torch.ones(256, dtype=torch.bool)},
        "repeated id": {"d2t": d2t.index_fill(0, torch.tensor([5]), int(targets[4]) - 5), "t2d": t2d},
        "d2t short": {"d2t": d2t[:63], "t2d": t2d},
        "t2d short": {"d2t": d2t, "t2d": t2d[:255]},
        "no t2d": {"d2t": d2t},
        "no d2t": {"t2d": t2d},
        "none": {},
    }


BOTH = [name for name, m in vocab_map_cases().items() if set(m) == {"d2t", "t2d"}]  # what the drafter is given


@pytest.mark.parametrize("case", BOTH)
def test_check_and_drafter_agree(case):
    c, m = tiny_contract(), vocab_map_cases()[case]
    problems = vocab_map_problems(c, m)
    try:
        check_vocab_map(c, m["d2t"], m["t2d"])
        refused = None
    except ContractError as e:
        refused = e
    assert (refused is None) == (problems == []) == (case == "valid"), (case, problems, refused)
    if refused is not None and problems[0]["code"] != "vocab_map_shape":  # the drafter checks shapes itself
        assert str(refused) == problems[0]["problem"] and refused.hint == problems[0]["fix"]


def test_why_the_order_matters():
    """Engines read d2t in any order, but a t2d mask can only describe the ascending map: whatever reads
    the map from t2d (speculators' and SpecForge's training losses, eyas's doctor) gets another one."""
    m = vocab_map_cases()["unsorted"]
    from_d2t = torch.arange(64) + m["d2t"]
    from_t2d = m["t2d"].nonzero().flatten()
    assert set(from_d2t.tolist()) == set(from_t2d.tolist()) and not torch.equal(from_d2t, from_t2d)
    assert [p["code"] for p in vocab_map_problems(tiny_contract(), m)] == ["d2t_not_increasing"]


@pytest.mark.parametrize(
    ("case", "codes"),
    [
        ("valid", []),
        ("unsorted", ["d2t_not_increasing"]),
        ("out of range", ["d2t_out_of_range"]),
        ("d2t int32", ["d2t_dtype"]),
        ("t2d uint8", ["t2d_dtype"]),
        ("t2d disagrees", ["t2d_disagrees"]),
        ("t2d count", ["t2d_count"]),
        ("repeated id", ["d2t_not_increasing"]),
        ("d2t short", ["vocab_map_shape"]),
        ("t2d short", ["vocab_map_shape"]),
        ("no t2d", ["t2d_missing"]),
        ("no d2t", ["d2t_missing"]),
        ("none", ["vocab_map_missing"]),
    ],
)
def test_each_case_has_its_code(case, codes):
    assert [p["code"] for p in vocab_map_problems(tiny_contract(), vocab_map_cases()[case])] == codes


def test_a_missing_half_of_the_map_is_rebuilt_from_the_other_as_the_fix_says():
    """The fix for a missing d2t defined it by itself ("t2d[j] is true exactly for j in arange(Vd) + d2t")."""
    valid = vocab_map_cases()["valid"]
    [found] = vocab_map_problems(tiny_contract(), vocab_map_cases()["no d2t"])
    t2d = valid["t2d"]
    assert found["fix"] == "store d2t = t2d.nonzero().flatten() - arange(draft_vocab_size) (int64)"
    assert torch.equal(t2d.nonzero().flatten() - torch.arange(int(t2d.sum())), valid["d2t"])


def _stored(tmp_path, case: str):
    """tiny_contract() written as speculators, its vocab map then stored as `case` has it."""
    c = tiny_contract()
    d = write_checkpoint(tmp_path / case.replace(" ", "_"), c, random_tensors(c), "speculators")
    t = {k: v for k, v in load_file(d / "model.safetensors").items() if k not in ("d2t", "t2d")}
    save_file({**t, **vocab_map_cases()[case]}, d / "model.safetensors")
    return d


@pytest.mark.parametrize("case, codes", [("no t2d", ["t2d_derived"]), ("d2t int32", ["d2t_cast"]),
                                         ("t2d uint8", ["t2d_cast"])])
def test_a_map_engines_serve_is_completed_on_read(tmp_path, capsys, case, codes):
    """Engines read d2t alone and cast it on load: a valid d2t without t2d, or as int32, is served as
    intended, so eyas reads it whole (saying so) instead of refusing it, and convert stores it whole."""
    valid = vocab_map_cases()["valid"]
    ck = read_checkpoint(_stored(tmp_path, case))
    assert [w["code"] for w in ck.warnings if w["field"] in ("d2t", "t2d")] == codes and not ck.problems
    assert all(ck.tensors[k].dtype == v.dtype and torch.equal(ck.tensors[k], v) for k, v in valid.items())
    check_vocab_map(ck.contract, ck.tensors["d2t"], ck.tensors["t2d"])  # what every verb running it checks
    _, written = convert_checkpoint(ck.path, tmp_path / "out", "eagle")
    assert not {w["code"] for w in read_checkpoint(written.path).warnings} & set(VOCAB_MAP_COMPLETED)
    assert set(codes) <= set(VOCAB_MAP_COMPLETED)  # convert says "completed as warned", not "bit-identical"
    for src, completed in ((ck.path, True), (written.path, False)):  # and its JSON says which it was
        out = str(tmp_path / f"json_{completed}")
        assert main(["convert", str(src), out, "--format", "speculators", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["vocab_map_completed"] is completed


@pytest.mark.parametrize("case, stored, said", [
    ("no t2d", {"d2t": "int64"}, "not in the file: derived from d2t"),
    ("d2t int32", {"d2t": "int32", "t2d": "bool"}, "stored int32, read as int64"),
    ("t2d uint8", {"d2t": "int64", "t2d": "uint8"}, "stored uint8, read as bool"),
])
def test_inspect_lists_the_map_as_stored_and_says_what_was_completed(tmp_path, capsys, case, stored, said):
    """inspect listed the completed map as the file's: a t2d the file lacks among its tensors (one more than
    it holds), a d2t stored int32 as int64, beside the warning that said otherwise."""
    main(["inspect", str(_stored(tmp_path, case)), "--json"])
    t = json.loads(capsys.readouterr().out)["tensors"]
    assert {k: v["dtype"] for k, v in t["tensors"].items() if k in ("d2t", "t2d")} == stored
    assert t["count"] == len(t["tensors"]) and t["dtypes"]["float32"] == t["count"] - len(stored)
    (name, how), = t["completed"].items()
    assert how.startswith(said) and name == ("t2d" if case != "d2t int32" else "d2t")


@pytest.mark.parametrize("case", ["out of range", "d2t short"])
def test_a_map_engines_misread_is_not_completed(tmp_path, case):
    """Only a d2t the rule accepts is completed: a broken one without t2d stays refused."""
    d = _stored(tmp_path, case)
    save_file({k: v for k, v in load_file(d / "model.safetensors").items() if k != "t2d"}, d / "model.safetensors")
    codes = [p["code"] for p in read_checkpoint(d, strict=False).problems]
    assert "t2d_missing" in codes
    with pytest.raises(ContractError):
        read_checkpoint(d)


def test_engines_are_said_to_have_no_map_where_t2d_is_stored_without_d2t(tmp_path):
    """vLLM and SGLang skip t2d on load and llama.cpp's converter drops it: a t2d alone is no map to them, as no
    tensor is. inspect said vLLM and llama.cpp load it as intended (its `d2t_missing` problem aside)."""
    from eyas.check.consumers import consumers

    for case in ("no d2t", "none"):
        views = consumers(read_checkpoint(_stored(tmp_path, case), strict=False))
        assert [m["code"] for m in views["vllm"]["mismatches"]] == ["consumer_no_vocab_map"], case
        assert views["llamacpp"]["refused"] == ["reduced vocab without d2t: the loader sizes the lm_head by the "
                                                "target vocab and fails"], case
    assert consumers(read_checkpoint(_stored(tmp_path, "no t2d")))["vllm"]["mismatches"] == []  # d2t is all they read


def test_speculators_is_said_to_need_both_halves_of_the_map(tmp_path):
    """speculators 0.9.0's from_pretrained (run on these files, with a local verifier) loads a t2d-only draft with
    its d2t buffer as allocated (not the map: 35 of 64 entries nonzero in one run), and raises a size mismatch on a
    d2t-only one (its t2d, as allocated, picks the lm_head rows). eyas said it loads both as intended."""
    from eyas.check.consumers import consumers

    t2d_only = consumers(read_checkpoint(_stored(tmp_path, "no d2t"), strict=False))["speculators"]
    assert t2d_only["loads"] and [m["code"] for m in t2d_only["mismatches"]] == ["consumer_no_vocab_map"]
    for case in ("no t2d", "none"):
        view = consumers(read_checkpoint(_stored(tmp_path, case), strict=False))["speculators"]
        assert not view["loads"] and "no t2d in the file" in view["refused"][0], case
        assert [(m["code"], m["field"]) for m in view["mismatches"]] == [("consumer_cannot_load", "t2d")], case
    assert consumers(read_checkpoint(_stored(tmp_path, "valid")))["speculators"]["mismatches"] == []


def test_inspect_counts_no_vocab_map_among_the_parameters(tmp_path):
    """d2t and t2d are token ids and a mask, not weights: the parameter count held their 57,344 elements too."""
    from eyas.cli.checkpoint import tensor_summary

    ck = read_checkpoint(_stored(tmp_path, "valid"))
    assert tensor_summary(ck)["parameters"] == sum(t.numel() for n, t in ck.tensors.items() if n not in ("d2t", "t2d"))
    assert tensor_summary(ck)["count"] == len(ck.tensors)  # still listed as tensors
