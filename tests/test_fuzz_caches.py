"""Other trainers' feature caches, fuzzed like every other input: a SpecForge `.ckpt` or a speculators
`hs_i.safetensors` with one thing wrong (NaN or Inf in the states, ids outside the vocabulary or float,
a key missing, a width or length that disagrees, the file cut short, a bit flipped in a stored tensor)
is refused by `eyas eval --data`
with exit 2 and one `error:` line naming the cache, no traceback, nothing written, the cache untouched;
a mutation that leaves a valid cache is evaluated (exit 0).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

import cache_writers
from eyas.cli import main
from eyas.data import open_shards
from eyas.target import Target
from test_data import CROSS
from test_evaluate import tiny  # noqa: F401 (a fixture)
from test_fuzz import FUZZ

pytestmark = pytest.mark.usefixtures("one_thread")
CACHE_FUZZ = FUZZ.__class__(FUZZ, max_examples=int(os.environ.get("EYAS_FUZZ_CACHE_EXAMPLES", "40")))
VOCAB = 48  # the tiny target's


@pytest.fixture(scope="module")
def caches(tiny, tmp_path_factory):
    folder, shards = tiny
    rows = [(s["input_ids"], s["loss_mask"].long()) for s in open_shards(shards)][:2]
    model = Target.load(folder).model
    root = tmp_path_factory.mktemp("fuzz-caches")
    cache_writers.write_specforge(model, rows, root / "specforge", layer_ids=[k - 1 for k in CROSS], batch_size=1)
    cache_writers.write_speculators(model, rows, root / "speculators",
                                    layer_ids=[*CROSS, model.config.num_hidden_layers])
    draft = root / "draft"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", ",".join(map(str, CROSS))]) == 0
    return folder, root, draft


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(folder)).encode() + p.read_bytes())
    return h.hexdigest()


@st.composite
def record_mutation(draw, record: dict[str, torch.Tensor], ids_key: str, float_keys: tuple[str, ...]):
    """One thing wrong with a stored sample: (the new record or raw bytes, whether it must be refused)."""
    rec = {k: v.clone() for k, v in record.items()}
    kind = draw(st.sampled_from(["nan", "inf", "id_high", "id_negative", "float_ids", "drop_key", "narrow",
                                 "shorter", "truncate", "harmless"]))
    if kind in ("nan", "inf"):
        key = draw(st.sampled_from(float_keys))
        flat = rec[key].view(-1)
        flat[draw(st.integers(0, flat.numel() - 1))] = float("nan") if kind == "nan" else float("inf")
    elif kind == "id_high":
        rec[ids_key][draw(st.integers(0, rec[ids_key].numel() - 1))] = draw(st.integers(VOCAB, 10**6))
    elif kind == "id_negative":
        rec[ids_key][draw(st.integers(0, rec[ids_key].numel() - 1))] = -draw(st.integers(1, 10))
    elif kind == "float_ids":
        rec[ids_key] = rec[ids_key].float()
    elif kind == "drop_key":
        del rec[draw(st.sampled_from(sorted(rec)))]
    elif kind == "narrow":
        key = draw(st.sampled_from(float_keys))
        rec[key] = rec[key][..., :-1].contiguous()
    elif kind == "shorter":
        key = draw(st.sampled_from(sorted(rec)))
        rec[key] = rec[key][..., :-1, :].contiguous() if rec[key].ndim >= 2 else rec[key][:-1].contiguous()
    elif kind == "harmless":  # ids still inside the vocabulary: a different but valid sample
        rec[ids_key] = rec[ids_key] % VOCAB
    return rec, kind, kind != "harmless"


def _truncate(path: Path, data) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])


def _flip_a_stored_bit(path: Path, data) -> None:
    """One bit of a tensor's bytes flipped inside the zip (torch.load does not check the members' CRC-32s)."""
    with zipfile.ZipFile(path) as archive:
        members = [i for i in archive.infolist() if "/data/" in i.filename and i.file_size]
    info = data.draw(st.sampled_from(members))
    raw = bytearray(path.read_bytes())
    name_len, extra_len = (int.from_bytes(raw[info.header_offset + o: info.header_offset + o + 2], "little")
                           for o in (26, 28))  # the local header's name and extra-field lengths
    at = info.header_offset + 30 + name_len + extra_len + data.draw(st.integers(0, info.file_size - 1))
    raw[at] ^= 1 << data.draw(st.integers(0, 7))
    path.write_bytes(bytes(raw))


def _run_case(folder: Path, case: Path, draft: Path, capsys, must: bool) -> None:
    before = _digest(case)
    out = case.parent / "plot.png"
    capsys.readouterr()
    rc = main(["eval", str(draft), "--data", str(case), "--target", str(folder), "--dtype", "fp32", "--depth", "2",
               "--no-progress", "--plot", str(out)])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert "Traceback" not in err
    if must:
        assert rc == 2 and len(errors) == 1 and str(case) in errors[0], err
        assert not out.exists()
    else:
        assert rc in (0, 2), err
    assert _digest(case) == before


@CACHE_FUZZ
@given(data=st.data())
def test_mutated_specforge_files_are_refused_cleanly(caches, data, capsys, tmp_path_factory):
    folder, root, draft = caches
    case = tmp_path_factory.mktemp("sf") / "cache"
    shutil.copytree(root / "specforge", case)
    target = sorted(case.rglob("*.ckpt"))[0]
    record = torch.load(target, weights_only=True)
    rec, kind, must = data.draw(record_mutation(record, "input_ids", ("aux_hidden_state", "hidden_state")))
    if kind == "truncate":
        _truncate(target, data)
    elif data.draw(st.booleans(), label="flip a bit instead"):
        must = True
        _flip_a_stored_bit(target, data)
    else:
        torch.save(rec, target)
    _run_case(folder, case, draft, capsys, must)


@CACHE_FUZZ
@given(data=st.data())
def test_mutated_speculators_files_are_refused_cleanly(caches, data, capsys, tmp_path_factory):
    folder, root, draft = caches
    case = tmp_path_factory.mktemp("spec") / "cache"
    shutil.copytree(root / "speculators", case)
    target = case / "hidden_states" / "hs_0.safetensors"
    rec, kind, must = data.draw(record_mutation(load_file(target), "token_ids", ("hidden_states",)))
    if kind == "truncate":
        _truncate(target, data)
    else:
        if kind == "harmless":  # the Arrow rows must match the token ids: keep them as written
            rec["token_ids"] = load_file(target)["token_ids"]
        save_file({k: v.contiguous() for k, v in rec.items()}, str(target))
    _run_case(folder, case, draft, capsys, must)
