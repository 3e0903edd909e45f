"""eyas.train: vocab map, label alignment, TTT loss, resume after SIGKILL, DDP, export, refusals.

Everything runs on a tiny random Llama target (hidden 32, 4 layers, 26-token word vocab) whose
features are captured once per module. Its weights are initialised with std 0.5 so the target's
next-token distributions are peaked: with the default 0.02 they are nearly uniform and no draft can
lower the loss below their entropy. Torch runs single-threaded here (and in the subprocesses) so
that runs are bit-reproducible and the shared 2-core machine is not oversubscribed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
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

from conftest import random_tensors
from eyas.contract import contract_for_target
from eyas.cli import build_parser
from eyas.cli.measure import format_train
from eyas.data import capture
from eyas.drafter_loading import load_drafter
from eyas.errors import ContractError, EyasError
from eyas.evaluate import evaluate_samples
from eyas.formats import read_checkpoint, write_checkpoint
from eyas.machine import cpu_class, runs_on
from eyas.shift import shift_for_draft
from eyas.target import Target, target_config, target_tensors
from eyas.train import (
    TrainConfig,
    config_from_args,
    latest_checkpoint,
    build_vocab_map,
    heldout_curve,
    pack_batch,
    plot_heldout,
    plan_epoch,
    rank_share,
    step_labels,
    target_probs,
    token_counts,
    train,
    ttt_loss,
    vocab_coverage,
)
from eyas.train.checkpoint import append_log
from eyas.train.config import add_arguments, autocast_dtype, export_dtype
from eyas.train.dataset import by_prompt, load_training_data, split

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
    """The `python -m eyas train` command line for `c` (inverse of build_parser)."""
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
    assert [r["step"] for r in evals] == [8, summary["steps"]]
    for r in evals:  # the record is eyas.evaluate's report at k = 5 over one set of chain starts
        taus = [r["tau_chain"][str(k)] for k in range(1, 6)]
        assert r["tau"] == taus[-1] and taus == sorted(taus) and r["tokens"] > 0
        assert r["accept_depth1"] == r["acceptance_by_depth"][0]
        assert 1 <= r["tau_ci95"][0] <= r["tau_ci95"][1] <= 6  # its interval over resampled held-out samples
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
    proc = subprocess.Popen([PYTHON, "-m", "eyas", "train", *flags(c)], env=env(), stdout=subprocess.DEVNULL,
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


def test_resuming_a_finished_run_measures_nothing_again(target_dir, captured, tmp_path):
    """--resume after the last step takes no step: the summary's loss and held-out eval are the log's,
    and the log gains no second eval record of that step."""
    c = config(captured, tmp_path / "run", target_dir, max_steps=4, eval_fraction=0.3)
    done = train(c)
    before = (tmp_path / "run" / "train_log.jsonl").read_text()
    again = train(TrainConfig(**{**vars(c), "resume": True}))
    assert (tmp_path / "run" / "train_log.jsonl").read_text() == before
    assert (again["steps"], again["loss"], again["acc_by_step"]) == (done["steps"], done["loss"], done["acc_by_step"])
    assert {k: again["eval"][k] for k in ("step", "tau", "accept_depth1", "tau_ci95")} == {
        k: done["eval"][k] for k in ("step", "tau", "accept_depth1", "tau_ci95")}  # as logged (NaN: null)


def torchrun_train(captured: Path, tmp_path: Path, target_dir: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """`torchrun --nproc_per_node=2 -m eyas train` (gloo), and the run's folder. Rank 1 used to abort at
    exit ("terminate called without an active exception") in 6 runs of 15 on 2 busy cores: a reference
    cycle kept the DDP wrapper, and with it the process group, alive until interpreter exit
    (eyas.train.loop.train). Run once: that abort would fail the test."""
    env2 = {k: v for k, v in env().items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    c2 = config(captured, tmp_path / "ddp", target_dir, epochs=2, save_every=0)
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "eyas", "train",
           *flags(c2), "--json"]
    return subprocess.run(cmd, env=env2, capture_output=True, timeout=300), tmp_path / "ddp"


def test_two_processes_match_one_with_the_same_global_batch(target_dir, captured, tmp_path):
    """torchrun --nproc_per_node=2 (gloo) vs one process, fp32, same global batches.

    Tolerance 1e-5 (absolute, weights are O(1)): the two ranks pack their halves into different
    rows and the gradient is the all-reduced sum of two partial sums, so float summation order
    differs; over 8 AdamW steps that gives ~1e-7. A wrong split (a sample twice or dropped, loss
    not normalised by the global token count) is off by 1e-4 or more.
    """
    proc, out = torchrun_train(captured, tmp_path, target_dir)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    single = train(config(captured, tmp_path / "one", target_dir, epochs=2, save_every=0))
    ddp = json.loads(proc.stdout)
    assert ddp["world_size"] == 2 and ddp["steps"] == single["steps"] >= 6
    a, b = draft_tensors(tmp_path / "one"), draft_tensors(out)
    for k in a:
        if a[k].is_floating_point():
            assert torch.allclose(a[k], b[k], rtol=0, atol=1e-5), (k, (a[k] - b[k]).abs().max())
        else:
            assert torch.equal(a[k], b[k])
    one, two = log_records(tmp_path / "one"), log_records(out)
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
    """Another folder whose recorded dimensions differ (a copy is known by the digest of its weights:
    tests/test_data.py)."""
    other = shutil.copytree(target_dir, tmp_path / "other-target")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "vocab_size": cfg["vocab_size"] + 16}))
    with pytest.raises(ContractError, match="captured from target"):
        train(config(captured, tmp_path / "run", other))
    assert not (tmp_path / "run").exists()


def test_resume_restores_the_gpu_rngs_that_are_here(monkeypatch):
    """A run saved where 4 GPUs were visible resumes where 2 are: the first two states are restored,
    the rest left (torch's set_rng_state_all would fail on the third). No GPU needed: torch.cuda is
    patched."""
    from eyas.train.checkpoint import set_rng_state

    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, i: restored.append((i, int(s[0]))))
    saved = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "cuda": [torch.full((8,), i, dtype=torch.uint8) for i in range(4)]}
    set_rng_state(saved)
    assert restored == [(0, 0), (1, 1)]


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


def test_resume_drops_a_log_record_cut_short_and_refuses_a_garbled_log(target_dir, captured, tmp_path):
    """A full disk mid-append left a half line at the log's end: every --resume was a JSONDecodeError."""
    out = tmp_path / "run"
    train(config(captured, out, target_dir, max_steps=2, save_every=1))
    log = out / "train_log.jsonl"
    whole = log.read_text()
    log.write_text(whole + '{"step": 3, "loss": 1.2')
    assert train(config(captured, out, target_dir, max_steps=2, save_every=1, resume=True))["steps"] == 2
    assert log.read_text() == whole
    log.write_text("not a record\n" + whole)
    with pytest.raises(EyasError, match=rf"{log}: line 1 is not a training log record"):
        train(config(captured, out, target_dir, max_steps=2, save_every=1, resume=True))
    log.write_text(whole)
    (out / "draft" / "README.md").write_text("notes")  # the export would delete it: said before training, in train's
    with pytest.raises(EyasError, match=r"the run's export replaces this folder, but it holds files .*README.md"):
        train(config(captured, out, target_dir, max_steps=2, save_every=1, resume=True))  # words (it named --force)


def test_the_log_records_the_rate_each_step_took(target_dir, captured, tmp_path):
    """Step s trains at lr * lr_factor(s - 1): the log gave the next step's rate (step 1 at the second's). The
    export records --verifier-name (a local target's path made every trained draft fail `eyas check`)."""
    from eyas.train.checkpoint import read_log
    from eyas.train.schedule import lr_factor

    summary = train(config(captured, tmp_path / "run", target_dir, warmup=2, max_steps=5, save_every=0,
                           verifier_name="org/tiny"))
    assert read_checkpoint(tmp_path / "run" / "draft").contract.verifier.name_or_path == "org/tiny"  # not the path
    assert 0 < summary["epochs_run"] < 1 == summary["epochs"]  # 5 steps of an epoch of ~8 (it said 1 epoch)
    assert f"({summary['epochs_run']:g} of 1 epochs" in format_train(summary)
    logged = [(r["step"], r["lr"]) for r in read_log(tmp_path / "run" / "train_log.jsonl") if r["kind"] == "train"]
    assert logged == [(s, pytest.approx(1e-3 * lr_factor(s - 1, 2, 5))) for s in range(1, 6)]


def test_every_answer_to_a_heldout_prompt_is_held_out(target_dir, captured, tmp_path):
    """Two captures of the same prompts (greedy and sampled answers, or fp32 and bf16) were split sample by
    sample: a held-out prompt's other answer trained, and held-out tau overstated the draft. Prompts are split
    now; data captured once splits as it did (runs resume with their held-out set)."""
    again = tmp_path / "again"
    capture(Target.load(target_dir), prompts(), LAYERS, again, max_new_tokens=12, dtype="float32", progress=False)
    data = load_training_data(config(f"{captured},{again}", tmp_path / "run", target_dir, eval_fraction=0.25))
    n = len(set(prompts()))
    assert data.data_id["samples"] == 2 * n and data.data_id["prompts"] == n
    held = by_prompt(data.heldout)
    assert len(held) == round(n * 0.25) and all(len(group) == 2 for group in held)  # both answers held out
    assert len(data.train_set) + len(data.heldout) == 2 * n
    assert "prompts" not in load_training_data(config(captured, tmp_path / "one", target_dir)).data_id
    for size, fraction, seed in [(16, 0.25, 0), (100, 0.05, 3), (2, 0.5, 1)]:  # one answer each: as before
        order = torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()
        k = max(1, round(size * fraction))
        assert split([[i] for i in range(size)], fraction, seed) == (sorted(order[k:]), sorted(order[:k]))
    out = tmp_path / "run"  # a run an earlier eyas split sample by sample is not resumed with another held-out set
    train(config(f"{captured},{again}", out, target_dir, eval_fraction=0.25, max_steps=1, lr=1e-12))
    path = next((out / "checkpoints").glob("step_*.pt"))
    state = torch.load(path, weights_only=True)
    del state["data"]["prompts"]
    torch.save(state, path)
    with pytest.raises(EyasError, match=rf"{path} was split sample by sample .* {n} of its samples answer a prompt"):
        train(config(f"{captured},{again}", out, target_dir, eval_fraction=0.25, max_steps=1, lr=1e-12, resume=True))


def test_a_heldout_set_the_cut_leaves_unmeasurable_is_refused_before_training(target_dir, captured, tmp_path):
    """--max-len 11 keeps the three samples whose answers start at token 11, one answer token each: the held-out
    one was refused by the first eval, after training, and the run erased with it."""
    out = tmp_path / "run"
    with pytest.raises(EyasError, match=r"the 1 held-out samples, cut to --max-len 11, have no answer"), \
            pytest.warns(UserWarning, match="13 of 16 samples left out"):
        train(config(captured, out, target_dir, max_len=11, eval_fraction=0.2, max_steps=1))
    assert not out.exists()


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
    parser = build_parser()  # the `eyas` parser: `eyas train` and `torchrun ... -m eyas train` share it
    c = config_from_args(parser.parse_args(
        ["train", "--data", "d", "--out", "o", "--draft-vocab", "8192", "--max-steps", "5", "--norm-before-fc",
         "--no-progress", "--lr", "2e-4", "--dtype", "fp32"]))
    assert c == TrainConfig(data="d", out="o", draft_vocab=8192, max_steps=5, norm_before_fc=True, progress=False,
                            lr=2e-4, dtype="fp32")
    assert config_from_args(parser.parse_args(["train", *flags(c)])) == c


def test_train_flags_have_help_and_take_the_dtype_names_of_other_tools():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags_ = [a for a in parser._actions if a.dest != "help"]
    assert len(flags_) == len(dataclasses.fields(TrainConfig)) and all(a.help for a in flags_)
    assert "bfloat16" in next(a for a in flags_ if a.dest == "dtype").choices
    c = config_from_args(parser.parse_args(["--data", "d", "--out", "o", "--init", "D", "--dtype", "bfloat16",
                                            "--export-dtype", "float32"]))
    assert c.init == "D" and autocast_dtype(c) == torch.bfloat16 and export_dtype(c) == torch.float32
    assert autocast_dtype(TrainConfig(data="d", out="o", dtype="fp32")) is None


# --- warm start (--init) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def init_draft(target_dir, captured, tmp_path_factory) -> Path:
    """A draft trained on every captured sample until it knows them: far above a fresh draft."""
    out = tmp_path_factory.mktemp("init") / "run"
    train(config(captured, out, target_dir, epochs=40, lr=3e-3, batch_tokens=128, save_every=0))
    return out / "draft"


def test_init_continues_from_the_drafts_accuracy_with_its_vocab_map(target_dir, captured, init_draft, tmp_path):
    kw = dict(lr=1e-4, max_steps=1, eval_fraction=0.25, seed=1, save_every=0, eval_every=1)
    warm = train(config(captured, tmp_path / "warm", target_dir, init=str(init_draft), draft_vocab=None, **kw))
    train(config(captured, tmp_path / "scratch", target_dir, **kw))
    heldout = load_training_data(config(captured, tmp_path / "x", target_dir, **kw)).heldout
    lm_head = target_tensors(target_dir, ["lm_head.weight"])["lm_head.weight"]
    before = evaluate_samples(load_drafter(init_draft, target=target_dir), heldout, lm_head, depth=5, tree_depth=5)
    first, scratch = log_records(tmp_path / "warm", "eval")[0], log_records(tmp_path / "scratch", "eval")[0]
    assert first["step"] == scratch["step"] == 1
    assert first["tau"] == pytest.approx(before["tau_chain"]["5"], abs=0.15)  # one small step from the draft
    assert first["tau"] > scratch["tau"] + 0.3, (first["tau"], scratch["tau"])
    # the draft's vocab map and size, not a full vocab from the (absent) --draft-vocab
    a, b = load_file(init_draft / "model.safetensors"), draft_tensors(tmp_path / "warm")
    assert warm["draft_vocab_size"] == 16 and torch.equal(a["d2t"], b["d2t"]) and torch.equal(a["t2d"], b["t2d"])
    assert json.loads(json.dumps(warm))["init"] == str(init_draft)
    # resumed without --init: the checkpoint holds the draft, its vocab map included
    again = train(config(captured, tmp_path / "warm", target_dir, draft_vocab=None, resume=True, **kw))
    assert again["steps"] == 1 and again["draft_vocab_size"] == 16
    assert torch.equal(draft_tensors(tmp_path / "warm")["d2t"], a["d2t"])


def test_init_from_a_draft_without_lm_head_trains_on_the_targets_frozen(target_dir, captured, tmp_path):
    """A full-vocab draft that reads the target's lm_head stays one: the head is the target's, never
    trained or saved, through a warm start, a checkpoint and a resume."""
    c = contract_for_target(target_config(target_dir), capture_layers=tuple(LAYERS)).replace(has_lm_head=False)
    draft = write_checkpoint(tmp_path / "shared", c, random_tensors(c), "eagle")
    kw = dict(draft_vocab=None, max_steps=2, save_every=1)
    train(config(captured, tmp_path / "run", target_dir, init=str(draft), **kw))
    (tmp_path / "run" / "draft").rename(tmp_path / "first")
    assert train(config(captured, tmp_path / "run", target_dir, resume=True, **kw))["steps"] == 2  # rebuilt
    out = read_checkpoint(tmp_path / "run" / "draft")
    assert not out.contract.has_lm_head and "lm_head.weight" not in out.tensors
    assert not torch.equal(out.tensors["fc.weight"], random_tensors(c)["fc.weight"])  # the rest was trained
    head = target_tensors(target_dir, ["lm_head.weight"])["lm_head.weight"]
    assert torch.equal(load_drafter(tmp_path / "run" / "draft", target=target_dir).lm_head.weight, head)


def test_init_reads_nested_layer_ids_as_layer_convention_says(target_dir, captured, tmp_path):
    """--init's eagle_config ids [0, 1, 3] are capture [0, 1, 3] as current SGLang reads them (first id
    not 1), which the data does not hold; `--layer-convention output` reads them as the data's [1, 2, 4]."""
    c = contract_for_target(target_config(target_dir), capture_layers=tuple(LAYERS))
    draft = write_checkpoint(tmp_path / "nested", c, random_tensors(c), "eagle")
    cfg = json.loads((draft / "config.json").read_text())
    cfg.pop("eagle_aux_hidden_state_layer_ids", None)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [k - 1 for k in LAYERS]}
    (draft / "config.json").write_text(json.dumps(cfg))
    kw = dict(init=str(draft), draft_vocab=None, max_steps=1, save_every=0)
    with pytest.raises(ContractError, match=r"capture_layers is \[0, 1, 3\]"):
        train(config(captured, tmp_path / "input", target_dir, **kw))
    assert train(config(captured, tmp_path / "output", target_dir, layer_convention="output", **kw))["steps"] == 1
    with pytest.raises(EyasError, match=r"layer_convention='output' without init"):
        train(config(captured, tmp_path / "alone", target_dir, layer_convention="output", max_steps=1))
    # resumed as the interrupt note says (without the warm start's flags): layer_convention was refused as changed
    run = dict(max_steps=1, save_every=1, draft_vocab=None)
    train(config(captured, tmp_path / "resumed", target_dir, init=str(draft), layer_convention="output", **run))
    assert train(config(captured, tmp_path / "resumed", target_dir, resume=True, **run))["steps"] == 1


