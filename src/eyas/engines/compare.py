"""Served against predicted: is the difference noise, and did the engine wire the draft as its contract says?

Acceptance (`acceptance_agreement`): per draft position i, a two-proportion z-test of the served
rate (accepted at i / drafts) against eyas's, pooled variance, Bonferroni over the k positions at
ALPHA overall. It calls a difference real only when binomial noise on that many drafts could not
produce it for two unrelated runs. Two things bend that reading, in opposite directions. Served and
predicted come from the SAME token sequences and, wired alike, draft the same tokens, so their
difference varies far less than two unrelated runs would: conservative. Drafts of one prompt are not
independent (a draft that stumbles on code stumbles on all of a code answer), so binomial noise
understates how much two unrelated runs on other prompts would differ: anti-conservative. The
first dominates here: wired alike in fp32, vLLM and eyas drafted the same tokens at all 409 chain
starts of 10 MT-bench prompts x 64 (the shipped draft), so served and predicted were equal prompt by
prompt.

The effect size (`paired_difference`) accounts for both: served minus predicted, per position and
in mean acceptance length, with a 95% interval over resampled prompts, each prompt's served and
predicted counts drawn together (eyas.intervals; too narrow under FEW prompts). It needs the
engine's counters per request.

Sampled serving (`sampled_agreement`, `samples_test`): the served count at each position against
its expectation on the engine's own draft steps, and the engine's tokens against the target's
distribution at the temperature (their surprisal against its entropy). A faithful speculative
sampler passes the second whatever its draft; one that is not lossless fails it.

Wiring (`wiring_report`) does not depend on acceptance: what the live engine built (the layers its
target captures, the draft's norm flags, its vocab map, whose embeddings it reads) and what it fed the
draft (the dump, matched against eyas's capture of the same tokens) are compared with the contract.
A cheap draft hides a wrong wiring in the noise (one layer early moved the shipped draft's served
mean acceptance length by -0.015 on 10 MT-bench prompts x 64, interval -0.064 to +0.029), so any
difference here is a disagreement on its own.

Drafts (`drafts_agreement`): the engine's own draft tokens against eyas's at the same chain starts.
The same prefixes, the same weights, fp32 on both sides: a draft computed alike drafts the same
first token everywhere (409 of 409 above), and one computed otherwise (an attention window one
position wider, here) at 80% of 161 while acceptance stayed within noise (1.210 served, 1.218
predicted). Below DRAFTS_SAME, over at least MIN_DRAFTS chain starts, they disagree.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import torch
from torch import Tensor

from eyas.contract import DraftContract
from eyas.engines.predict import RARE, SampledPrediction
from eyas.intervals import paired_differences

ALPHA = 0.01  # family-wise, over the k positions
DRAFTS_SAME = 0.95  # first draft tokens the engine and eyas must share (fp32 both: all, but for a near tie)
MIN_DRAFTS = 20  # chain starts compared before the share decides
DUMP_REL_ERROR = 0.01  # an fp32 engine feeding the contract's states matches eyas's capture to ~1e-6


def rates(counts: list[int], drafts: int) -> dict[str, Any]:
    """The engine's definition: mean acceptance length 1 + accepted / drafts; rate i = accepted at i / drafts."""
    if not drafts:
        return {"mean_acceptance_length": None, "acceptance_by_position": [], "drafts": 0,
                "accepted_by_position": list(counts)}
    return {"mean_acceptance_length": 1 + sum(counts) / drafts,
            "acceptance_by_position": [c / drafts for c in counts],
            "drafts": drafts, "accepted_by_position": list(counts)}


def drafts_agreement(compared: dict[str, Any] | None) -> bool:
    """The engine drafted eyas's first token at DRAFTS_SAME of the chain starts compared, or too few
    (or none: the engine recorded no drafts) were compared to say."""
    return compared is None or compared["drafts"] < MIN_DRAFTS or compared["first_token_same"] >= DRAFTS_SAME


def acceptance_agreement(served: dict[str, Any], predicted: dict[str, Any], alpha: float = ALPHA
                         ) -> tuple[bool, list[dict[str, Any]]]:
    """(agree, per-position tests): see the module docstring."""
    n1, n2 = served["drafts"], predicted["drafts"]
    c1, c2 = served["accepted_by_position"], predicted["accepted_by_position"]
    k = min(len(c1), len(c2))
    crit = NormalDist().inv_cdf(1 - alpha / (2 * max(k, 1)))
    tests = []
    for i in range(k):
        p1, p2, pooled = c1[i] / n1, c2[i] / n2, (c1[i] + c2[i]) / (n1 + n2)
        se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
        z = (p1 - p2) / se if se else (0.0 if p1 == p2 else math.inf)
        tests.append({"position": i + 1, "served": p1, "predicted": p2, "z": z, "within_noise": abs(z) <= crit})
    return all(t["within_noise"] for t in tests), tests


