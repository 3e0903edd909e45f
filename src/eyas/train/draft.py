"""The draft a run trains: a fresh one, one warm-started from an existing draft (`--init`), or a resumed one.

A fresh draft mirrors the target's decoder layer (`contract_for_target`), shares the target's
embeddings (frozen, not saved), takes its vocab map from the training labels and starts its lm_head
as the target's rows of the draft vocab, so it starts out predicting through the target's own
output matrix. A warm-started draft keeps everything it has (weights, vocab map, draft vocab size,
norm flags) and must fit the target and the data; a resumed draft is rebuilt from its checkpoint.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from eyas.borrowed import borrowed
from eyas.contract import DraftContract, contract_for_target
from eyas.drafter import Drafter
from eyas.drafter_loading import resolve_drafter
from eyas.errors import ContractError
from eyas.formats import read_checkpoint
from eyas.logit_map import LogitMap
from eyas.target import TargetRef, check_fits, target_name
from eyas.train.config import TrainConfig, data_folders
from eyas.train.vocab import build_vocab_map, token_counts, vocab_coverage

# TrainConfig fields (named as in the contract) that shape a fresh draft; with --init the draft's own
# values are used, and a value given that differs from the draft's is refused.
_ARCHITECTURE = ("num_hidden_layers", "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


@dataclass
class TrainDraft:
    drafter: Drafter
    lm_head: Tensor  # the target's output matrix [V, H] fp32: the labels are computed with it
    used: Tensor | None  # the draft vocab's target ids, ascending [Vd]; None: the full vocab
    coverage: float  # share of the training labels inside the draft vocab
    logit_map: LogitMap = LogitMap()  # what the target's class does to lm_head's output: the labels read it

    def to(self, device: torch.device) -> TrainDraft:
        used = None if self.used is None else self.used.to(device)
        return TrainDraft(self.drafter.to(device), self.lm_head.to(device), used, self.coverage, self.logit_map)


def fresh_draft(config: TrainConfig, tcfg: dict, capture_layers: list[int],
                train_set: list[dict[str, Tensor]]) -> TrainDraft:
    """A new draft for `config.target` reading `capture_layers`, its vocab from `train_set`'s labels."""
    name = target_name(config.target)
    base = _base_contract(config, tcfg, capture_layers)
    V = base.vocab_size
    vd = config.draft_vocab or V
    if vd > V:
        raise ContractError(f"draft_vocab {vd} exceeds the vocab of target {name} ({V})", f"use --draft-vocab <= {V}")
    counts = token_counts(train_set, V)
    used, d2t, t2d = build_vocab_map(counts, vd) if vd < V else (None, None, None)
    contract = base.replace(draft_vocab_size=vd, has_vocab_map=vd < V,
                            **{field: getattr(config, field) for field in _ARCHITECTURE})
    check_fits(contract, tcfg)
    lm_head, embed, logit_map = _target_matrices(config)
    drafter = Drafter(contract, embed_tokens=embed).init_weights(config.seed)
    with torch.no_grad():
        drafter.lm_head.weight.copy_(lm_head if used is None else lm_head[used])  # [Vd, H]
    if used is not None:
        drafter.set_vocab_map(d2t, t2d)
    return TrainDraft(drafter, lm_head, used, vocab_coverage(counts, t2d), logit_map)


def warm_start(config: TrainConfig, tcfg: dict, capture_layers: list[int],
               train_set: list[dict[str, Tensor]]) -> TrainDraft:
    """The draft in `config.init`, every weight and its vocab map kept, checked to fit the target
    and the data first (a ContractError names the first field that does not)."""
    init = resolve_drafter(config.init, config.target)  # "default": the draft eyas ships for the target
    ckpt = read_checkpoint(init, verifier_config=tcfg, layer_convention=config.layer_convention)
    base = _base_contract(config, tcfg, capture_layers)
    contract = _init_contract(ckpt.contract, base, config)
    check_fits(contract, tcfg)
    lm_head, embed, logit_map = _target_matrices(config)
    drafter = _rebuilt(contract, ckpt.tensors, lm_head, embed)
    return _trained_on(drafter, lm_head, logit_map, train_set)


