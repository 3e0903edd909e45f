"""eyas.train: vocab map, label alignment, TTT loss, resume after SIGKILL, DDP, export, refusals.

Everything runs on a tiny random Llama target (hidden 32, 4 layers, 26-token word vocab) whose
features are captured once per module. Its weights are initialised with std 0.5 so the target's
next-token distributions are peaked: with the default 0.02 they are nearly uniform and no draft can
lower the loss below their entropy. Torch runs single-threaded here (and in the subprocesses) so
that runs are bit-reproducible and the shared 2-core machine is not oversubscribed.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from eyas.contract import contract_for_target
from eyas.cli import build_parser
from eyas.data import capture, shift_for_draft
from eyas.errors import ContractError, EyasError
from eyas.formats import read_checkpoint
from eyas.target import Target, target_config, target_tensors
from eyas.train import (
    TrainConfig,
    config_from_args,
    latest_checkpoint,
    build_vocab_map,
    pack_batch,
    plan_epoch,
    rank_share,
    step_labels,
    target_probs,
    token_counts,
    train,
    ttt_loss,
    vocab_coverage,
)

WORDS = "hello world how are you today tell me a story about the cat dog sun moon why is sky blue".split()
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "user", "assistant"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
LAYERS = [1, 2, 4]
PYTHON = sys.executable


pytestmark = pytest.mark.usefixtures("one_thread")


def save_target(folder: Path) -> Path:
    """A tiny chat target: word-level tokenizer with a chat template, random peaked Llama."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, eos_token_id=vocab["<|im_end|>"],
        pad_token_id=0, initializer_range=0.5,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def prompts(n: int = 16) -> list[str]:
    rnd = random.Random(0)
    return [" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 8))) for _ in range(n)]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return save_target(tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def captured(target_dir, tmp_path_factory) -> Path:
    """16 prompts, 16 answer tokens each, fp32 features at LAYERS (~470 tokens)."""
    out = tmp_path_factory.mktemp("capture") / "data"
    capture(Target.load(target_dir), prompts(), LAYERS, out, max_new_tokens=16, dtype="float32", progress=False)
    return out


def config(data: Path, out: Path, target: Path, **kw) -> TrainConfig:
    base = dict(data=str(data), out=str(out), target=str(target), draft_vocab=16, ttt_steps=3, lr=1e-3,
                batch_tokens=64, eval_fraction=0.0, dtype="fp32", progress=False)
    return TrainConfig(**{**base, **kw})


def flags(c: TrainConfig) -> list[str]:
    """The `python -m eyas.train` command line for `c` (inverse of build_parser)."""
    args = []
    for key, value in vars(c).items():
        name = "--" + key.replace("_", "-")
        if value is True and key == "progress" or value is False and key != "progress" or value is None:
            continue
        args += ["--no-progress"] if key == "progress" else [name] if value is True else [name, str(value)]
    return args


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "1", "PYTHONUNBUFFERED": "1"}


def draft_tensors(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "draft" / "model.safetensors")


def log_records(out: Path, kind: str = "train") -> list[dict]:
    records = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == kind]


# --- the vocab map ------------------------------------------------------------------------------


def test_vocab_map_from_hand_built_counts():
    counts = torch.tensor([0, 5, 3, 5, 0, 1, 0, 0])
    used, d2t, t2d = build_vocab_map(counts, 4)
    assert used.tolist() == [1, 2, 3, 5]  # 1 and 3 (5 each), 2 (3), 5 (1)
    assert d2t.dtype == torch.int64 and d2t.tolist() == [1, 1, 1, 2]  # target = draft + d2t[draft]
    assert t2d.tolist() == [False, True, True, True, False, True, False, False]
    assert vocab_coverage(counts, t2d) == 1.0
    used, _, _ = build_vocab_map(counts, 2)  # tie between 1 and 3 at count 5
    assert used.tolist() == [1, 3]
    assert vocab_coverage(counts, build_vocab_map(counts, 2)[2]) == pytest.approx(10 / 14)
    used, d2t, _ = build_vocab_map(counts, 6)  # 4 distinct tokens: padded with the lowest unused ids
    assert used.tolist() == [0, 1, 2, 3, 4, 5] and d2t.tolist() == [0] * 6


