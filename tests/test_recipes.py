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
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
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
    assert sorted(p.name for p in run.glob("shards-*")) == [f"shards-{i}" for i in range(captures)]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["steps"] > 0 and summary["eval"] is not None
    return summary


def test_gpu_recipe_runs_at_tiny_scale_on_the_cpu(tmp_path):
    target = save_target(tmp_path / "target")
    (tmp_path / "prompts.txt").write_text("\n".join(prompts(12)) + "\n")
    dst, run = tmp_path / "draft", tmp_path / "run"
    env = dict(TARGET=str(target), CAPTURE_LAYERS="1,2,4", PROMPTS=str(tmp_path / "prompts.txt"), LIMIT="11",
               MAX_LENGTH="64", DRAFT_VOCAB="16", BATCH_TOKENS="64")
    r = run_recipe(dst, run, **env)
    assert r.returncode == 0, r.stderr
    summary = check_result(dst, run, 16, captures=2)
    assert summary["train_samples"] + summary["heldout_samples"] == 11  # 6 + 5 prompts, none skipped

    again = run_recipe(dst, run, **env)  # a draft folder that is not empty is refused before any work
    assert again.returncode == 2 and "not empty" in again.stderr


def test_gpu_recipe_refuses_a_gpu_that_is_not_there(tmp_path):
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run_recipe(tmp_path / "draft", tmp_path / "run", EYAS_DEVICE="cuda")
    assert r.returncode == 2 and "no GPU" in r.stderr
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
