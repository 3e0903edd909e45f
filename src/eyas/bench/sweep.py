"""`eyas bench --sweep`: time every chain length and tree shape, and find the fastest.

The winner is recorded in the shape cache (eyas.draft_shape) for this target, drafter, dtype and
machine; `eyas generate` and later benches use it when no shape is given. The target alone runs in
the same sweep: where no shape beats it, `eyas generate` decodes without the draft instead of
being slower than plain decoding.

When no shape is cached, `eyas generate` and `eyas bench` run `quick_sweep` first: fewer shapes on a
few short MT-bench answers (one to three minutes on a 2-core CPU: 109 s in bf16 and 183 s in fp32 on
an AMX Xeon; said on stderr with what it cost, under a progress bar unless `--no-progress`), once per target,
drafter, dtype and machine. It starts no question once QUICK_SECONDS have passed, so a slow target (a
large one on a CPU, one transformers' forward runs, a machine busy elsewhere) is timed on fewer questions
rather than for ten minutes; the report and stderr say on how many. A quick sweep timed while other
processes took much of the CPU is provisional (eyas.machine.Contention): it is used, and made again at the
next runs until one is made on a quiet machine or the attempts run out; the quietest stands.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from eyas.bench.timing import eyas_runner, summary, time_interleaved
from eyas.draft_shape import save_best_shape, shape_label
from eyas.drafter import Drafter
from eyas.dtypes import short_name
from eyas.machine import Contention, quietest, runs_on, say_if_busy
from eyas.target import Target

SWEEP_CHAINS = tuple(range(1, 9))
# short chains also timed with shorter n-gram branches (0: none, else the longest the branch may
# grow to, eyas.decode.ngram.BranchLength): the branch's tokens ride along in every verify, about free
# where a verify over a few more tokens costs one step (bf16 dot products); on AVX2-only CPUs each
# token costs (benchmarks/README.md)
SWEEP_PLAIN_CHAINS = (1, 2, 3, 4)
NGRAM_VARIANTS = (0, 2, 4)
SWEEP_TREES = ((3, 4, 8), (4, 4, 12), (5, 4, 16), (5, 8, 32), (6, 8, 48))
# the sweep run when nothing is cached: these shapes and the target alone, QUICK_PROMPTS MT-bench
# questions (spread over categories) x QUICK_TOKENS answer tokens
QUICK_CHAINS = (1, 2, 3, 4, 6)
QUICK_PLAIN_CHAINS = (1, 2)
QUICK_TREES = ((3, 4, 8), (4, 4, 12), (5, 4, 16))
QUICK_PROMPTS, QUICK_TOKENS = 4, 96  # answers long enough for an n-gram branch to find repeats
QUICK_SECONDS = 240  # no question started past this (SmolLM2's whole quick sweep: 109-183 s, 2-core AMX Xeon)


def save_sweep(target: Target, drafter: str | Path, dtype: torch.dtype, report: dict, *, prompts: int,
               max_new_tokens: int) -> str | None:
    """Cache a sweep's result for this target / drafter / dtype / machine (eyas.draft_shape): the cache file,
    None where it cannot be written (the report's `cache`)."""
    entry = {**report, "target": target.name, "drafter": str(Path(drafter).resolve()), "dtype": short_name(dtype),
             "prompts": prompts, "max_new_tokens": max_new_tokens, "torch": torch.__version__,
             "measured": report.get("measured") or datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    path = save_best_shape(target.name, drafter, dtype, entry)
    return None if path is None else str(path)


def quick_sweep(target: Target, draft: Drafter, drafter: str | Path, dtype: torch.dtype, prompt_ids: list[list[int]],
                stops: list[int], *, ngram_tokens: int, previous: dict | None = None, progress: bool = False) -> dict:
    """The sweep run when no settled shape is cached (`previous`: a provisional one): QUICK_CHAINS,
    QUICK_TREES and the target alone on `prompt_ids` (QUICK_PROMPTS MT-bench questions, chat template
    applied) x QUICK_TOKENS tokens. Says on stderr what it does and what it cost (with a progress bar
    where `progress`); caches and returns the quietest sweep's report."""
    shapes = len(QUICK_CHAINS) + len(_ngram_variants(QUICK_PLAIN_CHAINS, ngram_tokens)) + len(QUICK_TREES)
    why = "timed under load before" if previous is not None else "measured"
    print(f"eyas: no draft shape {why} for this target, draft, {short_name(dtype)} and machine: timing "
          f"{shapes} shapes and the target alone on {len(prompt_ids)} MT-bench questions x {QUICK_TOKENS} tokens "
          f"(once; minutes on a small CPU, no question started past {QUICK_SECONDS} s)", file=sys.stderr)
    t0 = time.perf_counter()
    report = sweep_shapes(target, draft, prompt_ids, stops, max_new_tokens=QUICK_TOKENS, ngram_tokens=ngram_tokens,
                          chains=QUICK_CHAINS, plain_chains=QUICK_PLAIN_CHAINS, trees=QUICK_TREES, progress=progress,
                          seconds=QUICK_SECONDS)
    report = quietest(report, previous)
    report["cache"] = save_sweep(target, drafter, dtype, report, prompts=report["prompts"], max_new_tokens=QUICK_TOKENS)
    report["seconds"] = time.perf_counter() - t0
    cut = (f" on {report['prompts']} of {len(prompt_ids)} questions (the {QUICK_SECONDS} s bound)"
           if report["prompts"] < len(prompt_ids) else "")
    verdict = (f"fastest {shape_label(report['best'])} at {report['best_tokens_per_s']:.1f} tok/s"
               if report["beats_target"] else
               f"no shape beat the target alone (best {shape_label(report['best'])} "
               f"{report['best_tokens_per_s']:.1f} tok/s): the draft is off")
    print(f"eyas: {verdict}, target alone {report['target_tokens_per_s']:.1f} tok/s on {runs_on(target.device)}; took "
          f"{report['seconds']:.0f} s{cut}, cached in {report['cache']} (measured again by `eyas bench --sweep`)",
          file=sys.stderr)
    say_if_busy(report)
    return report


def _ngram_variants(chains: Sequence[int], ngram_tokens: int) -> list[dict]:
    """The `chains` with each n-gram branch of NGRAM_VARIANTS shorter than the default `ngram_tokens`."""
    return [{"draft_tokens": k, "ngram_tokens": n} for k in chains for n in NGRAM_VARIANTS if n < ngram_tokens]


def sweep_shapes(
    target: Target,
    drafter: Drafter,
    prompt_ids: list[list[int]],
    stops: list[int],
    *,
    max_new_tokens: int,
    ngram_tokens: int = 0,
    chains: Sequence[int] = SWEEP_CHAINS,
    plain_chains: Sequence[int] = SWEEP_PLAIN_CHAINS,
    trees: Sequence[tuple[int, int, int]] = SWEEP_TREES,
    progress: bool = True,
    seconds: float | None = None,
) -> dict:
    """Time every chain length and tree shape on the prompts (greedy, each round's tree with an
    n-gram branch of `ngram_tokens`; the `plain_chains` also with each shorter NGRAM_VARIANTS branch:
    such a shape carries its "ngram_tokens", 0 for none), and the target alone; the fastest shape wins.

    Shapes are interleaved prompt by prompt, so slow drifts in machine load hit them alike. Returns
    `results` (shape, tokens_per_s, tau per shape), `best` (the fastest shape of all), `best_chain`
    (k of the fastest chain; `best_chain_ngram`, the n-gram branch it was timed with), `best_tree`,
    `target_tokens_per_s` (the target alone, plain decoding), `beats_target` (whether `best` beat it: where it
    did not, `eyas generate` decodes without the draft),
    `others_cpu_share`: how much of the CPU other processes took meanwhile (eyas.machine.Contention), and
    `prompts`: how many were timed (with `seconds`, none is started past that many: `time_interleaved`).
    """
    shapes = ([{"draft_tokens": k} for k in chains] + _ngram_variants(plain_chains, ngram_tokens)
              + [{"tree": list(t)} for t in trees])
    runners = {i: eyas_runner(target, drafter, stops, s, ngram_tokens) for i, s in enumerate(shapes)}
    runners["target"] = eyas_runner(target, None, stops, {})
    others = Contention()
    runs = time_interleaved(runners, prompt_ids, max_new_tokens, set(stops), "sweep", progress, seconds)
    results = []
    for i, shape in enumerate(shapes):
        s = summary(runs[i], runs[i])
        results.append({"shape": shape, "tokens_per_s": s["tokens_per_s"], "tau": s["tau"]})

    def fastest(kind: str | None = None) -> dict:
        return max((r for r in results if kind is None or kind in r["shape"]), key=lambda r: r["tokens_per_s"] or 0.0)

    alone = summary(runs["target"], runs["target"])["tokens_per_s"] or 0.0
    return {
        "best": fastest()["shape"],
        "best_tokens_per_s": fastest()["tokens_per_s"],
        "target_tokens_per_s": alone,
        "beats_target": (fastest()["tokens_per_s"] or 0.0) > alone,
        "ngram_tokens": ngram_tokens,
        "best_chain": fastest("draft_tokens")["shape"]["draft_tokens"],
        "best_chain_ngram": fastest("draft_tokens")["shape"].get("ngram_tokens", ngram_tokens),
        "best_tree": fastest("tree")["shape"]["tree"],
        "results": results,
        "others_cpu_share": others.others(),
        "prompts": len(runs["target"]),
    }
