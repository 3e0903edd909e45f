"""eyas.weights: every on-disk layout, partial reads, corrupt files, the one rename rule, exact writes."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from safetensors.torch import save_file

from conftest import random_tensors, tiny_contract
from eyas.contract import expected_shapes
from eyas.errors import FormatError
from eyas.weights import (
    dtype_name,
    from_canonical,
    read_tensors,
    to_canonical,
    weight_files,
    weight_naming,
    write_tensors,
)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def _shard(folder, tensors, n_shards: int, ext: str) -> dict[str, str]:
    """Split tensors over n shards + an index, the way HF writes them."""
    names = sorted(tensors)
    weight_map = {}
    for s in range(n_shards):
        part = {n: tensors[n] for n in names[s::n_shards]}
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.{ext}"
        if ext == "safetensors":
            save_file(part, str(folder / fname))
        else:
            torch.save(part, folder / fname)
        weight_map.update({n: fname for n in part})
    index = "model.safetensors.index.json" if ext == "safetensors" else "pytorch_model.bin.index.json"
    (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return weight_map


@pytest.fixture
def tensors():
    t = random_tensors(tiny_contract(has_embeddings=True), seed=1)
    t["fc.weight"] = t["fc.weight"].to(torch.bfloat16)  # mixed dtypes must survive as they are
    return t


def test_single_safetensors_and_bin_read_exactly(tmp_path, tensors):
    (tmp_path / "a").mkdir()
    save_file(tensors, str(tmp_path / "a" / "model.safetensors"))
    (tmp_path / "b").mkdir()
    torch.save(tensors, tmp_path / "b" / "pytorch_model.bin")
    assert _same(read_tensors(tmp_path / "a"), tensors)
    assert _same(read_tensors(tmp_path / "b"), tensors)
    assert weight_files(tmp_path / "b") == ["pytorch_model.bin"]


@pytest.mark.parametrize("ext", ["safetensors", "bin"])
def test_sharded_reads_all_and_only_needed_shards(tmp_path, tensors, ext):
    wm = _shard(tmp_path, tensors, 3, ext)
    assert _same(read_tensors(tmp_path), tensors)
    assert weight_files(tmp_path)[0].endswith(".index.json") and len(weight_files(tmp_path)) == 4
    # corrupt every shard that does not hold lm_head: a partial read must not open them
    for shard in set(wm.values()) - {wm["lm_head.weight"]}:
        (tmp_path / shard).write_bytes(b"not a tensor file")
    got = read_tensors(tmp_path, ["lm_head.weight"])
    assert list(got) == ["lm_head.weight"] and torch.equal(got["lm_head.weight"], tensors["lm_head.weight"])
    with pytest.raises(FormatError, match="model-0000"):
        read_tensors(tmp_path)


def test_missing_name_is_named(tmp_path, tensors):
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(FormatError, match=r"tensor 'nope\.weight' not found") as e:
        read_tensors(tmp_path, ["fc.weight", "nope.weight"])
    assert str(tmp_path) in str(e.value)


def test_missing_shard_and_bad_index(tmp_path, tensors):
    wm = _shard(tmp_path, tensors, 2, "safetensors")
    os.remove(tmp_path / wm["norm.weight"])
    with pytest.raises(FormatError, match="names shard .* which is not in"):
        read_tensors(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{")
    with pytest.raises(FormatError, match="weight_map"):
        read_tensors(tmp_path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors(tmp_path, tensors, damage):
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    data = path.read_bytes()
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x00garbage" * 64, "empty": b""}[damage])
    with pytest.raises(FormatError, match="model.safetensors: not a readable safetensors file"):
        read_tensors(tmp_path)


def _relabel(path, name: str, **entry) -> None:
    """Rewrite one tensor's header entry (dtype, shape, data_offsets), the bytes left as they are."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    header[name].update(entry)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])


