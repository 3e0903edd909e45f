"""The capture format on disk: a manifest plus safetensors shards, written atomically, read back checked.

On disk (`out_dir/`):
    manifest.json                 what was captured (target, capture layers, dtype, prompts,
                                  generation settings), counts, the list of finished shards, and
                                  the digest of the target's final norm (its weights' identity)
    shard_00000.safetensors ...   samples concatenated along the token axis:
        input_ids    [N] int64
        loss_mask    [N] bool           True on response tokens (incl. the end-of-turn token)
        features     [N, A*H] dtype     states ENTERING the capture layers, concatenated in order
        last_hidden  [N, H] dtype       the final-normed state lm_head reads (logits are recomputed
                                        from it at train time, never stored: V is large)
        offsets      [n+1] int64        sample i is tokens offsets[i]:offsets[i+1]
        prompt_index [n] int64          index of its prompt in the prompt list

Each shard carries the manifest's fingerprint and its own entry in its metadata, so a shard from
another capture, a truncated one or one that disagrees with the manifest is recognised and skipped
(with a warning naming it) instead of being trained on.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eyas.atomic import remove_empty, temp_file, write_json
from eyas.data.values import check_ids, check_tensors
from eyas.dtypes import to_dtype
from eyas.errors import ContractError, FormatError
from eyas.target_ref import TargetRef

if TYPE_CHECKING:
    from eyas.target import Target

FORMAT = "eyas-capture"
FORMAT_VERSION = 2  # 2: greedy answers are recorded as temperature 0 (1 recorded the unused 1.0); 1 is read
MANIFEST = "manifest.json"
NORM_DIGEST = "target_norm_sha256"  # TargetRef.norm_digest of the weights captured from (recorded from 2026-12-06)
KEYS = ("index", "samples", "tokens", "loss_tokens")  # the integers of a manifest's shard entry
TOTALS = {"num_samples": "samples", "num_tokens": "tokens", "num_loss_tokens": "loss_tokens"}  # sums of entries
# the manifest's fields that say what its shards hold (capturing._plan); PLAN_DIGEST records their digest
PLAN_KEYS = ("format", "format_version", "target", "capture_layers", "dtype", "shard_size", "prompts", "generation")
PLAN_DIGEST = "plan_sha256"  # recorded from 2026-12-07: an edited plan (capture_layers [3, ...]) is refused
_SAFETENSORS_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def text_sha256(text: str) -> str:
    """Hex SHA-256 of a text: prompt lists and plans are compared by it, never stored whole."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_GREEDY = {"do_sample": False, "temperature": 0.0}  # all a greedy capture's manifest says of its answers


def generation_settings(do_sample: bool, temperature: float, top_p: float, top_k: int, seed: int) -> dict[str, Any]:
    """How the answers were chosen, as the manifest records it: greedy is temperature 0 and nothing
    else (a greedy capture resumes under any seed or top-p, which it never reads); sampling, every
    setting that shapes the draws."""
    if not do_sample:
        return dict(_GREEDY)
    return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed}


def _upgrade(manifest: dict) -> dict:
    """A version-1 manifest as version 2 records it (greedy settings rewritten, nothing else): its
    captures read, and resume, as before. The fingerprint is the capture's identity, carried by its
    shards, so it stays."""
    if manifest.get("format_version") != 1:
        return manifest
    upgraded, generation = {**manifest, "format_version": FORMAT_VERSION}, manifest.get("generation")
    if isinstance(generation, dict) and not generation.get("do_sample"):
        unused = ("temperature", "top_p", "top_k", "seed")
        upgraded["generation"] = {**{k: v for k, v in generation.items() if k not in unused}, **_GREEDY}
    return upgraded


