"""How a finding is recorded and worded: the fault's slug, a title, the evidence, the fix, the numbers.

Every finding, whatever found it (a measurement, a config file, a serving engine, an engine dump,
`eyas check`), is the same JSON-ready dict, so the report can rank them all by the gain they promise.
"""

from __future__ import annotations

from typing import Any

from eyas.doctor.stats import ALPHA, Outcome, rounded
from eyas.doctor.wiring import Wiring
from eyas.formats import NORM_FLAGS

SLUGS = ("capture_layers", "concat_order", "normalized_features", "fc_skipped", "embeddings", "vocab_map",
         "rope", "norm_flags", "config_file", "position_shift", "unmatched_features")


def make_finding(slug: str, title: str, evidence: str, fix: str, before: Outcome | None, after: Outcome | None,
                 source: str, *, codes: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """One finding; `before`/`after` are the outcomes without and with the fix (None: not measured),
    `codes` the eyas.codes of the `eyas check` findings it includes."""
    assert slug in SLUGS, slug
    return {"fault": slug, "title": title, "evidence": evidence, "fix": fix, "codes": list(codes),
            "acceptance_before": None if before is None else rounded(before.depth1),
            "acceptance_after": None if after is None else rounded(after.depth1),
            "tau_before": None if before is None else rounded(before.tau),
            "tau_after": None if after is None else rounded(after.tau),
            "logprob_before": None if before is None else rounded(before.mean_logprob),
            "logprob_after": None if after is None else rounded(after.mean_logprob),
            "kl_before": None if before is None else rounded(before.mean_kl),
            "kl_after": None if after is None else rounded(after.mean_kl), "source": source, **extra}


def numbers(before: Outcome, after: Outcome, test: dict[str, Any], tests: int) -> str:
    """The evidence of a measured finding: both outcomes and the paired tests, in one sentence."""
    b, c = test["depth1_wins_losses"]
    w, l = test["chain_wins_losses"]
    (k, n), (j, _) = test["samples_favouring"], test["samples_favouring_kl"]
    kl = f"p = {test['p_kl']:.1e}" if test["kl_compared"] else "over another draft vocabulary: not compared"
    return (f"log-probability of the target's token {before.mean_logprob:.3f} -> {after.mean_logprob:.3f} nats "
            f"(signed-rank p = {test['p_logprob']:.1e}), divergence from the target {before.mean_kl:.3f} -> "
            f"{after.mean_kl:.3f} nats ({kl}) over {test['positions']} positions, {tests} "
            f"test{'s' * (tests != 1)} in the round, Bonferroni at {ALPHA}; depth-1 acceptance {before.depth1:.3f} -> "
            f"{after.depth1:.3f} (exact McNemar p = {test['p_depth1']:.1e}, {b} positions gained, {c} lost), tau(5) "
            f"{before.tau:.2f} -> {after.tau:.2f} (chain-length sign test p = {test['p_chain']:.1e}, {w}/{l}); "
            f"log-probability higher on {k} of {n} answers (sign test p = {test['p_samples']:.2g}), divergence lower "
            f"on {j} (p = {test['p_samples_kl']:.2g})")


def differs(a: Wiring, b: Wiring) -> str:
    """The slug of the first way two wirings differ (the fault that separates them)."""
    if a.layers != b.layers:
        return "concat_order" if sorted(a.layers) == sorted(b.layers) else "capture_layers"
    for field, slug in (("normed", "normalized_features"), ("shift", "position_shift"), ("embeddings", "embeddings"),
                        ("vocab", "vocab_map"), ("rope_theta", "rope"), ("rope_scaled", "rope")):
        if getattr(a, field) != getattr(b, field):
            return slug
    return "norm_flags"


def said(slug: str, base: Wiring, new: Wiring) -> str:
    """What the wiring `base` says, in the words of the fault that separates it from `new`."""
    if slug in ("capture_layers", "concat_order", "config_file"):
        return f"capture layers {list(base.layers)}"
    if slug == "norm_flags":
        return ", ".join(f"{f} = {str(getattr(base, f)).lower()}" for f in NORM_FLAGS
                         if getattr(base, f) != getattr(new, f))
    return {"normalized_features": "raw features",
            "embeddings": "its own embeddings" if base.embeddings == "own" else "the target's embeddings",
            "vocab_map": f"the {base.vocab} vocab map", "rope": base.rope(),
            "position_shift": "features of the same position"}[slug]
