"""The search: rounds of measuring every hypothesis against the current wiring, adopting the best.

A hypothesis is adopted only when it beats the current wiring significantly (`stats.beats`, with
Bonferroni over the round's tests, the answers agreeing); the rest are then re-tested against it, so
a second fault hiding behind the first is found too. Capture layers are searched further (`climb`):
a round compares the layers one step from the current ones (every id moved together by -2..+2, each
id alone by one), and when the real fault is two steps away the round's best is only its neighbour;
the climb keeps moving to a neighbouring set of layers while one beats the current set
significantly, so the search does not stop beside the truth.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from tqdm import tqdm

from eyas.doctor.findings import make_finding, numbers, said
from eyas.doctor.hypotheses import Hypothesis, hypotheses, layer_moves, layers_hypothesis
from eyas.doctor.measure import Measurer
from eyas.doctor.stats import Outcome, beats, held_back, loses_acceptance, p_value, paired_test, rounded, score
from eyas.doctor.wiring import Wiring

MAX_ROUNDS = 3  # adopt the best hypothesis, re-test the rest; at most this many faults in a row


def _row(rnd: int, name: str, slug: str, out: Outcome, test: dict[str, Any], tests: int,
         significant: bool) -> dict[str, Any]:
    """One row of the table of every wiring measured."""
    return {"round": rnd, "hypothesis": name, "fault": slug, **out.summary(),
            "gain_logprob": rounded(test["gain_logprob"]), "p_logprob": test["p_logprob"],
            "drop_kl": rounded(test["drop_kl"]), "p_kl": test["p_kl"], "sd_logprob": rounded(test["sd_logprob"]),
            "gain_depth1": rounded(test["gain_depth1"]), "p_depth1": test["p_depth1"], "p_chain": test["p_chain"],
            "p_depth1_worse": test["p_depth1_worse"], "p_chain_worse": test["p_chain_worse"],
            "samples_favouring": test["samples_favouring"], "p_samples": test["p_samples"],
            "samples_favouring_kl": test["samples_favouring_kl"], "p_samples_kl": test["p_samples_kl"],
            "loses_acceptance": loses_acceptance(test), "held_back": held_back(test, tests),
            "tests": tests, "significant": significant}


def climb(m: Measurer, h: Hypothesis, base: Wiring, base_out: Outcome, rnd: int, tests: int,
          table: list[dict[str, Any]]) -> tuple[Hypothesis, Outcome, int]:
    """From the round's winning capture layers `h`, move to the best-measured neighbouring layers
    (`layer_moves`) while that neighbour beats the current layers significantly (the same test as a
    round, Bonferroni over the neighbours). Each wiring measured joins the table, tested against the
    round's `base` (with the round's `tests`). Returns the last hypothesis, its outcome and how many
    wirings were added."""
    best, best_out, seen, added = h, m.measure(h.wiring), {base, h.wiring}, 0
    while True:
        moves = [(name, layers) for name, layers in layer_moves(best.wiring.layers)
                 if all(0 <= k <= m.N for k in layers) and dataclasses.replace(best.wiring, layers=layers) not in seen]
        if not moves:
            break
        tried = [layers_hypothesis(base, m.ckpt, f"{best.name}, then {name}", layers) for name, layers in moves]
        seen.update(t.wiring for t in tried)
        added += len(tried)
        outs = [m.measure(t.wiring) for t in tried]
        for t, out in zip(tried, outs, strict=True):
            test = paired_test(base_out, out)
            table.append(_row(rnd, t.name, t.slug, out, test, tests, beats(test, tests)))
        top = max(range(len(tried)), key=lambda i: score(outs[i]))
        if not beats(paired_test(best_out, outs[top]), 2 * len(tried)):
            break
        best, best_out = tried[top], outs[top]
    return best, best_out, added


def _round(m: Measurer, base: Wiring, hyps: list[Hypothesis], rnd: int, table: list[dict[str, Any]],
           progress: bool) -> tuple[dict[str, Any], Wiring] | None:
    """Measure every hypothesis against `base`; the best significant one's finding and wiring, or None."""
    base_out, tests, winners = m.measure(base), 2 * len(hyps), []  # two tests per hypothesis
    for h in tqdm(hyps, desc=f"doctor round {rnd}", unit="wiring", file=sys.stderr, disable=not progress):
        out = m.measure(h.wiring)
        test = paired_test(base_out, out)
        table.append(_row(rnd, h.name, h.slug, out, test, tests, beats(test, tests)))
        if table[-1]["significant"]:
            winners.append((h, out))
    if not winners:
        return None
    h, out = max(winners, key=lambda r: score(r[1]))
    if h.slug == "capture_layers":
        h, out, added = climb(m, h, base, base_out, rnd, tests, table)
        tests += 2 * added
    test = paired_test(base_out, out)
    finding = make_finding(h.slug, f"the weights fit {h.trained_for}, not {said(h.slug, base, h.wiring)}",
                           f"{h.name}: {numbers(base_out, out, test, tests)}", h.fix, base_out, out, "measured",
                           hypothesis=h.name, p_value=p_value(test), round=rnd)
    return finding, h.wiring


def search(m: Measurer, start: Wiring, conventions: dict[str, tuple[int, ...]], progress: bool
           ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Wiring]:
    """Rounds of `_round` from the wiring `start`, each adopting its finding's wiring.

    Returns the findings (one per round that found something), the table of every measurement and
    the final wiring: what the weights fit.
    """
    base, adopted, findings, table = start, set(), [], []
    for rnd in range(1, MAX_ROUNDS + 1):
        hyps = [h for h in hypotheses(base, m, conventions if rnd == 1 else {}) if h.slug not in adopted]
        if not hyps:
            break
        found = _round(m, base, hyps, rnd, table, progress)
        if found is None:
            break
        finding, base = found
        adopted.add(finding["fault"])
        findings.append(finding)
    return findings, table, base
