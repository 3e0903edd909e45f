"""What one `generate` call measured: accepted tokens per round, acceptance by depth, time by phase.

The result carries the histogram of accepted tokens per round (`accept_counts`) and the counts behind
the per-depth ratios (`accepted_by_depth`, `tried_by_depth`), so that a benchmark can pool several
calls exactly (eyas.bench.timing.summary).
"""

from __future__ import annotations

import time

from eyas.decode.tree import DraftTree


class DecodeStats:
    """Counters for one generate call; `result()` is the stats dict."""

    def __init__(self, max_draft: int):
        self.accept_counts = [0] * (max_draft + 1)  # accepted draft tokens per round (gpt-fast)
        self.tried = [0] * max_draft  # rounds in which depth j+1 was verified with all shallower accepted
        self.accepted = [0] * max_draft
        self.ngram_accepted = 0  # accepted tokens that only the n-gram branch proposed (the loop counts)
        self.time = {"prefill": 0.0, "draft": 0.0, "verify": 0.0}
        self.start = time.perf_counter()

    def round(self, tree: DraftTree, path: list[int]) -> None:
        a = len(path)
        self.accept_counts[a] += 1
        for j in range(a):
            self.tried[j] += 1
            self.accepted[j] += 1
        if tree.children(path[-1] if path else 0):  # the first rejected depth had candidates
            self.tried[a] += 1

    def result(self, new_tokens: int) -> dict:
        total = time.perf_counter() - self.start
        rounds = sum(self.accept_counts)
        produced = sum((a + 1) * c for a, c in enumerate(self.accept_counts))
        return {
            "accept_counts": list(self.accept_counts),
            "tau": produced / rounds if rounds else None,
            "acceptance_by_depth": [a / t if t else None for a, t in zip(self.accepted, self.tried)],
            "accepted_by_depth": list(self.accepted),  # the counts behind the ratios, to pool calls exactly
            "tried_by_depth": list(self.tried),
            "ngram_accepted": self.ngram_accepted,
            "rounds": rounds,
            "new_tokens": new_tokens,
            "time_prefill_s": self.time["prefill"],
            "time_draft_s": self.time["draft"],
            "time_verify_s": self.time["verify"],
            "time_other_s": total - sum(self.time.values()),
            "time_total_s": total,
            "tokens_per_s": new_tokens / total if total > 0 else None,
        }

