"""eyas.bench and eyas.generate: `eyas bench` / `eyas generate` on a tiny random chat target and a tiny random draft saved to
disk (nothing downloaded). Speed is measured in benchmarks/, never asserted here."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import fake_dtype_measurement, random_tensors, tiny_contract
from test_data import save_tiny_target
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import eyas.bench.sweep as sweep_module
from eyas import bench
from eyas.bench import METHODS, format_bench, run_bench
from eyas.generate import TO_MEASURE
from eyas import dtype_choice
from eyas.bench.timing import Run, spread, summary
from eyas.contract import Verifier
from eyas.data import eos_ids
from eyas.decode import DEFAULT_DRAFT_TOKENS, DecodeStats, DraftTree, bf16_kernel, generate
from eyas.draft_shape import decode_shape, parse_tree, read_best_shape, save_best_shape
from eyas.drafter_loading import load_drafter
from eyas.embedded import cache_dir
from eyas.dtype_choice import hf_dtypes, resolve_dtype
from eyas.dtypes import to_dtype
from eyas.errors import ContractError, EyasError
from eyas.formats import write_checkpoint
from eyas.generate import (
    DECODE_DTYPES,
    MEASURED_NOW,
    NGRAM_TOKENS,
    TARGET_ALONE,
    TextStream,
    chat_ids,
    format_generate,
    run_generate,
)
from eyas.machine import cpu_class, cpu_flags, measured_file
from eyas.target import Target

PROMPTS = [  # words of test_data's word-level vocabulary
    {"prompt": "tell me a story about the cat", "category": "story"},
    {"prompt": "why is the sky blue", "category": "science"},
    {"prompt": "hello world how are you today", "category": "story"},
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test gets its own shape cache; the user's is never read or written."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(autouse=True)
def no_quick_sweep(request, monkeypatch):
    """Bench and generate measure a shape when none is cached (the quick sweep); tests that do not
    test it see the uncached defaults (None: nothing was measured)."""
    if "real_quick_sweep" not in request.fixturenames:
        monkeypatch.setattr(sweep_module, "quick_sweep", lambda *a, **kw: None)


@pytest.fixture
def real_quick_sweep():
    """Opts a test out of no_quick_sweep."""


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(target folder, draft folder): test_data's chat target with sharper random weights
    (initializer_range 0.3: greedy choices are not decided by rounding) and a random draft for it."""
    folder = save_tiny_target(tmp_path_factory.mktemp("target"))
    config = LlamaConfig.from_pretrained(folder)
    config.initializer_range = 0.3
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    contract = tiny_contract(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
        vocab_size=48, draft_vocab_size=32, target_hidden_size=32, capture_layers=(1, 2, 3),
        verifier=Verifier(name_or_path=str(folder), architectures=("LlamaForCausalLM",), num_hidden_layers=4,
                          hidden_size=32, vocab_size=48),
    )
    draft = write_checkpoint(folder.parent / "draft", contract, random_tensors(contract), "speculators")
    return folder, draft


