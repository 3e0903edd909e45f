"""Tensor files of a draft checkpoint: find them, read them (all or a few), write them, rename them.

Formats on disk: `model.safetensors`, sharded `model.safetensors.index.json` (+ shards),
`pytorch_model.bin` and its sharded index. Pickles are read with `torch.load(weights_only=True)`
only: a checkpoint never runs code here.

Names: eyas works in speculators naming (`layers.{i}.*`). Every other spelling is read here and
nowhere else: the original EAGLE / SpecForge / SGLang naming's `midlayer.` for `layers.0.` (written
back by `from_canonical`), a SpecForge branch's `aux_norm_low/mid/high` for `fc_norm.0/1/2`, and the
`model.` prefix of an export that saved the wrapping module's state dict (`unwrap`; read only).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from eyas.atomic import temp_file
from eyas.errors import FormatError

# Single-file and sharded layouts, in the order they are looked for (safetensors first: no pickle).
WEIGHT_LAYOUTS = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)
WEIGHTS_FILE = "model.safetensors"  # what eyas writes

# The eagle rename rule (both ways): eagle on-disk prefix <-> canonical prefix.
_EAGLE_PREFIX, _CANONICAL_PREFIX = "midlayer.", "layers.0."
WRAPPER_PREFIX = "model."  # the wrapping module's prefix some exports leave on the draft's names
# fc_norm's chunks under the names a SpecForge branch gives them (ceefdebd, `use_aux_norm`), in capture order
AUX_NORM_NAMES = {"aux_norm_low.": "fc_norm.0.", "aux_norm_mid.": "fc_norm.1.", "aux_norm_high.": "fc_norm.2."}

# What safetensors and torch raise on a file that lies about itself: its own error for a bad header,
# OSError for an unreadable or vanished file, the rest for dtypes or sizes torch cannot hold.
UNREADABLE = (SafetensorError, OSError, ValueError, TypeError, OverflowError, MemoryError, RuntimeError)

_HINT_FILES = "a draft folder holds model.safetensors, a sharded model.safetensors.index.json, or pytorch_model.bin"


def find_weights(folder: Path) -> Path | None:
    """The index or single weights file in `folder`, or None when it holds none."""
    for name in WEIGHT_LAYOUTS:
        if (folder / name).is_file():
            return folder / name
    return None


def weight_layouts(folder: Path) -> list[str]:
    """Every weights layout in `folder`, in the order eyas looks (the first is the one read); a file
    that an index present lists as its shard is part of that index, not a layout of its own."""
    present = [n for n in WEIGHT_LAYOUTS if (folder / n).is_file()]
    if len(present) < 2:  # the usual folder: no index read again
        return present
    listed = {f for n in present if n.endswith(".index.json") for f in _weight_map(folder / n).values()}
    return [n for n in present if n not in listed]


def weight_files(folder: Path) -> list[str]:
    """Every file that holds tensors (the index first, then its shards), as names relative to `folder`."""
    found = find_weights(folder)
    if found is None:
        return []
    if found.name.endswith(".index.json"):
        return [found.name, *sorted(set(_weight_map(found).values()))]
    return [found.name]


def tensor_list(names: Iterable[str], shown: int = 6) -> str:
    """"N tensors: a, b, ... and M more": what a file holds, on one line (a model's weights name hundreds)."""
    names = sorted(names)
    head = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
    return f"{len(names)} tensor{'s' * (len(names) != 1)}" + (f": {head}" if names else "")


def written(folder: Path) -> list[list]:
    """[name, bytes, modification time in ns] of each weights file in `folder` (none for what is no folder):
    what a measurement cached for a model is keyed by, so weights written anew there are measured again
    (keyed by the path alone, a retrained draft or another model copied in kept the old verdict)."""
    stamps = []
    for name in weight_files(folder) if folder.is_dir() else []:
        try:
            st = (folder / name).stat()
        except OSError:  # the load that follows says what is missing
            continue
        stamps.append([name, st.st_size, st.st_mtime_ns])
    return stamps


def model_files(folder: Path) -> list[str]:
    """What makes `folder` a model's or a draft's: its config.json and weight files (none: it is neither).
    Outputs that are folders (a capture, a training run) are not written among them."""
    if not folder.is_dir():
        return []
    return (["config.json"] if (folder / "config.json").is_file() else []) + weight_files(folder)


def read_tensors(folder: Path, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
    """Tensors of the checkpoint in `folder`, under their raw on-disk names (no renaming).

    With `names`, only those tensors are read, opening only the shards that hold them; a missing
    name raises FormatError naming the folder and the tensor.
    """
    folder = Path(folder)
    found = find_weights(folder)
    if found is None:
        present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise FormatError(
            f"{folder}: no weights found (files: {present or 'none'})",
            _HINT_FILES,
        )
    wanted = None if names is None else list(dict.fromkeys(names))
    if found.name.endswith(".index.json"):
        tensors = _read_sharded(found, wanted)
    else:
        tensors = _read_file(found, None if wanted is None else set(wanted))
    if wanted is not None:
        missing = [n for n in wanted if n not in tensors]
        if missing:
            raise FormatError(
                f"{folder}: tensor {missing[0]!r} not found in {found.name}"
                + (f" (also missing: {missing[1:]})" if missing[1:] else ""),
                "check the tensor name, or run: eyas inspect " + str(folder),
            )
    return tensors


def weight_bytes(folder: Path, dtype: torch.dtype) -> int:
    """What the weights in `folder` take once loaded in `dtype`, from the safetensors headers (no
    tensor is read); pickles count by file size, as if stored in fp32. 0 when there are none."""
    folder, itemsize, count = Path(folder), torch.empty(0, dtype=dtype).element_size(), 0
    for rel in weight_files(folder) if find_weights(folder) else []:
        path = folder / rel
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="pt") as f:
                    count += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
            except UNREADABLE:
                continue  # reading it later names the problem
        elif path.is_file() and not rel.endswith(".json"):
            count += path.stat().st_size // 4
    return count * itemsize


def _first_line(e: BaseException) -> str:
    """An exception as one short line, for an error that must stay on one line."""
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:200]