def test_token_counts_count_the_labels_under_the_mask():
    # unshifted: x = 7 8 9 10 11, answer = 9 10 11; draft labels x_{t+2} are 9, 10, 11
    sample = {"input_ids": torch.tensor([7, 8, 9, 10, 11]), "loss_mask": torch.tensor([0, 0, 1, 1, 1]).bool(),
              "features": torch.zeros(5, 6), "last_hidden": torch.zeros(5, 2)}
    counts = token_counts([shift_for_draft(sample)], 12)
    assert counts.nonzero().flatten().tolist() == [9, 10, 11] and counts.sum() == 3


# --- label alignment ----------------------------------------------------------------------------


def greedy_sample(ids: list[int], V: int) -> dict[str, torch.Tensor]:
    """A self-distilled sample: the target's state at s points (one-hot) at the next token x_{s+1}."""
    x = torch.tensor(ids)
    nxt = torch.cat([x[1:], torch.tensor([0])])
    return {"input_ids": x, "loss_mask": torch.ones(len(ids), dtype=torch.bool),
            "features": torch.randn(len(ids), 6), "last_hidden": 10 * torch.nn.functional.one_hot(nxt, V).float()}


def test_step_j_labels_are_the_target_distribution_j_positions_on_within_a_document():
    V = 16
    a, b = [1, 2, 3, 4, 5, 6, 7], [9, 10, 11, 12]
    packed = pack_batch([shift_for_draft(greedy_sample(a, V)), shift_for_draft(greedy_sample(b, V))], row_len=20)
    assert packed["input_ids"].shape == (1, 9) and packed["document_ids"].tolist() == [[0] * 6 + [1] * 3]
    p, in_vocab = target_probs(packed["target_hidden"], torch.eye(V), None)
    assert in_vocab.all()
    for j in range(4):
        p_j, mask_j = step_labels(p, packed["loss_mask"], packed["document_ids"], j)
        for t in range(9 - j):
            doc, local = (a, t) if t < 6 else (b, t - 6)
            n = len(doc) - 1  # shifted length
            # step j at draft position t predicts x_{t+j+2} of its own document, if it exists
            expected = local + j < n and local + j + 2 < len(doc)
            assert bool(mask_j[0, t]) == expected, (j, t)
            if expected:
                assert int(p_j[0, t].argmax()) == doc[local + j + 2], (j, t)
    # teacher forcing: step j + 1 at t reads next_ids[t + j] = x_{t+j+2}, the label of step j
    assert packed["next_ids"][0, :6].tolist() == [3, 4, 5, 6, 7, 0]


def test_target_probs_renormalise_over_the_draft_vocab_and_mask_outside_argmax():
    lm_head = torch.eye(4)
    hidden = torch.tensor([[[3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]]])  # argmax 0 (drafted), 3 (not)
    p, in_vocab = target_probs(hidden, lm_head, torch.tensor([0, 1]))
    full = torch.softmax(hidden[0, 0, :2], -1)
    assert torch.allclose(p[0, 0], full) and torch.allclose(p.sum(-1), torch.ones(1, 2))
    assert in_vocab.tolist() == [[True, False]]


def test_ttt_loss_pairs_each_step_with_its_shifted_labels():
    torch.manual_seed(0)
    B, T, Vd, steps = 1, 8, 5, 3
    p = torch.softmax(3 * torch.randn(B, T, Vd), -1)
    valid = torch.ones(B, T, dtype=torch.bool)
    valid[0, 5] = False
    doc = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])
    aligned = [torch.log(torch.cat([p[:, j:], p[:, :j]], dim=1)) for j in range(steps)]  # step j at t -> p[t+j]
    loss, stats = ttt_loss(aligned, p, valid, doc, 0.8, denom=4.0)
    entropy = -(p * p.log()).sum(-1)
    want = 0.0
    for j in range(steps):
        p_j, m_j = step_labels(p, valid, doc, j)
        assert int(stats[2, j]) == int(m_j.sum()) and int(stats[1, j]) == int(m_j.sum())  # all argmax right
        want += 0.8**j * float(entropy[:, j:][m_j].sum())
    assert float(loss) == pytest.approx(want / 4.0, rel=1e-5)
    assert stats[2].tolist() == [7, 6, 4]  # t=5 unlabelled; labels of t=4 (j=1), t=3, 4 (j=2) are in doc 1
    unshifted = [torch.log(p)] * steps  # the classic off-by-j bug: step j graded against p[t]
    _, bad = ttt_loss(unshifted, p, valid, doc, 0.8, denom=4.0)
    assert bad[1, 1] < bad[2, 1]