def prompt_file(tmp_path, records=PROMPTS, name="p.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def decode_tau(target, draft, shape: dict, *, max_new_tokens: int, ngram_tokens: int) -> float:
    """tau over PROMPTS of decode.generate with `shape` and an n-gram branch (fp32, greedy, stop at end
    of turn): the tokens every round produced over the rounds, summed over the prompts."""
    target_model = Target.load(target, dtype=torch.float32)
    drafter = load_drafter(draft, target=target)
    produced = rounds = 0
    for record in PROMPTS:
        ids = chat_ids(target_model, record["prompt"], max_new_tokens=max_new_tokens)
        _, stats = generate(target_model, drafter, ids, max_new_tokens=max_new_tokens,
                            stop_ids=eos_ids(target_model), **decode_shape(shape, ngram_tokens))
        produced += sum((a + 1) * c for a, c in enumerate(stats["accept_counts"]))
        rounds += stats["rounds"]
    return produced / rounds


def test_run_bench_all_methods(saved, tmp_path):
    target, draft = saved
    png = tmp_path / "speedup.png"
    rep = run_bench(draft, prompts=prompt_file(tmp_path), target=target, dtype="fp32", max_new_tokens=6,
                    plot=png, progress=False)
    json.dumps(rep)  # JSON-ready
    assert set(rep["methods"]) == set(METHODS)
    for name, m in rep["methods"].items():
        assert {"tokens_per_s", "speedup", "tau", "greedy_identical", "acceptance_by_depth", "time_split"} <= set(m)
        assert m["tokens_per_s"] > 0 and m["new_tokens"] > 0
    assert rep["methods"]["hf_greedy"]["speedup"] == 1.0
    for name in ("hf_greedy", "eyas_target", "eyas_chain", "eyas_tree"):  # lossless greedy, fp32
        assert rep["methods"][name]["greedy_identical"], name
        assert rep["methods"][name]["identical_prompts"] == 3
    assert rep["methods"]["hf_greedy"]["tau"] is None and rep["methods"]["hf_prompt_lookup"]["tau"] is None
    assert rep["methods"]["eyas_target"]["tau"] == 1.0
    for name, depth in (("eyas_chain", 4), ("eyas_tree", 5)):  # the default shapes: chain k=4, tree depth 5
        tau = rep["methods"][name]["tau"]
        assert 1.0 <= tau <= 1 + depth, name  # a round yields its accepted draft tokens + 1
        # the same greedy decode calls, pooled by hand: what bench reports is what decode counted
        assert tau == pytest.approx(decode_tau(target, draft, rep["shapes"][name], max_new_tokens=6,
                                               ngram_tokens=rep["ngram_tokens"])), name
    chain = rep["methods"]["eyas_chain"]
    # depths up to the chain's and the n-gram branch's (the bench's default: NGRAM_TOKENS)
    assert rep["ngram_tokens"] == NGRAM_TOKENS
    assert len(chain["acceptance_by_depth"]) == max(rep["shapes"]["eyas_chain"]["draft_tokens"], NGRAM_TOKENS)
    assert sum(chain["time_split"].values()) == pytest.approx(1.0)
    assert rep["shapes"]["source"] == {"eyas_chain": "default", "eyas_tree": "default"}
    # no quick-sweep question fits this tiny target's context: generate times nothing and decodes the default
    assert rep["shapes"]["generate"] == {"shape": {"draft_tokens": DEFAULT_DRAFT_TOKENS}, "source": "default"}
    assert "eyas generate decodes with chain k=" in format_bench(rep)
    # per-prompt ratios to hf_greedy (run back to back): hf_greedy's own are all 1
    assert rep["methods"]["hf_greedy"]["per_prompt_speedup"] == {"median": 1.0, "q25": 1.0, "q75": 1.0}
    assert rep["methods"]["hf_greedy"]["speedup_ci95"] == pytest.approx([1.0, 1.0])
    for m in rep["methods"].values():
        p = m["per_prompt_speedup"]
        assert p["q25"] <= p["median"] <= p["q75"] and m["cpu_tokens_per_s"] > 0 and m["cpu_speedup"] > 0
        assert 0 < m["speedup_ci95"][0] <= m["speedup_ci95"][1]
        assert 0 < m["cpu_speedup_ci95"][0] <= m["cpu_speedup_ci95"][1]
    # categories from the file; the per-category numbers pool exactly their prompts
    assert list(rep["categories"]) == ["story", "science"]
    story = rep["categories"]["story"]
    assert story["prompts"] == 2 and story["methods"]["hf_greedy"]["speedup"] == 1.0
    assert [p["origin"] for p in rep["prompts"]] == ["p.jsonl line 1", "p.jsonl line 2", "p.jsonl line 3"]
    for name in METHODS:
        new = sum(p["new_tokens"][name] for p in rep["prompts"])
        assert rep["methods"][name]["new_tokens"] == new
        assert story["methods"][name]["new_tokens"] + rep["categories"]["science"]["methods"][name]["new_tokens"] == new
    env = rep["environment"]
    assert env["torch"] == torch.__version__ and env["threads"] == 1 and env["dtype"] == "fp32"
    assert env["cpu_flags"] == cpu_flags() and rep["dtype_source"] == "given"
    # the terms of speedup = tau x T(1) / (T_verify + draft), per drafting method, from the same run
    terms = rep["speedup_terms"]
    assert set(terms) == {"eyas_chain", "eyas_tree"}
    for name, t in terms.items():
        m = rep["methods"][name]
        assert t["tau"] == m["tau"] and t["T_verify_ms"] == m["ms_per_round"]["verify"] > 0
        assert t["T1_ms"] == rep["methods"]["eyas_target"]["ms_per_round"]["verify"]
        assert t["predicted"] == pytest.approx(t["tau"] * t["T1_ms"] / (t["T_verify_ms"] + t["draft_ms"]))
    assert "eyas_commit" in env
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = format_bench(rep)
    assert all(name in table for name in METHODS) and "chain k=4" in table and "speedup by category" in table
    rows = table.splitlines()
    head = next(i for i, r in enumerate(rows) if r.startswith("method "))
    at = rows[head].index("dtype")  # every row's dtype under the header's, however long a method's label
    assert all(r[at:at + 5].strip() in ("bf16", "fp32") for r in rows[head + 1:head + 1 + len(METHODS)]), table


def test_sweep_writes_and_reads_the_best_shape(saved, tmp_path, capsys):
    target, draft = saved
    files = prompt_file(tmp_path)
    name = Target.load(target).name
    assert read_best_shape(name, draft, "bf16") is None
    rep = run_bench(draft, prompts=files, target=target, dtype="bf16", max_new_tokens=5, limit=2, progress=False)
    assert rep["num_prompts"] == 2 and rep["sweep"] is None
    rep = run_bench(draft, prompts=files, target=target, dtype="bf16", max_new_tokens=5, limit=2, sweep=True,
                    progress=False)
    sweep = rep["sweep"]
    assert [r["shape"] for r in sweep["results"]] == (  # short chains also with shorter n-gram branches, or none
        [{"draft_tokens": k} for k in bench.SWEEP_CHAINS]
        + [{"draft_tokens": k, "ngram_tokens": n} for k in sweep_module.SWEEP_PLAIN_CHAINS for n in (0, 2, 4)]
        + [{"tree": list(t)} for t in bench.SWEEP_TREES])
    fastest_chain = max((r for r in sweep["results"] if "draft_tokens" in r["shape"]), key=lambda r: r["tokens_per_s"])
    assert sweep["best_chain_ngram"] == fastest_chain["shape"].get("ngram_tokens", 8)
    assert rep["shapes"]["eyas_chain"].get("ngram_tokens", 8) == sweep["best_chain_ngram"]
    assert sweep["best"] in [r["shape"] for r in sweep["results"]]
    assert sweep["best_tokens_per_s"] == max(r["tokens_per_s"] for r in sweep["results"])
    assert rep["shapes"]["eyas_chain"]["draft_tokens"] == sweep["best_chain"]
    assert rep["shapes"]["eyas_tree"] == {"tree": sweep["best_tree"]}
    assert rep["shapes"]["source"]["eyas_tree"] == "sweep"
    path = tmp_path / "cache" / "eyas" / "best_shape.json"
    assert sweep["cache"] == str(path)
    stored = json.loads(path.read_text())
    assert len(stored) == 1 and not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    # target and its weights as written, drafter and its weights, dtype, machine, cpus, instruction sets,
    # dispatched set, threads, torch, eyas's bf16 kernel
    key = json.loads(next(iter(stored)))
    weights, target_weights = (draft / "model.safetensors").stat(), (target / "model.safetensors").stat()
    assert key[:5] == [name, [["model.safetensors", target_weights.st_size, target_weights.st_mtime_ns]],
                       str(draft.resolve()), [["model.safetensors", weights.st_size, weights.st_mtime_ns]],
                       "bf16"] and key[6] == os.cpu_count()
    assert key[7:] == [cpu_flags(), torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(),
                       torch.__version__, bf16_kernel.available()]
    assert sweep["beats_target"] == (sweep["best_tokens_per_s"] > sweep["target_tokens_per_s"])
    entry = read_best_shape(name, draft, "bf16")
    assert entry["best"] == sweep["best"] and entry["max_new_tokens"] == 5
    assert read_best_shape(name, draft, "fp32") is None  # keyed by dtype
    # later runs use the cached shapes: bench, and generate when no shape is given
    again = run_bench(draft, prompts=files, target=target, dtype="bf16", max_new_tokens=5, limit=1, progress=False)
    assert again["shapes"]["eyas_chain"] == rep["shapes"]["eyas_chain"]
    assert again["shapes"]["source"] == {"eyas_chain": "sweep cache", "eyas_tree": "sweep cache"}
    # generate decodes with the sweep's best, or with the target alone where nothing beat it
    used = (sweep["best"], "sweep cache") if sweep["beats_target"] else (None, TARGET_ALONE)
    out = run_generate(draft, "hello world", target=target, dtype="bf16", max_new_tokens=5)
    assert (out["shape"], out["shape_source"]) == used
    out = run_generate(draft, "hello world", target=target, dtype="bfloat16", max_new_tokens=5)
    assert out["shape"] == used[0] and out["dtype"] == "bf16"  # transformers' spelling, the same entry
    out = run_generate(draft, "hello world", target=target, dtype="bf16", max_new_tokens=5, tree="2,2,2")
    assert out["shape"] == {"tree": [2, 2, 2]} and out["shape_source"] == "given"
    # a broken cache is reported and ignored, then replaced by the next save, kept beside (its other entries)
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="ignoring the shape cache"):
        assert read_best_shape(name, draft, "bf16") is None
    with pytest.warns(UserWarning, match=r"ignoring the shape cache .* \(kept as .*best_shape.json.unreadable; "):
        save_best_shape(name, draft, "bf16", stored[json.dumps(key)])
    assert read_best_shape(name, draft, "bf16") == stored[json.dumps(key)]
    assert (path.parent / "best_shape.json.unreadable").read_text() == "{not json"


