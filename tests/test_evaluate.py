"""Acceptance metrics on hand-built examples where the right answer is known by counting."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eyas.acceptance import chain_acceptance, top_ids, tree_tau
from eyas.evaluate import chain_truth


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
    m = chain_acceptance(pred, truth, valid, ~valid)
    assert m["acceptance_by_depth"] == pytest.approx([0.75, 2 / 3, 0.5])
    assert m["depth_counts"] == [4, 3, 2]
    # accepted tokens with k=3: 3, 2, 1, 0 -> tau = 1 + 1.5
    assert m["tau_chain"]["3"] == 2.5
    assert m["tau_chain"]["1"] == 1.75


def test_chain_acceptance_with_nothing_reached_is_nan_not_zero():
    m = chain_acceptance(torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.long),
                         torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, 2, dtype=torch.bool))
    assert m["acceptance_by_depth"][0] == 0.0
    assert math.isnan(m["acceptance_by_depth"][1])
    assert m["tau_chain"]["2"] == 1.0


def test_tau_chain_counts_every_start_so_it_never_falls_with_k():
    """A chain valid at depth 1 only, the other valid at both. Counted for k=1 but not k=2 (a set of
    starts per k), its accepted token raised tau(1) above tau(2): tau fell as k grew; left out of every
    k (the starts valid through the deepest depth), tau moved with the depth measured. It counts at every
    k with the token it accepted, cut where its answer ends (as decoding cuts it) or where the stored
    answer leaves the target's greedy path (the truth unknown: then it is one of `chains_cut`)."""
    truth = torch.tensor([[1, 2], [1, 2]])
    pred = torch.tensor([[1, 0], [0, 0]])  # the short chain is right at depth 1, the other is wrong
    valid = torch.tensor([[True, False], [True, True]])
    ends = torch.tensor([[False, True], [False, False]])
    for ended, cut in ((ends, 0), (torch.zeros_like(ends), 1)):
        m = chain_acceptance(pred, truth, valid, ended)
        assert m["tau_chain"] == {"1": 1.5, "2": 1.5} and m["chain_starts"] == 2 and m["chains_cut"] == cut
        assert chain_acceptance(pred[:, :1], truth[:, :1], valid[:, :1], ended[:, :1])["tau_chain"] == {"1": 1.5}
        assert m["acceptance_by_depth"][0] == 0.5 and m["tau_chain"]["1"] == 1 + m["acceptance_by_depth"][0]


def _chains(n: int, depth: int, seed: int, unknown: float) -> tuple[torch.Tensor, ...]:
    """pred, truth, valid, ended [n, depth] of random chains: each answer ends after a random depth (or
    later), and with probability `unknown` per depth the stored answer leaves the target's greedy path."""
    g = torch.Generator().manual_seed(seed)
    truth = torch.randint(0, 3, (n, depth), generator=g)
    pred = torch.randint(0, 3, (n, depth), generator=g)
    ended = torch.arange(depth) >= torch.randint(1, depth + 2, (n, 1), generator=g)
    known = torch.rand(n, depth, generator=g) >= unknown
    known[:, 0] = True  # the first target token is always known (a chain starts on the stored answer)
    return pred, truth, torch.cummin(known, dim=1).values & ~ended, ended


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_tau_chain_is_non_decreasing_in_k(n, depth, seed):
    pred, truth, valid, ended = _chains(n, depth, seed, unknown=0.2)
    tau = chain_acceptance(pred, truth, valid, ended)["tau_chain"]
    values = [tau[str(k)] for k in range(1, depth + 1)]
    assert all(a <= b for a, b in zip(values, values[1:])), values
    assert 1.0 <= values[0] and values[-1] <= depth + 1


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(2, 6), st.integers(0, 2**32 - 1))
def test_tau_at_k_is_the_same_whatever_the_depth_measured(n, depth, seed):
    """tau(k) does not depend on --depth, with answers off the target's greedy path too: eval (depth 8),
    the doctor and training's held-out report (depth 5) give one figure for tau(5)."""
    pred, truth, valid, ended = _chains(n, depth, seed, unknown=0.2)
    deep = chain_acceptance(pred, truth, valid, ended)["tau_chain"]
    for k in range(1, depth):
        assert chain_acceptance(pred[:, :k], truth[:, :k], valid[:, :k], ended[:, :k])["tau_chain"][str(k)] \
            == pytest.approx(deep[str(k)])
        assert tree_tau(pred[..., None], truth, valid, k) == pytest.approx(deep[str(k)])  # top-1 tree: chain


