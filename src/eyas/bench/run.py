"""`eyas bench`: the five methods of eyas.bench.timing on the same prompts, one JSON report."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

import torch

from eyas.bench.prompts import bench_prompts
from eyas.bench.report import environment, plot_bench
from eyas.bench.sweep import sweep_shapes
from eyas.bench.timing import (
    METHODS,
    PROMPT_LOOKUP_TOKENS,
    Run,
    eyas_runner,
    hf_runner,
    speedup_terms,
    summary,
    time_interleaved,
    with_speedups,
)
from eyas.data import eos_ids
from eyas.decode import DEFAULT_DRAFT_TOKENS
from eyas.draft_shape import parse_tree, read_best_shape, save_best_shape
from eyas.dtype_choice import AUTO, DECODE_DTYPES, resolve_dtype
from eyas.dtypes import short_name, to_dtype
from eyas.errors import EyasError
from eyas.generate import NGRAM_TOKENS, chat_ids, choose_shape, load_models

DEFAULT_TREE = (5, 4, 16)  # 16 draft nodes: the tree when neither --tree nor a sweep gives one


def run_bench(
    drafter: str | Path,
    *,
    prompts: str | Path = "mtbench",
    target: str | Path | None = None,
    dtype: str | torch.dtype = AUTO,
    max_new_tokens: int = 128,
    limit: int | None = None,
    draft_tokens: int | None = None,
    tree: str | Sequence[int] | None = None,
    ngram_tokens: int = NGRAM_TOKENS,
    sweep: bool = False,
    plot: str | Path | None = None,
    progress: bool = True,
    layer_convention: str | None = None,
) -> dict:
    """`eyas bench`: HF greedy, HF prompt lookup, eyas target-only, chain and tree on the same prompts.

    Greedy, batch 1, chat template applied, stop at end of turn or `max_new_tokens`. Each method
    is warmed up once, then every prompt runs every method back to back. `dtype` "auto": the dtype
    measured fastest for this target on this machine (eyas.dtype_choice), for every method, the
    baseline included. Chain and tree shapes: `draft_tokens` / `tree` if given, else the sweep's
    (`sweep=True` runs one first and caches its winner), else the cached best for this target /
    drafter / dtype / machine, else defaults; both carry an n-gram branch of `ngram_tokens` (0: off).
    `plot`: a PNG of the speedup per method and category. Returns the JSON report: `methods` and
    `categories` (per method: tokens_per_s, speedup over hf_greedy pooled and `per_prompt_speedup`
    median and quartiles, tau, acceptance_by_depth, time_split, greedy_identical), `prompts` (per
    prompt), `shapes` (with what `eyas generate` would use), `sweep` and `environment`.
    """
    if not (isinstance(dtype, str) and dtype.lower() == AUTO):
        dtype = to_dtype(dtype, DECODE_DTYPES)  # a bad name fails before anything is read
    tree = parse_tree(tree)
    if draft_tokens is not None and draft_tokens < 1:
        raise EyasError(f"draft_tokens={draft_tokens}: a chain needs at least 1 draft token", "e.g. --draft-tokens 4")
    items = bench_prompts(prompts, limit=limit)  # a bad prompt file fails before any model loads
    dtype, dtype_source = resolve_dtype(dtype, target)
    target_model, draft = load_models(drafter, target, dtype, layer_convention)
    prompt_ids = [chat_ids(target_model, it.prompt, max_new_tokens=max_new_tokens) for it in items]
    stops = eos_ids(target_model)

    sweep_report = None
    if sweep:
        sweep_report = sweep_shapes(target_model, draft, prompt_ids, stops, max_new_tokens=max_new_tokens,
                                    ngram_tokens=ngram_tokens, progress=progress)
        entry = {**sweep_report, "target": target_model.name, "drafter": str(Path(drafter).resolve()),
                 "dtype": short_name(dtype), "prompts": len(items), "max_new_tokens": max_new_tokens,
                 "torch": torch.__version__,
                 "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        sweep_report["cache"] = str(save_best_shape(target_model.name, drafter, dtype, entry))
    shapes = _shapes(target_model.name, drafter, dtype, draft_tokens, tree, sweep_report)
    runners = {
        "hf_greedy": hf_runner(target_model, stops, None),
        "hf_prompt_lookup": hf_runner(target_model, stops, PROMPT_LOOKUP_TOKENS),
        "eyas_target": eyas_runner(target_model, None, stops, {}),
        "eyas_chain": eyas_runner(target_model, draft, stops, shapes["eyas_chain"], ngram_tokens),
        "eyas_tree": eyas_runner(target_model, draft, stops, shapes["eyas_tree"], ngram_tokens),
    }
    runs: dict[str, list[Run]] = time_interleaved(runners, prompt_ids, max_new_tokens, set(stops), "bench",
                                                  progress)

    def summarise(indices: list[int]) -> dict[str, dict]:
        ref = [runs["hf_greedy"][i] for i in indices]
        return with_speedups({m: summary([runs[m][i] for i in indices], ref) for m in METHODS})

    categories: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        categories.setdefault(it.category, []).append(i)
    report = {
        "drafter": str(drafter),
        "target": target_model.name,
        "prompt_set": str(prompts),
        "num_prompts": len(items),
        "max_new_tokens": max_new_tokens,
        "dtype": short_name(dtype),
        "dtype_source": dtype_source,
        "ngram_tokens": ngram_tokens,
        "shapes": shapes,
        "methods": summarise(list(range(len(items)))),
        "speedup_terms": None,
        "categories": {c: {"prompts": len(idx), "methods": summarise(idx)} for c, idx in categories.items()},
        "prompts": [
            {"origin": it.prompt.origin, "category": it.category, "prompt_tokens": len(ids),
             "new_tokens": {m: len(runs[m][i].tokens) for m in METHODS},
             "seconds": {m: runs[m][i].seconds for m in METHODS},
             "identical": {m: runs[m][i].tokens == runs["hf_greedy"][i].tokens for m in METHODS}}
            for i, (it, ids) in enumerate(zip(items, prompt_ids))
        ],
        "sweep": sweep_report,
        "environment": environment(dtype),
    }
    report["speedup_terms"] = speedup_terms(report["methods"])
    if plot:
        plot_bench(report, plot)
    return report


def _shapes(target_name: str, drafter: str | Path, dtype: torch.dtype, draft_tokens: int | None,
            tree: tuple[int, int, int] | None, sweep_report: dict | None) -> dict:
    """The chain and tree to time, where each came from, and what `eyas generate` would decode with."""
    known = sweep_report or read_best_shape(target_name, drafter, dtype)
    found = "sweep" if sweep_report else "sweep cache" if known else "default"
    chain = {"draft_tokens": draft_tokens or (known["best_chain"] if known else DEFAULT_DRAFT_TOKENS)}
    tree_shape = {"tree": list(tree or (known["best_tree"] if known else DEFAULT_TREE))}
    generate_shape, generate_source = choose_shape(target_name, drafter, dtype, None, None)
    return {"eyas_chain": chain, "eyas_tree": tree_shape,
            "source": {"eyas_chain": "given" if draft_tokens else found, "eyas_tree": "given" if tree else found},
            "generate": {"shape": generate_shape or None, "source": generate_source}}
