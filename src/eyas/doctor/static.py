"""What `eyas check` finds, joined to the doctor's faults by code (eyas.codes), never by wording.

A check problem whose code points at a fault joins that fault's measured finding as evidence, or
becomes a static finding of its own; the rest (a local verifier path, a missing name) stay "other
problems". Consumer mismatches (`eyas.check.consumers`) become hazards: where an engine would wire
the checkpoint differently from its contract.
"""

from __future__ import annotations

from typing import Any

from eyas.check import CheckReport
from eyas.codes import slug_of, text_of
from eyas.doctor.configs import engines_file
from eyas.doctor.findings import make_finding
from eyas.doctor.hypotheses import config_edits
from eyas.doctor.wiring import Wiring
from eyas.formats import Checkpoint


def acceptance_problems(rep: CheckReport) -> list[dict[str, str]]:
    """check's problems that change what the draft computes (their code names a fault)."""
    return [p for p in rep.problems if slug_of(p["code"]) is not None]


def other_problems(rep: CheckReport) -> list[dict[str, str]]:
    """check's problems that do not change what the draft computes."""
    return [p for p in rep.problems if slug_of(p["code"]) is None]


def join_problems(findings: list[dict[str, Any]], rep: CheckReport) -> None:
    """Each acceptance problem joins the finding of its fault (as evidence and a code) or becomes a
    static finding of its own."""
    for p in acceptance_problems(rep):
        slug, text = slug_of(p["code"]), p["problem"]
        same = next((f for f in findings if f["fault"] == slug), None)
        if same is None:
            findings.append(make_finding(slug, text, f"eyas check: {text}", p["fix"], None, None, "static",
                                         codes=(p["code"],)))
            continue
        if text not in same["evidence"]:
            same["evidence"] += f"; eyas check: {text}"
        same["codes"].append(p["code"])


def fc_skipped(rep: CheckReport, ckpt: Checkpoint) -> list[dict[str, Any]]:
    """The file engines read sets eagle_config.use_aux_hidden_state = false: vLLM then skips fc and the
    draft gets one state. (check warns about every file that sets it; only the engines' file matters.)"""
    reads = engines_file(ckpt)
    flagged = [w for w in rep.warnings if w["code"] == "fc_skipped"]
    if not flagged or (ckpt.configs.get(reads, {}).get("eagle_config") or {}).get("use_aux_hidden_state") is not False:
        return []
    evidence = "; ".join(f"eyas check: {text_of(w)}" for w in flagged)
    title = f"{reads} sets eagle_config.use_aux_hidden_state = false: vLLM skips fc and feeds the draft one state"
    return [make_finding("fc_skipped", title, evidence, f"in {reads} set eagle_config.use_aux_hidden_state = true",
                         None, None, "static", codes=("fc_skipped",))]


def hazards(cons: dict[str, dict[str, Any]], ckpt: Checkpoint, final: Wiring) -> list[dict[str, str]]:
    """Where a consumer wires the checkpoint differently from its contract, with the agreeing fix (for
    capture layers: the exact edit that records the layers the weights fit)."""
    layers_fix = (f"write the ids in every place engines read: {config_edits(ckpt, 'layers', final.layers)} "
                  "(eyas convert DIR OUT --format both)")
    return [{"consumer": name, "code": m["code"], "hazard": text_of(m), "fault": slug_of(m["code"]),
             "fix": layers_fix if slug_of(m["code"]) == "capture_layers" else m["fix"]}
            for name, r in cons.items() for m in r["mismatches"]]
