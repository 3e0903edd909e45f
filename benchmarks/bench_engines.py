"""Peers in one run, on the same prompts: vLLM (plain greedy, the eyas draft at several k, n-gram
speculation) and eyas's own decoder (target alone, chain, tree), each as tokens/s and as a speedup
over ITS OWN engine's plain greedy (vLLM plain for vLLM's rows, eyas's target-only loop for eyas's).

    .venv/bin/python benchmarks/bench_engines.py [--limit 6] [--max-new-tokens 64] [--ks 1,3,5]

Needs the engine (bash scripts/install-engines.sh). fp32 everywhere (vLLM runs fp32 here; the
2-core EPYC it was first run on has no bf16 dot products), greedy, batch 1, chat-templated MT-bench
prompts. vLLM runs in one worker process, one engine per configuration, each warmed up on one short
request before timing; its tokens/s is generated tokens over the wall time of generate (prefill
included), prompt by prompt. eyas's rows come from `eyas.bench.run_bench` (its own warm-up and
interleaved timing).
"""

from __future__ import annotations

import argparse
import sys

import torch

from eyas.bench import git_commit, run_bench
from eyas.drafter_loading import resolve_drafter
from eyas.engines import run_vllm
from eyas.engines.serve_check import engine_job, prompt_ids, timeout_for, vllm_spec
from eyas.machine import cpu_class
from eyas.target import Target, resolve_target
import flags

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def bench_engines(limit: int = 6, max_new_tokens: int = 64, ks: tuple[int, ...] = (1, 3, 5)) -> dict:
    draft = resolve_drafter(None).resolve()
    mine = run_bench(draft, prompts="mtbench", dtype="fp32", max_new_tokens=max_new_tokens, limit=limit)
    own = mine["methods"]["eyas_target"]["tokens_per_s"]
    rows: dict[str, dict] = {}
    for m in ("eyas_target", "eyas_chain", "eyas_tree"):
        x = mine["methods"][m]
        rows[m] = {"tokens_per_s": x["tokens_per_s"], "speedup": x["tokens_per_s"] / own, "tau": x.get("tau")}
    tgt = Target.load(resolve_target(None), dtype=torch.float32)
    ids = prompt_ids(tgt, "mtbench", limit, max_new_tokens)
    runs = [{"name": "vllm_greedy", "speculative_config": None},
            *({"name": f"vllm_eagle3_k{k}", "speculative_config": vllm_spec(draft, k)} for k in ks),
            {"name": "vllm_ngram", "speculative_config": NGRAM}]
    job = {**engine_job(tgt, ids, runs, max_new_tokens), "warmup": True}
    result = run_vllm(job, timeout=timeout_for(len(runs), len(ids), max_new_tokens))
    for r in result["runs"]:
        if not r["loaded"] or r["error"]:
            rows[r["name"]] = {"error": r["error"]}
            continue
        tokens = sum(len(o) for o in r["outputs"])
        c = r["counters"]
        rows[r["name"]] = {"tokens_per_s": tokens / r["seconds_generate"], "tokens": tokens,
                           "mean_acceptance_length": 1 + c["num_accepted_tokens"] / c["num_drafts"] if c["num_drafts"]
                           else None, "identical_to_greedy": r["outputs"] == result["runs"][0]["outputs"]}
    base = rows["vllm_greedy"]["tokens_per_s"]
    for name, row in rows.items():
        if name.startswith("vllm") and "tokens_per_s" in row:
            row["speedup"] = row["tokens_per_s"] / base
    eagle = {n: r for n, r in rows.items() if n.startswith("vllm_eagle3") and "speedup" in r}
    best = max(eagle, key=lambda n: eagle[n]["speedup"]) if eagle else None
    return {"vllm": result["version"], "prompts": len(ids), "max_new_tokens": max_new_tokens, "best_eagle3": best,
            "shapes": mine.get("shapes"), "rows": rows, "torch": torch.__version__,
            "cpu_class": cpu_class(), "threads": torch.get_num_threads(), "commit": git_commit()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=flags.count, default=6)
    ap.add_argument("--max-new-tokens", type=flags.count, default=64)
    ap.add_argument("--ks", type=flags.counts, default="1,3,5",
                    help="draft lengths tried for vLLM's EAGLE-3 (best reported)")
    flags.add_threads(ap)
    a = ap.parse_args()
    flags.use_threads(a.threads)
    rep = bench_engines(a.limit, a.max_new_tokens, tuple(a.ks))
    print(f"CPU {rep['cpu_class']}, {rep['threads']} threads (eyas's side; vLLM runs its own)", file=sys.stderr)
    print(f"{'method':<18} {'tokens/s':>9} {'speedup':>8}  notes", file=sys.stderr)
    for name, r in sorted(rep["rows"].items(), key=lambda kv: not kv[0].startswith("vllm")):
        if "tokens_per_s" not in r:
            print(f"{name:<18} failed: {r['error']}", file=sys.stderr)
            continue
        note = (f"mean acceptance length {r['mean_acceptance_length']:.2f}" if r.get("mean_acceptance_length")
                else f"tau {r['tau']:.2f}" if r.get("tau") else "")
        best = "  <- best k" if name == rep["best_eagle3"] else ""
        print(f"{name:<18} {r['tokens_per_s']:9.2f} {r['speedup']:8.2f}  {note}{best}", file=sys.stderr)
    flags.emit(rep)


if __name__ == "__main__":
    sys.exit(flags.run(main))
