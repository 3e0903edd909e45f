"""Acceptance metrics on hand-built examples where the right answer is known by counting."""

import math

import pytest
import torch

from eyas.evaluate import chain_acceptance, chain_truth, tree_tau


def test_chain_truth_on_greedy_data_is_the_stored_continuation():
    x = torch.tensor([5, 6, 7, 8, 9, 10])
    y = torch.tensor([6, 7, 8, 9, 10, 11])  # every stored token is the target's greedy choice
    truth, valid = chain_truth(x, y, depth=3)
    # from t=0 the draft (reading x_1 = 6) predicts x_2, x_3, x_4 = y_1, y_2, y_3
    assert truth[0].tolist() == [7, 8, 9]
    assert valid[0].tolist() == [True, True, True]
    # from t=3 only y_4, y_5 exist
    assert valid[3].tolist() == [True, True, False]
    assert valid[5].tolist() == [False, False, False]


def test_chain_truth_stops_where_the_data_leaves_the_greedy_path():
    x = torch.tensor([5, 6, 99, 8, 9])
    y = torch.tensor([6, 7, 8, 9, 10])  # x_2 = 99 is not the greedy choice y_1 = 7
    truth, valid = chain_truth(x, y, depth=2)
    # from t=0, depth 0 asks for y_1 (known); depth 1 would replace x_2 = 99, which the
    # target never chose, so what follows is unknown
    assert valid[0].tolist() == [True, False]
    # from t=1 the draft reads x_2 = 99 (a given token, as in the prompt) and x_3 is greedy
    assert valid[1].tolist() == [True, True]
    assert valid[2].tolist() == [True, True]


def test_chain_acceptance_counts_conditional_rates_and_tau():
    truth = torch.tensor([[1, 2, 3]] * 4)
    valid = torch.ones(4, 3, dtype=torch.bool)
    pred = torch.tensor([[1, 2, 3], [1, 2, 0], [1, 0, 3], [0, 2, 3]])
    m = chain_acceptance(pred, truth, valid)
    assert m["acceptance_by_depth"] == pytest.approx([0.75, 2 / 3, 0.5])
    assert m["depth_counts"] == [4, 3, 2]
    # accepted tokens with k=3: 3, 2, 1, 0 -> tau = 1 + 1.5
    assert m["tau_chain"]["3"] == 2.5
    assert m["tau_chain"]["1"] == 1.75


def test_chain_acceptance_with_nothing_reached_is_nan_not_zero():
    m = chain_acceptance(torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.long),
                         torch.ones(2, 2, dtype=torch.bool))
    assert m["acceptance_by_depth"][0] == 0.0
    assert math.isnan(m["acceptance_by_depth"][1])
    assert m["tau_chain"]["2"] == 1.0


def test_tree_tau_accepts_the_true_token_anywhere_in_the_top_k():
    truth = torch.tensor([[1, 2]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    topk = torch.tensor([[[9, 1], [2, 9]]])  # right at rank 2, then at rank 1
    assert tree_tau(topk, truth, valid, depth=2) == 3.0
    assert tree_tau(topk[..., :1], truth, valid, depth=2) == 1.0