def test_tree_tau_accepts_the_true_token_anywhere_in_the_top_k():
    truth = torch.tensor([[1, 2]])
    valid = torch.ones(1, 2, dtype=torch.bool)
    topk = torch.tensor([[[9, 1], [2, 9]]])  # right at rank 2, then at rank 1
    assert tree_tau(topk, truth, valid, depth=2) == 3.0
    assert tree_tau(topk[..., :1], truth, valid, depth=2) == 1.0


# --- end to end on a tiny target: alignment with the data's label shift, and the CLI ---------------

import json  # noqa: E402

import torch.nn.functional as F  # noqa: E402

from eyas.cli import main  # noqa: E402
from eyas.contract import contract_for_target  # noqa: E402
from eyas.data import capture, open_shards  # noqa: E402
from eyas.drafter import Drafter  # noqa: E402
from eyas.evaluate import evaluate_samples  # noqa: E402
from eyas.target import Target, target_config, target_tensors  # noqa: E402
from test_data import LAYERS, PROMPTS, save_tiny_target  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = save_tiny_target(tmp_path_factory.mktemp("target"))
    shards = tmp_path_factory.mktemp("shards") / "s"
    capture(Target.load(folder), PROMPTS, LAYERS, shards, max_new_tokens=12, batch_size=2, dtype="float32",
            progress=False)
    return folder, shards


class Oracle(Drafter):
    """Predicts, at step j and draft position t, the stored token `shift` places after the
    teacher-forced one: shift 0 is the truth on greedy data, anything else is misaligned. Its
    states are its logits (`head` is the identity)."""

    shift = 0

    def head(self, next_hidden):
        return next_hidden

    def forward_ttt(self, features, input_ids, steps, *, next_ids=None, position_ids=None, document_ids=None,
                    rows=None, logits=True):
        B, T = input_ids.shape
        # stream[i] = x_{i+1}: the given tokens, then the teacher-forced ones, then padding
        stream = torch.cat([input_ids[:, :1], next_ids, next_ids.new_zeros(B, steps + 1)], dim=1)
        start = 1 + self.shift  # the truth at step j and position t is x_{t+2+j} = stream[t+1+j]
        at = slice(None) if rows is None else rows
        return [F.one_hot(stream[:, start + j: start + j + T], self.contract.vocab_size).float()[:, at]
                for j in range(steps)]


def oracle(folder, shift):
    c = contract_for_target(target_config(folder), capture_layers=tuple(LAYERS))
    d = Oracle(c, embed_tokens=torch.zeros(c.vocab_size, c.hidden_size))
    d.shift = shift
    return d


def inner(samples, depth):
    """Samples whose chains never run past the stored tokens (the oracle knows only those)."""
    for s in samples:
        s["loss_mask"][-depth - 1:] = False
        yield s


def test_an_oracle_draft_is_accepted_at_every_depth(tiny):
    folder, shards = tiny
    lm_head = target_tensors(folder, ["lm_head.weight"])["lm_head.weight"]
    rep = evaluate_samples(oracle(folder, 0), inner(open_shards(shards), 4), lm_head, depth=4, tree_top_k=2,
                           tree_depth=3)
    assert rep["tokens"] > 15
    assert rep["acceptance_by_depth"] == [1.0] * 4
    n = rep["depth_counts"]  # every start counts (greedy answers), each chain cut where its answer ends
    assert rep["chain_starts"] == n[0] == rep["tokens"] and n[-1] < n[0]
    for k, tau in rep["tau_chain"].items():  # every token up to the answer's end accepted
        assert tau == pytest.approx(1 + sum(n[: int(k)]) / n[0])
    assert rep["coverage"] == 1.0


@pytest.mark.parametrize("shift", [1, -1])
def test_a_draft_off_by_one_position_is_rejected(tiny, shift):
    folder, shards = tiny
    lm_head = target_tensors(folder, ["lm_head.weight"])["lm_head.weight"]
    rep = evaluate_samples(oracle(folder, shift), inner(open_shards(shards), 3), lm_head, depth=3)
    assert rep["acceptance_by_depth"][0] < 0.5  # the aligned oracle gets 1.0; random answers repeat a little