def test_run_generate_streams_the_answer(saved):
    target, draft = saved
    pieces = []
    out = run_generate(draft, "tell me a story about the cat", target=target, dtype="fp32", max_new_tokens=8,
                       draft_tokens=2, stream=pieces.append)
    assert "".join(pieces) == out["text"] and out["text"]
    assert out["shape"] == {"draft_tokens": 2} and out["shape_source"] == "given"
    assert out["stopped"] or len(out["tokens"]) == 8
    ref = run_generate(None, "tell me a story about the cat", target=target, dtype="fp32", max_new_tokens=8)
    assert ref["tokens"] == out["tokens"] and ref["shape"] is None
    assert out["stats"]["new_tokens"] == len(out["tokens"])
    assert f"tokens/s on CPU {cpu_class()}, " in format_generate(out) and "tau" in format_generate(out)
    assert out["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None}  # reproducible from it
    with pytest.raises(EyasError, match="need a drafter"):
        run_generate(None, "hello", target=target, dtype="fp32", max_new_tokens=4, draft_tokens=2)


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte, GPT-2 style: a multi-byte character spans several tokens."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE({c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_text_stream_holds_back_partial_characters():
    tok = byte_level_tokenizer()
    text = "naïve café: 日本語 ok 🙂!"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))
    pieces = []
    stream = TextStream(tok, pieces.append)
    for i in ids:
        stream([i])
    stream.close()
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    cut = []  # an answer cut inside a character: the remainder is written on close
    stream = TextStream(tok, cut.append)
    stream(tok("é")["input_ids"][:1])
    assert cut == []
    stream.close()
    assert cut == ["\ufffd"]