def test_init_refuses_a_draft_that_does_not_fit_naming_the_field(target_dir, captured, init_draft, tmp_path):
    def refused(field: str, draft: Path, data: Path = captured, **kw) -> None:
        out = tmp_path / f"run-{field}"
        with pytest.raises(ContractError, match=rf"--init {draft}: the draft's {field} is"):
            train(config(data, out, target_dir, init=str(draft), max_steps=1, **kw))
        assert not out.exists()  # refused before anything is written

    other_layers = tmp_path / "layers"
    capture(Target.load(target_dir), prompts(4), [1, 2, 3], other_layers, max_new_tokens=8, dtype="float32",
            progress=False)
    refused("capture_layers", init_draft, other_layers)
    tcfg = target_config(target_dir)
    for field, change in [("target_hidden_size", {"hidden_size": 48}), ("vocab_size", {"vocab_size": 40})]:
        other = contract_for_target({**tcfg, **change}, capture_layers=tuple(LAYERS), draft_vocab_size=16)
        refused(field, write_checkpoint(tmp_path / field, other, random_tensors(other), "speculators"))
    refused("draft_vocab_size", init_draft, draft_vocab=8)
    refused("num_hidden_layers", init_draft, num_hidden_layers=2)
    with pytest.raises(EyasError, match=r"init=.* with resume"):
        train(config(captured, tmp_path / "both", target_dir, init=str(init_draft), resume=True))


