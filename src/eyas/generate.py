"""`eyas generate`: answer one chat prompt with speculative decoding, streaming the text.

`run_generate` applies the target's chat template, decodes with `eyas.decode.generate` and writes
the answer as tokens are accepted (`TextStream` holds back a character split across tokens).
Without a shape it uses the fastest one a sweep recorded for this machine (eyas.draft_shape),
measured first by a quick sweep when none is recorded, or the target alone where the sweep found
nothing faster; `dtype="auto"` decodes in the dtype measured
fastest here (eyas.dtype_choice). Every round's tree also carries an n-gram branch (text copied from
the context, eyas.decode.ngram). `chat_ids`, `load_models` and `choose_shape` are shared with
`eyas bench`, which must decode exactly the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from eyas.data import Prompt, encode_prompts, eos_ids
from eyas.decode import DEFAULT_DRAFT_TOKENS, generate
from eyas.decode.loop import branch_tokens
from eyas.draft_shape import decode_shape, needs_sweep, parse_tree, read_best_shape, shape_label
from eyas.drafter import Drafter
from eyas.drafter_loading import load_drafter
from eyas.dtype_choice import DECODE_DTYPES, check_dtype, resolve_dtype
from eyas.dtypes import short_name
from eyas.errors import EyasError
from eyas.machine import runs_on
from eyas.target import Chat, Target, TargetRef

__all__ = ["DECODE_DTYPES", "MEASURED_NOW", "NGRAM_TOKENS", "TARGET_ALONE", "TO_MEASURE", "TO_MEASURE_AGAIN",
           "TextStream", "chat_ids", "choose_shape", "format_generate", "load_models", "measure_shape", "run_generate"]

NGRAM_TOKENS = 8  # the most tokens an n-gram branch proposes per round in `eyas generate` / `eyas bench`
TARGET_ALONE = "target alone: no shape beat it on this machine"  # the shape source when a sweep said so
MEASURED_NOW = "measured now (none was cached)"  # the shape source when choose_shape ran the quick sweep
MEASURED_AGAIN = "measured again (the cached one was timed under load)"
# choose_shape without models (eyas bench, which cannot measure one): what `eyas generate` will do
TO_MEASURE = "none cached: it times the quick sweep's shapes first (`eyas bench --sweep` caches them now)"
TO_MEASURE_AGAIN = "the cached one was timed under load: it times the quick sweep's shapes again first"


def chat_ids(target: Target | Chat, prompt: Prompt | str, *, max_new_tokens: int) -> list[int]:
    """The prompt as the user turn of the target's chat template, ready for the assistant's answer.

    Refuses a tokenizer without a chat template, and a prompt that leaves no room for
    `max_new_tokens` in the target's context (the error names the prompt's origin).
    """
    if isinstance(prompt, str):
        prompt = Prompt(prompt, "the prompt", "<argument>")
    ids, _ = encode_prompts(target, [prompt], max_new_tokens, target.context, False)
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


def load_models(
    drafter: str | Path | None, target: str | Path | None, dtype: torch.dtype, layer_convention: str | None = None,
    device: str | torch.device | None = None,
) -> tuple[Target, Drafter | None]:
    """The drafter first: load_drafter checks that it fits the target's config.json (vocab, hidden
    size, capture depth) before any weights are read, so a mismatch fails before the target loads.
    Both go to `device` (default cpu)."""
    ref = TargetRef.resolve(target, device=device, dtype=dtype)
    draft = (load_drafter(drafter, target=ref, dtype=dtype, layer_convention=layer_convention)
             if drafter is not None else None)
    return Target.load(ref), draft


def measure_shape(target: Target, draft: Drafter, drafter: str | Path, dtype: torch.dtype, *,
                  ngram_tokens: int = NGRAM_TOKENS, previous: dict | None = None, progress: bool = False) -> dict | None:
    """The quick sweep (eyas.bench.sweep.quick_sweep) on a few MT-bench questions (the copy-heavy set
    where MT-bench is not installed), run when no settled shape is cached (`previous`: one timed under
    load); its entry is cached. None: no question fits the target's context (nothing measured)."""
    from eyas.bench.sweep import quick_sweep

    ids = quick_prompt_ids(target)
    if not ids:
        return None
    return quick_sweep(target, draft, drafter, dtype, ids, eos_ids(target), ngram_tokens=ngram_tokens,
                       previous=previous, progress=progress)


def quick_prompt_ids(target: Target) -> list[list[int]]:
    """The quick sweep's prompts as the target's chat ids: those that fit its context with the sweep's
    answer length (none for a target with a tiny context: then no sweep can run)."""
    from eyas.bench.prompts import bench_prompts
    from eyas.bench.sweep import QUICK_PROMPTS, QUICK_TOKENS

    try:
        items = bench_prompts("mtbench", limit=QUICK_PROMPTS)
    except EyasError:
        items = bench_prompts("copy", limit=QUICK_PROMPTS)
    ids = []
    for it in items:
        try:
            ids.append(chat_ids(target, it.prompt, max_new_tokens=QUICK_TOKENS))
        except EyasError:  # longer than a small target's context: left out
            continue
    return ids


