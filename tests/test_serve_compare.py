"""serve-check's comparison without the engine: the replay of the engine's walk (`predict`), counts per
prompt that add up to the totals, and served minus predicted with its paired interval. The engine
itself is in tests/test_engine_vllm.py."""

from __future__ import annotations

import pytest
import torch
from test_data import save_tiny_target

from eyas.drafter_loading import load_drafter
from eyas.engines.compare import (count_tail, drafts_agreement, paired_difference, rates, sampled_agreement,
                                  samples_test)
from eyas.engines.predict import _walk, output_fit, predict, predict_sampled
from eyas.engines.serve_check import _difference_lines, _explain, _per_request, _steps, assess
from eyas.errors import EyasError, FormatError
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


def test_the_steps_matched_are_the_ones_the_engine_counted():
    """The proposal after a request's last token is recorded but never verified: dropped. Fewer recorded
    steps than counted is refused."""
    drafts = [[0, 5, [1, 2]], [0, 7, [3, 4]], [0, 9, [5, 6]], [1, 4, [7, 8]], [1, 6, [9, 9]]]
    assert _steps(drafts, [(2, [1, 0]), (1, [0, 0])], 2) == [[(5, [1, 2]), (7, [3, 4])], [(4, [7, 8])]]
    with pytest.raises(EyasError, match="more draft steps than eyas recorded for request 1"):
        _steps(drafts, [(2, [1, 0]), (3, [0, 0])], 2)


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
    one = paired_difference([(3, [1])], [(3, [0])], 1)  # one prompt: no interval, said so (it printed "(-)")
    assert _difference_lines(one) == ["  served minus predicted: +0.333 (one prompt: no interval; --limit 2 or more)"]


# --- sampled serving: an engine simulated on the tiny target, faithful or not -------------------------

T = 0.05  # the tiny random target's logits are flat (std 0.12): this gives it an entropy of about 2.1 nats


def _p(target, ids: list[int]):
    """softmax(logits / T) [len(ids), V] of the target over `ids`."""
    head = target.model.get_output_embeddings()
    with torch.inference_mode():
        return torch.softmax(head(target.forward(torch.tensor([ids]), [], with_logits=False).last_hidden[0])
                             .float() / T, -1)


def _simulate(target, prompts, new_tokens, k, gen, broken=False):
    """An engine that samples at T and drafts the target's own argmax tokens, verifying as vLLM's code
    reads: draft token d accepted with probability p(d); on a rejection a token from p with d removed;
    after k acceptances a bonus token from p. `broken`: the token after a rejection is uniform instead.
    Returns outputs, steps [(start, drafts)] and per-request (drafts, accepted by position)."""
    V = target.model.get_output_embeddings().weight.shape[0]
    outputs, steps, per = [], [], []
    for prompt in prompts:
        seq, taken, counts = list(prompt), [], [0] * k
        while len(seq) - len(prompt) < new_tokens:
            d: list[int] = []
            for _ in range(k):
                d.append(int(_p(target, seq + d)[-1].argmax()))
            p = _p(target, seq + d)  # the bonus token needs the last one too
            taken.append((len(seq) - 2, d))
            n = len(seq)
            for i in range(k):
                pi = p[n - 1 + i]
                if torch.rand((), generator=gen) < pi[d[i]]:
                    seq.append(d[i])
                    counts[i] += 1
                    continue
                rest = pi.clone()
                rest[d[i]] = 0
                seq.append(int(torch.randint(V, (), generator=gen)) if broken
                           else int(torch.multinomial(rest / rest.sum(), 1, generator=gen)))
                break
            else:
                seq.append(int(torch.multinomial(p[n - 1 + k], 1, generator=gen)))
        outputs.append(seq[len(prompt): len(prompt) + new_tokens])
        steps.append(taken)
        per.append((len(taken), counts))
    return outputs, steps, per


@pytest.fixture(scope="module")
def served(tiny):
    target, _ = tiny
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 48, (6,), generator=gen).tolist() for _ in range(8)]
    return target, prompts, _simulate(target, prompts, 32, 3, gen), _simulate(target, prompts, 32, 3, gen, broken=True)


def test_a_faithful_sampling_engine_agrees_with_the_expectation_on_its_own_steps(served):
    """The simulated engine follows the rule eyas predicts: served counts within noise of the expected
    ones, and its tokens fit the target's distribution (|z| well inside the 1% level's 2.6)."""
    target, prompts, (outputs, steps, per), _ = served
    assert sum(c[1] for _, c in per) > 10  # deep enough to test the products, not only depth 1
    sp = predict_sampled(target, prompts, outputs, steps, 3, T)
    assert [d for d, _ in sp.per_sequence] == [d for d, _ in per]
    counts = [sum(c[i] for _, c in per) for i in range(3)]
    expected = [sum(e[i] for _, e in sp.per_sequence) for i in range(3)]
    ok, tests = sampled_agreement(rates(counts, sum(d for d, _ in per)), sp.chances)
    assert ok and all(abs(t["z"]) < 4 and t["p"] > 1e-4 for t in tests), tests
    assert [t["predicted"] * sum(d for d, _ in per) for t in tests] == pytest.approx(expected)
    fit = samples_test(sp, 48)
    assert fit["tokens"] == 8 * 32 and abs(fit["z"]) < 4 and fit["faithful"], fit