def _read_file(path: Path, names: set[str] | None) -> dict[str, torch.Tensor]:
    """One safetensors or pickle file; `names` limits which tensors are materialised."""
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys() if names is None or k in names}
        except UNREADABLE as e:  # the header, offsets, dtypes or shapes are not what the bytes hold
            raise FormatError(
                f"{path}: not a readable safetensors file ({_first_line(e)})",
                "the file is truncated or corrupt: download or export it again",
            ) from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any unpickling failure is a bad input file, never a bug in eyas
        raise FormatError(
            f"{path}: torch.load(weights_only=True) refused the file ({_first_line(e)})",
            "eyas never unpickles arbitrary objects; re-save the weights as safetensors from a trusted environment",
        ) from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise FormatError(
            f"{path}: expected a dict of name -> tensor, found {type(obj).__name__}",
            "save the draft's state_dict (torch.save(model.state_dict(), ...)) or use safetensors",
        )
    return {k: v for k, v in obj.items() if names is None or k in names}


def _weight_map(index: Path) -> dict[str, str]:
    """The `weight_map` of a sharded index: tensor name -> shard file name."""
    try:
        wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (ValueError, RecursionError, KeyError, TypeError) as e:  # ValueError: bad JSON or UTF-8
        raise FormatError(
            f"{index}: field 'weight_map' unreadable ({type(e).__name__}: {_first_line(e)})",
            'a shard index is JSON with {"weight_map": {"tensor name": "shard file"}}',
        ) from None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise FormatError(f"{index}: field 'weight_map' is not a name -> file mapping", _HINT_FILES)
    return wm


def _read_sharded(index: Path, names: list[str] | None) -> dict[str, torch.Tensor]:
    wm = _weight_map(index)
    wanted = list(wm) if names is None else [n for n in names if n in wm]
    by_shard: dict[str, set[str]] = {}
    for n in wanted:
        by_shard.setdefault(wm[n], set()).add(n)
    out: dict[str, torch.Tensor] = {}
    for shard, shard_names in sorted(by_shard.items()):
        path = index.parent / shard
        if not path.is_file():
            raise FormatError(
                f"{index}: weight_map names shard {shard!r}, which is not in {index.parent}",
                "copy the missing shard next to the index",
            )
        got = _read_file(path, shard_names)
        absent = sorted(shard_names - got.keys())
        if absent:
            raise FormatError(
                f"{path}: tensor {absent[0]!r} is listed in {index.name} but not in the shard",
                "the index and the shards are from different exports: export them again",
            )
        out.update(got)
    return out


# --- naming -------------------------------------------------------------------------------------


def weight_naming(names: Iterable[str]) -> str:
    """ "eagle" when the first layer is stored as `midlayer.*`, else "speculators"."""
    return "eagle" if any(n.startswith(_EAGLE_PREFIX) for n in names) else "speculators"


