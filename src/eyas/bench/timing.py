"""The methods `eyas bench` times, and how: the same greedy answers produced five ways, on the same
prompts, prompt by prompt back to back (machine noise then hits every method alike):

    hf_greedy         Hugging Face `generate`, greedy: the baseline every speedup is relative to
    hf_prompt_lookup  Hugging Face prompt-lookup decoding (n-grams copied from the prompt, no draft)
    eyas_target       the target alone through eyas's own loop (decode.generate without a drafter):
                      separates the drafter's gain from the difference between the two loops
    eyas_chain        eyas with a chain of k draft tokens (plus the n-gram branch, eyas.decode.ngram)
    eyas_tree         eyas with an EAGLE-2 tree (depth, top_k, budget) (plus the n-gram branch)

Greedy outputs should be identical across methods; `summary` checks it (generated ids, cut at the
first stop token). Only trust that check in fp32: in bf16 the target's argmax is not stable across
batch shapes (a verify forward over 8 tokens rounds differently from 8 forwards over one), so
lossless methods can diverge from the baseline after a near-tie.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from eyas.data import pad_id
from eyas.decode import generate
from eyas.draft_shape import decode_shape
from eyas.drafter import Drafter
from eyas.intervals import ratio_intervals
from eyas.target import Target

METHODS = ("hf_greedy", "hf_prompt_lookup", "eyas_target", "eyas_chain", "eyas_tree")
PROMPT_LOOKUP_TOKENS = 10  # Hugging Face's `prompt_lookup_num_tokens`: candidate tokens per match
WARMUP_TOKENS = 8  # one short generation per method before timing (allocator, kernels, caches)


@dataclass
class Run:
    tokens: list[int]  # generated ids, cut after the first stop id
    seconds: float  # wall clock of the whole call, prefill included
    stats: dict | None  # decode's stats (eyas methods only)
    cpu_seconds: float | None = None  # CPU time of this process over the call (all its threads)


Runner = Callable[[list[int], int], tuple[list[int], dict | None]]


def _until_stop(tokens: list[int], stops: set[int]) -> list[int]:
    cut = next((i + 1 for i, x in enumerate(tokens) if x in stops), len(tokens))
    return tokens[:cut]


def hf_runner(target: Target, stops: list[int], lookup: int | None) -> Runner:
    """Hugging Face `generate`, greedy, batch 1; `lookup`: prompt-lookup decoding's candidate count."""
    from transformers import GenerationConfig

    pad = pad_id(target)

    def run(ids: list[int], max_new_tokens: int) -> tuple[list[int], None]:
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stops or None,
                                  pad_token_id=pad, prompt_lookup_num_tokens=lookup)
        x = torch.tensor([ids], device=target.model.device)
        out = target.model.generate(x, attention_mask=torch.ones_like(x), generation_config=config)
        return out[0, len(ids) :].tolist(), None

    return run


def eyas_runner(target: Target, drafter: Drafter | None, stops: list[int], shape: dict,
                ngram_tokens: int = 0) -> Runner:
    def run(ids: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        out, stats = generate(target, drafter, ids, max_new_tokens=max_new_tokens, stop_ids=stops,
                              **decode_shape(shape, ngram_tokens))
        return out[0, len(ids) :].tolist(), stats

    return run


def _timed(run: Runner, ids: list[int], max_new_tokens: int, stops: set[int]) -> Run:
    t0, c0 = time.perf_counter(), time.process_time()
    tokens, stats = run(ids, max_new_tokens)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return Run(_until_stop(tokens, stops), seconds, stats, cpu)


def depth_counts(stats: dict) -> tuple[list[int], list[int]]:
    """(accepted, tried) per draft depth for one decode call, to pool acceptance over prompts: the
    counts decode keeps (a ratio alone hides how often a depth was tried)."""
    return list(stats["accepted_by_depth"]), list(stats["tried_by_depth"])


def spread(values: list[float]) -> dict:
    """Median and quartiles (inclusive method: the extremes for two values) of per-prompt ratios."""
    if len(values) < 2:
        return {"median": values[0] if values else None, "q25": values[0] if values else None,
                "q75": values[0] if values else None}
    q25, median, q75 = statistics.quantiles(values, n=4, method="inclusive")
    return {"median": median, "q25": q25, "q75": q75}


def speedup_interval(runs: list[Run], reference: list[Run], *, cpu: bool = False) -> list[float | None]:
    """The 95% interval of the pooled speedup over `reference` (tokens/s over its tokens/s; `cpu`:
    tokens per CPU second), from prompts resampled for both alike (eyas.intervals); [None, None] under
    two prompts, or with `cpu` where a run has no CPU time."""
    def seconds(r: Run) -> float | None:
        return r.cpu_seconds if cpu else r.seconds

    if any(seconds(r) is None for r in runs + reference):
        return [None, None]

    def columns(rs: list[Run]) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.tensor([[float(len(r.tokens))] for r in rs], dtype=torch.float64),
                torch.tensor([[seconds(r)] for r in rs], dtype=torch.float64))

    bounds = ratio_intervals(*columns(runs), against=columns(reference), relative=True)[0].tolist()
    return [None if math.isnan(b) else b for b in bounds]


def _rate(run: Run) -> float:
    return len(run.tokens) / run.seconds if run.seconds > 0 else 0.0


