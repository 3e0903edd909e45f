"""`eyas check`: every finding on a draft checkpoint at once, against a target's config when given."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eyas.check.consumers import consumer_warnings, consumers
from eyas.check.rules import contract_problems, target_problems
from eyas.codes import as_problem, finding, prefixed
from eyas.contract import target_facts
from eyas.formats import LAYER_CONVENTIONS, Checkpoint, read_checkpoint
from eyas.target import target_config


@dataclass
class CheckReport:
    """Result of `check_checkpoint`: findings (eyas.codes); any problem makes `eyas check` exit 1."""

    path: Path
    checkpoint: Checkpoint
    problems: list[dict[str, str]] = field(default_factory=list)
    warnings: list[dict[str, str]] = field(default_factory=list)
    target: dict[str, Any] | None = None  # target_facts of the target config, when given
    engine: str | None = None  # the consumer whose mismatches are problems (`eyas check --engine`)

    @property
    def ok(self) -> bool:
        return not self.problems


def draft_warnings(ckpt: Checkpoint, cons: dict[str, dict[str, Any]] | None = None) -> list[dict[str, str]]:
    """The warnings on a draft alone, as read (no target): what `check` says beside its problems, and
    what `inspect` lists and `init` prints for the draft it wrote (`cons`: consumers(ckpt), if at hand)."""
    return ckpt.warnings + contract_problems(ckpt)[1] + consumer_warnings(cons or consumers(ckpt))


def served_problems(cons: dict[str, dict[str, Any]], engine: str) -> list[dict[str, str]]:
    """What keeps `engine` from serving the draft as its contract says: its mismatches, as problems, or
    where it refuses the draft without naming a field (a format it does not read), the refusal."""
    if engine not in cons:
        raise ValueError(f"engine must be one of {', '.join(cons)}")
    view = cons[engine]
    found = [as_problem(prefixed(m, f"{engine}: ")) for m in view["mismatches"]]
    if not view["loads"] and not any(f["code"] == "consumer_cannot_load" for f in found):
        found.append(as_problem(finding(
            "consumer_cannot_load", "config", f"{engine}: cannot load {view['reads']}: {'; '.join(view['refused'])}",
            "serve the draft with an engine that loads it, or convert it to the format this one reads "
            "(eyas inspect DIR: every engine's view)")))
    return found


def check_checkpoint(
    path: str | Path, *, target: str | Path | None = None, layer_convention: str | None = None,
    engine: str | None = None,
) -> CheckReport:
    """Every problem with the draft at `path` (folder or config .json), against `target` when given
    (a folder, its config file, or "default": eyas.target.target_config).

    `engine` (a consumer of eyas.check.consumers: vllm, sglang, ...): the one that will serve the draft.
    Its mismatches, warnings otherwise (another engine may serve the draft as its contract says), are
    problems then, and so is its refusing the draft.

    Raises ValueError for an unknown `engine` or `layer_convention` (a caller's bug), and FormatError only
    when the input cannot be read at all (no config, malformed JSON, a config
    of neither format, weights that cannot be read, an unreadable target); everything else is a
    finding in the report.
    """
    if layer_convention not in (None, *LAYER_CONVENTIONS):
        raise ValueError(f"layer_convention must be one of {LAYER_CONVENTIONS} or None")
    tgt_cfg = target_config(target) if target is not None else None
    if tgt_cfg is not None:
        target_facts(tgt_cfg, f"target {target}")  # its sizes refused in one line before the draft is read
    ckpt = read_checkpoint(path, layer_convention=layer_convention, verifier_config=tgt_cfg, strict=False)
    cons = consumers(ckpt)
    served = served_problems(cons, engine) if engine is not None else []
    report = CheckReport(path=Path(path), checkpoint=ckpt, problems=list(ckpt.problems) + contract_problems(ckpt)[0],
                         warnings=[w for w in draft_warnings(ckpt, cons) if as_problem(w) not in served],
                         engine=engine)
    report.problems += served
    if tgt_cfg is not None:
        report.target = target_facts(tgt_cfg)
        report.problems += target_problems(ckpt.contract, report.target)
    else:
        report.warnings.append(
            finding(
                "target_not_given",
                "target",
                "no --target: vocab, width, depth and context were not checked against a target",
                "pass --target DIR_OR_CONFIG (or --target default for the embedded target)",
            )
        )
    return report