def test_a_shape_given_is_timed_without_a_sweep(saved, tmp_path, monkeypatch):
    """`--draft-tokens K` alone times chain k=K and the cached or default tree: no quick sweep (minutes)
    for the shape not asked for; with neither given the sweep is measured as before."""
    import eyas.bench.run as run_module

    target, draft = saved
    asked = []
    monkeypatch.setattr(run_module, "measure_shape", lambda *a, **k: asked.append(1))
    monkeypatch.setattr(run_module, "quick_prompt_ids", lambda t: [[1, 2]])  # as if a sweep question fit it
    rep = run_bench(draft, prompts=prompt_file(tmp_path), target=target, dtype="fp32", max_new_tokens=3, limit=1,
                    draft_tokens=2, progress=False)
    assert not asked and rep["shapes"]["eyas_chain"] == {"draft_tokens": 2}
    assert rep["shapes"]["source"] == {"eyas_chain": "given", "eyas_tree": "default"}
    assert rep["shapes"]["generate"] == {"shape": None, "source": TO_MEASURE}  # generate would time shapes first
    assert f"eyas generate decodes with a measured shape: {TO_MEASURE}" in format_bench(rep)
    run_bench(draft, prompts=prompt_file(tmp_path), target=target, dtype="fp32", max_new_tokens=3, limit=1,
              progress=False)
    assert asked == [1]


