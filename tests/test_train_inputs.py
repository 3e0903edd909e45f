"""eyas train on inputs at the edges: float knobs that are not finite, updates that overflow the weights,
--ttt-steps past the data, seeds up to 2**63 - 1, a --max-len that cuts off every answer.

Runs on the tiny chat target of test_train (a smaller capture: 6 prompts, 8 answer tokens each).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eyas.data import capture
from eyas.data.self_written import write_self_prompts
from eyas.errors import EyasError
from eyas.formats import read_checkpoint
from eyas.target import Target, target_config
from eyas.train import plan_epoch, train
from eyas.train.checkpoint import RunFiles, refuse_old_run, resumable
from eyas.train.config import check_config
from eyas.train.dataset import load_training_data
from test_train import LAYERS, config, env, flags, log_records, prompts
from test_train import target_dir  # noqa: F401 (module fixture: the tiny chat target)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def captured(target_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("capture") / "data"
    capture(Target.load(target_dir), prompts(6), LAYERS, out, max_new_tokens=8, dtype="float32", progress=False)
    return out


@pytest.mark.parametrize("knob", ["lr", "weight_decay", "step_decay", "grad_clip", "eval_fraction"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_float_knobs_that_are_not_finite_are_refused(target_dir, captured, tmp_path, knob, value):
    out = tmp_path / "run"
    with pytest.raises(EyasError, match=rf"{knob}={value} \(must be finite") as e:
        train(config(captured, out, target_dir, **{knob: value}))
    assert e.value.hint and not out.exists()


def test_each_bad_count_is_named_with_the_flag_that_sets_it(target_dir, captured, tmp_path):
    with pytest.raises(EyasError, match=r"save_every=-1 \(must be >= 0\); warmup=-2 \(must be >= 0\)") as e:
        train(config(captured, tmp_path / "run", target_dir, save_every=-1, warmup=-2))
    assert "max_steps is --max-steps" in e.value.hint and not (tmp_path / "run").exists()


def test_an_infinite_lr_on_the_command_line_is_one_line_exit_2(target_dir, captured, tmp_path):
    c = config(captured, tmp_path / "run", target_dir)
    run = subprocess.run([sys.executable, "-m", "eyas", "train", *flags(c), "--lr", "inf"], env=env(),
                         capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    assert [line for line in run.stderr.splitlines() if line.startswith("error:")] == [
        "error: invalid training settings: --lr inf (must be finite and > 0)"]
    assert "Traceback" not in run.stderr and not (tmp_path / "run").exists()


def test_weights_an_update_overflows_are_never_written(target_dir, captured, tmp_path):
    """lr 1e308 is finite, and so is step 1's loss (taken before the update), but the update makes the
    weights inf: the run stops as diverged before its checkpoint and draft, and leaves nothing."""
    out = tmp_path / "new" / "run"
    with pytest.raises(EyasError, match=r"diverged at step 1: after the update, .* inf of its") as e:
        train(config(captured, out, target_dir, lr=1e308, max_steps=1))
    assert "no checkpoint was written" in str(e.value) and "lower --lr" in e.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # out and the parent made for it are gone


def test_a_diverged_run_without_a_checkpoint_leaves_its_folder_as_it_was(target_dir, captured, tmp_path):
    """Diverged at step 2 (lr 1e30: step 1's weights are finite and huge) with no checkpoint due: the
    log and checkpoints/ it wrote go, a --out that was there before stays, and a rerun is not refused."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(EyasError, match="diverged at step 2"):
        train(config(captured, out, target_dir, lr=1e30, max_steps=5, save_every=0))
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert train(config(captured, out, target_dir, max_steps=1))["steps"] == 1  # not refused as an old run


@pytest.mark.parametrize("crash", [RuntimeError("out of memory"), KeyboardInterrupt()])
def test_a_crash_before_the_first_checkpoint_leaves_the_folder_as_it_was(target_dir, captured, tmp_path,
                                                                         monkeypatch, crash):
    """Any failure, not only eyas's own errors: what the run wrote goes, and a rerun is not refused."""
    import eyas.train.loop as loop

    def crashed(*args, **kwargs):
        raise crash
    out = tmp_path / "new" / "run"
    with monkeypatch.context() as m:
        m.setattr(loop, "forward_backward", crashed)
        with pytest.raises(type(crash)):
            train(config(captured, out, target_dir, max_steps=2, save_every=1))
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert train(config(captured, out, target_dir, max_steps=1))["steps"] == 1


def test_a_diverged_run_keeps_what_a_checkpoint_was_written_for(target_dir, captured, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(EyasError, match="diverged at step 2"):
        train(config(captured, out, target_dir, lr=1e30, max_steps=5, save_every=1))
    assert (out / "checkpoints" / "step_00000001.pt").is_file() and len(log_records(out)) == 1


def test_ttt_steps_past_the_longest_sample_unroll_only_the_steps_with_labels(target_dir, captured, tmp_path,
                                                                             capsys):
    longest = max(load_training_data(config(captured, tmp_path / "x", target_dir, max_len=20)).lengths)
    assert longest <= 20
    out = tmp_path / "run"
    train(config(captured, out, target_dir, ttt_steps=60, max_len=20, max_steps=1))
    assert [len(r["acc_by_step"]) for r in log_records(out)] == [longest]
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [f"note: --ttt-steps 60 unrolls {longest} steps: no step past the longest training sample "
                     f"({longest} draft positions, --max-len 20) has a label"]
    train(config(captured, tmp_path / "fits", target_dir, ttt_steps=5, max_len=20, max_steps=1))
    assert "note:" not in capsys.readouterr().err


@pytest.mark.parametrize("seed", [10**15, 2**63 - 1])
def test_any_seed_up_to_2_63_trains(target_dir, captured, tmp_path, seed):
    summary = train(config(captured, tmp_path / "run", target_dir, seed=seed, max_steps=1, eval_fraction=0.2))
    assert summary["steps"] == 1
    assert read_checkpoint(tmp_path / "run" / "draft", verifier_config=target_config(target_dir))


def test_self_written_prompts_take_any_seed_up_to_2_63(target_dir):
    target, kw = Target.load(target_dir), dict(batch_size=4, max_new_tokens=8, min_words=1)
    texts = [p.text for p in write_self_prompts(target, 2, seed=2**63 - 1, **kw)]
    assert texts and texts == [p.text for p in write_self_prompts(target, 2, seed=2**63 - 1, **kw)]


def test_epoch_seeds_of_small_seeds_are_unchanged():
    lengths = [30, 5, 12, 40, 8, 20, 7]
    for seed, epoch in [(0, 0), (3, 1), (12345, 7)]:
        order = torch.randperm(7, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
        assert [i for b in plan_epoch(lengths, 10_000, seed, epoch) for i in b] == order
    assert plan_epoch(lengths, 40, 2**63 - 1, 5) == plan_epoch(lengths, 40, 2**63 - 1, 5)


def test_a_max_len_that_cuts_off_every_answer_says_so(target_dir, captured, tmp_path):
    with pytest.raises(EyasError, match=r"--max-len 2 cuts off every sample's answer") as e:
        load_training_data(config(captured, tmp_path / "run", target_dir, max_len=2))
    shortest = int(e.value.hint.split("--max-len ")[1].split()[0])
    assert e.value.hint == f"train with --max-len {shortest} or more" and shortest > 2
    with pytest.warns(UserWarning, match="samples left out"):  # the others start later
        assert len(load_training_data(config(captured, tmp_path / "run", target_dir, max_len=shortest)).train_set) >= 1
    with pytest.raises(EyasError, match="cuts off every"):
        load_training_data(config(captured, tmp_path / "run", target_dir, max_len=shortest - 1))



def test_samples_a_max_len_leaves_out_are_said(target_dir, captured, tmp_path):
    from eyas.data import open_shards

    starts = sorted(2 + int(s["loss_mask"][2:].nonzero()[0]) for s in open_shards(captured))
    assert starts[0] < starts[-1]  # prompts of different lengths
    cut = starts[-1] - 1
    left = sum(start > cut for start in starts)
    with pytest.warns(UserWarning, match=rf"{left} of 6 samples left out: their answers start past --max-len {cut} "
                                         rf"\(the latest at token {starts[-1]}; --max-len {starts[-1]} keeps them all"):
        data = load_training_data(config(captured, tmp_path / "run", target_dir, max_len=cut))
    assert data.data_id["samples"] == 6 - left


def test_samples_without_an_answer_to_label_are_said(tmp_path):
    """A sample whose loss_mask is empty (its trainer's template did not match) was left out of training unsaid."""
    from eyas.train.dataset import load_samples

    class Capture(list):
        folder = tmp_path / "cache"

    def sample(mask: list[int]) -> dict[str, torch.Tensor]:
        T = len(mask)
        return {"input_ids": torch.arange(T), "loss_mask": torch.tensor(mask), "features": torch.zeros(T, 6),
                "last_hidden": torch.zeros(T, 2)}

    data = Capture([sample([0, 0, 1, 1, 1]), sample([0] * 5), sample([1, 1, 0, 0, 0])])
    with pytest.warns(UserWarning, match=r"cache: 2 of 3 samples left out: no answer token to label \(an empty "
                                         r"loss_mask, or answer tokens only among the first 2\)"):
        assert len(load_samples(data, 16)) == 1
    with pytest.raises(EyasError, match="no sample has answer tokens to train on"):
        load_samples(Capture(data[1:]), 16)  # none left: the refusal, not the warning


def test_a_fresh_run_never_writes_over_another_runs_curves(tmp_path):
    """train_curves.png is a run's file like its log: a fresh run into its folder is refused, not let
    replace it."""
    refuse_old_run(RunFiles.of(tmp_path))  # an empty folder takes a run
    (tmp_path / "train_curves.png").write_bytes(b"png")
    with pytest.raises(EyasError, match=r"already holds a training run \(train_curves.png\)"):
        refuse_old_run(RunFiles.of(tmp_path))
    (tmp_path / "train_curves.png").unlink()
    (tmp_path / "notes.txt").write_text("mine")  # stays, and takes a run
    refuse_old_run(RunFiles.of(tmp_path))
    (tmp_path / "config.json").write_text("{}")  # a draft's folder: its weights would sit beside a run's
    with pytest.raises(EyasError, match=r"is a draft's or a model's folder \(config.json\): a run is not written"):
        refuse_old_run(RunFiles.of(tmp_path))


def test_resume_without_a_run_is_refused_not_started_afresh(target_dir, captured, tmp_path):
    """A mistyped --out with --resume started a fresh run from step 0 and said nothing."""
    with pytest.raises(EyasError, match=r"no training run to resume \(no checkpoint in ") as e:
        train(config(captured, tmp_path / "typo", target_dir, resume=True))
    assert "drop --resume" in e.value.hint and not (tmp_path / "typo").exists()


def test_a_full_disk_at_the_first_checkpoint_is_one_line_and_leaves_no_run(target_dir, captured, tmp_path):
    """torch.save on a full disk (here a file-size limit) was a traceback that left checkpoints/ and the log."""
    c = config(captured, tmp_path / "run", target_dir, max_steps=1)
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))"
    run = subprocess.run([sys.executable, "-c", f"{limit}; from eyas.cli import main; raise SystemExit(main())",
                          "train", *flags(c)], env=env(), capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "step_00000001.pt: cannot write it (" in run.stderr and not (tmp_path / "run").exists()


def test_a_run_killed_before_its_first_checkpoint_starts_over_and_cannot_be_resumed(tmp_path):
    """kill -9 before step 1's checkpoint leaves an empty checkpoints/ and a log: nothing to resume, so a
    fresh run takes the folder (each refusal's hint used to point at the other)."""
    files = RunFiles.of(tmp_path)
    files.checkpoints.mkdir()
    files.log.write_text('{"kind": "train", "step": 1}\n')
    refuse_old_run(files)
    with pytest.raises(EyasError, match="no training run to resume"):
        resumable(files)
    (files.checkpoints / "step_00000001.pt").write_bytes(b"")
    with pytest.raises(EyasError, match=r"already holds a training run \(checkpoints\)"):
        refuse_old_run(files)


def test_the_command_line_names_its_flags_not_the_fields(target_dir, captured, tmp_path):
    """`--init x --resume` on the command line is refused in the words typed, not TrainConfig's."""
    c = config(captured, tmp_path / "run", target_dir)
    run = subprocess.run([sys.executable, "-m", "eyas", "train", *flags(c), "--init", "somewhere", "--resume",
                          "--max-steps", "0", "--data", "", "--verifier-name", " "], env=env(), capture_output=True,
                         text=True)
    assert run.returncode == 2, run.stderr
    error = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert error == ["error: invalid training settings: --max-steps 0 (must be >= 1); --data '' (a capture folder, "
                     "or several joined by commas, none empty); --verifier-name ' ' (the target's hub id, e.g. "
                     "HuggingFaceTB/SmolLM2-135M-Instruct); --init somewhere with --resume (a resumed run continues "
                     "from its checkpoint; pass one of them)"], run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "run").exists()
    for data in (f"{captured},", f",{captured}", f"{captured},,{captured}"):  # `--data A,$UNSET` trained on A alone
        with pytest.raises(EyasError, match="none empty"):
            check_config(config(data, tmp_path / "run", target_dir))


def test_device_is_read_as_every_verb_reads_it(target_dir, captured, tmp_path):
    """--device CPU passed preflight (parse_device lower-cases and strips) and then crashed in torch.device."""
    assert train(config(captured, tmp_path / "run", target_dir, device=" CPU", max_steps=1))["steps"] == 1


def test_max_steps_caps_the_planning_of_a_huge_epoch_count(target_dir, captured, tmp_path):
    """--epochs 10**18 with --max-steps 1 planned every epoch before the first step (a hang); only the
    epochs the steps reach are planned. A draft deeper than any reader takes is refused up front."""
    assert train(config(captured, tmp_path / "run", target_dir, epochs=10**18, max_steps=1))["steps"] == 1
    with pytest.raises(EyasError, match=r"num_hidden_layers=1025 \(must be <= 1024\)"):
        train(config(captured, tmp_path / "deep", target_dir, num_hidden_layers=1025))


def test_capture_layers_the_target_lacks_are_blamed_on_the_data(target_dir, captured, tmp_path):
    """A manifest naming layer 400 of a 4-layer target: the error names the manifest, and no flag train lacks."""
    import json
    import shutil

    data = tmp_path / "data"
    shutil.copytree(captured, data)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["capture_layers"] = [*manifest["capture_layers"][:-1], 400]
    del manifest["plan_sha256"]  # a capture from before the plan's digest (else refused as edited, test_data)
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EyasError, match=rf"--data {data}/manifest.json: captured at layers \[.*400\]") as e:
        train(config(data, tmp_path / "run", target_dir, max_steps=1))
    assert "eyas capture --capture-layers" in e.value.hint and not (tmp_path / "run").exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_log_line_the_disk_refuses_is_one_error():
    """The step log is appended, not written atomically: a full disk there is eyas's one line, not a traceback."""
    from eyas.train.checkpoint import append_log

    with pytest.raises(EyasError, match=r"/dev/full: cannot write it \(No space left on device\)"):
        append_log(Path("/dev/full"), {"step": 1})