def count_tail(chances: list[float], count: int) -> float:
    """Two-sided p of `count` successes among independent trials with these chances: 2 x the smaller
    tail of the exact distribution (Poisson-binomial, by convolution), at most 1."""
    dist = torch.ones(1, dtype=torch.float64)
    for q in chances:
        dist = torch.cat([dist * (1 - q), dist.new_zeros(1)]) + torch.cat([dist.new_zeros(1), dist * q])
    if not 0 <= count < dist.numel():
        return 0.0
    return min(1.0, 2 * min(float(dist[: count + 1].sum()), float(dist[count:].sum())))


def sampled_agreement(served: dict[str, Any], chances: list[list[float]], alpha: float = ALPHA
                      ) -> tuple[bool, list[dict[str, Any]]]:
    """(agree, per-position tests) for an engine that samples: the served count at position i against
    its chances on the engine's own steps (`chances[i]`: each step's chance of accepting that far,
    eyas.engines.predict.predict_sampled). Each step accepts with its chance given what came before,
    so the count is distributed as a sum of independent trials with those chances: decided by its
    exact two-sided tail (`p`, Bonferroni over k), with z = (count - expected) / sqrt(sum q(1 - q))
    reported beside it (the normal approximation overstates the upper tail where few are expected)."""
    n, c = served["drafts"], served["accepted_by_position"]
    k = min(len(c), len(chances))
    tests = []
    for i in range(k):
        expected, variance = sum(chances[i]), sum(q * (1 - q) for q in chances[i])
        gap = c[i] - expected
        z = gap / math.sqrt(variance) if variance else (0.0 if abs(gap) < 1e-9 else math.copysign(math.inf, gap))
        p = count_tail(chances[i], c[i])
        tests.append({"position": i + 1, "served": c[i] / n, "predicted": expected / n, "z": z, "p": p,
                      "within_noise": p > alpha / max(k, 1)})
    return all(t["within_noise"] for t in tests), tests


def samples_test(fit: SampledPrediction, vocab: int, alpha: float = ALPHA) -> dict[str, Any]:
    """Are the engine's output tokens samples of the target's distribution at its temperature? (`fit`:
    eyas.engines.predict.output_fit on them.)

    Under faithful sampling each token's surprisal -log p(x) has the target's entropy at that position
    as its mean, given the past, so (sum of surprisals - sum of entropies) / sqrt(sum of variances) is
    close to normal: `faithful` when |z| is within the two-sided ALPHA level. `rare_tokens`: tokens the
    target gives under RARE; a faithful sampler draws each with chance at most vocab x RARE, so
    `rare_bound` is the most it would draw on average."""
    n = fit.tokens
    z = (fit.surprisal - fit.entropy) / math.sqrt(fit.surprisal_var) if fit.surprisal_var > 0 else 0.0
    return {"tokens": n, "mean_surprisal": fit.surprisal / n if n else None,
            "mean_entropy": fit.entropy / n if n else None, "z": z,
            "faithful": abs(z) <= NormalDist().inv_cdf(1 - alpha / 2),
            "rare_tokens": fit.rare, "rare_below": RARE, "rare_bound": n * vocab * RARE}


def paired_difference(served: list[tuple[int, list[int]]], predicted: list[tuple[int, list[float]]], k: int
                      ) -> dict[str, Any] | None:
    """Served minus predicted on the same prompts, from each prompt's (drafts, accepted by position):
    {"samples", "mean_acceptance_length": {"difference", "ci95"}, "acceptance_by_position": [...],
    "per_prompt": {"served": [mean acceptance length per prompt], "predicted": [...]}}.
    None without at least one prompt each side drafted on."""
    if len(served) != len(predicted) or not any(d for d, _ in served) or not any(d for d, _ in predicted):
        return None

    def columns(per: list[tuple[int, list[float]]]) -> tuple[Tensor, Tensor]:
        acc = torch.tensor([(c + [0] * k)[:k] for _, c in per], dtype=torch.float64)  # [S, k]
        drafts = torch.tensor([[float(d)] for d, _ in per], dtype=torch.float64)
        return torch.cat([acc.sum(1, keepdim=True), acc], 1), drafts.expand(-1, k + 1)

    def lengths(per: list[tuple[int, list[float]]]) -> list[float | None]:
        return [1 + sum(c) / d if d else None for d, c in per]

    diffs = paired_differences(*columns(served), *columns(predicted))  # 1 + a minus 1 + b is a - b
    return {"samples": len(served), "mean_acceptance_length": diffs[0], "acceptance_by_position": diffs[1:],
            "per_prompt": {"served": lengths(served), "predicted": lengths(predicted)}}