def test_acceptance_pools_exactly_over_calls():
    """Per-depth acceptance pooled over prompts equals the acceptance of all their rounds together."""
    chain = DraftTree(torch.arange(4), [-1, 0, 1, 2], [0, 1, 2, 3])
    tree = DraftTree(torch.arange(5), [-1, 0, 0, 1, 3], [0, 1, 1, 2, 3])
    calls = [  # (draft, accepted path) per round; some calls never accept a depth at all
        [(chain, []), (chain, [1]), (chain, [1, 2, 3])],
        [(chain, []), (chain, [])],
        [(tree, [2]), (tree, [1, 3]), (tree, []), (tree, [1, 3, 4])],
        [(chain, [1, 2]), (tree, [1])],
        # depth 2 never accepted, tried once (an n-gram branch under a 1-token chain): a ratio of 0 hides
        # how often it was tried; the rounds that stopped at depth 1 (4) are not it
        [(DraftTree(torch.arange(3), [-1, 0, 1], [0, 1, 2]), [1])] + [(DraftTree(torch.arange(2), [-1, 0], [0, 1]),
                                                                      [1])] * 3,
    ]
    runs, pooled = [], DecodeStats(3)
    for rounds in calls:
        one = DecodeStats(3)
        for draft, path in rounds:
            one.round(draft, path)
            pooled.round(draft, path)
        runs.append(Run([0], 1.0, one.result(1)))
    pooled_summary = summary(runs, runs)
    want = pooled.result(1)
    assert pooled_summary["acceptance_by_depth"] == pytest.approx(want["acceptance_by_depth"])
    assert pooled_summary["tau"] == pytest.approx(want["tau"])


def test_a_draft_for_another_target_is_refused_before_the_target_loads(saved, tmp_path, monkeypatch):
    target, _ = saved
    contract = tiny_contract()  # vocab 256, hidden 64: not this target's
    draft = write_checkpoint(tmp_path / "other", contract, random_tensors(contract), "speculators")
    monkeypatch.setattr(Target, "load", lambda *a, **k: pytest.fail("target loaded for a draft that cannot fit"))
    with pytest.raises(ContractError, match="does not fit"):
        run_generate(draft, "hello", target=target, dtype="fp32", max_new_tokens=8)  # the prompt fits the context
    with pytest.raises(ContractError, match="does not fit"):
        run_bench(draft, prompts=prompt_file(tmp_path), target=target, dtype="fp32", max_new_tokens=8, progress=False)


def test_prompt_longer_than_the_context_is_named(saved, tmp_path):
    target, draft = saved
    long = {"prompt": " ".join(["hello world"] * 30)}
    with pytest.raises(EyasError, match="p.jsonl line 2: the prompt is .* tokens"):
        run_bench(draft, prompts=prompt_file(tmp_path, [PROMPTS[0], long]), target=target, dtype="fp32",
                  max_new_tokens=8, progress=False)
    with pytest.raises(EyasError, match="the prompt: it is .* tokens"):
        run_generate(draft, long["prompt"], target=target, dtype="fp32", max_new_tokens=8)


def test_option_parsing():
    assert parse_tree("5,4,16") == (5, 4, 16) and parse_tree([3, 2, 8]) == (3, 2, 8) and parse_tree(None) is None
    for bad in ("5,4", "a,b,c", "5,0,16"):
        with pytest.raises(EyasError, match="depth,top_k,budget"):
            parse_tree(bad)
    assert to_dtype("bf16", DECODE_DTYPES) is torch.bfloat16 and to_dtype(torch.float32, DECODE_DTYPES) is torch.float32
    assert to_dtype("bfloat16", DECODE_DTYPES) is torch.bfloat16 and to_dtype("float32", DECODE_DTYPES) is torch.float32
    for run in (lambda: run_generate(None, "hello", dtype="fp16"), lambda: run_bench("no-draft", dtype="float16")):
        with pytest.raises(EyasError, match="dtype '(fp|float)16' is not supported") as e:  # before any model loads
            run()
        assert "bf16 (bfloat16) or fp32 (float32)" in e.value.hint
    assert not cache_dir().exists()  # the default target was not converted: nothing loaded (24 s, 2-core AVX2 EPYC)