def unwrap(tensors: dict[str, torch.Tensor], source: str = "weights") -> tuple[dict[str, torch.Tensor], int]:
    """The names without the `model.` prefix a whole-model export leaves on them, and how many carried it.

    Read through, not refused: the weights are the draft's own and SGLang, which adds the prefix only
    where it is missing, serves them; vLLM adds it to every name but lm_head's and refuses
    `model.model.*`, which is why a reader reports the count. A file holding both spellings of one
    tensor is refused (`source` names it).
    """
    out: dict[str, torch.Tensor] = {}
    carried = 0
    for name, t in sorted(tensors.items(), key=lambda kv: kv[0].startswith(WRAPPER_PREFIX)):
        bare = name.removeprefix(WRAPPER_PREFIX)
        if bare in out:
            raise FormatError(
                f"{source}: holds both {bare!r} and {name!r}",
                f"keep one of the two ({WRAPPER_PREFIX}* is the same tensor under its wrapping module's prefix)",
            )
        carried += bare != name
        out[bare] = t
    return out, carried


def to_canonical(tensors: dict[str, torch.Tensor], fmt: str, source: str = "weights") -> dict[str, torch.Tensor]:
    """On-disk names of format `fmt` -> canonical (speculators) names.

    eagle: `midlayer.x` -> `layers.0.x`; either format: `aux_norm_low.x` -> `fc_norm.0.x` (and mid, high).
    A file holding two spellings of one tensor is refused (`source` names it in the error).
    """
    if fmt != "speculators":
        _check_fmt(fmt)
    out: dict[str, torch.Tensor] = {}
    spelled: dict[str, str] = {}
    for name, t in tensors.items():
        canon = _canonical_name(name, fmt)
        if canon in out:
            raise FormatError(
                f"{source}: holds both {spelled[canon]!r} and {name!r}, two spellings of {canon!r}",
                "keep one of the two (midlayer.* is the EAGLE name of layers.0.*, aux_norm_low/mid/high.* a "
                "SpecForge name of fc_norm.0/1/2.*)",
            )
        out[canon], spelled[canon] = t, name
    return out


def aux_norm_spelled(names: Iterable[str]) -> int:
    """How many names are SpecForge's aux_norm_* spelling of fc_norm.* (engines refuse them; readers say so)."""
    return sum(n.startswith(tuple(AUX_NORM_NAMES)) for n in names)


def _canonical_name(name: str, fmt: str) -> str:
    if fmt == "eagle" and name.startswith(_EAGLE_PREFIX):
        return _CANONICAL_PREFIX + name[len(_EAGLE_PREFIX) :]
    old = next((o for o in AUX_NORM_NAMES if name.startswith(o)), None)
    return name if old is None else AUX_NORM_NAMES[old] + name[len(old) :]


def from_canonical(tensors: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """Canonical names -> on-disk names of format `fmt` (eagle: `layers.0.x` -> `midlayer.x`)."""
    if fmt == "speculators":
        return dict(tensors)
    _check_fmt(fmt)
    return {
        (_EAGLE_PREFIX + n[len(_CANONICAL_PREFIX) :] if n.startswith(_CANONICAL_PREFIX) else n): t
        for n, t in tensors.items()
    }


def _check_fmt(fmt: str) -> None:
    assert fmt in ("eagle", "speculators"), f"unknown weight naming {fmt!r}"


# --- writing ------------------------------------------------------------------------------------


def write_tensors(folder: Path, tensors: dict[str, torch.Tensor], name: str = WEIGHTS_FILE) -> Path:
    """Write one safetensors file (names as given), atomically; values and dtypes are kept bit for bit.

    Tensors that share storage (tied weights from a pickle) are cloned: safetensors stores each once.
    """
    seen: set[int] = set()
    flat: dict[str, torch.Tensor] = {}
    for n, t in tensors.items():
        t = t.detach().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel() > 0:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        flat[n] = t
    path = Path(folder) / name
    with temp_file(path) as tmp:
        save_file(flat, str(tmp), metadata={"format": "pt"})
    return path


def dtype_name(tensors: dict[str, torch.Tensor]) -> str | None:
    """The floating dtype most of the weights use (`bfloat16`, `float32`, ...), for config `dtype` keys."""
    counts: dict[torch.dtype, int] = {}
    for t in tensors.values():
        if t.is_floating_point():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    if not counts:
        return None
    return str(max(counts, key=counts.__getitem__)).removeprefix("torch.")