def test_target_probs_where_skips_positions_without_labels():
    torch.manual_seed(0)
    hidden, lm_head, used = torch.randn(2, 5, 8), torch.randn(12, 8), torch.tensor([0, 3, 4, 7, 9])
    where = torch.tensor([[True, False, True, True, False], [False, True, True, False, True]])
    p_all, in_all = target_probs(hidden, lm_head, used)
    p, in_vocab = target_probs(hidden, lm_head, used, where=where)
    assert torch.equal(p[where], p_all[where]) and torch.equal(in_vocab[where], in_all[where])
    assert not p[~where].any() and not in_vocab[~where].any()


def test_ttt_loss_with_head_on_labelled_rows_equals_full_logits():
    """Training passes hidden states and `Drafter.head`: the lm_head runs on labelled rows only; the
    loss, its gradient and the stats equal those of full logits."""
    torch.manual_seed(0)
    B, T, H, Vd, steps = 2, 7, 6, 5, 3
    head = torch.nn.Linear(H, Vd, bias=False)
    hidden = [torch.randn(B, T, H, requires_grad=True) for _ in range(steps)]
    p = torch.softmax(torch.randn(B, T, Vd), -1)
    valid = torch.rand(B, T) > 0.3
    doc = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 0, 0, 0]])
    loss, stats = ttt_loss(hidden, p, valid, doc, 0.8, denom=5.0, head=head)
    grad = torch.autograd.grad(loss, head.weight)[0]
    full, full_stats = ttt_loss([head(h) for h in hidden], p, valid, doc, 0.8, denom=5.0)
    assert torch.allclose(loss, full) and torch.equal(stats, full_stats)
    assert torch.allclose(grad, torch.autograd.grad(full, head.weight)[0])


