"""Writing a checkpoint folder from a contract and canonical tensors, and converting one format to another.

A folder is built beside its destination (eyas.atomic.temp_folder), read back and compared with
what was meant to be written, and only then renamed into place: on any failure nothing is left and
a replaced folder is restored.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import torch

from eyas.atomic import temp_folder, write_json
from eyas.codes import finding
from eyas.contract import DraftContract
from eyas.errors import ContractError, FormatError
from eyas.formats.emit import eagle_config, proposals_of, speculators_config, verifier_config_of
from eyas.formats.parse import parse_eagle, parse_speculators
from eyas.formats.parsed import Parsed
from eyas.formats.read import Checkpoint, read_checkpoint
from eyas.formats.schema import CONFIG_NAMES, FORMATS, detect_format
from eyas.formats.validate import tensor_problems
from eyas.weights import WEIGHT_LAYOUTS, dtype_name, from_canonical, write_tensors


def check_destination(dst: str | Path, force: bool) -> None:
    """DST is new, empty, or (with `force`) a draft folder: --force replaces a draft, never a folder
    that holds anything else (a model, captures, the current directory)."""
    dst = Path(dst)
    if dst.exists() and not dst.is_dir():
        raise FormatError(f"{dst}: exists and is not a folder", "choose a folder path for DST")
    here, where = Path.cwd().resolve(), dst.resolve()
    if dst.is_dir() and (where == here or where in here.parents):
        raise FormatError(f"{dst}: is the current folder{'' if where == here else ' or holds it'}: the draft is "
                          "written as a new folder in its place, which would leave the shell in a deleted one",
                          "give DST as a folder below the current one (e.g. ./draft), or run from elsewhere")
    if dst.is_dir() and any(dst.iterdir()):
        if not force:
            raise FormatError(f"{dst}: folder is not empty",
                              "choose an empty or new DST, or pass --force to replace it")
        why = not_a_draft(dst)
        if why is not None:
            raise FormatError(f"{dst}: --force replaces only a draft folder, and this one {why}",
                              "choose a new DST (or move those out of this one yourself)")


def not_a_draft(folder: Path) -> str | None:
    """Why `folder` is not a draft folder that --force may replace; None when it is one: a draft
    config, and nothing but a draft's files (replacing the folder deletes everything in it, so a
    README, a training log or a model's tokenizer beside the draft refuse it)."""
    inner = sorted(p.name for p in folder.iterdir() if p.is_dir())
    if inner:
        return f"holds folders ({_some(inner)})"
    if not any(_draft_config(folder / name) for name in CONFIG_NAMES):
        return "holds no EAGLE-3 draft config"
    others = sorted(p.name for p in folder.iterdir() if not _draft_file(p.name))
    if others:
        return f"holds files that are not a draft's, which replacing it would delete ({_some(others)})"
    return None


def _draft_config(path: Path) -> bool:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and detect_format(cfg) is not None


_SHARD = re.compile(r"(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)")


def _draft_file(name: str) -> bool:
    """A file a draft folder is made of: a config eyas reads, a weights file or a shard of one."""
    return name in CONFIG_NAMES or name in WEIGHT_LAYOUTS or _SHARD.fullmatch(name) is not None