@pytest.mark.parametrize(
    "lie",
    [dict(shape=[2**40, 2**40]), dict(shape=[-1, 64]), dict(shape="64"), dict(dtype="XYZ"), dict(dtype=7),
     dict(data_offsets=[0, 2**63]), dict(data_offsets=[-1, 4])],
    ids=lambda lie: json.dumps(lie),
)
def test_a_lying_header_is_a_format_error(tmp_path, tensors, lie):
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    _relabel(path, "norm.weight", **lie)
    with pytest.raises(FormatError, match="model.safetensors: not a readable safetensors file"):
        read_tensors(tmp_path)


def test_an_index_python_cannot_hold_is_a_format_error(tmp_path, tensors):
    _shard(tmp_path, tensors, 2, "safetensors")
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": ' + "9" * 5000 + "}")
    with pytest.raises(FormatError, match="index.json: field 'weight_map' unreadable"):
        read_tensors(tmp_path)


class _Payload:
    """A pickle that would create a file if it were ever unpickled without weights_only."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_code_is_refused_never_run(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"fc.weight": torch.ones(2), "x": _Payload(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(FormatError, match=r"pytorch_model.bin: torch.load\(weights_only=True\) refused"):
        read_tensors(tmp_path)
    assert not marker.exists()


def test_bin_that_is_not_a_state_dict(tmp_path):
    torch.save([torch.ones(2)], tmp_path / "pytorch_model.bin")
    with pytest.raises(FormatError, match="expected a dict of name -> tensor, found list"):
        read_tensors(tmp_path)


def test_no_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FormatError, match=r"no weights found \(files: \['config.json'\]\)"):
        read_tensors(tmp_path)


def test_rename_rule_covers_every_key_and_round_trips():
    c = tiny_contract(
        num_hidden_layers=2, layer_type="qwen3", attention_bias=True, norm_before_fc=True, has_embeddings=True
    )
    t = random_tensors(c)
    on_disk = from_canonical(t, "eagle")
    assert not any(n.startswith("layers.0.") for n in on_disk)
    assert {n for n in on_disk if n.startswith("midlayer.")} == {
        "midlayer." + n[9:] for n in expected_shapes(c) if n.startswith("layers.0.")
    }
    assert any(n.startswith("layers.1.") for n in on_disk)  # later layers keep their names
    assert weight_naming(on_disk) == "eagle" and weight_naming(t) == "speculators"
    assert _same(to_canonical(on_disk, "eagle"), t)
    assert _same(to_canonical(t, "eagle"), t)  # canonical names pass through the eagle reader
    assert from_canonical(t, "speculators") == t


def test_both_spellings_of_one_tensor_are_refused():
    x = torch.ones(2)
    with pytest.raises(FormatError, match="both 'layers.0.norm' and 'midlayer.norm', two spellings of 'layers.0.norm'"):
        to_canonical({"layers.0.norm": x, "midlayer.norm": x}, "eagle")
    with pytest.raises(FormatError, match="both 'fc_norm.2.weight' and 'aux_norm_high.weight'"):
        to_canonical({"fc_norm.2.weight": x, "aux_norm_high.weight": x}, "speculators")


def test_specforge_aux_norm_names_are_fc_norm_in_capture_order():
    x = [torch.full((2,), float(i)) for i in range(3)]
    got = to_canonical({"aux_norm_low.weight": x[0], "aux_norm_mid.weight": x[1], "aux_norm_high.weight": x[2],
                        "midlayer.hidden_norm.weight": x[0]}, "eagle")
    assert sorted(got) == ["fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight", "layers.0.hidden_norm.weight"]
    assert [got[f"fc_norm.{i}.weight"][0].item() for i in range(3)] == [0.0, 1.0, 2.0]


def test_write_is_bit_exact_and_unties_shared_storage(tmp_path, tensors):
    tied = dict(tensors)
    tied["lm_head.weight"] = tied["embed_tokens.weight"][:64]  # a view sharing storage, as tied heads are
    path = write_tensors(tmp_path, tied)
    assert path.name == "model.safetensors"
    assert _same(read_tensors(tmp_path), {k: v.contiguous() for k, v in tied.items()})


def test_dtype_name(tensors):
    assert dtype_name(tensors) == "float32"
    assert (
        dtype_name({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}) == "bfloat16"
    )
    assert dtype_name({"d2t": torch.zeros(3, dtype=torch.int64)}) is None