def test_eval_cli_on_a_random_draft(tiny, tmp_path, capsys):
    folder, shards = tiny
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    capsys.readouterr()
    png = tmp_path / "acc.png"
    assert main(["eval", str(draft), "--data", str(shards), "--target", str(folder), "--json", "--depth", "4",
                 "--dtype", "fp32", "--plot", str(png)]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep["tau_chain"]) == {"1", "2", "3", "4"}
    assert len(rep["acceptance_by_depth"]) == 4
    taus = [rep["tau_chain"][str(k)] for k in range(1, 5)]
    assert taus == sorted(taus) and taus[-1] < 1.3  # a random draft is almost never right
    assert png.stat().st_size > 1000



def test_a_cache_row_longer_than_the_targets_context_is_said(tiny, tmp_path, capsys):
    """eyas capture refuses such rows; a cache written elsewhere may hold them: measured, and said."""
    from cache_writers import write_specforge

    folder, _ = tiny
    cache = tmp_path / "sf"
    ids = torch.randint(4, 40, (80,), generator=torch.Generator().manual_seed(0))  # the tiny target's context: 64
    write_specforge(Target.load(folder).model, [(ids, torch.ones(80, dtype=torch.long))], cache)
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(cache), "--target", str(folder), "--json", "--no-progress"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["data"]["longer_than_context"] == 1
    said = f"warning: 1 sample(s) of {cache} are longer than the target's context (64 tokens; the longest 80)"
    assert said in out.err
    assert "--limit" not in out.err  # none given
    assert main(["eval", str(draft), "--data", str(cache), "--target", str(folder), "--limit", "99", "--json",
                 "--no-progress"]) == 0  # more samples asked for than the cache holds: said, as for prompts
    said = json.loads(capsys.readouterr().out)["stderr_warnings"]
    assert f"--limit 99: {cache} has 1 sample; measuring it" in said


@pytest.mark.parametrize("ids", [[4, 40], [4]])
def test_a_cache_without_a_draft_position_is_refused_naming_it(tiny, tmp_path, capsys, ids):
    """Rows of 2 tokens or fewer hold no position the draft is measured at (it reads x_{t+1} and is
    labelled with x_{t+2}, both answer tokens): eval and the doctor refuse them naming the cache,
    rather than report 0 positions with nan acceptance."""
    from cache_writers import write_specforge

    from eyas.data.caches import open_cache
    from eyas.doctor.caches import measure_on_cache
    from eyas.errors import EyasError
    from eyas.target_ref import TargetRef

    folder, _ = tiny
    cache = tmp_path / "sf"
    write_specforge(Target.load(folder).model, [(torch.tensor(ids), torch.ones(len(ids), dtype=torch.long))], cache)
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(cache), "--target", str(folder), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"error: {cache}: no sample has a position the draft can be measured at (1 read;" in err, err
    assert "rows of 2 tokens or fewer" in err and "hint: " in err and "Traceback" not in err, err
    # the doctor, measuring the draft on the cache as stored (no full target at hand)
    with pytest.raises(EyasError, match=re.escape(f"{cache}: no sample has a position")):
        measure_on_cache(draft, open_cache(cache, num_layers=4), TargetRef.resolve(str(folder)), None, 5)