def start_manifest(out_dir: Path, plan: dict, skipped: list, norm_digest: str | None = None) -> dict:
    """The manifest of `out_dir`: a new one for `plan`, or the existing one when it has the same plan.

    A folder holding another capture is refused, naming every key that differs: shards made under
    one plan must never be mixed with another's. `norm_digest` (`TargetRef.norm_digest`) is recorded
    beside the plan, not in it (captures from before it was recorded resume): a capture resumed with
    other weights under the same name is refused too.
    """
    fingerprint = text_sha256(json.dumps(plan, sort_keys=True))[:16]
    path = out_dir / MANIFEST
    if path.exists():
        old = read_manifest(out_dir)
        same_plan(old, plan, path)
        _same_weights(old, path, plan["target"]["name"], norm_digest)
        return old
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {**plan, "fingerprint": fingerprint, "eyas_version": _eyas_version(), "skipped_prompts": skipped,
                "shards": [], **totals([]), "complete": False,
                PLAN_DIGEST: plan_digest(plan)}
    if norm_digest is not None:
        manifest[NORM_DIGEST] = norm_digest
    write_json(path, manifest)
    return manifest


def same_plan(old: dict, plan: dict, path: Path) -> None:
    """Refuse resuming the capture `old` (its manifest at `path`) under another plan, naming every key of
    `plan` that differs (a part of a plan: capture's preflight compares what it knows before loading)."""
    changes = "; ".join(d for key in plan for d in _differences(key, old.get(key), plan[key]))
    if changes:
        raise ContractError(f"{path} describes a different capture ({changes})",
                            "rerun with the same arguments to resume, or capture into a new folder")


def _differences(key: str, then: Any, now: Any) -> list[str]:
    """`key: then there, now now` for each part that differs; an object by its keys that differ (a prompts
    count, not both whole objects and their digests), a target by its name."""
    if isinstance(then, dict) and isinstance(now, dict) and "name" not in now:
        keys = sorted(then.keys() | now.keys())
        return [d for k in keys for d in _differences(f"{key}.{k}", then.get(k), now.get(k))]
    return [] if then == now else [f"{key}: {_short(then)} there, {_short(now)} now"]


def forget_capture(out_dir: Path, made: list[Path]) -> None:
    """Remove what a capture that stopped before its first shard wrote: its manifest, then the folders
    it made (each only when empty), so that a rerun with other arguments is not refused as another
    capture. A folder that was there before is never removed."""
    (out_dir / MANIFEST).unlink(missing_ok=True)
    remove_empty(made)


def _short(value: Any) -> str:
    if isinstance(value, dict) and "name" in value:
        return repr(value["name"])
    return json.dumps(value, sort_keys=True)


def plan_digest(manifest: dict) -> str:
    """The SHA-256 of the manifest's plan (PLAN_KEYS): what its shards hold. The fingerprint cannot serve:
    it stays a version-1 capture's after the plan is upgraded (`_upgrade`)."""
    return text_sha256(json.dumps({k: manifest.get(k) for k in PLAN_KEYS}, sort_keys=True))


def totals(entries: list[dict]) -> dict[str, int]:
    """The manifest's totals (TOTALS) of its shard entries: what record_shards writes, manifest_problem checks."""
    return {k: sum(e[key] for e in entries) for k, key in TOTALS.items()}


def record_shards(out_dir: Path, manifest: dict, shards: dict[int, dict], *, complete: bool) -> dict:
    """List the finished shards and their totals in the manifest, and write it (a capture from before the
    plan's digest was recorded gains it here: its plan was just held against the run's, `same_plan`)."""
    entries = [shards[k] for k in sorted(shards)]
    manifest.update(shards=entries, **totals(entries), complete=complete)
    manifest.setdefault(PLAN_DIGEST, plan_digest(manifest))
    write_json(out_dir / MANIFEST, manifest)
    return manifest


def shard_name(k: int) -> str:
    return f"shard_{k:05d}.safetensors"


def write_shard(out_dir: Path, entry: dict, prompt_index: list[int], samples: list[dict], fingerprint: str) -> dict:
    """Concatenate samples along the token axis and write one shard atomically."""
    lengths = [len(s["input_ids"]) for s in samples]
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    if samples:
        tensors = {key: torch.cat([s[key] for s in samples]) for key in samples[0]}
    else:  # every prompt of this shard was skipped as too long
        tensors = {"input_ids": torch.zeros(0, dtype=torch.long), "loss_mask": torch.zeros(0, dtype=torch.bool)}
    entry = {**entry, "samples": len(samples), "tokens": int(offsets[-1]),
             "loss_tokens": int(tensors["loss_mask"].sum())}
    tensors.update(offsets=offsets, prompt_index=torch.tensor(prompt_index, dtype=torch.long))
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "fingerprint": fingerprint,
            "entry": json.dumps(entry, sort_keys=True)}
    with temp_file(out_dir / entry["file"]) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata=meta)
    return entry


