"""`diagnose`: the doctor's entry point, from a draft folder to a JSON-ready report.

Static findings always (`eyas check`, consumer hazards); then, when the draft can run on the
target, the measured ones: config files, the search over hypotheses, serving engines and, given
one, an engine dump. Findings are ranked by the gain they promise; static ones come last.
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from eyas.check import CheckReport, check_checkpoint, consumers
from eyas.codes import slug_of, text_of
from eyas.contract import DEFAULT_ROPE_THETA
from eyas.evaluate import check_slots
from eyas.doctor.caches import CacheFeed, cache_notes, cache_section, layers_found, measure_on_cache, \
    open_for
from eyas.doctor.capture import DEFAULT_LIMIT, DEFAULT_MAX_NEW_TOKENS, DEFAULT_PROMPTS, Capture, collect, collect_from
from eyas.doctor.configs import config_files, conventions, engines_file, file_wirings
from eyas.data import prompts_fit, read_prompts, short_of_limit
from eyas.data.dumps import read_dump
from eyas.doctor.dumps import check_dump, dump_on_tokens, dump_section
from eyas.doctor.measure import Measurer
from eyas.doctor.search import search
from eyas.doctor.serving import serving, serving_wirings
from eyas.doctor.static import fc_skipped, hazards, join_problems, other_problems
from eyas.doctor.stats import (ACCEPTANCE_ALPHA, ALPHA, ANSWERS_ALPHA, DEPTH, MIN_ANSWERS, MIN_DROP_KL,
                               MIN_GAIN_LOGPROB, MIN_USABLE, POWER, decidable, detectable, p_value, rounded,
                               smallest_p)
from eyas.doctor.wiring import Wiring, contract_wiring
from eyas.formats import Checkpoint
from eyas.machine import runs_on
from eyas.target import Target
from eyas.target_ref import TargetRef

GROW = 2  # times the answers are doubled while positions and answers disagree (the default 8 -> 16 -> 32)

_TEST = (f"paired per position against the current wiring: Wilcoxon signed-rank tests on the gain in the draft's "
         f"log-probability of the target's token and on the drop in KL(target || draft) over the draft vocabulary "
         f"(each averaged over a chain of k={DEPTH}); significant when p x tests < {ALPHA} (Bonferroni) and the gain "
         f"is >= {MIN_GAIN_LOGPROB} nats of log-probability or >= {MIN_DROP_KL} nats of divergence, and that measure "
         f"leans the same way across answers (exact sign test over answers p < {ANSWERS_ALPHA}; from {MIN_ANSWERS} "
         f"answers: fewer cannot reach it; where positions and answers disagree the answers are doubled, to at "
         f"most {2 ** GROW}x), unless the wiring loses acceptance (exact one-sided McNemar or chain sign test "
         f"p < {ACCEPTANCE_ALPHA}); the best is adopted, the rest re-tested. Depth-1 acceptance and accepted "
         "chain length are reported beside them. Features one position EARLY (t+1) are not tried: they hand the "
         "draft the target's state after the token it must predict")


def _cannot_measure(rep: CheckReport, ckpt: Checkpoint, tcfg: dict) -> str | None:
    """Why the draft cannot be run on this target at all (then only static findings are reported)."""
    if not ckpt.tensors_loaded:
        return "the weights were not read (pass the checkpoint folder, with its weights)"
    fit = [p["problem"] for p in rep.problems
           if p["code"] in ("target_vocab_size", "target_draft_vocab_size", "target_hidden_size")]
    if fit:
        return "the draft does not fit this target: " + "; ".join(fit)
    c = ckpt.contract
    if c.hidden_size != tcfg.get("hidden_size") and not c.has_embeddings:
        return "the draft has no embed_tokens and its width differs from the target's"
    return None


def _measure(m: Measurer, rep: CheckReport, cons: dict[str, dict[str, Any]], path: Path, layer_convention: str | None,
             tcfg: dict, progress: bool) -> tuple[list[dict[str, Any]], Wiring, dict[str, Any]]:
    """Config files, then the rounds of hypotheses, then the consumers: (findings, final wiring, section)."""
    ckpt, N = rep.checkpoint, m.N
    files = file_wirings(ckpt, path, layer_convention, tcfg, N)
    reads = engines_file(ckpt)
    disagree = [text_of(p) for p in rep.problems if slug_of(p["code"]) == "config_file"]
    file_findings, file_table, start = config_files(m, files, reads, ckpt.config_used, disagree)
    said = contract_wiring(ckpt.contract, ckpt.tensors, N)
    found, table, final = search(m, start, conventions(path, ckpt, tcfg, said), progress)
    covered = ({start} if found else set()) | (set(files.values()) if file_findings else set())
    wirings = serving_wirings(cons, files[reads], ckpt.contract.has_embeddings)
    serve_findings, serve_table = serving(m, wirings, final, covered, ckpt)
    section = {
        "data": m.cap.source, "positions": m.cap.positions, "depth": DEPTH,
        "contract": {"wiring": start.describe(), **m.measure(start).summary()},
        "trained_for": {"wiring": final.describe(), **m.measure(final).summary()},
        "hypotheses": table, "config_files": file_table, "serving": serve_table, "test": _TEST,
        "detectable_logprob": _detectable(table, m.cap.positions),
        "decidable": decidable(m.cap.positions, _tests(table)),
    }
    return file_findings + found + serve_findings, final, section


def _doubt(row: dict[str, Any]) -> str:
    """A wiring significant over positions whose answers do not agree (`stats.held_back`), in words."""
    (k, n), (j, _) = row["samples_favouring"], row["samples_favouring_kl"]
    return (f"{row['hypothesis']} measured better over positions (p = {p_value(row):.1e}) but not across answers "
            f"(log-probability higher on {k} of {n}, sign test p = {row['p_samples']:.2g}; divergence lower on {j} "
            f"of {n}, p = {row['p_samples_kl']:.2g})")


def _settled(cap: Capture, rep: CheckReport, cons: dict[str, dict[str, Any]], path: Path,
             layer_convention: str | None, tcfg: dict, progress: bool, notes: list[str]
             ) -> tuple[Measurer, Capture, list[dict[str, Any]], Wiring, dict[str, Any]]:
    """`_measure`, repeated on twice the answers while a wiring is significant over positions but not
    across answers, at most GROW times: positions of one answer are not independent, so a preference
    a few answers hold can look decisive over positions, and only more answers tell it from a fault.
    Only the last round's doubts count (that round found nothing more; an earlier round's doubt is
    re-tested in the next one). What more answers do not settle is reported in `notes`, not as a fault."""
    for grown in range(GROW + 1):
        m = Measurer(rep.checkpoint, cap)
        found, final, section = _measure(m, rep, cons, path, layer_convention, tcfg, progress)
        rows = section["hypotheses"]
        last = max((r["round"] for r in rows), default=0)
        doubtful = [r for r in rows if r["held_back"] and r["round"] == last]
        thin = not section["decidable"]
        more = cap.extended(progress) if (doubtful or thin) and grown < GROW else None
        if more is None:
            break
        added = len(more.samples) - len(cap.samples)
        why = _doubt(doubtful[0]) if doubtful else _too_few(cap.positions, _tests(rows))
        notes.append(f"{why}: {more.feed.more(added)} to settle it")
        cap = more
    notes += [f"{_doubt(r)}: not named a fault; other {cap.unit}, or more (--limit), would settle it"
              for r in doubtful]
    return m, cap, found, final, section


def _too_few(positions: int, tests: int) -> str:
    need = next(n for n in itertools.count(positions + 1) if decidable(n, tests))
    return (f"{positions} positions are too few for any of {tests} wirings to be named a fault (the test's smallest "
            f"p there, {smallest_p(positions):.1e}, times {tests} is not below {ALPHA}; {need} or more can be)")


def _states(capture: Capture | None, ref: TargetRef, prompts: str | Path | None, feed: CacheFeed | None,
            limit: int, max_new_tokens: int, progress: bool) -> Capture:
    """The target's states to measure every wiring on: the first `limit` samples of a cache (`feed`),
    else `capture`, else greedy answers to the prompts."""
    tgt = capture.target if capture is not None else Target.load(ref, dtype=torch.float32)
    if feed is not None:
        return collect_from(tgt, feed, limit, progress)
    return capture or collect(tgt, prompts, limit=limit, max_new_tokens=max_new_tokens, progress=progress)


def _features(features: str | Path | None, data_format: str | None, ref: TargetRef, report: dict[str, Any],
              layers: tuple[int, ...], draft: Path, at_hand: bool, max_new_tokens: int
              ) -> tuple[tuple[Tensor, Tensor] | None, CacheFeed | None]:
    """`--features` read: an engine dump (a file, checked against the target before anything loads)
    or a trainer's cache (a folder, opened once and described in the report). Returns the dump to
    match (None without features; a cache's first sample measured) and, for a cache, the feed of
    its samples."""
    if features is None:
        return None, None
    if not Path(features).is_dir():
        dump = read_dump(features)
        check_dump(dump, ref, features)
        return dump, None
    cache = open_for(features, data_format, ref)
    report["cache"] = cache_section(cache.info)
    report["notes"] += cache_notes(cache.info, at_hand, layers, draft)
    feed = CacheFeed(cache, max_new_tokens)
    return (feed.first() if at_hand else None), feed


def _dump(m: Measurer, cap: Capture, feed: CacheFeed | None, dump: tuple[Tensor, Tensor], final: Wiring,
          path: Path, ckpt: Checkpoint) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """The dump matched: a cache's first sample on the search's own measurer (it is that sample; the
    draft then runs on every measured sample's stored features), an engine dump on the target's
    states over its own tokens (one sequence: the wirings were measured on answers, which the
    positions of one sequence cannot stand for)."""
    if feed is None:
        return dump_on_tokens(ckpt, cap.target, dump, path, final)
    fed = [w["features"].float() for w in feed.windows(0, len(m.cap.samples))]
    return dump_section(m, final, dump[1], path, ckpt, fed)


def _detectable(table: list[dict[str, Any]], positions: int) -> float | None:
    """`stats.detectable` for round 1 (every hypothesis against the wiring as the contract says)."""
    first = [r for r in table if r["round"] == 1 and not r.get("error")]
    sds = [r["sd_logprob"] for r in first if r["sd_logprob"] is not None]
    return rounded(detectable(sds, positions, first[0]["tests"])) if first else None


def _tests(table: list[dict[str, Any]]) -> int:
    """How many wirings round 1 tested (its Bonferroni count)."""
    return max((r["tests"] for r in table if r["round"] == 1), default=0)


def _untrained(section: dict[str, Any]) -> str | None:
    """Why the draft is trained for none of the wirings measured (the contract's included), or None:
    depth-1 acceptance below MIN_USABLE under every one, or a log-probability of the target's tokens
    no better than a uniform guess over the draft vocabulary gives them under every one (a draft a few
    steps into training, peaked on the wrong tokens, can accept a few tokens and learn nothing)."""
    rows = [*section["hypotheses"], section["trained_for"]]
    if max(r["acceptance_depth1"] or 0 for r in rows) < MIN_USABLE:
        return f"depth-1 acceptance is below {MIN_USABLE} under every wiring tried"
    measured = [r for r in rows if r["logprob"] is not None and r.get("uniform_logprob") is not None]
    if measured and all(r["logprob"] <= r["uniform_logprob"] for r in measured):
        best = max(measured, key=lambda r: r["logprob"] - r["uniform_logprob"])
        return (f"the draft's log-probability of the target's tokens is no better than a uniform guess over its "
                f"vocabulary under any wiring tried (at best {best['logprob']:.2f} nats against the guess's "
                f"{best['uniform_logprob']:.2f})")
    return None


def _measure_notes(cap: Capture, section: dict[str, Any], found: bool, untrained: str | None, withheld: list[str],
                   limit: int | None) -> list[str]:
    """What limits the measurement: how large a fault an `ok` could have missed (and how much data
    halves that), too few answers, or a draft that accepts nothing under any wiring (`untrained`, its
    findings `withheld`)."""
    notes, mde = [], section["detectable_logprob"]
    if not found and not withheld and mde is not None:
        more = f"four times the {cap.unit}" if limit is None else f"--limit {4 * limit}"
        notes.append(f"no other wiring measured better over {cap.positions} positions: one that raises the "
                     f"draft's mean log-probability of the target's tokens by {mde:.3f} nats or more would have "
                     f"been found ({POWER:.0%} power); smaller faults can hide, and {more} halves what can")
    if len(cap.samples) < MIN_ANSWERS:
        notes.append(f"{len(cap.samples)} {cap.unit} measured: under {MIN_ANSWERS} "
                     "the answers cannot confirm a preference the positions show (positions of one answer are not "
                     f"independent), so positions decided alone; --limit {DEFAULT_LIMIT} or more lets them")
    if untrained:
        notes.append(f"{untrained}: untrained weights, a "
                     "draft for another target, or a fault the doctor does not test" + (
                         "; the wirings its weights measure better under are not named faults, random weights "
                         f"lean somewhere: {'; '.join(withheld)}" if withheld else ""))
    return notes


def _skeleton(path: Path, tgt_dir: Path, rep: CheckReport, cons: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report before anything is measured."""
    ckpt = rep.checkpoint
    notes = [f"{name}: cannot load {r['reads']}: {r['notes'][-1]}" for name, r in cons.items() if not r["loads"]]
    return {
        "verdict": "ok", "findings": [], "drafter": str(path), "target": str(tgt_dir),
        "contract": ckpt.contract.to_dict(), "trained_for": None,
        "static": {"problems": other_problems(rep), "warnings": rep.warnings},
        "hazards": [], "consumers": {n: {"reads": r["reads"], "loads": r["loads"], "notes": r["notes"]}
                                     for n, r in cons.items()},
        "measured": None, "dump": None, "cache": None, "cache_measured": None, "notes": notes, "seconds": {},
        "inconclusive": None,
    }


def _rank(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Largest measured gain first, static findings last."""
    return sorted(findings, key=lambda f: math.inf if f["acceptance_before"] is None or f["acceptance_after"] is None
                  else f["acceptance_before"] - f["acceptance_after"])


def diagnose(
    drafter: str | Path,
    *,
    target: str | Path | None = None,
    prompts: str | Path | None = None,
    features: str | Path | None = None,
    data_format: str | None = None,
    layer_convention: str | None = None,
    limit: int | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    progress: bool = True,
    capture: Capture | None = None,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Diagnose the draft checkpoint at `drafter` (a folder) against `target` (None: the embedded default).

    Static findings always; measured findings on the target's greedy answers to `limit` prompts
    (default MT-bench), on the tokens of an engine dump (`features` a file, docs/engine-dumps.md), or
    on the tokens of a trainer's feature cache's first `limit` samples (`features` a folder,
    `data_format` or detected; each cut after `max_new_tokens` answer tokens: eyas.doctor.caches), whose
    first sample is also matched against the target's states. Up to 4x as many prompts or samples
    where positions and answers disagree (`_settled`). `limit` None is DEFAULT_LIMIT, asked for by no one: a
    file or cache shorter than a `limit` given is warned about, not one shorter than the default. Without the
    target's full weights (a cache judged by the target's final norm and lm_head alone) the draft is
    measured on the cache as stored (`cache_measured`). The target runs on `device` (default cpu).
    `capture` (from `collect`) reuses recorded states across calls (its target is used; `target` and
    `prompts` are then ignored, and so are its states where `features` is a cache). Returns the JSON
    report: `verdict` ("ok" | "faulty" | "inconclusive": nothing found where nothing could have been, or the
    draft accepts nothing under any wiring; `inconclusive` says which), `findings` (most likely first: {fault,
    title, evidence, fix, codes, acceptance_before, acceptance_after, tau_before, tau_after, source, ...}),
    `trained_for`, `static`, `hazards`, `consumers`, `measured`, `dump`, `notes`, `seconds`.
    """
    t0 = time.perf_counter()
    path, asked, limit = Path(drafter), limit, DEFAULT_LIMIT if limit is None else limit  # asked: None, the default
    ref = TargetRef.resolve(capture.target.path if capture is not None else target, weights=False, device=device)
    answers = features is None or not Path(features).is_dir()  # an engine dump is measured on answers to prompts
    if capture is None and answers and ref.missing_model() is None:  # one too long is said first
        source = prompts or DEFAULT_PROMPTS
        prompts_fit(ref, short_of_limit(read_prompts(source, limit=limit), asked, source), max_new_tokens)
    tgt_dir = ref.path
    rep = check_checkpoint(path, target=tgt_dir, layer_convention=layer_convention)
    ckpt, tcfg = rep.checkpoint, ref.text_config
    cons = consumers(ckpt)
    report = _skeleton(path, tgt_dir, rep, cons)
    final = contract_wiring(ckpt.contract, ckpt.tensors, ref.num_layers)
    findings: list[dict[str, Any]] = []
    missing = None if capture is not None else ref.missing_model()
    at_hand = missing is None
    dump, feed = _features(features, data_format, ref, report, final.layers, path, at_hand, max_new_tokens)
    if feed is not None:
        short_of_limit(feed.cache, asked, feed.cache.info.path, unit="sample")
    if feed is not None and feed.cache.info.num_slots < ckpt.contract.num_aux_layers:  # fc cannot run on it
        check_slots(feed.cache.info, ckpt.contract.num_aux_layers, path, ckpt.contract.capture_layers)
    cannot, unsure = _cannot_measure(rep, ckpt, tcfg), None
    why_not = cannot or (None if at_hand else f"the target's weights are not all in {ref.folder} ({missing})")
    if why_not:
        report["notes"].append(f"not measured: {why_not}")
        if feed is not None and not cannot:  # the draft runs: measure it on the cache as stored
            report["cache_measured"] = measure_on_cache(path, feed.cache, ref, layer_convention, limit)
    else:
        cap = _states(capture, ref, prompts, feed, limit, max_new_tokens, progress)
        t1, answered = time.perf_counter(), cap.seconds
        m, cap, findings, adopted, report["measured"] = _settled(cap, rep, cons, path, layer_convention, tcfg,
                                                                progress, report["notes"])
        untrained = _untrained(report["measured"])
        unsure = untrained or (None if report["measured"]["decidable"] else
                               _too_few(cap.positions, _tests(report["measured"]["hypotheses"])))
        withheld = [f["title"] for f in findings] if untrained else []
        if withheld:  # the contract's wiring stands: nothing measured is evidence against it
            findings, report["measured"]["trained_for"] = [], {"wiring": final.describe(), **m.measure(final).summary()}
        else:
            final = adopted
        taken = None if capture is not None and feed is None else cap.used  # a shared capture: no --limit
        report["notes"] += _measure_notes(cap, report["measured"], bool(findings), untrained, withheld, taken)
        if dump is not None:  # an engine's, or the cache's first sample
            dump_findings, report["dump"], dump_notes = _dump(m, cap, feed, dump, final, Path(features), ckpt)
            findings += dump_findings
            report["notes"] += dump_notes
            if feed is not None:
                report["cache"]["layers_found"], found_notes = layers_found(feed.cache.info, report["dump"]["chunks"])
                report["notes"] += found_notes
        report["seconds"].update(capture=round(cap.seconds, 1),
                                 measure=round(time.perf_counter() - t1 - (cap.seconds - answered), 1))
    join_problems(findings, rep)
    findings += fc_skipped(rep, ckpt)
    if ckpt.contract.rope_theta is None and not any(f["fault"] == "rope" for f in findings):
        report["notes"].append(f"the config names no rope_theta: every engine builds {DEFAULT_ROPE_THETA:g}"
                               + ("" if why_not else ", and the measurement found no better theta"))
    findings = _rank(findings)
    report.update(findings=findings, verdict="faulty" if findings else "inconclusive" if unsure else "ok",
                  inconclusive=None if findings else unsure, trained_for=final.describe(),
                  hazards=hazards(cons, ckpt, final))
    report["seconds"]["total"] = round(time.perf_counter() - t0, 1)
    report["runs_on"] = runs_on(ref.device)  # what the seconds were spent on
    return report