def test_eval_says_how_many_samples_had_no_position(tiny, tmp_path, capsys):
    """A sample with an empty loss_mask (a chat template the trainer's mask did not match) was skipped unsaid:
    the figures stood for fewer samples than the cache held, and nothing told the user."""
    from cache_writers import write_specforge

    folder, _ = tiny
    cache, draft = tmp_path / "sf", tmp_path / "draft"
    ids = torch.randint(3, 40, (12,), generator=torch.Generator().manual_seed(0))
    write_specforge(Target.load(folder).model, [(ids, torch.ones(12, dtype=torch.long)),
                                                (ids, torch.zeros(12, dtype=torch.long))], cache)
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    capsys.readouterr()
    assert main(["eval", str(draft), "--data", str(cache), "--target", str(folder), "--no-progress", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] == {"read": 2, "measured": 1}
    assert main(["eval", str(draft), "--data", str(cache), "--target", str(folder), "--no-progress"]) == 0
    assert "1 of the 2 samples read have no position the draft can be measured at" in capsys.readouterr().out


def test_eval_against_a_second_draft_reports_both_and_their_paired_difference(tiny, tmp_path, capsys):
    folder, shards = tiny
    lm_head = target_tensors(folder, ["lm_head.weight"])["lm_head.weight"]
    right, wrong = oracle(folder, 0), oracle(folder, 1)
    alone = evaluate_samples(wrong, inner(open_shards(shards), 3), lm_head, depth=3)
    rep = evaluate_samples(right, inner(open_shards(shards), 3), lm_head, depth=3, against=wrong)
    assert {k: rep["against"][k] for k in alone} == alone  # the second draft's figures as if measured alone
    d = rep["against"]["difference"]["acceptance_depth1"]
    assert d["difference"] == pytest.approx(1.0 - alone["acceptance_by_depth"][0])
    assert 0 < d["ci95"][0] <= d["difference"] <= d["ci95"][1] <= 1
    same = evaluate_samples(right, inner(open_shards(shards), 3), lm_head, depth=3, against=right)
    assert same["against"]["difference"]["tau_tree"] == {"difference": 0.0, "ci95": [0.0, 0.0]}
    lo, hi = rep["ci95"]["tau_chain"]["3"]
    n, tau = rep["depth_counts"], rep["tau_chain"]["3"]  # the oracle accepts every token up to the answers' ends
    assert tau == pytest.approx(1 + sum(n) / n[0]) and lo <= tau <= hi <= 4.0

    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    capsys.readouterr()
    png = tmp_path / "both.png"
    assert main(["eval", str(draft), "--data", str(shards), "--target", str(folder), "--depth", "2",
                 "--dtype", "fp32", "--against", str(draft), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.stat().st_size > 1000 and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert "95% intervals, resampling the" in out and f"against {draft}:" in out
    assert "this draft minus it, on the same samples: depth-1 +0.000 (95% +0.000 to +0.000)" in out


def test_eval_against_a_missing_draft_is_refused_before_loading(tiny, capsys):
    folder, shards = tiny
    assert main(["eval", "--data", str(shards), "--target", str(folder), "--against", "no-such-draft"]) == 2
    err = capsys.readouterr().err
    assert "no-such-draft does not exist (--against)" in err and "Traceback" not in err


def test_running_a_lone_config_file_is_refused_naming_it(tiny, tmp_path, capsys):
    """inspect and check read a lone config .json; eval (and every verb that runs the draft) needs the
    weights, and says so instead of listing every tensor the config names."""
    folder, shards = tiny
    assert main(["init", str(tmp_path / "d"), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    capsys.readouterr()
    config = tmp_path / "d" / "config.json"
    for drafts in ([str(config)], [str(tmp_path / "d"), "--against", str(config)]):
        assert main(["eval", *drafts, "--data", str(shards), "--target", str(folder)]) == 2
        err = capsys.readouterr().err
        assert f"{config} is a file: running the draft needs its folder" in err and "missing" not in err


def test_eval_against_a_draft_reading_other_layers_is_refused(tiny, tmp_path, capsys):
    folder, shards = tiny
    for name, layers in [("a", "1,2,4"), ("b", "0,2,4")]:
        assert main(["init", str(tmp_path / name), "--target", str(folder), "--capture-layers", layers]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "a"), "--data", str(shards), "--target", str(folder),
                 "--against", str(tmp_path / "b")]) == 2
    assert "one set of features cannot measure both" in capsys.readouterr().err


def test_eval_refuses_a_draft_for_another_target(tiny, tmp_path, capsys):
    folder, shards = tiny
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--capture-layers", "2,15,27"]) == 0  # for the embedded default
    assert main(["eval", str(draft), "--data", str(shards), "--target", str(folder)]) == 2
    assert "does not fit" in capsys.readouterr().err


# --- the seed scenario: a training pipeline's two-file export, evaluated offline -----------------


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""
    import socket

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_two_file_export_is_evaluated_offline_and_inspect_names_the_file(tiny, tmp_path, capsys, no_network):
    from eyas.formats import read_checkpoint, speculators_config, write_checkpoint

    folder, shards = tiny
    init = tmp_path / "init"
    assert main(["init", str(init), "--target", str(folder), "--capture-layers", "1,2,4"]) == 0
    ckpt = read_checkpoint(init)
    # what training pipelines export: a flat config.json (eagle) and config_speculators.json
    export = write_checkpoint(tmp_path / "export", ckpt.contract, ckpt.tensors, "eagle")
    (export / "config_speculators.json").write_text(json.dumps(speculators_config(ckpt.contract)))
    capsys.readouterr()

    assert main(["inspect", str(export), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["files"] == {"config.json": "eagle", "config_speculators.json": "speculators"}
    assert rep["config_used"] == "config_speculators.json"
    assert "speculators" in rep["reason"]

    assert main(["eval", str(export), "--data", str(shards), "--target", str(folder), "--json", "--depth", "2",
                 "--dtype", "fp32"]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["capture_layers"] == [1, 2, 4] and ev["tokens"] > 0


# --- evaluation computes later TTT steps at the chain starts only, exactly as the full unroll ------


def _random_drafter(folder, dtype=torch.float32) -> Drafter:
    from conftest import random_tensors

    c = contract_for_target(target_config(folder), capture_layers=tuple(LAYERS))
    embed = 0.5 * torch.randn(c.vocab_size, c.hidden_size, generator=torch.Generator().manual_seed(1))
    return Drafter.from_tensors(c, random_tensors(c), embed_tokens=embed, dtype=dtype)


@pytest.mark.parametrize("threads", [1, 2])
def test_forward_ttt_at_rows_is_the_full_unroll_there(threads):
    """The shipped draft's shapes, rows as eval picks them (at least ROWS_MIN), teacher-forced and free.
    Equal up to fp32 rounding, not bit for bit: the BLAS may pick another kernel for R rows than for
    T (with two threads on an AMX Xeon the logits, about 50 in size, differ by up to 3e-5)."""
    from eyas.drafter_loading import load_drafter
    from eyas.evaluate import ROWS_MIN
    from eyas.shift import label_ids

    d = load_drafter(None, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for T, R, teacher in [(60, ROWS_MIN, True), (200, 120, True), (300, 50, False), (400, 380, True)]:
            ids = torch.randint(0, d.contract.vocab_size, (1, T), generator=g)
            features = torch.randn(1, T, d.contract.fc_in_features, generator=g)
            rows = torch.randperm(T, generator=g)[:R].sort().values
            nxt = label_ids(ids) if teacher else None
            with torch.inference_mode():
                full = d.forward_ttt(features, ids, 8, next_ids=nxt)
                some = d.forward_ttt(features, ids, 8, next_ids=nxt, rows=rows)
            for j in range(8):
                torch.testing.assert_close(some[j], full[j][:, rows], rtol=0, atol=1e-3, msg=f"{T, R, teacher, j}")
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("block", [4, 256], ids=["block4", "block256"])
def test_forward_ttt_at_rows_skips_query_blocks_without_rows(tiny, monkeypatch, block):
    import eyas.ttt_attention as ttt
    from eyas.shift import label_ids

    monkeypatch.setattr(ttt, "QUERY_BLOCK", block)  # 4: rows fall in several query blocks, some in none
    d = _random_drafter(tiny[0])
    g = torch.Generator().manual_seed(3)
    T = 23
    ids = torch.randint(0, d.contract.vocab_size, (1, T), generator=g)
    features = torch.randn(1, T, d.contract.fc_in_features, generator=g)
    rows = torch.tensor([2, 3, 9, 10, 11, 12, 21])
    with torch.inference_mode():
        full = d.forward_ttt(features, ids, 5, next_ids=label_ids(ids))
        some = d.forward_ttt(features, ids, 5, next_ids=label_ids(ids), rows=rows)
    for j in range(5):  # tiny products over 7 rows may round differently from 23 (see ROWS_MIN)
        torch.testing.assert_close(some[j], full[j][:, rows], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows_min", [None, 1])
def test_sample_predictions_equal_the_full_unroll_at_the_chain_starts(tiny, monkeypatch, rows_min):
    """What eval reports comes from the full unroll's numbers at the chain starts (the tiny samples
    have fewer starts than ROWS_MIN: bit-identical; forced through the rows path: within rounding)."""
    import eyas.evaluate
    from eyas.evaluate import chain_truth, sample_predictions, target_greedy
    from eyas.shift import label_ids, shift_for_draft

    if rows_min is not None:
        monkeypatch.setattr(eyas.evaluate, "ROWS_MIN", rows_min)
    folder, shards = tiny
    d = _random_drafter(folder)
    lm_head = target_tensors(folder, ["lm_head.weight"])["lm_head.weight"]
    for sample in open_shards(shards):
        with torch.inference_mode():
            got = sample_predictions(d, sample, lm_head, 4, 3, measure=lambda logits, rows: logits)
            # the reference: every position at every step, then the chain starts
            s = shift_for_draft(sample)
            starts = sample["loss_mask"][1:].bool() & s["loss_mask"].bool()
            steps = d.forward_ttt(s["features"][None], s["input_ids"][None], 4, next_ids=label_ids(s["input_ids"])[None])
            logits = torch.stack(steps, dim=2)[0][starts]
            truth, valid = chain_truth(sample["input_ids"], target_greedy(sample, lm_head), 4)
        T = sample["input_ids"].shape[0]
        if rows_min is None:
            assert torch.equal(got["measured"], logits)
            assert torch.equal(got["topk"], d.to_target_ids(logits.topk(3, dim=-1).indices))
        else:
            torch.testing.assert_close(got["measured"], logits, rtol=1e-5, atol=1e-5)
        pos = torch.arange(T - 1)[starts][:, None] + 2 + torch.arange(4)  # the token each depth drafts: x_{t+2+j}
        answered = torch.cummin((pos < T) & sample["loss_mask"].bool()[pos.clamp(max=T - 1)], dim=1).values
        assert torch.equal(got["truth"], truth[: T - 1][starts]) and torch.equal(got["ended"], ~answered)
        assert torch.equal(got["valid"], valid[: T - 1][starts] & answered)  # no truth past the answer's end


def test_eval_of_the_shipped_draft_is_identical_with_rows_and_pruning(tmp_path, monkeypatch):
    """The report `eyas eval` gives (fp32, real answers of the embedded target) is exactly the one the
    full unroll at every position gives: later steps at the chain starts only, ended chains pruned."""
    import eyas.evaluate
    from eyas.data import read_prompts
    from eyas.drafter_loading import load_drafter

    target = Target.load(None, dtype=torch.float32)
    draft = load_drafter(None, dtype=torch.float32)
    capture(target, read_prompts("mtbench", limit=2), draft.contract.capture_layers, tmp_path / "s",
            max_new_tokens=40, dtype="float32", progress=False)
    lm_head = target.model.get_output_embeddings().weight.detach()
    samples = list(open_shards(tmp_path / "s"))
    assert all(int(s["loss_mask"].sum()) > eyas.evaluate.ROWS_MIN for s in samples)  # the rows path runs
    with torch.inference_mode():
        fast = evaluate_samples(draft, samples, lm_head, depth=8, tree_top_k=4, tree_depth=5)
        monkeypatch.setattr(eyas.evaluate, "ROWS_MIN", 10**9)  # every position, every step
        full = evaluate_samples(draft, samples, lm_head, depth=8, tree_top_k=4, tree_depth=5)
    assert fast == full and fast["acceptance_by_depth"][0] > 0.2


def test_the_chain_token_does_not_depend_on_the_tree_top_k():
    """Ties (common in bf16 logits) go to the lower id, as argmax breaks them, whatever k is."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (64, 300), generator=g).to(torch.bfloat16)  # every row full of ties
    first = scores.argmax(-1)
    for k in (1, 4, 5, 100, 300):
        top = top_ids(scores, k)
        assert torch.equal(top[:, 0], first) and top.shape == (64, k)
        assert torch.equal(scores.gather(-1, top), scores.topk(k, dim=-1).values)  # still the k largest
    assert torch.equal(top_ids(scores, 5), top_ids(scores, 300)[:, :5])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_top_ids_is_the_head_of_a_stable_sort(dtype):
    """Exactly the first k of the stable descending sort, ties straddling the k-th place or not, without
    sorting the whole vocabulary; empty rows and k past the vocabulary too."""
    g = torch.Generator().manual_seed(1)
    for scores in (torch.randint(0, 3, (50, 200), generator=g), torch.randn(3, 7, 500, generator=g),
                   torch.zeros(4, 30), torch.randn(0, 9, generator=g)):
        scores = scores.to(dtype)
        for k in (1, 2, 7, 30, 600):
            want = scores.sort(dim=-1, descending=True, stable=True).indices[..., :k]
            assert torch.equal(top_ids(scores, k), want), (scores.shape, k)