def shard_entry(path: Path) -> dict:
    """The manifest entry a shard carries in its own metadata (to adopt a shard never recorded)."""
    with safe_open(path, "pt") as f:
        return json.loads(f.metadata()["entry"])


def _eyas_version() -> str:
    try:
        return importlib.metadata.version("eyas")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class CapturedData:
    """Samples of a capture folder whose manifest matched; iterate for unshifted sample dicts.

    Each sample: `input_ids` [T] int64, `loss_mask` [T] bool, `features` [T, A*H],
    `last_hidden` [T, H] (the capture dtype), `prompt_index` (int). Feed it to `eyas.shift.shift_for_draft`.
    """

    def __init__(self, folder: Path, manifest: dict, shards: list[dict], skipped: list[tuple[Path, str]]):
        self.folder = folder
        self.manifest = manifest
        self.shards = shards  # manifest entries of the usable shards
        self.skipped = skipped  # (path, reason) of shards that were not used

    @property
    def capture_layers(self) -> list[int]:
        return list(self.manifest["capture_layers"])

    def __len__(self) -> int:
        return sum(e["samples"] for e in self.shards)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for entry in self.shards:
            path = self.folder / entry["file"]
            try:
                with safe_open(path, "pt") as f:
                    t = {key: f.get_tensor(key) for key in f.keys()}
            except Exception as e:  # changed on disk since open_shards checked it
                _skip_warning(path, f"unreadable ({e})")
                continue
            check_shard_values(path, t, self.manifest)
            bounds = t["offsets"].tolist()
            for i in range(entry["samples"]):
                a, b = bounds[i], bounds[i + 1]
                yield {"input_ids": t["input_ids"][a:b], "loss_mask": t["loss_mask"][a:b],
                       "features": t["features"][a:b], "last_hidden": t["last_hidden"][a:b],
                       "prompt_index": int(t["prompt_index"][i])}


_DIMS = ("num_layers", "hidden_size", "vocab_size")  # what a manifest records of its target besides the name


def target_digest(want: str | Target | TargetRef) -> str | None:
    """The digest of the weights `want` names (None for a bare name, or weights without a final norm)."""
    return None if isinstance(want, str) else _ref(want).norm_digest()


def _ref(want: Target | TargetRef) -> TargetRef:
    """The weights a loaded target or a ref names, as a ref (read by name, never loaded)."""
    return want if isinstance(want, TargetRef) else TargetRef.resolve(want.path)


def _same_weights(manifest: dict, where: Path, name: str, now: str | None) -> None:
    """Refuse a target of the capture's name whose weights are not those captured from (a folder
    fine-tuned or replaced in place): where the manifest records a digest and the weights are here."""
    then = manifest.get(NORM_DIGEST)
    if then is not None and now is not None and now != then:
        raise ContractError(f"{where}: captured from {name} when its final norm's digest was {then}; it is {now} "
                            "now: the weights there changed since",
                            "capture again from the target as it is now, or restore the weights it was captured from")