def test_an_engine_whose_tokens_after_a_rejection_are_wrong_is_caught(served):
    target, prompts, _, (outputs, steps, per) = served
    fit = output_fit(target, prompts, outputs, T)
    t = samples_test(fit, 48)
    assert not t["faithful"] and t["z"] > 4 and t["mean_surprisal"] > t["mean_entropy"]


def test_records_that_cannot_be_matched_are_not_called_a_draft_that_cannot_run(served, tmp_path):
    """At a temperature, per-request counters that do not add up to the engine's totals leave its steps
    unmatched: the report says so, not that eyas cannot run the draft."""
    target, prompts, (outputs, steps, per), _ = served
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(target.path), "--capture-layers", "1,2,3"]) == 0
    totals = {"num_drafts": sum(d for d, _ in per), "accepted_per_pos": [sum(c[i] for _, c in per) for i in range(3)]}
    run = {"loaded": True, "error": None, "outputs": outputs, "counters": totals,
           "drafts": [[r, start, d] for r, taken in enumerate(steps) for start, d in taken],
           "per_request": [{"num_drafts": d + 1, "accepted_per_pos": c} for d, c in per]}  # one draft too many each
    rep = assess(draft, target, prompts, run, 3, engine_version="test", dump=None, doctor=False, temperature=T)
    assert not rep["agree"] and rep["drafts_compared"] is not None
    problems = " ".join(rep["check"]["problems"])
    assert "cannot match the engine's records" in problems and "cannot run the draft" not in problems


def test_drafts_the_engine_computed_otherwise_are_a_disagreement():
    """The same prefixes and weights in fp32 draft the same first token at every chain start; an engine
    that drafts another at over 5% of at least 20 disagrees, and the explanation says so, even where
    acceptance stayed within noise (a window one position wider: 80% of 161, acceptance 1.210 vs 1.218)."""
    assert drafts_agreement(None) and drafts_agreement({"drafts": 19, "first_token_same": 0.5})
    assert drafts_agreement({"drafts": 161, "first_token_same": 0.96})
    assert not drafts_agreement({"drafts": 161, "first_token_same": 0.795})
    report = {"wiring": {"differences": []}, "positions": [], "samples": None, "consumer_view": [],
              "engine_version": "test", "predicted": {}, "drafts_compared": {"drafts": 161, "first_token_same": 0.795}}
    said = _explain(report, {"mismatches": [], "notes": []})
    assert said == ["drafts: vLLM's first draft token is eyas's at 80% of 161 chain starts, where the same prefixes "
                    "and weights in fp32 share 95% or more: the engine feeds or computes the draft otherwise (its "
                    "attention, rope, norms or embeddings)"]
    report["wiring"]["differences"] = ["capture layers: the engine fed [1, 14, 26], the contract says [2, 15, 27]"]
    said = _explain(report, {"mismatches": [], "notes": []})  # a wiring found is the cause named, not the others
    assert said[0].startswith("wiring: capture layers") and said[1].endswith("otherwise (the wiring above)")


def test_what_check_predicted_for_vllm_comes_with_its_fix():
    """The text report named a norm flag vLLM reads otherwise but not its fix, which only --json carried."""
    from eyas.codes import finding

    m = finding("consumer_norm_flags", "norm_before_residual", "uses norm_before_residual=True, the contract says "
                "False", "write every norm flag explicitly")
    report = {"wiring": {"differences": []}, "positions": [], "samples": None, "consumer_view": [],
              "engine_version": "test", "predicted": {}, "drafts_compared": None}
    said = _explain(report, {"mismatches": [m, m], "notes": []})
    assert said == ["eyas check predicted for vLLM: uses norm_before_residual=True, the contract says False; uses "
                    "norm_before_residual=True, the contract says False", "fix: write every norm flag explicitly"]


def test_the_served_count_is_judged_by_its_exact_distribution():
    """Steps with known chances: the count's exact tail decides, not the normal approximation, which
    overstates the upper tail where few acceptances are expected."""
    ok, tests = sampled_agreement({"drafts": 4, "accepted_by_position": [2, 1]}, [[0.5] * 4, [0.25] * 4])
    assert ok and [t["z"] for t in tests] == [0.0, 0.0] and [t["p"] for t in tests] == [1.0, 1.0]
    ok, tests = sampled_agreement({"drafts": 400, "accepted_by_position": [100]}, [[0.5] * 400])
    assert not ok and tests[0]["z"] == pytest.approx(-10.0) and tests[0]["p"] < 1e-20
    ok, tests = sampled_agreement({"drafts": 10, "accepted_by_position": [2]}, [[0.03] * 10])
    assert tests[0]["z"] > 3 and ok  # normal: p 0.0016; exact: 2 x P(X >= 2) = 0.069