def _vocab_map(engine_d2t: list[int] | None, c: DraftContract, d2t: Tensor | None) -> tuple[str, str]:
    """(what the engine maps draft ids with, what the contract says)."""
    want = ("the checkpoint's d2t" if c.has_vocab_map else "no d2t: draft ids have no target ids") \
        if c.reduced_vocab else "full vocabulary (draft id = target id)"
    if engine_d2t is None:
        return "full vocabulary (draft id = target id)", want
    got = torch.tensor(engine_d2t)
    if d2t is not None and got.shape == d2t.shape and torch.equal(got, d2t.long()):
        return "the checkpoint's d2t", want
    if not got.any():
        return "draft id i = target id i (d2t all zeros: none was loaded)", want
    return "a d2t that differs from the checkpoint's", want


def _embeddings(engine: dict[str, Any]) -> str:
    """Whose embeddings the engine's draft reads. vLLM shares the target's table with a draft that ships
    its own only when the two are equal (`torch.equal`), so the draft still reads its own values."""
    if engine.get("has_own_embed_tokens"):
        return "draft's own"
    return "target's" if engine.get("embeddings_shared") else "none"


def wiring_report(engine: dict[str, Any], c: DraftContract, d2t: Tensor | None, layers: list[int],
                  dump: dict[str, Any] | None) -> dict[str, Any]:
    """The engine's wiring (its model objects, and the dump) against the contract.

    `engine`: the worker's `wiring`; `d2t`: the checkpoint's tensor (None without); `layers`: the
    contract's capture layers (the engines' default when it names none); `dump`: the result of
    `dump_check`, or None when no dump was taken. Returns {"agree", "engine", "contract",
    "differences": [text, ...], "dump"}. The concatenation order is a difference only between the
    same layers (vLLM appends states in layer order, whatever order the ids are listed in).
    """
    contract = {"capture_layers": layers, "features": "raw residual stream",
                "positions": "features[t] with token x_{t+1}", "norm_before_residual": c.norm_before_residual,
                "norm_before_fc": c.norm_before_fc, "fc_norm": c.fc_norm, "norm_output": c.norm_output,
                "embeddings": "draft's own" if c.has_embeddings else "target's"}
    got_map, contract["vocab_map"] = _vocab_map(engine.get("d2t"), c, d2t)
    got = engine.get("aux_layers")
    if got is not None and sorted(got) == sorted(layers):
        got = sorted(got)  # the order it concatenates them in
    mine = {"capture_layers": got, "norm_before_residual": engine.get("norm_before_residual"),
            "norm_before_fc": engine.get("norm_before_fc"),
            "fc_norm": engine.get("fc_norm"), "norm_output": engine.get("norm_output"), "vocab_map": got_map,
            "embeddings": _embeddings(engine)}
    if dump is not None and dump["matches"]:
        mine.update(features=contract["features"], positions=contract["positions"])
    diffs = [f"{key}: the engine uses {mine[key]}, the contract says {contract[key]}"
             for key in mine if key in contract and mine[key] != contract[key]]
    if dump is not None and not dump["matches"]:
        diffs.append(f"the engine fed the draft other states than the contract's: {dump['text']}")
    return {"agree": not diffs, "engine": mine, "contract": contract, "differences": diffs, "dump": dump}


@torch.inference_mode()
def dump_check(dump_ids: Tensor, dump_feats: Tensor, target, layers: list[int]) -> dict[str, Any]:
    """Do the engine's features equal eyas's capture of the same tokens at the contract's layers, chunk
    by chunk, at the same positions? (The doctor's dump analysis says what they are when they do not.)"""
    T, H = dump_feats.shape[0], target.hidden_size
    if dump_feats.shape[1] != len(layers) * H:
        return {"matches": False, "text": f"{dump_feats.shape[1]} wide, the contract reads {len(layers)} x {H}",
                "chunks": [], "positions": T}
    mine = target.forward(dump_ids[None].to(target.model.device), layers,
                          with_logits=False).features[0].float().cpu()  # [T, A*H]
    chunks = []
    for i, k in enumerate(layers):
        a, b = dump_feats[:, i * H:(i + 1) * H], mine[:, i * H:(i + 1) * H]
        rel = float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-12)).median())
        chunks.append({"chunk": i, "contract_layer": k, "rel_error": rel})
    text = "; ".join(f"chunk {ch['chunk']} vs layer {ch['contract_layer']}: relative error {ch['rel_error']:.3g}"
                     for ch in chunks)
    return {"matches": all(ch["rel_error"] <= DUMP_REL_ERROR for ch in chunks), "text": text, "chunks": chunks,
            "positions": T}