def check_target(manifest: dict, where: Path, want: str | Target | TargetRef) -> None:
    """A capture from another target is refused, naming both. `want`: the target or its name (then
    compared by name alone). Where the manifest records the digest of the target's final norm
    (`TargetRef.norm_digest`) and the target given has its final norm here, a digest that differs is
    refused (the same name holding other weights, or another model of the same shape), and a copy or a
    move under another name with the same digest (a judging machine that holds only the head,
    docs/bring-your-draft.md's 671B walk-through) is accepted with a warning: the norm is all the
    digest covers, and a fine-tune that leaves it (a merged LoRA) matches too. Without a digest, a
    folder's copy (both names absolute paths, every dimension recorded equal) is accepted with a
    warning that eyas takes them as one model."""
    got, name = manifest["target"], getattr(want, "name", want)
    then = manifest.get(NORM_DIGEST)
    now = target_digest(want) if then is not None else None
    if got["name"] == name:
        return _same_weights(manifest, where, name, now)
    dims = {k: getattr(want, k, None) for k in _DIMS}
    if dims == {k: got.get(k) for k in _DIMS}:
        if now is not None and now == then:
            warnings.warn(f"{where}: captured from the target at {got['name']}, given {name}: its final norm's "
                          f"digest matches ({now}), taken as the same model, copied or moved (the digest covers the "
                          "final norm only: a fine-tune that leaves it, as a merged LoRA does, matches too)",
                          stacklevel=2)
            return None
        if now is None and Path(got["name"]).is_absolute() and Path(name).is_absolute():
            warnings.warn(f"{where}: captured from the target at {got['name']}, given {name}: the same dimensions "
                          f"({dims['num_layers']} layers, hidden {dims['hidden_size']}, vocab {dims['vocab_size']}), "
                          "taken as the same model, copied or moved (the capture records no digest of its weights, "
                          "or they are not here to compare)", stacklevel=2)
            return None
    differ = [f"{k} {got.get(k)} there, {dims[k]} here" for k in _DIMS if dims[k] != got.get(k)]
    if not differ and now is None and then is not None and not isinstance(want, str):
        # the digest cannot be compared because the norm cannot be read (missing, nan): that is the fault to name
        _ref(want).tensors(["norm.weight"])
    other = (f" ({'; '.join(differ)})" if differ else
             f" (its final norm's digest is {now}, the capture's {then})" if now is not None else "")
    raise ContractError(
        f"{where}: captured from target {got['name']!r}, not {name!r}{other}",
        "capture features with the target you train/evaluate against",
    )


def open_shards(
    folder: str | Path,
    *,
    expect_capture_layers: Sequence[int] | None = None,
    expect_target: str | Target | TargetRef | None = None,
    for_training: bool = False,
) -> CapturedData:
    """Open a capture folder after checking its manifest; broken shards are named and skipped.

    Refuses (ContractError) a capture from another target or other capture layers than expected,
    naming both, and with `for_training` a capture of the held-out evaluation prompts (MT-bench).
    A shard that is missing, truncated or inconsistent with the manifest gets a warning and is
    never used.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    where = folder / MANIFEST
    if expect_target is not None:
        check_target(manifest, where, expect_target)
    if expect_capture_layers is not None and list(expect_capture_layers) != manifest["capture_layers"]:
        raise ContractError(
            f"{where}: captured at layers {manifest['capture_layers']}, the draft reads {list(expect_capture_layers)}",
            "capture again with the draft's capture layers",
        )
    if for_training and manifest["prompts"]["eval_only"]:
        raise ContractError(
            f"{where}: captured from the held-out evaluation prompts ({', '.join(manifest['prompts']['sources'])})",
            "never train on evaluation prompts; capture training data from other prompts",
        )
    if not manifest["complete"]:
        warnings.warn(f"{where}: the capture is incomplete ({len(manifest['shards'])} shards finished); "
                      "rerun the same capture to finish it", stacklevel=2)
    usable, skipped = usable_shards(folder, manifest)
    for path, problem in skipped:
        _skip_warning(path, problem)
    return CapturedData(folder, manifest, usable, skipped)


def usable_shards(folder: Path, manifest: dict) -> tuple[list[dict], list[tuple[Path, str]]]:
    """(entries of the usable shards, (path, problem) of the others); refused when shards were
    recorded but none can be used: there is nothing to train or evaluate on, and the first
    problem says why."""
    if not manifest["shards"]:
        raise FormatError(f"{folder / MANIFEST}: no shard is finished (the capture stopped before its first one)",
                          "rerun the same `eyas capture` to finish it")
    usable, skipped = [], []
    for entry in manifest["shards"]:
        path = folder / entry["file"]
        problem = shard_problem(path, manifest, entry)
        if problem:
            skipped.append((path, problem))
        else:
            usable.append(entry)
    if skipped and not usable:
        path, problem = skipped[0]
        others = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        raise FormatError(f"{path}: {problem}; no shard listed in {folder / MANIFEST} can be used{others}",
                          "rerun the same `eyas capture` to redo the broken shards, or capture again")
    return usable, skipped


def check_capture(folder: str | Path) -> dict:
    """A capture folder checked as `open_shards` would (manifest, shard headers), without warnings
    and without reading features: what `eyas train` / `eval --data` verify before anything heavy."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    usable_shards(folder, manifest)
    return manifest


