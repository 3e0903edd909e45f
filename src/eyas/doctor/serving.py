"""Serving faults: an engine that would wire the draft worse than what its weights fit.

`eyas.check.consumers` says how vLLM, SGLang and speculators would wire the checkpoint; each such
wiring is measured against the one the search ended on, and a significant loss is a finding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from eyas.doctor.findings import differs, make_finding, numbers, said
from eyas.doctor.hypotheses import config_edits
from eyas.doctor.measure import Measurer
from eyas.doctor.stats import beats, p_value, paired_test
from eyas.doctor.wiring import Wiring
from eyas.formats import NORM_FLAGS, Checkpoint


def serving_wirings(cons: dict[str, dict[str, Any]], engine: Wiring, has_embeddings: bool
                    ) -> dict[Wiring, list[str]]:
    """The wiring each consumer that loads the checkpoint would run (`eyas.check.consumers`)."""
    out: dict[Wiring, list[str]] = {}
    for name, r in cons.items():
        if not r["loads"] or not r["capture_layers"]:
            continue
        embeddings = "target" if r["embeddings"] == "shares target's" else "own"
        if embeddings == "own" and not has_embeddings:
            continue  # it would not run at all; `check` already says so
        w = dataclasses.replace(engine, layers=tuple(r["capture_layers"]), embeddings=embeddings,
                                norm_before_residual=r["norm_before_residual"], **r["norm_flags"])
        out.setdefault(w, []).append(name)
    return out


def _fix(slug: str, ckpt: Checkpoint, final: Wiring, served: Wiring, names: list[str]) -> str:
    if slug == "capture_layers" and final.layers[0] == 1 and any(n.startswith("sglang") for n in names):
        return (f"SGLang reads eagle_config ids that start at 1 as output-of-layer ids and adds 1: it cannot capture "
                f"{list(final.layers)}; serve this draft with vLLM, or retrain it on layers that do not start at 1")
    if slug in ("capture_layers", "concat_order"):
        return (f"write the layer ids where every engine reads them: {config_edits(ckpt, 'layers', final.layers)} "
                "(eyas convert DIR OUT --format both writes both places)")
    if slug == "norm_flags":
        flags = [f for f in NORM_FLAGS if getattr(final, f) != getattr(served, f)]
        return "write every norm flag explicitly: " + "; ".join(config_edits(ckpt, f, getattr(final, f)) for f in flags)
    if slug == "embeddings":
        return ("SGLang always substitutes the target's embed_tokens; this draft needs its own: serve it with vLLM, "
                "or retrain it on the target's embeddings")
    return "make the checkpoint state it explicitly (eyas convert DIR OUT --format both)"


def serving(m: Measurer, wirings: dict[Wiring, list[str]], final: Wiring, covered: set[Wiring],
            ckpt: Checkpoint) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Consumers that would wire the draft worse than `final` (what its weights fit): serving faults.
    Wirings in `covered` are already explained by another finding. Returns findings and a table per consumer."""
    final_out, findings, table = m.measure(final), [], {}
    todo = {w: names for w, names in wirings.items() if w != final}
    for w, names in wirings.items():
        out = m.measure(w)
        for n in names:
            table[n] = {**out.summary(), "wiring": w.describe()}
        if w not in todo or w in covered:
            continue
        test = paired_test(out, final_out)
        if beats(test, len(todo)):
            slug = differs(w, final)
            findings.append(make_finding(
                slug, f"{', '.join(names)} would wire it with {said(slug, w, final)}; the weights fit "
                      f"{said(slug, final, w)}", numbers(out, final_out, test, len(todo)),
                _fix(slug, ckpt, final, w, names), out, final_out, "serving", consumers=names,
                p_value=p_value(test)))
    return findings, table
