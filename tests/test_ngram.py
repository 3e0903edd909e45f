"""eyas.decode.ngram: n-gram candidates (prompt lookup) as one more branch of the verify tree.

They are only candidates: greedy output stays the target's own and sampling stays exact (the same
checks as test_decode's, with the branch on); on text the answer copies, the branch is accepted.
"""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_contract
from test_decode import (  # noqa: F401  (big, references, small: module fixtures shared with test_decode)
    N_PROMPTS,
    Sampling,
    big,
    cheat_drafter,
    chi_square_pvalue,
    greedy_oracle,
    prompt_plan,
    random_drafter,
    references,
    sample_runs,
    small,
    small_contract,
)

from eyas.decode import DraftTree, generate
from eyas.decode.ngram import BranchLength, NgramIndex, add_branch

pytestmark = pytest.mark.usefixtures("one_thread")


def test_index_proposes_what_followed_the_latest_match():
    index = NgramIndex([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3])
    assert index.propose(3) == [7, 5, 2]  # "2 3" matched at its latest earlier place (a 3-gram has none)
    index.extend([7])  # "2 3 7": the 3-gram occurred before
    assert index.propose(2) == [5, 2]
    assert NgramIndex([4, 5, 6]).propose(4) == []  # nothing occurs twice
    assert NgramIndex([8, 8]).propose(3) == [8]  # the suffix never matches itself, an earlier 8 does
    assert NgramIndex([1, 2, 1]).propose(5) == [2, 1]


def test_the_branch_length_follows_its_recent_acceptance():
    n = BranchLength(8)
    assert n.now == 8  # a first branch may be long: copying starts at once on an edit
    n.update([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 9])  # two accepted: next time three
    assert n.now == 3
    n.update([1, 2, 3], [1, 2, 3])  # accepted whole: doubled
    assert n.now == 6
    n.update([4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 8, 9, 1])
    assert n.now == 8  # never past the cap
    n.update([], [4, 5])  # no earlier occurrence: nothing learned
    assert n.now == 8
    n.update([5, 6], [7])  # nothing accepted: one token, the cheapest probe
    assert n.now == 1
    n.update([5], [5])
    assert n.now == 2
    n.update([5, 6], [5])  # cut short by the round (a stop, the limit): one of two, so two
    assert n.now == 2


def test_branch_merges_into_the_tree():
    #                    root  a  b  c
    tree = DraftTree(torch.tensor([0, 10, 11, 12]), [-1, 0, 0, 1], [0, 1, 1, 2])
    merged, added = add_branch(tree, [10, 12, 13, 14])  # follows root -> 10 -> 12, then grows
    assert added == 2
    assert merged.tokens.tolist() == [0, 10, 11, 12, 13, 14]
    assert merged.parents == [-1, 0, 0, 1, 3, 4] and merged.depths == [0, 1, 1, 2, 3, 4]
    fresh, added = add_branch(tree, [20, 21])  # no shared prefix: a new child of the root
    assert added == 2 and fresh.parents[4:] == [0, 4] and not fresh.is_chain
    same, added = add_branch(tree, [10, 12])
    assert added == 0 and same is tree


@pytest.mark.parametrize("case", ["target+ngram", "chain+ngram", "tree+ngram"])
def test_greedy_with_ngrams_matches_target(big, references, case):
    """The target's own greedy output with the n-gram branch on (beside a chain, a tree, or alone)."""
    options = {"target+ngram": {}, "chain+ngram": {"draft_tokens": 3}, "tree+ngram": {"tree": (3, 2, 5)}}[case]
    drafter = None if case == "target+ngram" else cheat_drafter(big, tiny_contract(draft_vocab_size=256))
    for i in range(N_PROMPTS):
        prompt, new = prompt_plan(i)
        if drafter is not None:
            drafter.arm(int(prompt[0, 0]), greedy_oracle(references[i]), hit=0.3, seed=i)
        out, stats = generate(big, drafter, prompt, max_new_tokens=new, ngram_tokens=6, **options)
        assert out.tolist() == references[i].tolist(), f"{case}: prompt {i} differs from HF greedy"
        assert sum((a + 1) * c for a, c in enumerate(stats["accept_counts"])) == new - 1