def check_shard_values(path: Path, t: dict[str, torch.Tensor], manifest: dict) -> None:
    """A shard's numbers as they are loaded: features finite, token ids inside the target's vocab,
    one row per token in every per-token tensor, prompt indices inside the prompt list."""
    check_tensors(path, t, floats=("features", "last_hidden"), ids=("input_ids",),
                  vocab_size=manifest["target"]["vocab_size"],
                  same_length=("input_ids", "loss_mask", "features", "last_hidden"),
                  hint=f"delete {path.name} and rerun the same `eyas capture` to redo it (in bf16 or fp32 if "
                  "the target overflowed)")
    check_ids(t["prompt_index"], manifest["prompts"]["count"], file=path, key="prompt_index", what="the prompt list",
              hint=f"delete {path.name} and rerun the same `eyas capture` to redo it")


def _skip_warning(path: Path, problem: str) -> None:
    warnings.warn(f"skipping shard {path}: {problem}", stacklevel=3)


def read_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if folder.is_file():
        raise FormatError(f"{folder} is a file, not a folder written by `eyas capture`",
                          "point at the capture's folder (the one holding manifest.json)")
    if not path.is_file():
        raise FormatError(f"{path} does not exist", "point at a folder written by `eyas capture`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not valid JSON ({e})", "capture the data again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f"{path}: format is {manifest.get('format') if isinstance(manifest, dict) else None!r}, "
                          f"expected {FORMAT!r}", "point at a folder written by `eyas capture`")
    manifest = _upgrade(manifest)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise FormatError(f"{path}: format_version {manifest.get('format_version')}, this eyas reads 1 to "
                          f"{FORMAT_VERSION}", "capture the data again with this eyas version")
    if problem := manifest_problem(manifest):
        raise FormatError(f"{path}: {problem}", "the manifest was edited or damaged: capture the data again")
    recorded = manifest.get(PLAN_DIGEST)  # absent: a capture from before it was recorded
    if recorded is not None and recorded != (now := plan_digest(manifest)):
        raise FormatError(f"{path}: its fields {', '.join(PLAN_KEYS[2:])} are not those the shards were captured "
                          f"under (their digest is {now[:16]}, {PLAN_DIGEST} recorded {recorded[:16]})",
                          "the manifest was edited: restore it as captured (a changed capture_layers trains a draft "
                          "wired to layers its features are not from), or capture the data again")
    return manifest


def _ints(value: Any, n: int | None = None, low: int = 0) -> bool:
    """A list of `n` (any number when None) integers, each >= low."""
    return isinstance(value, list) and (n is None or len(value) == n) \
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= low for v in value)