def test_a_sweep_that_nothing_beat_decodes_with_the_target_alone(saved, tmp_path):
    """The shape cache's verdict decides: a best shape slower than the target alone is not used."""
    target, draft = saved
    name = Target.load(target).name
    entry = {"best": {"tree": [2, 2, 3]}, "best_chain": 2, "best_tree": [2, 2, 3], "best_tokens_per_s": 9.0,
             "target_tokens_per_s": 10.0, "beats_target": False}
    save_best_shape(name, draft, "fp32", entry)
    out = run_generate(draft, "hello world", target=target, dtype="fp32", max_new_tokens=5)
    assert out["shape"] is None and out["shape_source"] == TARGET_ALONE
    assert out["stats"]["rounds"] == len(out["tokens"]) - 1 and out["stats"]["tau"] == 1.0  # no draft, no n-grams
    assert TARGET_ALONE in format_generate(out)
    rep = run_bench(draft, prompts=prompt_file(tmp_path), target=target, dtype="fp32", max_new_tokens=4, limit=1,
                    progress=False)
    assert rep["shapes"]["generate"] == {"shape": None, "source": TARGET_ALONE}
    assert rep["shapes"]["eyas_tree"] == {"tree": [2, 2, 3]}  # the bench still times the cached shapes
    assert TARGET_ALONE in format_bench(rep)
    save_best_shape(name, draft, "fp32", {**entry, "best_tokens_per_s": 11.0, "beats_target": True})
    out = run_generate(draft, "hello world", target=target, dtype="fp32", max_new_tokens=5)
    assert out["shape"] == {"tree": [2, 2, 3]} and out["shape_source"] == "sweep cache"
    save_best_shape(name, draft, "fp32", {**entry, "best": {"draft_tokens": 2, "ngram_tokens": 0}, "beats_target": True})
    out = run_generate(draft, "hello world", target=target, dtype="fp32", max_new_tokens=5)  # swept without n-grams
    assert out["ngram_tokens"] == 0 and out["stats"]["ngram_accepted"] == 0 and "without n-grams" in format_generate(out)
    save_best_shape(name, draft, "fp32", {**entry, "best": {"draft_tokens": 2, "ngram_tokens": 2}, "beats_target": True})
    out = run_generate(draft, "hello world", target=target, dtype="fp32", max_new_tokens=5)  # a shorter n-gram branch
    assert out["ngram_tokens"] == 2 and "chain k=2 + up to 2 n-gram tokens" in format_generate(out)


def test_dtype_auto_is_measured_once_per_machine(saved, monkeypatch):
    """`auto` times the target in bf16 and fp32, keeps the faster, and caches it per machine."""
    target, draft = saved
    measured = dtype_choice.measure_dtypes(target, sizes=(1, 3), repeats=1)
    assert set(measured["forward_ms"]) == {"bf16", "fp32"} and measured["sizes"] == [1, 3]
    assert measured["dtype"] == min(measured["forward_ms"], key=lambda d: dtype_choice.per_token_ms(measured["forward_ms"][d]))
    calls = []
    monkeypatch.setattr(dtype_choice, "measure_dtypes", fake_dtype_measurement(calls, "fp32"))
    assert resolve_dtype("auto", target) == (torch.float32, "auto: measured on this machine")
    assert resolve_dtype("AUTO", target) == (torch.float32, "auto: measured on this machine (cached)")
    assert resolve_dtype("bf16", target) == (torch.bfloat16, "given") and len(calls) == 1
    out = run_generate(draft, "hello world", target=target, max_new_tokens=3)  # the default dtype is auto
    assert out["dtype"] == "fp32" and out["dtype_source"].startswith("auto") and len(calls) == 1
    assert hf_dtypes("auto", target) == {"hf_greedy": (torch.bfloat16, "auto: measured on this machine (cached)"),
                                         "hf_prompt_lookup": (torch.float32, "auto: measured on this machine (cached)")}
    assert hf_dtypes("fp32", target)["hf_greedy"] == (torch.float32, "given") and len(calls) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 7)  # another machine key: measured again
    resolve_dtype("auto", target)
    assert len(calls) == 2
    path = measured_file("dtype")  # a choice edited by hand, the timings that made it left: measured again
    path.write_text(json.dumps({k: {**e, "dtype": "bf16"} for k, e in json.loads(path.read_text()).items()}))
    assert resolve_dtype("auto", target) == (torch.float32, "auto: measured on this machine") and len(calls) == 3


