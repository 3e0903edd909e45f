"""`eyas bench --sweep`: time every chain length and tree shape, and find the fastest.

The winner is recorded in the shape cache (eyas.draft_shape) for this target, drafter, dtype and
machine; `eyas generate` and later benches use it when no shape is given. The target alone runs in
the same sweep: where no shape beats it, `eyas generate` decodes without the draft instead of
being slower than plain decoding.
"""

from __future__ import annotations

from collections.abc import Sequence

from eyas.bench.timing import eyas_runner, summary, time_interleaved
from eyas.drafter import Drafter
from eyas.target import Target

SWEEP_CHAINS = tuple(range(1, 9))
SWEEP_TREES = ((3, 4, 8), (4, 4, 12), (5, 4, 16), (5, 8, 32), (6, 8, 48))


def sweep_shapes(
    target: Target,
    drafter: Drafter,
    prompt_ids: list[list[int]],
    stops: list[int],
    *,
    max_new_tokens: int,
    ngram_tokens: int = 0,
    chains: Sequence[int] = SWEEP_CHAINS,
    trees: Sequence[tuple[int, int, int]] = SWEEP_TREES,
    progress: bool = True,
) -> dict:
    """Time every chain length and tree shape on the prompts (greedy, each round's tree with an
    n-gram branch of `ngram_tokens`), and the target alone; the fastest shape wins.

    Shapes are interleaved prompt by prompt, so slow drifts in machine load hit them alike. Returns
    `results` (shape, tokens_per_s, tau per shape), `best` (the fastest shape of all), `best_chain`,
    `best_tree`, `target_tokens_per_s` (the target alone, plain decoding) and `beats_target`
    (whether `best` beat it: where it did not, `eyas generate` decodes without the draft).
    """
    shapes = [{"draft_tokens": k} for k in chains] + [{"tree": list(t)} for t in trees]
    runners = {i: eyas_runner(target, drafter, stops, s, ngram_tokens) for i, s in enumerate(shapes)}
    runners["target"] = eyas_runner(target, None, stops, {})
    runs = time_interleaved(runners, prompt_ids, max_new_tokens, set(stops), "sweep", progress)
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
        "best_tree": fastest("tree")["shape"]["tree"],
        "results": results,
    }