def manifest_problem(m: dict) -> str | None:
    """What in a manifest eyas cannot use (a missing key, a wrong type, a shard file outside the
    folder), or None: each key is checked once here instead of failing where it is used."""
    target, prompts, shards = m.get("target"), m.get("prompts"), m.get("shards")
    if not isinstance(target, dict) or not isinstance(target.get("name"), str) \
            or not _ints([target.get(k) for k in ("num_layers", "hidden_size", "vocab_size")], 3, low=1):
        return "field 'target' needs name, and num_layers, hidden_size, vocab_size >= 1"
    layers = m.get("capture_layers")
    if not _ints(layers) or not layers or layers != sorted(set(layers)):
        return f"field 'capture_layers' is {layers!r}, expected a strictly increasing list of layer indices"
    if not isinstance(m.get("generation", {}), dict):
        return f"field 'generation' is {m['generation']!r}, expected the answers' settings (an object)"
    if m.get("dtype") not in [str(d).removeprefix("torch.") for d in _SAFETENSORS_DTYPE]:
        return f"field 'dtype' is {m.get('dtype')!r}, expected bfloat16, float16 or float32"
    if not isinstance(prompts, dict) or not _ints([prompts.get("count")]) \
            or not isinstance(prompts.get("eval_only"), bool) or not isinstance(prompts.get("sources"), list):
        return "field 'prompts' needs count, sources and eval_only"
    if not isinstance(m.get("fingerprint"), str) or not isinstance(m.get("complete"), bool):
        return "fields 'fingerprint' (text) and 'complete' (true/false) are needed"
    if not isinstance(shards, list):
        return f"field 'shards' is {type(shards).__name__}, expected a list"
    for i, e in enumerate(shards):
        if not isinstance(e, dict) or not isinstance(e.get("file"), str) or Path(e["file"]).name != e["file"] \
                or not e["file"].endswith(".safetensors") or not _ints([e.get(k) for k in KEYS], len(KEYS)) \
                or not _ints(e.get("prompts"), 2):
            return f"shards[{i}] is not an entry eyas wrote ({{{', '.join(('file', 'prompts', *KEYS))}}})"
    files = [e["file"] for e in shards]
    again = next((f for i, f in enumerate(files) if f in files[:i]), None)
    if again is not None:  # its samples would be read twice, and could sit on both sides of a held-out split
        return f"field 'shards' lists {again} twice"
    summed = totals(shards)  # what capture reports of a finished capture, and what a reader would count on
    if wrong := next((k for k, n in summed.items() if not _ints([m.get(k)]) or m[k] != n), None):
        return f"field {wrong!r} is {m.get(wrong)!r}, its shards' entries sum to {summed[wrong]}"
    if not isinstance(m.get(NORM_DIGEST, ""), str):
        return f"field {NORM_DIGEST!r} is {m[NORM_DIGEST]!r}, expected the digest eyas recorded (text)"
    if not isinstance(m.get("skipped_prompts"), list):
        return "field 'skipped_prompts' is not a list"
    if not isinstance(m.get(PLAN_DIGEST, ""), str):
        return f"field {PLAN_DIGEST!r} is {m[PLAN_DIGEST]!r}, expected the digest eyas recorded (text)"
    return None


def shard_problem(path: Path, manifest: dict, entry: dict | None = None) -> str | None:
    """Why a shard cannot be used with this manifest, or None when it can."""
    if not path.is_file():
        return "missing"
    try:
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
            shapes = {key: f.get_slice(key).get_shape() for key in f.keys()}
            dtypes = {key: f.get_slice(key).get_dtype() for key in f.keys()}
            offsets = f.get_tensor("offsets") if "offsets" in shapes else None
    except Exception as e:  # safetensors raises its own error types for truncated/garbled files
        return f"unreadable ({e})"
    if meta.get("fingerprint") != manifest["fingerprint"]:
        return "written by a different capture (fingerprint differs)"
    try:
        on_disk = json.loads(meta.get("entry", "{}"))
    except (ValueError, RecursionError):
        on_disk = None
    if not isinstance(on_disk, dict) or not _ints([on_disk.get("samples"), on_disk.get("tokens")], 2):
        return "its metadata has no readable manifest entry"
    if entry is not None and on_disk != entry:
        return f"does not match its manifest entry ({on_disk} on disk, {entry} in the manifest)"
    n, N = on_disk["samples"], on_disk["tokens"]
    H = manifest["target"]["hidden_size"]
    want = {"input_ids": ([N], "I64"), "loss_mask": ([N], "BOOL"), "offsets": ([n + 1], "I64"),
            "prompt_index": ([n], "I64")}
    if n:
        dtype = _SAFETENSORS_DTYPE[to_dtype(manifest["dtype"])]
        want.update(features=([N, len(manifest["capture_layers"]) * H], dtype), last_hidden=([N, H], dtype))
    for key, (shape, dtype) in want.items():
        if key not in shapes:
            return f"has no tensor {key!r}"
        if list(shapes[key]) != shape or dtypes[key] != dtype:
            return f"{key} is {dtypes[key]} {list(shapes[key])}, expected {dtype} {shape}"
    if offsets[0] != 0 or offsets[-1] != N or bool((offsets.diff() <= 0).any()):
        return "offsets are inconsistent"
    return None