def test_dtype_auto_keeps_the_cheapest_way_of_decoding_per_token():
    """bf16 whose one-token step is fastest wins even where its verify is slow (AVX2: the draft is
    then turned off by the sweep); where both speculate, the cheaper verify per token wins."""
    avx2 = {"bf16": {1: 25.2, 5: 83.3, 17: 261.6}, "fp32": {1: 47.2, 5: 60.2, 17: 92.0}}
    assert min(avx2, key=lambda d: dtype_choice.per_token_ms(avx2[d])) == "bf16"
    assert dtype_choice.per_token_ms(avx2["bf16"]) == 25.2 and dtype_choice.per_token_ms(avx2["fp32"]) == 30.1
    amx = {"bf16": {1: 40.0, 5: 46.5, 17: 53.5}, "fp32": {1: 57.8, 5: 65.6, 17: 92.5}}
    assert min(amx, key=lambda d: dtype_choice.per_token_ms(amx[d])) == "bf16"


def test_dtype_auto_times_each_baseline_in_transformers_own_forward(saved):
    target, _ = saved
    measured = dtype_choice.measure_dtypes(target, sizes=(1,), repeats=1)
    hf = measured["hf_forward_ms"]
    assert set(hf) == {"bf16", "fp32"} and all(set(v) == {1, 11} for v in hf.values())
    assert measured["hf_dtypes"]["hf_greedy"] == min(hf, key=lambda d: hf[d][1])
    assert measured["hf_dtypes"]["hf_prompt_lookup"] == min(hf, key=lambda d: hf[d][1] + hf[d][11])


def test_without_a_cached_shape_bench_and_generate_measure_one_once(saved, tmp_path, monkeypatch, capsys,
                                                                    real_quick_sweep):
    """No shape cached: a quick sweep runs (said on stderr, with its cost, under a progress bar unless
    progress is off), is cached, and is reused."""
    target, draft = saved
    monkeypatch.setattr(sweep_module, "QUICK_CHAINS", (1, 2))
    monkeypatch.setattr(sweep_module, "QUICK_PLAIN_CHAINS", (1,))
    monkeypatch.setattr(sweep_module, "QUICK_TREES", ((2, 2, 3),))
    monkeypatch.setattr(sweep_module, "QUICK_PROMPTS", 2)
    monkeypatch.setattr(sweep_module, "QUICK_TOKENS", 4)
    out = run_generate(draft, "hello world", target=target, dtype="fp32", max_new_tokens=5, progress=True)
    err = capsys.readouterr().err
    assert "no draft shape measured" in err and "cached in" in err and "took" in err and "sweep: 100%" in err
    name = Target.load(target).name
    entry = read_best_shape(name, draft, "fp32")
    assert entry is not None and [r["shape"] for r in entry["results"]] == [
        {"draft_tokens": 1}, {"draft_tokens": 2}, *({"draft_tokens": 1, "ngram_tokens": n} for n in (0, 2, 4)),
        {"tree": [2, 2, 3]}]
    used = entry["best"] if entry["beats_target"] else None
    assert out["shape"] == used and out["shape_source"] == (MEASURED_NOW if used else TARGET_ALONE)
    again = run_generate(draft, "hello world", target=target, dtype="fp32", max_new_tokens=5)
    assert "no draft shape measured" not in capsys.readouterr().err
    assert again["shape"] == used and again["shape_source"] == ("sweep cache" if used else TARGET_ALONE)
    rep = run_bench(draft, prompts=prompt_file(tmp_path), target=target, dtype="fp32", max_new_tokens=4, limit=1,
                    progress=False)
    assert rep["sweep"] is None and rep["shapes"]["source"]["eyas_chain"] == "sweep cache"
    # bench measures too when nothing is cached (here: for bf16)
    rep = run_bench(draft, prompts=prompt_file(tmp_path), target=target, dtype="bf16", max_new_tokens=4, limit=1,
                    progress=False)
    assert rep["sweep"]["quick"] and rep["shapes"]["source"]["eyas_chain"] == "quick sweep"
    err = capsys.readouterr().err
    assert "no draft shape measured" in err and "sweep:" not in err
    assert "quick sweep" in format_bench(rep) and read_best_shape(name, draft, "bf16") is not None