def _base_contract(config: TrainConfig, tcfg: dict, capture_layers: list[int]) -> DraftContract:
    """A fresh draft's contract for the target, reading the data's capture layers: layers the target does
    not have are the data's fault (its manifest), said as such."""
    try:
        return contract_for_target(tcfg, capture_layers=tuple(capture_layers), name=target_name(config.target))
    except ContractError as e:
        where = " and ".join(f"{f}/manifest.json" for f in data_folders(config))
        raise ContractError(f"--data {where}: captured at layers {list(capture_layers)}, which do not fit the target "
                            f"({e})", "capture the data again from this target (eyas capture --capture-layers "
                            "a,b,c), or train for the target it was captured from") from None


def resumed_draft(config: TrainConfig, state: dict[str, Any], train_set: list[dict[str, Tensor]]) -> TrainDraft:
    """The draft of a training checkpoint: its contract and weights (the optimiser is restored apart)."""
    contract = DraftContract.from_dict(state["contract"])
    lm_head, embed, logit_map = _target_matrices(config)
    return _trained_on(_rebuilt(contract, state["model"], lm_head, embed), lm_head, logit_map, train_set)


def _rebuilt(contract: DraftContract, tensors: dict[str, Tensor], lm_head: Tensor, embed: Tensor) -> Drafter:
    """A drafter from saved tensors, given the target's matrices it borrows (a borrowed lm_head stays
    frozen and unsaved, as it was trained)."""
    return Drafter.from_tensors(contract, tensors, **borrowed(contract, embed_tokens=embed, lm_head=lm_head))


def _target_matrices(config: TrainConfig) -> tuple[Tensor, Tensor, LogitMap]:
    """The target's lm_head [V, H] and embed_tokens [V, H], fp32, and the map its class applies to lm_head's
    output (eyas.logit_map)."""
    ref = TargetRef.resolve(config.target)
    t = ref.tensors(["embed_tokens.weight", "lm_head.weight"])
    return t["lm_head.weight"].float(), t["embed_tokens.weight"].float(), ref.logit_map()


def _trained_on(drafter: Drafter, lm_head: Tensor, logit_map: LogitMap,
                train_set: list[dict[str, Tensor]]) -> TrainDraft:
    """A draft that brings its own vocab map: the labels use its draft vocab."""
    c = drafter.contract
    counts = token_counts(train_set, c.vocab_size)
    if not c.has_vocab_map:
        return TrainDraft(drafter, lm_head, None, vocab_coverage(counts, None), logit_map)
    used = torch.arange(c.draft_vocab_size) + drafter.d2t.cpu()  # target = draft + d2t[draft]
    return TrainDraft(drafter, lm_head, used, vocab_coverage(counts, drafter.t2d.cpu()), logit_map)


def _init_contract(init: DraftContract, base: DraftContract, config: TrainConfig) -> DraftContract:
    """The warm-started draft's contract, recorded against this run's target; refused when it
    does not fit the target (`base`: a fresh draft's contract for it) or the data."""
    where = f"--init {config.init}"
    fit = [("capture_layers", init.capture_layers, base.capture_layers, "the data was captured at"),
           ("target_hidden_size", init.target_hidden_size, base.target_hidden_size, "the target's hidden size is"),
           ("vocab_size", init.vocab_size, base.vocab_size, "the target's vocab is")]
    if not init.has_embeddings:  # it reads the target's embeddings: its width must be theirs
        fit.append(("hidden_size", init.hidden_size, base.hidden_size, "the target's embeddings are"))
    for field, have, want, what in fit:
        if have != want:
            raise ContractError(f"{where}: the draft's {field} is {_show(have)}, {what} {_show(want)}",
                                "warm-start from a draft made for this target and these capture layers, "
                                "or capture the data at the draft's layers")
    for field, flag, value in _asked(config):
        if getattr(init, field) != value:
            raise ContractError(f"{where}: the draft's {field} is {getattr(init, field)}, the run asks for "
                                f"{flag}={value}", f"drop --{flag.replace('_', '-')}: a warm start keeps the "
                                "draft's architecture and vocab")
    return init.replace(verifier=base.verifier, embed_scale=None)  # eyas trains on the embeddings engines serve


def _asked(config: TrainConfig) -> list[tuple[str, str, Any]]:
    """(contract field, config field, value) of the draft shape the config sets to other than its
    default: those the warm-started draft must already have."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    asked = [(field, field, getattr(config, field)) for field in _ARCHITECTURE
             if getattr(config, field) != defaults[field]]
    if config.draft_vocab is not None:
        asked.append(("draft_vocab_size", "draft_vocab", config.draft_vocab))
    return asked


def _show(value: Any) -> str:
    return str(list(value)) if isinstance(value, tuple) else str(value)