def test_a_copied_span_is_accepted_whole(big, references, monkeypatch):
    """Where the context holds the continuation (as a rewrite prompt holds its text), the branch is
    accepted over its whole length: here the index is made to find the reference continuation
    (two lookups in three; the third proposes a wrong span, which must be rejected)."""
    prompt, new = prompt_plan(0)
    ref = references[0][0].tolist()

    def found(self, count):  # what the context would offer if the answer were copying it
        return ref[len(self.tokens) : len(self.tokens) + count] if len(self.tokens) % 3 else [ref[0]] * count

    monkeypatch.setattr(NgramIndex, "propose", found)
    drafter = cheat_drafter(big, tiny_contract(draft_vocab_size=256))
    for options in ({}, {"draft_tokens": 2}, {"tree": (2, 2, 4)}):
        if options:
            drafter.arm(int(prompt[0, 0]), greedy_oracle(references[0]), hit=0.5, seed=0)
        out, stats = generate(big, drafter if options else None, prompt, max_new_tokens=new, ngram_tokens=8,
                              **options)
        assert out.tolist() == references[0].tolist(), options
        assert stats["ngram_accepted"] > new / 2 and stats["accept_counts"][8] > 0, options
        assert stats["tau"] > 4.0, options


@pytest.mark.parametrize("case", ["target+ngram", "tree+ngram"])
def test_sampling_with_ngrams_is_lossless(small, case):
    drafter = None if case == "target+ngram" else random_drafter(small, small_contract(), seed=2)
    options = {"ngram_tokens": 3} | ({} if drafter is None else {"tree": (2, 2, 3)})
    s = Sampling(1.0)
    p = chi_square_pvalue(sample_runs(small, drafter, options, s), small, s)
    assert p > 0.001, f"{case}: sampled sequences do not follow the target distribution (p = {p:.2g})"


def test_sampled_chains_take_no_branch(small):
    """A sampled chain is accepted through its draft distribution q: the n-gram branch stays out, and the stats
    and generate's report say so (they reported a branch of 4 and 4 depths, 2 of them never tried)."""
    from eyas.decode.loop import branch_tokens

    drafter = random_drafter(small, small_contract(), seed=2)
    _, stats = generate(small, drafter, torch.tensor([[1, 2, 1, 2, 1, 2]]), max_new_tokens=10, draft_tokens=2,
                        ngram_tokens=4, temperature=1.0, seed=0)
    assert stats["ngram_accepted"] == 0 and len(stats["acceptance_by_depth"]) == 2
    assert branch_tokens(4, drafter, None, 1.0) == 0 and branch_tokens(4, drafter, (2, 2, 3), 1.0) == 4
    assert branch_tokens(4, drafter, None, 0.0) == 4 and branch_tokens(4, None, None, 1.0) == 4


@pytest.mark.slow
def test_copy_heavy_prompt_on_the_embedded_default():
    """SmolLM2-135M-Instruct rewriting a given paragraph (eyas's copy-heavy set), fp32: the n-gram
    branch carries much of the answer, and the answer is the target's own greedy one."""
    from eyas.bench import bench_prompts
    from eyas.generate import chat_ids
    from eyas.target import Target

    target = Target.load()
    item = next(it for it in bench_prompts("copy") if it.category == "edit")
    ids = chat_ids(target, item.prompt, max_new_tokens=64)
    plain, _ = generate(target, None, ids, max_new_tokens=64)
    out, stats = generate(target, None, ids, max_new_tokens=64, ngram_tokens=8)
    assert out.tolist() == plain.tolist()
    assert stats["ngram_accepted"] >= 20 and stats["tau"] > 1.5, stats