def choose_shape(target_name: str, drafter: str | Path | None, dtype: torch.dtype, draft_tokens: int | None,
                 tree: tuple[int, int, int] | None, *, models: tuple[Target, Drafter] | None = None,
                 timeable: bool = True, progress: bool = False) -> tuple[dict, str]:
    """(shape, where it came from) for one generation: the one given, else the sweep's best for this
    target / drafter / dtype / machine (with `models`, the loaded target and draft, measured now by
    `measure_shape` when none is cached or the cached one was timed under load; without them, the
    empty shape and TO_MEASURE or TO_MEASURE_AGAIN, unless not `timeable`: no quick-sweep prompt fits the
    target, so nothing would be measured), else the default chain. An empty shape decodes
    with the target alone: without a drafter, or when the sweep found no shape faster than the target alone."""
    if draft_tokens is not None or tree is not None:  # decode refuses both, or either without a drafter
        given = {"draft_tokens": draft_tokens, "tree": None if tree is None else list(tree)}
        return {k: v for k, v in given.items() if v is not None}, "given"
    if drafter is None:
        return {}, "none"
    cached, source = read_best_shape(target_name, drafter, dtype), "sweep cache"
    if needs_sweep(cached) and models is None and timeable:  # the caller cannot measure: say that generate will
        return {}, TO_MEASURE if cached is None else TO_MEASURE_AGAIN
    if needs_sweep(cached) and models is not None and models[1] is not None:
        source = MEASURED_NOW if cached is None else MEASURED_AGAIN
        # None: nothing measured (a provisional entry, timed under load, then still stands)
        cached = measure_shape(*models, drafter, dtype, previous=cached, progress=progress) or cached
    if cached is None:
        return {"draft_tokens": DEFAULT_DRAFT_TOKENS}, "default"
    if cached.get("beats_target") is False:
        return {}, TARGET_ALONE
    return cached["best"], source


def run_generate(
    drafter: str | Path | None,
    prompt: str,
    *,
    draft_tokens: int | None = None,
    tree: str | Sequence[int] | None = None,
    ngram_tokens: int = NGRAM_TOKENS,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 256,
    seed: int | None = None,
    target: str | Path | None = None,
    dtype: str | torch.dtype = "auto",
    stream: Callable[[str], object] | None = None,
    layer_convention: str | None = None,
    device: str | torch.device | None = None,
    progress: bool = False,
) -> dict:
    """`eyas generate`: answer `prompt` (a user turn, chat template applied) with speculative decoding.

    Stops after the template's end-of-turn token or `max_new_tokens`. `stream` receives the text as
    tokens are accepted. Without `draft_tokens` and `tree` the shape is the best one a sweep
    recorded for this target / drafter / dtype / machine (measured now when none is recorded; none,
    when the sweep found the target alone faster). `drafter` None decodes with the target alone.
    `ngram_tokens`: the n-gram branch's length in every round's tree (0: off). `dtype`: "auto" (the
    dtype measured fastest for this target on this machine, eyas.dtype_choice), or bf16 / fp32 in
    any spelling eyas.dtypes accepts (on a GPU, `device`, "auto" is bf16). Returns the answer (`text`, `tokens`), the dtype and shape
    used and where they came from, and decode's stats (tau, acceptance_by_depth, tokens_per_s, ...).
    `progress`: a progress bar on stderr while a shape is measured.
    """
    tree = parse_tree(tree)
    check_dtype(dtype)
    chat_ids(Chat.load(target), prompt, max_new_tokens=max_new_tokens)  # a prompt too long: refused in seconds
    dtype, dtype_source = resolve_dtype(dtype, target, device)
    target_model, draft = load_models(drafter, target, dtype, layer_convention, device)
    shape, source = choose_shape(target_model.name, drafter, dtype, draft_tokens, tree, models=(target_model, draft),
                                 progress=progress)
    ids = chat_ids(target_model, prompt, max_new_tokens=max_new_tokens)
    stops = eos_ids(target_model)
    streamer = TextStream(target_model.tokenizer, stream) if stream is not None else None
    alone = source == TARGET_ALONE  # the sweep timed the target alone without n-grams too
    out, stats = generate(
        target_model, None if alone else draft, ids, max_new_tokens=max_new_tokens,
        temperature=temperature, top_p=top_p, top_k=top_k, stop_ids=stops, seed=seed, on_tokens=streamer,
        **decode_shape(shape, 0 if alone else ngram_tokens),
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
        "dtype": short_name(dtype),
        "dtype_source": dtype_source,
        "shape": shape or None,
        "shape_source": source,
        "ngram_tokens": branch_tokens(0 if alone else shape.get("ngram_tokens", ngram_tokens), None if alone else draft,
                                      shape.get("tree"), temperature),
        "sampling": {"temperature": temperature, "top_p": top_p, "top_k": top_k, "seed": seed},
        "runs_on": runs_on(target_model.device),
        "stats": stats,
    }


def format_generate(result: dict) -> str:
    """The end-of-generation summary line(s) for stderr."""
    s = result["stats"]
    # the branch decoding used, given shapes included (a given chain's label hid the branch its depths counted)
    used = {**result["shape"], "ngram_tokens": result["ngram_tokens"]} if result["shape"] else None
    shape = (shape_label(used) + f" ({result['shape_source']})" if used
             else "target alone" + (f" ({result['shape_source']})" if result["shape_source"] == TARGET_ALONE else ""))
    acc = " ".join("-" if a is None else f"{a:.2f}" for a in s["acceptance_by_depth"]) or "-"
    tau = "-" if s["tau"] is None else f"{s['tau']:.2f}"
    return (f"{s['new_tokens']} tokens in {s['time_total_s']:.2f} s: {s['tokens_per_s'] or 0:.1f} tokens/s on "
            f"{result['runs_on']}, {shape}, {result['dtype']} ({result['dtype_source']})\ntau {tau}; acceptance by "
            f"depth {acc}")