def test_the_quick_sweep_starts_no_question_past_its_time_bound(saved, monkeypatch, capsys, real_quick_sweep):
    """A toy gpt-oss target, run by transformers' forward on a loaded 2-core AVX2-only EPYC, spent 562 s in its
    first quick sweep: now no question is started past QUICK_SECONDS (here 0: the first question is always
    timed, by every shape alike), and stderr and the cache say on how many it was timed."""
    target_dir, draft_dir = saved
    monkeypatch.setattr(sweep_module, "QUICK_CHAINS", (1,))
    monkeypatch.setattr(sweep_module, "QUICK_PLAIN_CHAINS", ())
    monkeypatch.setattr(sweep_module, "QUICK_TREES", ((2, 2, 3),))
    monkeypatch.setattr(sweep_module, "QUICK_TOKENS", 4)
    monkeypatch.setattr(sweep_module, "QUICK_SECONDS", 0)
    target = Target.load(target_dir)
    draft = load_drafter(draft_dir, target=target_dir)
    prompts = [[5, 6, 7], [8, 9, 10], [11, 12]]
    report = sweep_module.quick_sweep(target, draft, draft_dir, torch.float32, prompts, [], ngram_tokens=0)
    assert report["prompts"] == 1 and read_best_shape(target.name, draft_dir, "fp32")["prompts"] == 1
    err = capsys.readouterr().err
    assert "no question started past 0 s" in err and " on 1 of 3 questions (the 0 s bound), cached in " in err
    whole = sweep_module.sweep_shapes(target, draft, prompts, [], max_new_tokens=4, chains=(1,), plain_chains=(),
                                      trees=((2, 2, 3),), progress=False)
    assert whole["prompts"] == 3


def test_per_prompt_spread():
    assert spread([2.0]) == {"median": 2.0, "q25": 2.0, "q75": 2.0}
    assert spread([1.0, 3.0]) == {"median": 2.0, "q25": 1.5, "q75": 2.5}
    assert spread([4.0, 1.0, 2.0, 3.0, 5.0]) == {"median": 3.0, "q25": 2.0, "q75": 4.0}
    runs = [Run([1] * 10, 1.0, None), Run([1] * 10, 2.0, None)]
    ref = [Run([1] * 10, 2.0, None), Run([1] * 10, 2.0, None)]  # ratios 2.0 and 1.0
    assert summary(runs, ref)["per_prompt_speedup"] == {"median": 1.5, "q25": 1.25, "q75": 1.75}


def test_the_speedup_interval_resamples_prompts_for_both_methods_alike():
    """A method exactly twice as fast on every prompt has the interval [2, 2] however long the prompts;
    with one prompt there is none."""
    ref = [Run([1] * n, n / 10, None) for n in (5, 40, 12, 80)]
    twice = [Run([1] * n, n / 20, None) for n in (5, 40, 12, 80)]
    assert summary(twice, ref)["speedup_ci95"] == pytest.approx([2.0, 2.0])
    mixed = [Run([1] * n, n / s, None) for n, s in ((5, 30), (40, 10), (12, 20), (80, 15))]
    lo, hi = summary(mixed, ref)["speedup_ci95"]
    pooled = (137 / sum(n / s for n, s in ((5, 30), (40, 10), (12, 20), (80, 15)))) / 10
    assert lo < pooled < hi
    assert summary(twice[:1], ref[:1])["speedup_ci95"] == [None, None]
    assert summary(twice, ref)["cpu_speedup_ci95"] == [None, None]  # no CPU time measured
    busy = [Run([1] * n, n / 20, None, cpu_seconds=n / 30) for n in (5, 40, 12, 80)]  # 3x per CPU second
    assert summary(busy, [Run(r.tokens, r.seconds, None, cpu_seconds=r.seconds) for r in ref]
                   )["cpu_speedup_ci95"] == pytest.approx([3.0, 3.0])


def test_the_command_line_decodes_in_dtype_auto_by_default():
    """`eyas generate` / `eyas bench` (and eval) take --dtype auto and default to it, as the library does."""
    from eyas.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["generate", "--prompt", "hi"]).dtype == "auto"
    assert parser.parse_args(["bench"]).dtype == "auto"
    assert parser.parse_args(["bench", "--dtype", "auto"]).dtype == "auto"
    assert parser.parse_args(["generate", "--prompt", "hi", "--dtype", "bfloat16"]).dtype == "bfloat16"
    assert parser.parse_args(["eval"]).dtype == "auto"  # eval's auto: bf16 where the CPU multiplies it natively
    assert parser.parse_args(["capture", "--out", "x"]).dtype == "bf16"  # capture stores features in it
