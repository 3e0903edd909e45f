"""A Drafter from a checkpoint folder, or the draft eyas ships for a target.

Every verb that runs a draft starts here: the folder is read in whatever format it has
(`eyas.formats.read_checkpoint`), checked against the target's config before any weight is read,
and given the target's embeddings when it does not ship its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path

import torch

from eyas.borrowed import borrowed_names
from eyas.drafter import Drafter
from eyas.errors import ContractError, EyasError, FormatError
from eyas.formats import Checkpoint, read_checkpoint
from eyas.devices import check_fits_memory
from eyas.dtypes import short_name
from eyas.target import check_fits
from eyas.target_ref import TargetRef
from eyas.weights import weight_bytes

# Drafts shipped inside the package, by target identity (trained with eyas: recipes/).
SHIPPED_DRAFTS = {"HuggingFaceTB/SmolLM2-135M-Instruct": "drafts/smollm2-135m-instruct"}


def resolve_drafter(spec: str | Path | None, target: str | Path | TargetRef | None = None) -> Path:
    """A draft folder: `spec` itself, or for None / "default" the draft shipped for `target`."""
    if spec not in (None, "default"):
        return Path(spec)
    name = TargetRef.resolve(target, weights=False).name
    shipped = shipped_draft(name)
    if shipped is None:
        given = target if isinstance(target, (str, Path)) and str(target) != "default" else name  # as typed
        ships = f"{', '.join(SHIPPED_DRAFTS)} (known by that name: the embedded default target, --target left out)"
        said = f"no draft given and eyas ships none for the target {given}: it ships one for {ships}" \
            if spec is None else f"the draft 'default' is the one eyas ships for {ships}, not for the target {given}"
        raise EyasError(said, "pass a draft folder (eyas init DIR --target T makes an untrained one; eyas train "
                        "trains one)")
    return shipped


def shipped_draft(target_name: str) -> Path | None:
    """The folder of the draft eyas ships for the target of this identity (`TargetRef.name`), if any."""
    shipped = files("eyas") / SHIPPED_DRAFTS[target_name] if target_name in SHIPPED_DRAFTS else None
    return Path(str(shipped)) if shipped is not None and shipped.is_dir() else None


def load_drafter(
    path: str | Path | None,
    *,
    target: str | Path | TargetRef | None = None,
    layer_convention: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Drafter:
    """A drafter from a checkpoint of any format; a draft without embed_tokens (or, full-vocab,
    without lm_head) gets the target's (only those tensors are read from the target's weight files,
    never the model).

    `path` None or "default": the draft eyas ships for the target (see `resolve_drafter`).
    `target`: the target's folder or TargetRef, or None for the embedded default. The draft must fit
    it (vocab, hidden size, capture depth) and the ref's device's memory: checked before any tensor
    is read. The drafter is placed on the ref's device.
    """
    return load_drafter_and_config(path, target=target, layer_convention=layer_convention, dtype=dtype)[0]


def _refuse_a_file(folder: Path) -> None:
    if folder.is_file():  # inspect and check read a lone config; running the draft needs the whole folder
        raise FormatError(f"{folder} is a file: running the draft needs its folder (its config and weights)",
                          "pass the draft's folder (the config beside its model.safetensors)")


def read_fitting(folder: Path, ref: TargetRef, layer_convention: str | None = None) -> Checkpoint:
    """The draft folder read (no weights, or a config that is not a draft's, is refused) and held against
    the target's dimensions, without building the drafter: what a verb that hands the draft to an engine
    checks before it loads the target or starts the engine, as `load_drafter` does before it runs."""
    _refuse_a_file(folder)
    ckpt = read_checkpoint(folder, layer_convention=layer_convention)
    with _naming(ckpt):
        check_fits(ckpt.contract, ref.text_config)
    return ckpt


def load_drafter_and_config(
    path: str | Path | None,
    *,
    target: str | Path | TargetRef | None = None,
    layer_convention: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Drafter, Path]:
    """`load_drafter`, and the config file the drafter's contract was read from (for errors that
    pair the draft with something else, such as data captured at other layers)."""
    ref = TargetRef.resolve(target, weights=False)
    folder = resolve_drafter(path, ref)
    _refuse_a_file(folder)
    check_fits_memory(weight_bytes(folder, dtype), ref.device, f"draft {folder} in {short_name(dtype)}")
    ckpt = read_fitting(folder, ref, layer_convention)
    c = ckpt.contract
    names = borrowed_names(c)
    if names:  # the target's [V, H] matrices come next: often larger than the draft
        size = c.vocab_size * c.hidden_size * torch.empty(0, dtype=dtype).element_size()
        check_fits_memory(len(names) * size, ref.device, f"the target's {' and '.join(names)} for draft {folder} "
                          f"in {short_name(dtype)}")
    given = ref.tensors([f"{n}.weight" for n in names], dtype=dtype, device=ref.device) if names else {}
    with _naming(ckpt):
        drafter = Drafter.from_tensors(c, ckpt.tensors, **{n: given[f"{n}.weight"] for n in names}, dtype=dtype)
    return drafter.to(ref.device), ckpt.config_path


@contextmanager
def _naming(ckpt: Checkpoint) -> Iterator[None]:
    """A contract error raised inside names the config file the contract was read from.

    The checks it guards (fits the target, the drafter implements the layer and rope) know only the
    contract; the user needs to know which file to fix.
    """
    try:
        yield
    except ContractError as e:
        raise ContractError(f"{ckpt.config_path}: {e}", e.hint) from None
