"""Held-out evaluation during training: the draft's greedy-chain tau on samples it never trains on."""

from __future__ import annotations

from typing import Any

import torch

from eyas.borrowed import borrowed_names
from eyas.drafter import Drafter
from eyas.evaluate import evaluate_samples

EVAL_DEPTH = 5  # held-out tau is reported at k = 5 drafted tokens


def heldout_eval(drafter: Drafter, heldout: list[dict[str, torch.Tensor]], lm_head: torch.Tensor,
                 step: int) -> dict[str, Any]:
    """One log record of `eyas.evaluate` on the held-out samples (run on the CPU). `tau_ci95` is tau's
    95% interval over resampled held-out samples: how far tau would move on another held-out set,
    which is what runs with different held-out sets are compared by (steps of one run share theirs)."""
    cpu = drafter if next(drafter.parameters()).device.type == "cpu" else cpu_copy(drafter)
    rep = evaluate_samples(cpu, heldout, lm_head.cpu(), depth=EVAL_DEPTH, tree_depth=EVAL_DEPTH)
    return {"kind": "eval", "step": step, "tau": rep["tau_chain"][str(EVAL_DEPTH)],
            "accept_depth1": rep["acceptance_by_depth"][0], "tau_chain": rep["tau_chain"],
            "acceptance_by_depth": rep["acceptance_by_depth"], "coverage": rep["coverage"],
            "tokens": rep["tokens"], "tau_ci95": rep["ci95"]["tau_chain"][str(EVAL_DEPTH)]}


def cpu_copy(drafter: Drafter) -> Drafter:
    """The drafter on the CPU for evaluation (eyas.evaluate builds its index tensors there)."""
    tensors = {k: v.detach().cpu() for k, v in drafter.state_dict().items()}
    shared = {name: getattr(drafter, name).weight.cpu() for name in borrowed_names(drafter.contract)}
    return Drafter.from_tensors(drafter.contract, tensors, **shared)
