"""serve-check's comparison without the engine: the replay of the engine's walk (`predict`), counts per
prompt that add up to the totals, and served minus predicted with its paired interval. The engine
itself is in tests/test_engine_vllm.py."""

from __future__ import annotations

import pytest
import torch
from test_data import save_tiny_target

from eyas.drafter_loading import load_drafter
from eyas.engines.compare import paired_difference
from eyas.engines.predict import _walk, predict
from eyas.engines.serve_check import _per_request, _difference_lines
from eyas.cli import main
from eyas.target import Target

LAYERS = [1, 2, 3]


def test_walk_replays_the_engines_steps():
    """Chain starts advance by accepted + 1, each step counts once, and a position counts only after
    every earlier one was accepted."""
    truth = torch.tensor([[5, 6], [7, 8], [9, 1], [2, 3], [4, 4]])
    chain = torch.tensor([[5, 6], [0, 0], [0, 0], [2, 0], [4, 4]])  # start 0: both; 3: one; 4: both
    counts = [0, 0]
    # the prefill made 1; start 0: 2 accepted + the target's own (4 made); start 3: 1 + 1 (6 made): done
    assert _walk(chain, truth, 0, 5, 2, counts) == 2
    assert counts == [2, 1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = save_tiny_target(tmp_path_factory.mktemp("target"))
    draft = tmp_path_factory.mktemp("init") / "draft"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", "1,2,3"]) == 0
    return Target.load(folder, dtype=torch.float32), load_drafter(draft, target=folder, dtype=torch.float32)


def test_per_sequence_counts_add_up_to_the_totals(tiny):
    target, drafter = tiny
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 48, (n,), generator=g).tolist() for n in (5, 8, 6)]
    outputs = [torch.randint(3, 48, (n,), generator=g).tolist() for n in (12, 0, 9)]  # one empty answer
    pred = predict(drafter, target, LAYERS, prompts, outputs, 3)
    assert len(pred.per_sequence) == 3 and pred.per_sequence[1] == (0, [0, 0, 0])
    assert sum(d for d, _ in pred.per_sequence) == pred.drafts > 0
    assert [sum(c[i] for _, c in pred.per_sequence) for i in range(3)] == pred.accepted_by_position


def _counters(per):
    return {"num_drafts": sum(d for d, _ in per), "accepted_per_pos": [sum(c[i] for _, c in per) for i in range(2)]}


def test_per_request_counters_are_used_only_when_they_add_up():
    per = [(10, [4, 2]), (6, [3, 0])]
    rows = [{"num_drafts": d, "accepted_per_pos": c} for d, c in per]
    assert _per_request({"per_request": rows, "counters": _counters(per)}, 2) == per
    lagging = {"per_request": rows[:1] + [{"num_drafts": 5, "accepted_per_pos": [3, 0]}], "counters": _counters(per)}
    assert _per_request(lagging, 2) is None  # a request's counters read before the engine updated them
    assert _per_request({"counters": _counters(per)}, 2) is None  # a worker that did not read them


def test_paired_difference_is_zero_on_identical_counts_and_resolves_a_shift():
    g = torch.Generator().manual_seed(1)
    drafts = torch.randint(20, 60, (24,), generator=g).tolist()
    served = [(d, [int(d * r) for r in (0.4, 0.2, 0.1)]) for d in drafts]
    same = paired_difference(served, list(served), 3)
    assert same["mean_acceptance_length"] == {"difference": 0.0, "ci95": [0.0, 0.0]}
    assert same["samples"] == 24 and same["per_prompt"]["served"] == same["per_prompt"]["predicted"]
    lower = [(d, [c[0] - 2, *c[1:]]) for d, c in served]  # eyas predicts 2 fewer at position 1 everywhere
    d = paired_difference(served, lower, 3)
    lo, hi = d["acceptance_by_position"][0]["ci95"]
    assert 0 < lo <= d["acceptance_by_position"][0]["difference"] <= hi
    assert d["mean_acceptance_length"]["difference"] == pytest.approx(2 * 24 / sum(drafts))
    assert d["acceptance_by_position"][1] == {"difference": 0.0, "ci95": [0.0, 0.0]}
    assert "under 20 prompts" not in _difference_lines(d)[0]


def test_paired_difference_needs_drafts_on_both_sides_of_the_same_prompts():
    assert paired_difference([(0, [0])], [(0, [0])], 1) is None
    assert paired_difference([(3, [1])], [(3, [1]), (2, [0])], 1) is None
    one = paired_difference([(3, [1])], [(3, [0])], 1)  # one prompt: no interval, said as "-"
    assert "(-)" in _difference_lines(one)[0] and "too narrow" in _difference_lines(one)[0]