def summary(runs: list[Run], reference: list[Run]) -> dict:
    """One method over some prompts: pooled speed, tau, acceptance, time split and greedy identity,
    and the spread of its per-prompt speed ratios to `reference` (run back to back with it, so a
    drift in machine load cancels out of each ratio; the quartiles show how far a pooled speedup
    can be trusted on a noisy machine)."""
    new = sum(len(r.tokens) for r in runs)
    seconds = sum(r.seconds for r in runs)
    ratios = [_rate(r) / _rate(ref) for r, ref in zip(runs, reference, strict=True) if _rate(ref) > 0]
    cpu = sum(r.cpu_seconds or 0.0 for r in runs)
    out = {
        "tokens_per_s": new / seconds if seconds > 0 else None,
        "new_tokens": new,
        "time_s": seconds,
        "per_prompt_speedup": spread(ratios),
        "speedup_ci95": speedup_interval(runs, reference),
        # with one torch thread on a shared machine, CPU time is what the method costs without the
        # other processes: tokens per CPU second, and its ratio to hf_greedy's (with_speedups)
        "cpu_tokens_per_s": new / cpu if cpu > 0 else None,
        "cpu_speedup_ci95": speedup_interval(runs, reference, cpu=True),
        "tau": None,
        "acceptance_by_depth": None,
        "time_split": None,
        "greedy_identical": all(r.tokens == ref.tokens for r, ref in zip(runs, reference, strict=True)),
        "identical_prompts": sum(r.tokens == ref.tokens for r, ref in zip(runs, reference, strict=True)),
    }
    stats = [r.stats for r in runs if r.stats is not None]
    if stats:
        counts = [sum(c) for c in zip(*(s["accept_counts"] for s in stats))]
        rounds = sum(counts)
        out["tau"] = sum((a + 1) * c for a, c in enumerate(counts)) / rounds if rounds else None
        pairs = [depth_counts(s) for s in stats]
        accepted = [sum(a) for a in zip(*(p[0] for p in pairs))]
        tried = [sum(t) for t in zip(*(p[1] for p in pairs))]
        out["acceptance_by_depth"] = [a / t if t else None for a, t in zip(accepted, tried)]
        out["ngram_accepted"] = sum(s.get("ngram_accepted", 0) for s in stats)
        split = {k: sum(s[f"time_{k}_s"] for s in stats) for k in ("prefill", "draft", "verify")}
        split["other"] = seconds - sum(split.values())  # decode's own bookkeeping and the call around it
        out["time_split"] = {k: v / seconds for k, v in split.items()} if seconds > 0 else None
        # the cost terms of the speedup (eyas.decode.cost): a round's verify forward and its drafting
        out["ms_per_round"] = {k: 1000 * split[k] / rounds for k in ("draft", "verify")} if rounds else None
    return out


def speedup_terms(methods: dict[str, dict]) -> dict[str, dict]:
    """speedup over eyas_target = tau x T(1) / (T_verify + d x T_draft), per drafting method, from
    the bench's own measurements: T(1) is eyas_target's verify per round (one token), T_verify and
    d x T_draft the method's verify and drafting per round. `predicted` leaves out prefill and the
    loop's other work; `measured` is the tokens/s ratio."""
    base = methods["eyas_target"]
    if not base["ms_per_round"] or not base["tokens_per_s"]:
        return {}
    t1 = base["ms_per_round"]["verify"]
    terms = {}
    for name in ("eyas_chain", "eyas_tree"):
        m = methods[name]
        if m["ms_per_round"] and m["tau"] and m["tokens_per_s"]:
            cost = m["ms_per_round"]["verify"] + m["ms_per_round"]["draft"]
            terms[name] = {"tau": m["tau"], "T1_ms": t1, "T_verify_ms": m["ms_per_round"]["verify"],
                           "draft_ms": m["ms_per_round"]["draft"], "predicted": m["tau"] * t1 / cost,
                           "measured": m["tokens_per_s"] / base["tokens_per_s"]}
    return terms


def with_speedups(methods: dict[str, dict]) -> dict[str, dict]:
    """Each method's pooled tokens/s (wall and CPU) as a ratio to hf_greedy's."""
    for key, rate in (("speedup", "tokens_per_s"), ("cpu_speedup", "cpu_tokens_per_s")):
        base = methods["hf_greedy"][rate]
        for m in methods.values():
            m[key] = m[rate] / base if base and m[rate] is not None else None
    return methods


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, disable=not enabled)


def time_interleaved(
    runners: dict[Hashable, Runner], prompt_ids: list[list[int]], max_new_tokens: int, stops: set[int],
    desc: str, progress: bool, seconds: float | None = None,
) -> dict[Hashable, list[Run]]:
    """Every runner on every prompt, timed: each warmed up once, then prompt by prompt, all runners
    back to back (a slow drift in machine load then hits them alike). With `seconds`, no prompt is
    started once that many have passed (the warm-up counted): every runner is timed on the same first
    prompts, one at least."""
    t0 = time.perf_counter()
    for run in runners.values():
        run(prompt_ids[0], min(WARMUP_TOKENS, max_new_tokens))
    runs: dict[Hashable, list[Run]] = {name: [] for name in runners}
    bar = _progress(len(prompt_ids) * len(runners), desc, progress)
    for i, ids in enumerate(prompt_ids):
        if i and seconds is not None and time.perf_counter() - t0 >= seconds:
            break
        for name, run in runners.items():
            runs[name].append(_timed(run, ids, max_new_tokens, stops))
            bar.update()
    bar.close()
    return runs