def test_the_exact_tail_is_the_binomial_one_for_equal_chances():
    from scipy.stats import binom

    for n, q, c in ((20, 0.3, 2), (20, 0.3, 11), (50, 0.05, 0), (7, 0.9, 7)):
        want = min(1.0, 2 * min(binom.cdf(c, n, q), binom.sf(c - 1, n, q)))
        assert count_tail([q] * n, c) == pytest.approx(want, rel=1e-9)
    assert count_tail([0.5] * 3, 4) == 0.0  # more than there were trials


def test_the_engine_is_given_no_longer_a_context_than_the_targets(tiny, tmp_path):
    """vLLM refuses a max_model_len beyond the model's: the tiny target's 64, not serve-check's 1024."""
    from eyas.data import read_prompts
    from eyas.engines.serve_check import engine_job, prompt_ids

    target, _ = tiny
    assert engine_job(target, [[1, 2, 3]], [], 4)["max_model_len"] == 64
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello world\n" + "hello world " * 30 + "\n", encoding="utf-8")  # ~70 tokens: fits 1024 only
    assert len(prompt_ids(target, prompts, read_prompts(prompts, limit=1), 4)) == 1
    with pytest.warns(UserWarning, match=r"1 of 2 prompts do not fit the 64 tokens serve-check gives vLLM with 4 new "
                                         r"ones and are left out \(first: p.txt line 2, \d+ tokens\)"):
        assert len(prompt_ids(target, prompts, read_prompts(prompts), 4)) == 1  # left out, and said (it was unsaid)
    (tmp_path / "long.txt").write_text("hello world " * 30 + "\n", encoding="utf-8")
    with pytest.raises(EyasError, match=r"no prompt of .*long.txt fits the 64 tokens"):
        prompt_ids(target, tmp_path / "long.txt", read_prompts(tmp_path / "long.txt"), 4)


def test_an_unusable_draft_is_refused_before_the_target_loads_or_the_engine_starts(tiny, tmp_path, monkeypatch):
    import importlib

    sc = importlib.import_module("eyas.engines.serve_check")  # the package exports its function under that name
    target, _ = tiny
    monkeypatch.setattr(sc, "engine_python", lambda name: None)  # as if vLLM were installed
    monkeypatch.setattr(sc.Target, "load", lambda *a, **k: pytest.fail("the target was loaded"))
    (tmp_path / "notdraft").mkdir()
    with pytest.raises(FormatError, match="notdraft"):
        sc.serve_check(tmp_path / "notdraft", target=target.path)
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(target.path), "--capture-layers", "1,2,3"]) == 0
    with pytest.raises(EyasError, match=r"--max-new-tokens 64 leaves no room for a prompt in the 64 tokens"):
        sc.serve_check(draft, target=target.path, max_new_tokens=64)
    (draft / "model.safetensors").unlink()
    with pytest.raises(FormatError, match=r"draft: no weights"):
        sc.serve_check(draft, target=target.path)


def test_an_engine_that_fails_while_generating_is_one_error_line_under_its_traceback(tiny, tmp_path, capsys):
    """The worker's traceback was inside the `error:` line (and JSON's error): now the engine's `vllm|` lines."""
    target, _ = tiny
    draft = tmp_path / "draft"
    assert main(["init", str(draft), "--target", str(target.path), "--capture-layers", "1,2,3"]) == 0
    capsys.readouterr()
    run = {"loaded": True, "error": "RuntimeError: Unsupported CPU attention configuration: head_dim=8\n"
           "Traceback (most recent call last):\n  File \"vllm_worker.py\", line 250", "outputs": []}
    with pytest.raises(EyasError) as e:
        assess(draft, target, [[5, 6]], run, 2, engine_version="test", dump=None, doctor=False)
    assert str(e.value) == ("vLLM loaded the draft but failed while generating: RuntimeError: Unsupported CPU "
                            "attention configuration: head_dim=8") and "vllm|" in e.value.hint
    assert capsys.readouterr().err.splitlines() == ["vllm| Traceback (most recent call last):",
                                                    'vllm|   File "vllm_worker.py", line 250']


def test_a_worker_that_dies_is_one_error_line_under_its_own_log_lines(tmp_path, monkeypatch, capsys):
    """vLLM's traceback is the engine's words: printed as `vllm|` lines, then eyas's one-line error with its
    last line (it was folded into the error itself, between `error:` and `hint:`)."""
    import stat

    from eyas.engines import launch
    from eyas.errors import EyasError

    py = tmp_path / "vllm" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/sh\necho 'Traceback (most recent call last):'\necho 'ValueError: head_dim 8 unsupported'\n"
                  "exit 3\n")
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(launch.ENGINES_ENV, str(tmp_path))
    with pytest.raises(EyasError) as e:
        launch.run_vllm({"runs": [], "prompts": []}, timeout=60, progress=False)
    assert str(e.value) == "the vLLM worker exited with code 3 and no result: ValueError: head_dim 8 unsupported"
    assert "\n" not in str(e.value) and "vllm|" in e.value.hint
    assert capsys.readouterr().err.splitlines() == ["vllm| Traceback (most recent call last):",
                                                    "vllm| ValueError: head_dim 8 unsupported"]
