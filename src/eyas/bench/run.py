"""`eyas bench`: the five methods of eyas.bench.timing on the same prompts, one JSON report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from eyas.bench.prompts import bench_prompts
from eyas.bench.report import environment, plot_bench
from eyas.bench.sweep import save_sweep, sweep_shapes
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
from eyas.data import eos_ids, prompts_fit, short_of_limit
from eyas.decode import DEFAULT_DRAFT_TOKENS
from eyas.draft_shape import needs_sweep, parse_tree, read_best_shape
from eyas.devices import on_gpu
from eyas.dtype_choice import DECODE_DTYPES, hf_dtypes, resolve_dtype
from eyas.dtypes import AUTO, is_auto
from eyas.dtypes import short_name, to_dtype
from eyas.errors import EyasError
from eyas.generate import NGRAM_TOKENS, chat_ids, choose_shape, load_models, measure_shape, quick_prompt_ids
from eyas.machine import quietest, say_if_busy
from eyas.target import Target

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
    device: str | torch.device | None = None,
) -> dict:
    """`eyas bench`: HF greedy, HF prompt lookup, eyas target-only, chain and tree on the same prompts.

    Greedy, batch 1, chat template applied, stop at end of turn or `max_new_tokens`. Each method
    is warmed up once, then every prompt runs every method back to back. `dtype` "auto": eyas's
    methods decode in the dtype measured fastest for this target on this machine, and each Hugging
    Face baseline runs in ITS fastest dtype here (eyas.dtype_choice; each row records its dtype); a
    given dtype is every method's. Chain and tree shapes: `draft_tokens` / `tree` if given, else the
    sweep's (`sweep=True` runs one first and caches its winner), else the cached best for this
    target / drafter / dtype / machine, else a quick sweep measures one now (and caches it); both
    carry an n-gram branch of `ngram_tokens` (0: off).
    Every model runs on `device` (default cpu; on a GPU "auto" is bf16 for every method).
    `plot`: a PNG of the speedup per method and category. Returns the JSON report: `methods` and
    `categories` (per method: tokens_per_s, speedup over hf_greedy pooled and `per_prompt_speedup`
    median and quartiles, tau, acceptance_by_depth, time_split, greedy_identical), `prompts` (per
    prompt), `shapes` (with what `eyas generate` would use), `sweep` and `environment`.
    """
    asked = dtype
    if not is_auto(dtype):
        dtype = to_dtype(dtype, DECODE_DTYPES)  # a bad name fails before anything is read
    tree = parse_tree(tree)
    if draft_tokens is not None and draft_tokens < 1:
        raise EyasError(f"draft_tokens={draft_tokens}: a chain needs at least 1 draft token", "e.g. --draft-tokens 4")
    items = short_of_limit(bench_prompts(prompts, limit=limit), limit, prompts)  # a bad file: refused before a load
    prompts_fit(target, [it.prompt for it in items], max_new_tokens)  # and one too long, before the dtype timing
    dtype, dtype_source = resolve_dtype(dtype, target, device, again=sweep)  # a sweep times the dtypes anew
    # each Hugging Face baseline in its own fastest dtype here (on a GPU: the one eyas decodes in)
    baseline_dtypes = hf_dtypes(dtype if on_gpu(device) else asked, target)
    target_model, draft = load_models(drafter, target, dtype, layer_convention, device)
    hf_models = {d: target_model if d == dtype else Target.load(target, dtype=d, device=device)
                 for d, _ in baseline_dtypes.values()}
    prompt_ids = [chat_ids(target_model, it.prompt, max_new_tokens=max_new_tokens) for it in items]
    stops = eos_ids(target_model)

    sweep_report = None
    if sweep:
        sweep_report = quietest(sweep_shapes(target_model, draft, prompt_ids, stops, max_new_tokens=max_new_tokens,
                                             ngram_tokens=ngram_tokens, progress=progress), None)
        sweep_report["cache"] = save_sweep(target_model, drafter, dtype, sweep_report, prompts=len(items),
                                           max_new_tokens=max_new_tokens)
        say_if_busy(sweep_report)
    elif draft_tokens is None and tree is None:  # a shape given is timed as given, the other cached or default
        known = read_best_shape(target_model.name, drafter, dtype)
        if needs_sweep(known):
            sweep_report = measure_shape(target_model, draft, drafter, dtype, ngram_tokens=ngram_tokens, previous=known,
                                         progress=progress)
        if sweep_report is not None:
            sweep_report["quick"] = True
    shapes = _shapes(target_model.name, drafter, dtype, draft_tokens, tree, sweep_report,
                     timeable=bool(quick_prompt_ids(target_model)))
    hf_greedy_model, hf_lookup_model = (hf_models[baseline_dtypes[m][0]] for m in ("hf_greedy", "hf_prompt_lookup"))
    runners = {
        "hf_greedy": hf_runner(hf_greedy_model, stops, None),
        "hf_prompt_lookup": hf_runner(hf_lookup_model, stops, PROMPT_LOOKUP_TOKENS),
        "eyas_target": eyas_runner(target_model, None, stops, {}),
        "eyas_chain": eyas_runner(target_model, draft, stops, shapes["eyas_chain"], ngram_tokens),
        "eyas_tree": eyas_runner(target_model, draft, stops, shapes["eyas_tree"], ngram_tokens),
    }
    runs: dict[str, list[Run]] = time_interleaved(runners, prompt_ids, max_new_tokens, set(stops), "bench",
                                                  progress)

    row_dtypes = {m: short_name(baseline_dtypes[m][0]) if m in baseline_dtypes else short_name(dtype) for m in METHODS}

    def summarise(indices: list[int]) -> dict[str, dict]:
        ref = [runs["hf_greedy"][i] for i in indices]
        methods = with_speedups({m: summary([runs[m][i] for i in indices], ref) for m in METHODS})
        return {m: {"dtype": row_dtypes[m], **v} for m, v in methods.items()}

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
        "baseline_dtypes": {m: {"dtype": short_name(d), "source": src} for m, (d, src) in baseline_dtypes.items()},
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
        "environment": environment(dtype, target_model.device),
    }
    report["speedup_terms"] = speedup_terms(report["methods"])
    if plot:
        plot_bench(report, plot)
    return report


def _shapes(target_name: str, drafter: str | Path, dtype: torch.dtype, draft_tokens: int | None,
            tree: tuple[int, int, int] | None, sweep_report: dict | None, *, timeable: bool) -> dict:
    """The chain and tree to time, where each came from, and what `eyas generate` would decode with
    (`timeable`: whether any quick-sweep prompt fits the target, so that generate would time shapes)."""
    known = sweep_report or read_best_shape(target_name, drafter, dtype)
    found = (("quick sweep" if sweep_report.get("quick") else "sweep") if sweep_report
             else "sweep cache" if known else "default")
    chain = {"draft_tokens": draft_tokens or (known["best_chain"] if known else DEFAULT_DRAFT_TOKENS)}
    swept_ngram = known.get("best_chain_ngram") if known and not draft_tokens else None
    if swept_ngram is not None and swept_ngram != known["ngram_tokens"]:  # faster with its own n-gram branch
        chain["ngram_tokens"] = swept_ngram
    tree_shape = {"tree": list(tree or (known["best_tree"] if known else DEFAULT_TREE))}
    generate_shape, generate_source = choose_shape(target_name, drafter, dtype, None, None, timeable=timeable)
    return {"eyas_chain": chain, "eyas_tree": tree_shape,
            "source": {"eyas_chain": "given" if draft_tokens else found, "eyas_tree": "given" if tree else found},
            "generate": {"shape": generate_shape or None, "source": generate_source}}
