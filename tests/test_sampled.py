"""Expected acceptance under sampling (eyas.sampled): the formulas by hand, against eyas's own
acceptance rules by simulation, and end to end through `eyas eval --temperature`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from eyas.cli import main
from eyas.decode.accept import accept_chain_sampling, accept_tree_sampling
from eyas.decode.sampling import Sampling
from eyas.decode.tree import DraftTree, chain_tree
from eyas.sampled import acceptance_probs, alpha_measure, answer_depths, expected_tau, first_answer_row
from test_data import LAYERS
from test_evaluate import tiny  # noqa: F401  (a fixture: a tiny target and its capture)

pytestmark = pytest.mark.usefixtures("one_thread")

CHAIN, GREEDY, TREE = 0, 1, 2


# --- the formulas, by hand ------------------------------------------------------------------------


def test_a_draft_equal_to_the_target_is_always_accepted_by_a_sampled_chain():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    a = acceptance_probs(p, p.clone(), 2)
    assert a[CHAIN] == pytest.approx(1.0)
    assert a[GREEDY] == pytest.approx(0.5)  # argmax proposed, accepted with p(argmax)
    assert a[TREE] == pytest.approx(0.8)  # top-2 candidates: 0.5 + 0.3


def test_disjoint_supports_are_never_accepted():
    p = torch.tensor([0.6, 0.4, 0.0, 0.0])
    q = torch.tensor([0.0, 0.0, 0.7, 0.3])
    assert acceptance_probs(p, q, 2).tolist() == [0.0, 0.0, 0.0]


def test_the_three_rules_on_a_hand_computed_pair():
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    a = acceptance_probs(p, q, 3)
    assert a[CHAIN] == pytest.approx(0.1 + 0.2 + 0.2 + 0.1)  # sum of min
    assert a[GREEDY] == pytest.approx(0.1)  # p at argmax q = token 0
    assert a[TREE] == pytest.approx(0.1 + 0.2 + 0.3)  # q's top 3: tokens 0, 1, 2
    assert acceptance_probs(p, q, 4)[TREE] == pytest.approx(1.0)  # k = V: every token is a candidate


def test_rows_are_independent_and_tau_multiplies_along_depth():
    alpha = torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.0, 1.0]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    assert expected_tau(alpha, valid, 1) == pytest.approx(1 + (0.5 + 1.0) / 2)
    # the second start's answer ends after 2 depths: its chain is cut there, as decoding cuts it, and counts
    assert expected_tau(alpha, valid, 3) == pytest.approx(1 + (0.5 + 0.25 + 0.125 + 1.0) / 2)
    assert math.isnan(expected_tau(alpha, torch.zeros(2, 3, dtype=torch.bool), 1))


# --- the formulas against eyas's acceptance rules, simulated -----------------------------------------


def _pair(g: torch.Generator, V: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(V, generator=g) * 1.5).softmax(-1), (torch.randn(V, generator=g) * 1.5).softmax(-1)


def _within(rate: float, alpha: float, n: int) -> bool:
    sd = math.sqrt(max(alpha * (1 - alpha), 1e-4) / n)
    return abs(rate - alpha) < 5 * sd


@pytest.mark.parametrize("seed", [0, 1])
def test_chain_alpha_is_the_rate_speculative_sampling_accepts(seed):
    g = torch.Generator().manual_seed(seed)
    p, q = _pair(g)
    s = Sampling(temperature=1.0, generator=g)
    P, Q = torch.stack([p, p]), torch.stack([torch.zeros_like(q), q])  # [2, V]: after the root, after d_1
    n = 3000
    drafts = torch.multinomial(q, n, replacement=True, generator=g).tolist()
    hits = sum(len(accept_chain_sampling(chain_tree(torch.tensor([0, d]), Q), P, s)[0]) for d in drafts)
    assert _within(hits / n, float(acceptance_probs(p, q, 1)[CHAIN]), n)


@pytest.mark.parametrize("k", [1, 3])
def test_tree_alpha_is_the_rate_a_first_level_child_is_accepted(k):
    g = torch.Generator().manual_seed(10 + k)
    p, q = _pair(g)
    top = q.topk(k).indices
    tree = DraftTree(torch.cat([torch.tensor([0]), top]), [-1] + [0] * k, [0] + [1] * k)
    P = p.expand(k + 1, -1).clone()
    s = Sampling(temperature=1.0, generator=g)
    n = 3000
    hits = sum(len(accept_tree_sampling(tree, P, s)[0]) > 0 for _ in range(n))
    assert _within(hits / n, float(acceptance_probs(p, q, k)[TREE]), n)


# --- one sample, a draft with a reduced vocabulary: the draft-vocab shortcut is exact ----------------


@pytest.mark.parametrize("chunks", [False, True], ids=["whole", "chunked"])
def test_alpha_measure_equals_the_full_vocabulary_computation(tiny, monkeypatch, chunks):
    """The draft-vocab shortcut, and (chunked) blocks of starts and slices of lm_head, change nothing."""
    from conftest import random_tensors

    import eyas.sampled

    from eyas.contract import contract_for_target
    from eyas.data import open_shards
    from eyas.drafter import Drafter
    from eyas.evaluate import sample_predictions
    from eyas.target import target_config, target_tensors

    if chunks:
        monkeypatch.setattr(eyas.sampled, "BLOCK", 4)
        monkeypatch.setattr(eyas.sampled, "VOCAB_CHUNK", 10)
    folder, shards = tiny
    c = contract_for_target(target_config(folder), capture_layers=tuple(LAYERS), draft_vocab_size=20)
    d = Drafter.from_tensors(c, random_tensors(c, seed=2), embed_tokens=torch.randn(c.vocab_size, c.hidden_size))
    lm_head = target_tensors(folder, ["lm_head.weight"])["lm_head.weight"]
    sample = next(iter(open_shards(shards)))
    T = 0.7
    with torch.inference_mode():
        first = first_answer_row(sample)
        got = sample_predictions(d, sample, lm_head, 3, 2, measure=alpha_measure(d, sample, lm_head, T, 2))
        alpha, valid = got["measured"], answer_depths(sample, got["rows"])
        assert int(got["rows"].min()) >= first  # p is computed from the first answer position on
        logits = sample_predictions(d, sample, lm_head, 3, 2, measure=lambda logits, rows: logits)["measured"]
        # reference: p and q over the whole target vocabulary (q zero outside the draft's)
        p = ((sample["last_hidden"] @ lm_head.T) / T).softmax(-1)[got["rows"]]  # [N, 3, V]
        q = torch.zeros_like(p)
        q[..., d.to_target_ids(torch.arange(20))] = (logits / T).softmax(-1)
        want = acceptance_probs(p, q, 2)
    torch.testing.assert_close(alpha, want, rtol=1e-5, atol=1e-6)
    assert valid[:, 0].all() and not valid[-1, 1]  # the last start's second token lies past the answer


# --- end to end -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def draft(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft") / "d"
    assert main(["init", str(out), "--target", str(tiny[0]), "--capture-layers", ",".join(map(str, LAYERS))]) == 0
    return out


def test_eval_at_a_temperature_adds_the_sampled_section_and_keeps_the_greedy_one(tiny, draft):
    from eyas.evaluate import evaluate

    folder, shards = tiny
    kw = dict(data=shards, target=folder, depth=4, tree_top_k=2, tree_depth=3, dtype="fp32", progress=False)
    greedy, sampled = evaluate(draft, **kw), evaluate(draft, temperature=0.8, **kw)
    s = sampled.pop("sampled")
    for rep in (greedy, sampled):
        rep.pop("cost")
    assert json.dumps(sampled) == json.dumps(greedy)  # the greedy numbers do not depend on the temperature (nan too)
    assert s["temperature"] == 0.8 and s["tokens"] == greedy["tokens"]
    for mode, values in s["acceptance_by_depth"].items():
        assert len(values) == 4 and all(0.0 <= v <= 1.0 for v in values), (mode, values)
    for mode, taus in s["tau_chain"].items():
        values = [taus[str(k)] for k in range(1, 5)]
        assert values == sorted(values) and 1.0 <= values[0] and values[-1] <= 5.0, (mode, values)
    assert 1.0 <= s["tau_tree"]["tau"] <= 4.0 and s["tau_tree"]["depth"] == 3
    # sampling from q is accepted at least as often as proposing its argmax, on average over positions
    assert s["acceptance_by_depth"]["tree"][0] >= s["acceptance_by_depth"]["greedy_draft"][0]
    assert "greedy" in s["note"] and "--temperature 0.8" in s["note"]  # the answers were captured greedily


def test_eval_against_at_a_temperature_compares_the_sampled_figures_too(tiny, draft, tmp_path, capsys):
    """The second draft's sampled section is the one it gets alone; the difference is the two sections'
    figures subtracted, with its interval; a draft against itself differs by exactly 0."""
    import shutil

    from safetensors.torch import load_file, save_file

    from eyas.evaluate import evaluate

    folder, shards = tiny
    other = shutil.copytree(draft, tmp_path / "other")
    tensors = load_file(other / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    save_file({k: v + 0.5 * torch.randn(v.shape, generator=g).to(v.dtype) if v.is_floating_point() else v
               for k, v in tensors.items()}, other / "model.safetensors")
    kw = dict(data=shards, target=folder, depth=3, tree_top_k=2, tree_depth=3, dtype="fp32", progress=False,
              temperature=0.8)
    both, alone = evaluate(draft, against=other, **kw), evaluate(other, **kw)
    assert both["against"]["sampled"] | {"difference": None} == alone["sampled"] | {"difference": None}
    d, mine, theirs = both["against"]["sampled"]["difference"], both["sampled"], alone["sampled"]
    want = mine["acceptance_by_depth"]["chain"][0] - theirs["acceptance_by_depth"]["chain"][0]
    assert d["acceptance_depth1"]["chain"]["difference"] == pytest.approx(want) and want != 0
    assert d["tau_tree"]["difference"] == pytest.approx(mine["tau_tree"]["tau"] - theirs["tau_tree"]["tau"])
    lo, hi = d["tau_chain"]["greedy_draft"]["ci95"]
    assert lo <= hi
    same = evaluate(draft, against=draft, **kw)["against"]["sampled"]["difference"]
    assert same["tau_chain"]["chain"] == {"difference": 0.0, "ci95": [0.0, 0.0]}
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(shards), "--target", str(folder), "--depth", "3", "--dtype",
                 "fp32", "--no-progress", "--temperature", "0.8", "--against", str(other)]) == 0
    assert "this draft minus the --against one, sampled: depth-1 " in capsys.readouterr().out


def test_the_sampled_intervals_are_of_the_figures_reported():
    """Five copies of one sample: every resample gives the sample's own figures, so each interval
    shrinks to the figure it belongs to (a numerator or a depth that is not the figure's would not)."""
    from eyas.sampled import sampled_report

    g = torch.Generator().manual_seed(0)
    alpha = torch.rand(40, 4, 3, generator=g, dtype=torch.float64)
    valid = torch.cummin(torch.rand(40, 4, generator=g) < 0.9, dim=1).values
    s = sampled_report([(alpha, valid)] * 5, 0.8, 2, 3, None)
    ci = s["ci95"]
    assert ci["samples"] == 5 and ci["tau_chain"]["k"] == 4
    for mode in ("chain", "greedy_draft"):
        assert ci["acceptance_depth1"][mode] == pytest.approx([s["acceptance_by_depth"][mode][0]] * 2)
        assert ci["tau_chain"][mode] == pytest.approx([s["tau_chain"][mode]["4"]] * 2)
    assert ci["tau_tree"] == pytest.approx([s["tau_tree"]["tau"]] * 2)


def test_eval_cli_prints_the_sampled_section(tiny, draft, capsys):
    folder, shards = tiny
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(shards), "--target", str(folder), "--depth", "3", "--dtype",
                 "fp32", "--no-progress", "--temperature", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "sampled at temperature 0.9" in out and "greedy draft (vLLM)" in out and "tree (top-4)" in out
    assert "95% intervals, resampling the" in out and "(greedy draft); tree" in out


def test_eval_refuses_a_temperature_for_a_cache_without_the_last_state(tiny, draft, tmp_path, capsys):
    import cache_writers

    from eyas.data import open_shards

    folder, shards = tiny
    first = next(iter(open_shards(shards)))
    dump = tmp_path / "dump.safetensors"
    cache_writers.write_dump(dump, first["input_ids"], first["features"])
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(dump), "--data-format", "eyas-dump", "--target", str(folder),
                 "--temperature", "0.8", "--no-progress"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(dump) in errors[0] and "last hidden state" in errors[0]
    assert "without --temperature" in err


def test_eval_refuses_a_negative_temperature_before_loading(tiny, draft, capsys):
    assert main(["eval", str(draft), "--data", str(tiny[1]), "--temperature", "-1"]) == 2
    assert "--temperature -1" in capsys.readouterr().err