def test_batches_cover_every_sample_once_and_split_by_tokens():
    lengths = [30, 5, 12, 40, 8, 20, 7]
    plan = plan_epoch(lengths, 40, seed=3, epoch=0, min_samples=2)
    assert sorted(i for b in plan for i in b) == list(range(7)) and all(len(b) >= 2 for b in plan)
    assert plan == plan_epoch(lengths, 40, seed=3, epoch=0, min_samples=2) != plan_epoch(lengths, 40, 3, 1, 2)
    parts = [rank_share([0, 1, 2, 3], lengths, r, 2) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == [0, 1, 2, 3] and parts == [[3, 1], [0, 2]]  # 45 and 42 tokens


# --- training runs ------------------------------------------------------------------------------


def test_training_lowers_the_loss_and_exports_both_formats(target_dir, captured, tmp_path):
    out = tmp_path / "run"
    c = config(captured, out, target_dir, epochs=4, lr=3e-3, batch_tokens=128, dtype="bf16", export_dtype="bf16",
               eval_fraction=0.2, save_every=8)
    summary = train(c)
    losses = [r["loss"] for r in log_records(out)]
    assert len(losses) == summary["steps"] >= 12
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3, losses
    assert all(len(r["acc_by_step"]) == 3 for r in log_records(out))
    evals = log_records(out, "eval")
    assert evals and all(r["tau"] >= 1 and 0 <= r["accept_depth1"] <= 1 for r in evals)
    assert summary["eval"]["step"] == summary["steps"] and 0 < summary["coverage"] <= 1
    assert (out / "train_curves.png").stat().st_size > 0
    assert any((out / "checkpoints").glob("step_*.pt"))

    ckpt = read_checkpoint(out / "draft", verifier_config=target_config(target_dir))
    assert ckpt.files == {"config.json": "speculators", "config_eagle.json": "eagle"}
    want = contract_for_target(target_config(target_dir), capture_layers=tuple(LAYERS), draft_vocab_size=16,
                               name=str(target_dir.resolve()))
    assert ckpt.contract == want
    assert ckpt.contract.capture_layers == tuple(LAYERS) and not ckpt.contract.has_embeddings
    assert not any([want.norm_before_residual, want.norm_before_fc, want.fc_norm, want.norm_output])
    assert "embed_tokens.weight" not in ckpt.tensors and ckpt.tensors["fc.weight"].dtype == torch.bfloat16
    cfg = json.loads((out / "draft" / "config.json").read_text())
    assert cfg["eagle_aux_hidden_state_layer_ids"] == LAYERS and cfg["norm_before_residual"] is False
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(target_dir.resolve())


def test_resume_after_sigkill_reaches_the_same_weights(target_dir, captured, tmp_path):
    c = config(captured, tmp_path / "killed", target_dir, epochs=6, max_steps=30, save_every=4)
    proc = subprocess.Popen([PYTHON, "-m", "eyas.train", *flags(c)], env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    first = tmp_path / "killed" / "checkpoints" / "step_00000004.pt"

    def kill_after_first_checkpoint():
        while proc.poll() is None and not first.exists():
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)

    watcher = threading.Thread(target=kill_after_first_checkpoint)
    watcher.start()
    whole = train(config(captured, tmp_path / "whole", target_dir, epochs=6, max_steps=30, save_every=4))
    watcher.join()
    assert proc.wait() == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (tmp_path / "killed" / "draft").exists()  # it died mid-run

    resumed = train(TrainConfig(**{**vars(c), "resume": True}))
    assert resumed["steps"] == whole["steps"] == 30
    a, b = draft_tensors(tmp_path / "whole"), draft_tensors(tmp_path / "killed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [r["step"] for r in log_records(tmp_path / "killed")]
    assert steps == list(range(1, 31))  # records past the checkpoint were dropped, then rewritten


def test_two_processes_match_one_with_the_same_global_batch(target_dir, captured, tmp_path):
    """torchrun --nproc_per_node=2 (gloo) vs one process, fp32, same global batches.

    Tolerance 1e-5 (absolute, weights are O(1)): the two ranks pack their halves into different
    rows and the gradient is the all-reduced sum of two partial sums, so float summation order
    differs; over 8 AdamW steps that gives ~1e-7. A wrong split (a sample twice or dropped, loss
    not normalised by the global token count) is off by 1e-4 or more.
    """
    c2 = config(captured, tmp_path / "ddp", target_dir, epochs=2, save_every=0)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "eyas.train", *flags(c2)]
    env2 = {k: v for k, v in env().items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    proc = subprocess.Popen(cmd, env=env2, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    single = train(config(captured, tmp_path / "one", target_dir, epochs=2, save_every=0))
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    ddp = json.loads(stdout)
    assert ddp["world_size"] == 2 and ddp["steps"] == single["steps"] >= 6
    a, b = draft_tensors(tmp_path / "one"), draft_tensors(tmp_path / "ddp")
    for k in a:
        if a[k].is_floating_point():
            assert torch.allclose(a[k], b[k], rtol=0, atol=1e-5), (k, (a[k] - b[k]).abs().max())
        else:
            assert torch.equal(a[k], b[k])
    one, two = log_records(tmp_path / "one"), log_records(tmp_path / "ddp")
    assert [r["positions_by_step"] for r in one] == [r["positions_by_step"] for r in two]
    for key in ("loss", "grad_norm"):  # grad_norm: AdamW would hide a gradient off by a constant factor
        assert [r[key] for r in one] == pytest.approx([r[key] for r in two], rel=1e-5), key


def test_nan_loss_stops_and_names_the_last_good_checkpoint(target_dir, captured, tmp_path):
    out = tmp_path / "nan"
    with pytest.raises(EyasError, match="diverged at step 2") as e:  # step 1's update blows the weights up
        train(config(captured, out, target_dir, lr=1e30, save_every=1, max_steps=10))
    assert str(out / "checkpoints" / "step_00000001.pt") in str(e.value) and "lower --lr" in e.value.hint
    assert not (out / "draft").exists()


def test_refuses_another_targets_shards_before_training(target_dir, captured, tmp_path):
    other = shutil.copytree(target_dir, tmp_path / "other-target")  # same weights, another identity
    with pytest.raises(ContractError, match="captured from target"):
        train(config(captured, tmp_path / "run", other))
    assert not (tmp_path / "run").exists()


def test_resume_refuses_shards_at_other_capture_layers_and_old_runs(target_dir, captured, tmp_path):
    data, out = shutil.copytree(captured, tmp_path / "data"), tmp_path / "run"
    first = train(config(data, out, target_dir, max_steps=1, lr=1e-12))
    # lm_head starts as the target's rows of the draft vocab (one step of lr 1e-12 moves nothing)
    d = draft_tensors(out)
    rows = torch.arange(16) + d["d2t"]
    lm_head = target_tensors(target_dir, ["lm_head.weight"])["lm_head.weight"]
    assert first["steps"] == 1 and torch.allclose(d["lm_head.weight"], lm_head[rows], atol=1e-9)
    with pytest.raises(EyasError, match="already holds a training run"):
        train(config(data, out, target_dir, max_steps=1, lr=1e-12))
    with pytest.raises(EyasError, match=r"different run \(lr: 1e-12 there, 0.001 now\)"):
        train(config(data, out, target_dir, max_steps=1, resume=True))
    shutil.rmtree(data)
    capture(Target.load(target_dir), prompts(4), [1, 2, 3], data, max_new_tokens=8, dtype="float32", progress=False)
    with pytest.raises(ContractError, match=r"captured at layers \[1, 2, 3\], the draft reads \[1, 2, 4\]"):
        train(config(data, out, target_dir, max_steps=1, lr=1e-12, resume=True))


def test_captures_made_in_parallel_train_as_one(target_dir, captured, tmp_path):
    """`eyas capture --skip` splits one prompt source over processes; `--data A,B` trains on all."""
    t = Target.load(target_dir)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    capture(t, prompts()[:10], LAYERS, a, max_new_tokens=16, dtype="float32", progress=False)
    capture(t, prompts()[10:], LAYERS, b, max_new_tokens=16, dtype="float32", progress=False)
    out = tmp_path / "run"
    summary = train(config(f"{a},{b}", out, target_dir, max_steps=2))
    assert summary["train_samples"] == 16 and summary["steps"] == 2
    state = torch.load(latest_checkpoint(out / "checkpoints"), weights_only=True)
    fingerprints = [json.loads((d / "manifest.json").read_text())["fingerprint"] for d in (a, b)]
    assert state["data"] == {"fingerprint": ",".join(fingerprints), "samples": 16}
    assert state["config"]["data"] == f"{a.resolve()},{b.resolve()}"
    capture(t, prompts(4), [1, 2, 3], c, max_new_tokens=8, dtype="float32", progress=False)
    with pytest.raises(ContractError, match=rf"{c}: captured at layers \[1, 2, 3\], {a} at \[1, 2, 4\]"):
        train(config(f"{a},{c}", tmp_path / "mixed", target_dir, max_steps=1))
    with pytest.raises(EyasError, match="data=','"):
        train(config(",", tmp_path / "none", target_dir))


def test_module_flags_map_to_the_config():
    parser = build_parser()  # the `eyas` parser: `eyas train` and `python -m eyas.train` share it
    c = config_from_args(parser.parse_args(
        ["train", "--data", "d", "--out", "o", "--draft-vocab", "8192", "--max-steps", "5", "--norm-before-fc",
         "--no-progress", "--lr", "2e-4", "--dtype", "fp32"]))
    assert c == TrainConfig(data="d", out="o", draft_vocab=8192, max_steps=5, norm_before_fc=True, progress=False,
                            lr=2e-4, dtype="fp32")
    assert config_from_args(parser.parse_args(["train", *flags(c)])) == c