def _some(names: list[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _write(
    dst: str | Path, contract: DraftContract, tensors: dict[str, torch.Tensor], fmt: str, force: bool,
    proposals: dict | None = None,
) -> Checkpoint:
    if fmt not in (*FORMATS, "both"):
        raise ValueError(f"fmt must be speculators, eagle or both, got {fmt!r}")
    dst = Path(dst).absolute()
    check_destination(dst, force)
    problems = tensor_problems(contract, tensors)
    if problems:
        raise ContractError(problems[0]["problem"], problems[0]["fix"])
    dtype = dtype_name(tensors)
    configs = {"config.json": speculators_config(contract, dtype, proposals) if fmt != "eagle"
               else eagle_config(contract, dtype)}
    if fmt == "both":
        configs["config_eagle.json"] = eagle_config(contract, dtype)
    with temp_folder(dst, replace=force) as tmp:
        for name, cfg in configs.items():
            write_json(tmp / name, cfg)
        write_tensors(tmp, from_canonical(tensors, "eagle" if fmt == "eagle" else "speculators"))
        back = read_checkpoint(tmp, verifier_config=verifier_config_of(contract))
        _assert_same(contract, tensors, back)
    back.path = dst
    back.warnings, back.problems = _moved(back.warnings, tmp, dst), _moved(back.problems, tmp, dst)
    return back


def _moved(findings: list[dict[str, str]], tmp: Path, dst: Path) -> list[dict[str, str]]:
    """Findings of the folder read back in `tmp`, naming `dst` instead: tmp is renamed to dst, so a path
    into tmp would name a folder that no longer exists."""
    return [{k: v.replace(str(tmp), str(dst)) for k, v in f.items()} for f in findings]


def _assert_same(contract: DraftContract, tensors: dict[str, torch.Tensor], back: Checkpoint) -> None:
    """A written checkpoint reads back as the same contract and bit-identical tensors (an invariant). A
    draft that names no capture layers keeps no target depth either (no config field records it, and
    read with one the ids would be the engines' default for it: `verifier_config_of`)."""
    if contract.capture_layers is None:
        contract = contract.replace(verifier=dataclasses.replace(contract.verifier, num_hidden_layers=None))
    if back.contract != contract:
        diff = {
            k: (v, back.contract.to_dict()[k]) for k, v in contract.to_dict().items() if back.contract.to_dict()[k] != v
        }
        raise AssertionError(f"written checkpoint reads back differently: {diff}")
    if set(back.tensors) != set(tensors) or not all(
        back.tensors[n].dtype == t.dtype and torch.equal(back.tensors[n], t) for n, t in tensors.items()
    ):
        raise AssertionError("written tensors read back differently")


def write_checkpoint(
    dst: str | Path, contract: DraftContract, tensors: dict[str, torch.Tensor], fmt: str, *, force: bool = False
) -> Path:
    """Write `contract` + canonical `tensors` as `fmt` ("speculators", "eagle" or "both") into folder `dst`.

    "both" writes `config.json` (speculators) and `config_eagle.json` (eagle) next to one
    `model.safetensors` in speculators naming. The folder is built in a temp dir beside dst, read back
    and compared (contract and tensors), then renamed into place: on any failure nothing is left.
    A non-empty dst is refused unless `force`.
    """
    return _write(dst, contract, tensors, fmt, force).path


def convert_checkpoint(
    src: str | Path,
    dst: str | Path,
    to: str,
    *,
    force: bool = False,
    layer_convention: str | None = None,
    verifier_config: dict | None = None,
    verifier_name: str | None = None,
    target_name: str | None = None,
) -> tuple[Checkpoint, Checkpoint]:
    """Read `src`, write it losslessly as `to` into `dst`; returns (source, written) checkpoints.

    `verifier_name` replaces the recorded verifier id (what `vllm serve DIR` will load); `target_name`
    (the --target's identity, what `init` records) is recorded only where the source names no verifier.
    Nothing else about the draft changes. Source config files that disagree on what the draft computes
    are refused (the output would keep one file's word and drop the other's); other disagreements
    (context length, epsilon rounding, verifier) are converted from the file eyas uses. A part eyas
    cannot run is converted where the written config states it as the source did (a rope type, an
    activation), and refused where it would be dropped (_lossy_parts).
    """
    src_p, dst_p = Path(src).resolve(), Path(dst).resolve()
    if not src_p.is_dir():
        raise FormatError(f"{src}: not a checkpoint folder", "convert needs a folder with a config and weights")
    if dst_p == src_p or dst_p.is_relative_to(src_p):
        raise FormatError(f"{dst}: DST is inside SRC {src}", "write the converted checkpoint outside the source folder")
    if src_p.is_relative_to(dst_p):
        raise FormatError(f"{dst}: DST contains SRC {src}", "choose a DST that does not hold the source")
    linked = _linked_into(src_p, dst_p)
    if linked is not None:
        raise FormatError(f"{dst}: DST holds the file {linked.resolve()} that SRC's {linked.name} links to: writing "
                          "DST would delete or rewrite the source",
                          "choose a DST that holds none of the source's files")
    source = read_checkpoint(src_p, layer_convention=layer_convention, verifier_config=verifier_config)
    if source.problems:  # strict reading leaves only the disagreements that change the draft here
        raise FormatError(source.problems[0]["problem"], source.problems[0]["fix"])
    lost = _lossy_parts(source, to, layer_convention)
    if lost:
        raise FormatError(
            f"{source.config_path}: eyas cannot convert this draft losslessly: it has a {lost}, which eyas's "
            f"{'speculators and eagle configs' if to == 'both' else to + ' config'} cannot state",
            "keep the draft in the format its trainer wrote; eyas inspect and eyas check read it as it is",
        )
    contract = source.contract.verifier_named(verifier_name or source.contract.verifier.name_or_path or target_name)
    if "capture_layers" in source.assumed:
        # the source names no layers: neither does its copy, which engines serve as they serve the source
        # (the engines' default of each target; --target's depth only resolved it for reading)
        contract = contract.replace(capture_layers=None)
    name, proposals = _proposals(source)
    written = _write(dst_p, contract, source.tensors, to, force, proposals)
    if to == "eagle" and proposals is not None:
        written.warnings.append(_proposals_not_kept(source.path / name, proposals))
    return source, written


def _proposals(source: Checkpoint) -> tuple[str, dict | None]:
    """The proposal settings a speculators config of the source states (the file eyas used first), and
    that file's name."""
    for name in sorted(source.configs, key=lambda name: name != source.config_used):
        if source.files.get(name) == "speculators" and (p := proposals_of(source.configs[name])) is not None:
            return name, p
    return source.config_used, None


def _proposals_not_kept(file: Path, proposals: dict) -> dict[str, str]:
    first = proposals["proposal_methods"][0]
    k = first.get("speculative_tokens") if isinstance(first, dict) else None
    return finding(
        "proposals_not_kept", "speculators_config.proposal_methods",
        f"{file}: speculators_config.proposal_methods (speculative_tokens {k}: how many tokens `vllm serve` "
        "drafts per step) has no field in an eagle config: an engine serving the copy drafts what it is told",
        f"serve the copy with --speculative-config '{{\"method\": \"eagle3\", \"model\": DST, "
        f"\"num_speculative_tokens\": {k}}}'",
    )


def _linked_into(src: Path, dst: Path) -> Path | None:
    """A file of the folder `src` that is a link into `dst` (a link farm, a hub cache's snapshot), which
    replacing or writing DST would delete or rewrite; None when there is none."""
    for entry in sorted(src.iterdir()):
        real = entry.resolve() if entry.is_symlink() else None
        if real is not None and (real == dst or dst in real.parents):
            return entry
    return None


def _lossy_parts(source: Checkpoint, to: str, layer_convention: str | None = None) -> str | None:
    """The parts eyas cannot run that writing `source` as `to` would drop, named; None when none would be.

    The emitters write the contract, which states a rope type and an activation whatever they are, but
    has no fields for a layer with tensors a dense Llama/Qwen3 layer lacks (experts, latent attention,
    NextN, ModelOpt's extra norms: `Parsed.foreign_layout`) nor for what eyas does not read into it
    (Granite multipliers, attention kinds that differ by layer): any other part is kept when the
    written config reads back with it.
    """
    if source.contract.unsupported is None:
        return None
    used, n = source.config_used, source.contract.verifier.num_hidden_layers
    had = _parsed(source.configs[used], source.files[used], n, layer_convention)
    written = [_parsed(cfg, fmt, n, None).unrunnable for fmt, cfg in
               (("speculators", speculators_config(source.contract)), ("eagle", eagle_config(source.contract)))
               if to in (fmt, "both")]
    lost = [part for part in had.unrunnable
            if part in had.foreign_layout or not all(part in parts for parts in written)]
    return "; ".join(lost) or None


def _parsed(cfg: dict, fmt: str, n_target: int | None, layer_convention: str | None) -> Parsed:
    """Config `cfg` as its reader reads it (the parts eyas has no code for, named)."""
    if fmt == "speculators":
        return parse_speculators(cfg, "config.json", n_target)
    return parse_eagle(cfg, "config.json", n_target, layer_convention)
