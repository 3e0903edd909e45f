"""`format_report`: the doctor's JSON report, rendered for a human reader."""

from __future__ import annotations

from typing import Any

from eyas.doctor.dumps import chunk_text
from eyas.doctor.stats import p_value


def _num(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _acc(f: dict[str, Any]) -> str:
    if f["acceptance_before"] is None or f["acceptance_after"] is None:
        return ""
    return (f" (depth-1 acceptance {_num(f['acceptance_before'])} -> {_num(f['acceptance_after'])}, tau(5) "
            f"{_num(f['tau_before'], '.2f')} -> {_num(f['tau_after'], '.2f')})")


def _measured(report: dict[str, Any]) -> list[str]:
    m = report["measured"]
    fit, said = m["trained_for"], m["contract"]
    what = "measured under" if report["verdict"] == "inconclusive" else "the weights fit"  # no fit was shown
    return ["", f"{what}: {fit['wiring']}",
            (f"  log-probability of the target's token {_num(fit['logprob'])} nats, depth-1 acceptance "
             f"{_num(fit['acceptance_depth1'])}, tau(5) {_num(fit['tau5'], '.2f')} (as the contract says: "
             f"{_num(said['logprob'])}, {_num(said['acceptance_depth1'])}, {_num(said['tau5'], '.2f')})")]


def _dump(d: dict[str, Any], cached: bool) -> list[str]:
    what = "feature cache (its first sample)" if cached else "engine dump"
    lines = ["", f"{what} {d['path']}: {d['positions']} positions x {d['width']}"]
    lines += [f"  {chunk_text(c)}{'' if c['identified'] else ' (no match)'}" for c in d["chunks"]]
    on = d["acceptance_on_dump"]
    fed = f"the cache's features ({d['samples_measured']} samples)" if cached else "the dump"
    lines.append(f"  draft on {fed}: depth-1 {_num(on['acceptance_depth1']) if on else 'cannot run'}; on "
                 f"correct features: {_num(d['acceptance_on_correct_features']['acceptance_depth1'])}")
    return lines


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", ("wirings measured (round: hypothesis, log-probability of the target's token and its gain, p "
                  "(log-probability or divergence), depth-1 acceptance, tau(5); * = significant, ? = over "
                  "positions only, not across answers, - = loses acceptance; after round 1 only the significant "
                  "and the doubted):")]
    for r in (r for r in rows if r["round"] == 1 or r["significant"] or r.get("held_back")):
        mark = (" *" if r["significant"] else " ?" if r.get("held_back") else
                " -" if r.get("loses_acceptance") else "")
        lines.append(f"  {r['round']}: {r['hypothesis']:<36} {_num(r['logprob'], '.3f')} "
                     f"({_num(r['gain_logprob'], '+.3f')}, p={p_value(r):.1e})  "
                     f"{_num(r['acceptance_depth1'])}  {_num(r['tau5'], '.2f')}{mark}")
    return lines


def _on_cache(cache: dict[str, Any], m: dict[str, Any]) -> list[str]:
    """The draft measured on a feature cache as stored (no target states to try other wirings on)."""
    acc = " / ".join(_num(a) for a in m["acceptance_by_depth"])
    return ["", f"measured on the {cache['format']} cache as stored ({m['positions']} positions of {m['samples']} "
            f"whole samples; {m['verdict_text']}):",
            f"  acceptance by depth {acc}; chain tau(5) {_num(m['tau_chain'].get('5'), '.2f')}; draft-vocab coverage "
            f"{_num(m['coverage'])}"]


def format_report(report: dict[str, Any]) -> str:
    """The report for humans: verdict, findings (most likely first) with numbers and the fix, then
    what the weights fit, the engine dump, consumer hazards, other problems, notes, and the table."""
    n = len(report["findings"])
    head = {"ok": "OK: no fault found", "faulty": f"FAULTY: {n} finding{'s' * (n != 1)}",
            "inconclusive": f"INCONCLUSIVE: {report['inconclusive']}"}[report["verdict"]]
    chunks = (report["dump"] or {}).get("chunks") or []
    unjudged = not any(f["fault"] == "unmatched_features" for f in report["findings"])
    lost = [c["chunk"] for c in chunks if not c["identified"]]
    if lost and unjudged:  # the verdict then says nothing about what was fed in those chunks
        what = ("matches none of the target's states" if len(lost) == len(chunks)
                else f"chunks {lost} match no target state")
        head += f"; the dump {what} (see notes): what the engine fed is unjudged"
    lines = [f"eyas doctor {report['drafter']}: {head}", f"target: {report['target']}"]
    m = report["measured"]
    if m:
        lines.append(f"measured: {m['data']}, {m['positions']} positions, {report['seconds'].get('total')} s "
                     f"(capture {report['seconds'].get('capture')} s) on {report['runs_on']}")
    for i, f in enumerate(report["findings"], 1):
        lines += ["", f"{i}. [{f['fault']}] {f['title']}{_acc(f)}", f"   evidence: {f['evidence']}",
                  f"   fix: {f['fix']}"]
    if m:
        lines += _measured(report)
    if report["dump"]:
        lines += _dump(report["dump"], report["cache"] is not None)
    if report.get("cache_measured"):
        lines += _on_cache(report["cache"], report["cache_measured"])
    if report["hazards"]:
        lines += ["", "consumer hazards (an engine wires the checkpoint differently from its contract):"]
        lines += [f"  - {h['consumer']}: {h['hazard']}\n      fix: {h['fix']}" for h in report["hazards"]]
    if report["static"]["problems"]:
        lines += ["", "other problems (eyas check; not acceptance faults):"]
        lines += [f"  - [{p['field']}] {p['problem']}\n      fix: {p['fix']}" for p in report["static"]["problems"]]
    if report["notes"]:
        lines += ["", "notes:"] + [f"  - {x}" for x in report["notes"]]
    if m and m["hypotheses"]:
        lines += _table(m["hypotheses"])
    return "\n".join(lines)