def test_init_default_is_the_draft_eyas_ships_for_the_target(target_dir, captured, tmp_path):
    """`--init default` reads as `eval --against default` does: the shipped draft for the target (this tiny
    target has none, which is said, where a folder named default was looked for before)."""
    with pytest.raises(EyasError, match="the draft .default. is the one eyas ships for .*, not for the target"):
        train(config(captured, tmp_path / "none", target_dir, init="default", max_steps=1))


# --- learning curve -----------------------------------------------------------------------------


def test_learning_curve_counts_processor_hours_of_the_training_steps(tmp_path):
    log = tmp_path / "train_log.jsonl"
    hw = {"device": "cpu", "procs": 2, "threads": 3}
    records = [{"kind": "train", "step": 1, "tokens": 3600, "tokens_per_s": 1.0, **hw},  # 1 h x 6 cores
               {"kind": "eval", "step": 1, "tau": 1.5, "accept_depth1": 0.3},
               {"kind": "train", "step": 2, "tokens": 1800, "tokens_per_s": 1.0, **hw},
               {"kind": "eval", "step": 2, "tau": 1.7, "accept_depth1": 0.4, "tau_ci95": [1.6, 1.8]}]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    curve = heldout_curve(log, "run", offset=1.0)
    assert (curve.unit, curve.hours, curve.tau, curve.total_hours) == ("CPU", [7.0, 10.0], [1.5, 1.7], 10.0)
    assert curve.tau_ci95 == [None, [1.6, 1.8]]  # the first record is from a log before the intervals
    plot_heldout([curve], tmp_path / "with_interval.png")
    one = tmp_path / "one_sample.jsonl"  # one held-out sample: no interval, written as JSON's null
    for r in records:
        append_log(one, {**r, "tau_ci95": [math.nan, math.nan]} if r["kind"] == "eval" else r)
    assert "NaN" not in one.read_text() and heldout_curve(one).tau_ci95 == [[None, None]] * 2
    plot_heldout([heldout_curve(one)], tmp_path / "no_interval.png")
    nothing = tmp_path / "nothing_measured.jsonl"  # a held-out set too short for depth 5: tau NaN, logged null
    for r in records:
        append_log(nothing, {**r, "tau": math.nan} if r["kind"] == "eval" else r)
    assert all(math.isnan(t) for t in heldout_curve(nothing).tau)  # a format error on None, it was
    plot_heldout([heldout_curve(nothing)], tmp_path / "nan.png")
    gpu = [{**r, "device": "cuda", "procs": 1} if r["kind"] == "train" else r for r in records]
    log.write_text("".join(json.dumps(r) + "\n" for r in gpu))
    assert heldout_curve(log).hours == [1.0, 1.5] and heldout_curve(log).unit == "GPU"
    legacy = [{k: v for k, v in r.items() if k not in hw} for r in records]  # logs before the hardware fields
    log.write_text("".join(json.dumps(r) + "\n" for r in legacy))
    with pytest.raises(EyasError, match="do not say what they ran on"):
        heldout_curve(log)
    assert heldout_curve(log, cpus=2).hours == [2.0, 3.0]
    png = tmp_path / "curve.png"
    plot_heldout([heldout_curve(log, cpus=2)], png)
    assert 0 < png.stat().st_size < 100_000


def test_train_records_say_what_they_ran_on(target_dir, captured, tmp_path):
    summary = train(config(captured, tmp_path / "run", target_dir, max_steps=2, eval_fraction=0.25, save_every=0))
    assert {(r["device"], r["procs"], r["threads"]) for r in log_records(tmp_path / "run")} == {("cpu", 1, 1)}
    on = {r.get("runs_on") for r in log_records(tmp_path / "run") if "tokens_per_s" in r}  # every speed names it
    assert on == {summary["runs_on"]} == {runs_on(torch.device("cpu"))}
    assert f"on 1 x CPU {cpu_class()}, 1 threads" in format_train(summary)
    curve = heldout_curve(tmp_path / "run" / "train_log.jsonl")
    assert curve.unit == "CPU" and len(curve.tau) == 1 and 0 < curve.hours[0] == curve.total_hours
