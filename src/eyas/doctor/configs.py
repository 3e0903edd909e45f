"""A folder's config files, each read as the wiring it states: which one do the weights fit?

Engines read config.json; eyas may prefer another file of the folder (config_speculators.json).
When the files state different wirings, each is measured and the finding names the one the weights
fit. Nested eagle_config layer ids are also read under every convention (`conventions`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eyas.doctor.findings import make_finding, numbers
from eyas.doctor.measure import Measurer
from eyas.doctor.stats import beats, p_value, paired_test, score
from eyas.doctor.wiring import Wiring, contract_wiring
from eyas.formats import Checkpoint, read_checkpoint


def engines_file(ckpt: Checkpoint) -> str:
    """The config file engines read: config.json when the folder has one."""
    return "config.json" if "config.json" in ckpt.files else ckpt.config_used


def file_wirings(ckpt: Checkpoint, path: Path, layer_convention: str | None, tcfg: dict, N: int
                 ) -> dict[str, Wiring]:
    """The wiring each config file of the folder states, with the weights' own facts (embeddings, d2t)."""
    if path.is_file():
        return {ckpt.config_used: contract_wiring(ckpt.contract, ckpt.tensors, N)}
    out = {}
    for name in ckpt.files:
        c = read_checkpoint(path / name, layer_convention=layer_convention, verifier_config=tcfg,
                            load_tensors=False, strict=False).contract
        c = c.replace(has_embeddings=ckpt.contract.has_embeddings)
        out[name] = contract_wiring(c, ckpt.tensors, N)
    return out


def conventions(path: Path, ckpt: Checkpoint, tcfg: dict, start: Wiring) -> dict[str, tuple[int, ...]]:
    """Capture layers under the other readings of nested eagle_config ids, when those are the source."""
    if "eagle_config." not in ckpt.origin.get("capture_layers", ""):
        return {}
    out = {}
    for conv in ("input", "output"):
        c = read_checkpoint(path, layer_convention=conv, verifier_config=tcfg, load_tensors=False,
                            strict=False).contract
        if c.capture_layers is not None and tuple(c.capture_layers) != start.layers:
            out[conv] = tuple(c.capture_layers)
    return out


def _readers(name: str, reads: str, chosen: str) -> str:
    who = ["engines" if name == reads else "", "eyas" if name == chosen else ""]
    return " and ".join(w for w in who if w) + " read it" if any(who) else "read by nobody by default"


def _fix(files: dict[str, Wiring], best: str, reads: str) -> str:
    others = [n for n in files if files[n] != files[best]]
    return f"the weights fit {best}: delete {', '.join(others)} from the folder" + (
        f", then eyas convert DIR OUT --format both: OUT/config.json (what engines read) and OUT/config_eagle.json "
        f"will state {best}'s wiring" if best != reads else " (engines read config.json; eyas read the others first)")


def config_files(m: Measurer, files: dict[str, Wiring], reads: str, chosen: str, disagree: list[str]
                 ) -> tuple[list[dict[str, Any]], dict[str, Any], Wiring]:
    """Config files that state different wirings: measure each, say which one the weights fit.

    `reads`: the file engines read; `chosen`: the one eyas read; `disagree`: check's words for how
    they differ. Returns findings, the per-file table and the wiring the search starts from (the
    best file's).
    """
    if len(set(files.values())) < 2:
        return [], {}, files[chosen]
    outs = {name: m.measure(w) for name, w in files.items()}
    best = max(files, key=lambda n: (*score(outs[n]), n == reads))
    table = {name: {**outs[name].summary(), "wiring": w.describe(), "read_by": _readers(name, reads, chosen)}
             for name, w in files.items()}
    what = "; ".join(disagree) or "they state different wirings"
    tests = len(files) - 1
    for name in dict.fromkeys([reads, chosen, *files]):  # the files read first; then one no engine reads, wrong alone
        if files[name] == files[best]:
            continue
        test = paired_test(outs[name], outs[best])
        if beats(test, tests):
            finding = make_finding(
                "config_file", f"{name} ({_readers(name, reads, chosen)}) does not fit the weights; {best} does",
                f"{what}. {name}: {files[name].describe()}; {best}: {files[best].describe()}. "
                f"{numbers(outs[name], outs[best], test, tests)}", _fix(files, best, reads), outs[name], outs[best],
                "measured", p_value=p_value(test))
            return [finding], table, files[best]
    finding = make_finding("config_file", "the config files disagree and the measurement cannot tell which is right",
                           f"{what}. " + "; ".join(f"{n}: log-probability of the target's token "
                                                    f"{outs[n].mean_logprob:.3f}, depth-1 acceptance "
                                                    f"{outs[n].depth1:.3f}" for n in files),
                           "make the files agree: keep the one the draft was trained with, delete the others, then "
                           "eyas convert DIR OUT --format both", None, None, "static")
    return [finding], table, files[best]
