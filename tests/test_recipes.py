"""The recipes beside the CPU reference, run at tiny scale on the CPU.

- smollm2-135m-instruct-gpu.sh: captures side by side, training, the draft with its log and held-out
  curve in the folder given; refusals before any work. Sized by environment variables: here
  EYAS_DEVICE=cpu and a handful of prompts.
- smollm2-135m-instruct-continue.sh: a warm start from a draft on new captures, resumed on rerun,
  its held-out curve drawn after the draft's own.

The fast tests use the tiny random target of tests/test_train.py; the slow one the embedded default
and the packaged ShareGPT prompts, as the GPU run does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM
from test_train import LAYERS, config, prompts, save_target

from eyas.data import capture
from eyas.formats import read_checkpoint
from eyas.target import Target
from eyas.train import train

REPO = Path(__file__).resolve().parent.parent
GPU_RECIPE = REPO / "recipes" / "smollm2-135m-instruct-gpu.sh"
CONTINUE_RECIPE = REPO / "recipes" / "smollm2-135m-instruct-continue.sh"


def bash(recipe: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run a recipe from the repository root, single-threaded, with this interpreter."""
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(["bash", str(recipe), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def run_recipe(dst: Path, run: Path, **env: str) -> subprocess.CompletedProcess:
    """The GPU recipe at tiny scale on the CPU."""
    base = {"EYAS_DEVICE": "cpu", "RUN": str(run), "PARALLEL": "2", "BATCH": "4", "MAX_NEW_TOKENS": "8",
            "EPOCHS": "1", "BATCH_TOKENS": "256", "EVAL_FRACTION": "0.25", "THREADS": "1"}
    return bash(GPU_RECIPE, [str(dst)], {**base, **env})


def check_result(dst: Path, run: Path, draft_vocab: int, captures: int) -> dict:
    assert {"config.json", "config_eagle.json", "train_log.jsonl", "heldout_tau.png"} <= {p.name for p in dst.iterdir()}
    ckpt = read_checkpoint(dst)
    assert ckpt.contract.draft_vocab_size == draft_vocab and not ckpt.contract.has_embeddings
    assert {str(t.dtype) for t in ckpt.tensors.values() if t.is_floating_point()} == {"torch.bfloat16"}
    assert len([p for p in run.glob("shards-*") if (p / "manifest.json").is_file()]) == captures
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] > 0 and summary["eval"] is not None
    return summary


def save_big_vocab_target(folder: Path, vocab: int = 16448) -> Path:
    """The tiny target with its vocab grown past 16384, so that a 16384-token draft vocab fits. The new
    ids score 0 (the target still answers in its 26 words, and ends its turns as before)."""
    save_target(folder)
    model = LlamaForCausalLM.from_pretrained(folder)
    old = model.config.vocab_size
    model.resize_token_embeddings(vocab, mean_resizing=False)
    with torch.no_grad():
        model.get_output_embeddings().weight[old:] = 0
    model.save_pretrained(folder)
    return folder


def latest_step(run: Path) -> int:
    found = sorted((run / "train" / "checkpoints").glob("step_*.pt"))
    return int(found[-1].stem.split("_")[1]) if found else 0


def test_gpu_recipe_stops_in_budget_and_resumes_across_calls_with_mixed_sources(tmp_path):
    """Three calls on one state folder, as on a GPU with a 10-minute limit per call: the first runs out
    of its budget (exit 75), the second is killed from outside after a checkpoint, the third
    continues both the captures and the training, and ends with the draft. The data: prompts the
    target writes itself, each answered greedily and sampled (two captures trained on together)."""
    target = save_target(tmp_path / "target")
    dst, run = tmp_path / "draft", tmp_path / "run"
    env = dict(TARGET=str(target), CAPTURE_LAYERS="1,2,4", PROMPTS="self-written", TEMPERATURES="0,0.9",
               SELF_COUNT="8", SELF_MAX_NEW_TOKENS="24", PARALLEL="1",
               MAX_LENGTH="64", DRAFT_VOCAB="16", BATCH_TOKENS="64", EPOCHS="15", MAX_STEPS="",
               SAVE_EVERY="5", EVAL_EVERY="25")

    first = run_recipe(dst, run, BUDGET_S="1", **env)  # 1. the budget is gone before anything finishes
    assert first.returncode == 75 and "rerun the same command to continue" in first.stderr, first.stderr

    base = {"EYAS_DEVICE": "cpu", "RUN": str(run), "BATCH": "4", "MAX_NEW_TOKENS": "8", "EVAL_FRACTION": "0.25",
            "THREADS": "1", "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    second = subprocess.Popen(["bash", str(GPU_RECIPE), str(dst)], cwd=REPO, env={**os.environ, **base, **env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while latest_step(run) < 5 and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(second.pid, signal.SIGKILL)  # 2. what the end of a device call does to what it left running
    second.wait()
    stopped_at = latest_step(run)
    assert second.returncode == -signal.SIGKILL and stopped_at >= 5, "the second call finished before the kill"
    logged = {json.loads(x)["step"]: x for x in (run / "train" / "train_log.jsonl").read_text().splitlines()
              if '"kind": "train"' in x and json.loads(x)["step"] <= stopped_at}
    shards = {p: p.stat().st_mtime_ns for p in run.glob("shards-*/*.safetensors")}

    third = run_recipe(dst, run, **env)  # 3. continues
    assert third.returncode == 0, third.stderr
    summary = check_result(dst, run, 16, captures=2)  # greedy and sampled
    assert (run / "self-written.jsonl").is_file()
    assert {p: p.stat().st_mtime_ns for p in shards} == shards  # captures kept, not redone
    after = {json.loads(x)["step"]: x for x in (run / "train" / "train_log.jsonl").read_text().splitlines()
             if '"kind": "train"' in x}
    assert sorted(after) == list(range(1, summary["steps"] + 1)) and summary["steps"] > stopped_at
    assert all(after[k] == v for k, v in logged.items())  # steps before the checkpoint were not trained again
    timings = [json.loads(x) for x in (dst / "timings.jsonl").read_text().splitlines()]
    assert [t["what"] for t in timings if t["phase"] == "train"][-1] == "--resume"  # a killed call logs none
    assert "held-out step" in third.stderr  # the curve, printed as it grows

    again = run_recipe(dst, run, **env)  # a draft folder that is not empty is refused before any work
    assert again.returncode == 2 and "not empty" in again.stderr
    other = run_recipe(tmp_path / "other", run, **{**env, "SELF_COUNT": "9"})  # so is a state folder of another run
    assert other.returncode == 2 and "started with SELF_COUNT=8" in other.stderr


def test_a_16384_token_draft_vocab_trains_and_exports(tmp_path):
    """The GPU comparison's larger vocab (DRAFT_VOCAB=16384) on a target whose vocab exceeds it: the
    map keeps 16384 ids (the answers' tokens first), and the draft exports and reads back with it."""
    target = save_big_vocab_target(tmp_path / "target")
    data = tmp_path / "capture"
    capture(Target.load(target), prompts(6), LAYERS, data, max_new_tokens=8, dtype="float32", progress=False)
    summary = train(config(data, tmp_path / "run", target, draft_vocab=16384, max_steps=2, save_every=0))
    ckpt = read_checkpoint(tmp_path / "run" / "draft")
    assert summary["draft_vocab_size"] == ckpt.contract.draft_vocab_size == 16384 and summary["coverage"] == 1.0
    assert ckpt.contract.has_vocab_map and ckpt.tensors["d2t"].shape == (16384,)
    assert int(ckpt.tensors["t2d"].sum()) == 16384 and ckpt.tensors["lm_head.weight"].shape[0] == 16384


def test_gpu_recipe_refuses_a_gpu_that_is_not_there(tmp_path):
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run_recipe(tmp_path / "draft", tmp_path / "run", EYAS_DEVICE="cuda")
    assert r.returncode == 2 and "no GPU" in r.stderr
    assert not (tmp_path / "run").exists()


def test_no_recipe_writes_into_the_shipped_drafts_and_the_cpu_one_refuses_a_full_folder_first(tmp_path):
    """The CPU reference once ended in `rm -rf src/eyas/drafts/...`: run again, it replaced the shipped (GPU)
    draft with its own. Recipes write into the folder they are given, checked empty before any work."""
    for recipe in (REPO / "recipes").glob("*.sh"):
        code = [line for line in recipe.read_text().splitlines() if not line.lstrip().startswith("#")]
        writes = ("rm ", "cp ", "mv ", "mkdir", "DST=", "--out", ">")  # reading it (a warm start's INIT) is fine
        assert not [line for line in code if "src/eyas/drafts" in line and any(w in line for w in writes)], recipe
    full = tmp_path / "draft"
    full.mkdir()
    (full / "config.json").write_text("{}")
    r = bash(REPO / "recipes" / "smollm2-135m-instruct.sh", [str(full)], {"RUN": str(tmp_path / "run")})
    assert r.returncode == 2 and f"{full} is not empty" in r.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_gpu_recipe_on_the_embedded_default_and_sharegpt(tmp_path):
    dst, run = tmp_path / "draft", tmp_path / "run"
    r = run_recipe(dst, run, LIMIT="8", DRAFT_VOCAB="256")
    assert r.returncode == 0, r.stderr
    check_result(dst, run, 256, captures=2)


def test_continue_recipe_warm_starts_resumes_and_draws_the_curve_after_the_drafts_own(tmp_path):
    target = save_target(tmp_path / "target")
    data = tmp_path / "capture"
    capture(Target.load(target), prompts(12), LAYERS, data, max_new_tokens=8, dtype="float32", progress=False)
    first = tmp_path / "first"  # the draft to continue, shipped with its log as eyas ships its own
    train(config(data, first, target, max_steps=2, eval_fraction=0.25, save_every=0))
    init = first / "draft"
    shutil.copy(first / "train_log.jsonl", init)
    run = tmp_path / "run"
    env = dict(RUN=str(run), INIT=str(init), TARGET=str(target), PROCS="1", NICE="0", EPOCHS="1", BATCH_TOKENS="64",
               EVAL_FRACTION="0.25")
    r = bash(CONTINUE_RECIPE, [str(data)], env)
    assert r.returncode == 0, r.stderr
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["init"] == str(init) and summary["steps"] > 0
    a, b = load_file(init / "model.safetensors"), load_file(run / "train" / "draft" / "model.safetensors")
    assert torch.equal(a["d2t"], b["d2t"]) and b["fc.weight"].dtype == torch.bfloat16  # the draft's vocab map kept
    curves = json.loads((run / "heldout_tau.json").read_text())["curves"]
    assert [c["label"] for c in curves] == ["draft", "continued"] and (run / "heldout_tau.png").is_file()
    assert curves[1]["hours"][0] > curves[0]["total_hours"]  # the warm start continues the draft's curve

    again = bash(CONTINUE_RECIPE, [str(data)], env)  # a rerun resumes (no --init) and ends where the run ended
    assert again.returncode == 0, again.stderr
    resumed = json.loads((run / "train_summary.json").read_text())
    assert resumed["init"] is None and resumed["steps"] == summary["steps"]


def test_gpu_stage_packs_wheels_into_parts_that_join_back_byte_for_byte(tmp_path):
    """The device machine takes 64 MiB per call: gpu-stage.sh cuts the wheels into parts of PART_MB
    MiB (one carried per call) and gpu-unstage.sh joins them there; a missing part is refused."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    sizes = {"big-1.0-py3-none-any.whl": 2_500_000, "mid-1.0-py3-none-any.whl": 700_000,
             "tiny-1.0-py3-none-any.whl": 10}
    for name, size in sizes.items():
        (wheels / name).write_bytes(os.urandom(size))
    stage = tmp_path / "stage"
    r = bash(REPO / "recipes" / "gpu-stage.sh", [], {"WHEELS": str(wheels), "STAGE": str(stage), "PART_MB": "1"})
    assert r.returncode == 0, r.stderr
    parts = sorted(stage.glob("part-*"))
    assert len(parts) == 4 and all(sum(f.stat().st_size for f in p.iterdir()) <= 1 << 20 for p in parts)
    site = tmp_path / "site"
    env = {"STAGE": str(stage), "SITE": str(site), "INSTALL": "0"}
    r = bash(REPO / "recipes" / "gpu-unstage.sh", [], env)
    assert r.returncode == 0, r.stderr
    assert all((site / "wheels" / n).read_bytes() == (wheels / n).read_bytes() for n in sizes)
    shutil.rmtree(parts[0])  # a part that was not carried
    r = bash(REPO / "recipes" / "gpu-unstage.sh", [], env)
    assert r.returncode == 2 and r.stderr.startswith("error: big-1.0-py3-none-any.whl has 2 of its 3 pieces")
