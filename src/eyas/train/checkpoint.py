"""A run's files: training checkpoints (save, find, load for --resume), the JSONL log and its curves.

A checkpoint holds everything a resumed run needs to reach bit-identical weights: the config, the
data's identity, the contract, model, optimiser, scheduler and RNG states, and the position in the
epoch plan. Checkpoints and plots are written atomically (`eyas.atomic`): a kill leaves the old
file or the new one. The log is appended to, one JSON record a line; a resumed run first drops the
records past its checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eyas.atomic import make_folders, remove_empty, write_atomic, write_text, writing
from eyas.dtypes import short_name
from eyas.errors import EyasError
from eyas.formats.write import not_a_draft
from eyas.jsonsafe import dumps
from eyas.target import target_name
from eyas.train.config import TrainConfig, data_folders
from eyas.train.heldout import EVAL_DEPTH
from eyas.weights import model_files

STATE_FORMAT = "eyas-train-state"
# Fields a resumed run may change: they do not affect the weights it produces.
# (`data` may move: the capture itself is compared by its manifest fingerprint and sample count;
# `init` and `layer_convention`, how its layer ids are read, are used once, by the first run: a resumed run
# starts from its checkpoint.)
RESUME_MAY_CHANGE = ("data", "out", "resume", "init", "layer_convention", "progress", "save_every", "eval_every",
                     "export_dtype", "keep_checkpoints", "device", "verifier_name")


@dataclass(frozen=True)
class RunFiles:
    """Where a run in `out` keeps its files."""

    out: Path
    checkpoints: Path
    log: Path
    curves: Path
    draft: Path

    @classmethod
    def of(cls, out: str | Path) -> RunFiles:
        out = Path(out).absolute()
        return cls(out, out / "checkpoints", out / "train_log.jsonl", out / "train_curves.png", out / "draft")


def refuse_old_run(files: RunFiles) -> None:
    """A fresh run never writes over another run's files, nor into a draft's or a model's folder (its
    checkpoints and draft/ would sit beside their weights); other files there stay as they are. A run
    killed before its first checkpoint (its log, an empty checkpoints/) left nothing to resume: a fresh
    run starts over it (`prepare` drops the log), where --resume is refused (`resumable`)."""
    saved = ["checkpoints"] if latest_checkpoint(files.checkpoints) is not None else []
    found = saved + [p.name for p in (files.draft, files.curves) if p.exists()]
    if found:
        raise EyasError(f"{files.out} already holds a training run ({', '.join(found)})",
                        "pass --resume to continue it, or choose a new --out")
    model = model_files(files.out)
    if model:
        raise EyasError(f"{files.out} (--out) is a draft's or a model's folder ({', '.join(model)}): a run is not "
                        "written among its files", "choose a new --out (the run's draft is written to OUT/draft)")


def resumable(files: RunFiles) -> Path:
    """The checkpoint a resumed run continues from; refused where there is none (a mistyped --out
    would otherwise start a fresh run from step 0 and say nothing)."""
    found = latest_checkpoint(files.checkpoints)
    if found is None:
        raise EyasError(f"{files.out}: no training run to resume (no checkpoint in {files.checkpoints})",
                        "drop --resume to start a run there, or pass the --out of the run to continue")
    why = not_a_draft(files.draft) if files.draft.is_dir() and any(files.draft.iterdir()) else None
    if why:  # said before training, not by the export at its end
        raise EyasError(f"{files.draft}: the run's export replaces this folder, but it {why}",
                        "move those out of it (the run's checkpoints stay), then rerun with --resume")
    return found


def prepare(files: RunFiles, resumed_step: int | None) -> list[Path]:
    """Make the checkpoint folder, drop temp files of a killed write, and start or trim the log.
    Returns the folders it made, innermost first (`forget_run` removes them)."""
    made = make_folders(files.checkpoints)
    for tmp in files.checkpoints.glob(".step_*.tmp"):  # a checkpoint write that was killed
        tmp.unlink()
    if resumed_step is not None:
        _truncate_log(files.log, resumed_step)
    elif files.log.exists():
        files.log.unlink()
    return made


def forget_run(files: RunFiles, made: list[Path]) -> None:
    """Remove what a run that stopped before its first checkpoint wrote: its log, then the folders
    `prepare` made (each only when empty), so that a rerun into the same --out is not refused as an
    old run. Its log is its own: a fresh run starts without one, and `prepare` drops the log of a
    resumed run that found no checkpoint. A folder that was there before the run is never removed."""
    files.log.unlink(missing_ok=True)
    remove_empty(made)


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:08d}.pt"


def latest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint with the highest step (temp files of an interrupted write are ignored)."""
    found = sorted(folder.glob("step_*.pt")) if folder.is_dir() else []
    return found[-1] if found else None


def config_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as recorded in a checkpoint: paths absolute, the target by name, dtypes by short name."""
    d = dataclasses.asdict(config)
    d["data"] = ",".join(str(Path(f).resolve()) for f in data_folders(config))
    d["out"] = str(Path(config.out).resolve())
    d["target"] = target_name(config.target)
    d["dtype"], d["export_dtype"] = short_name(config.dtype), short_name(config.export_dtype)
    return d


def save_state(folder: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write a training state as checkpoint `step` (atomically); keep only the newest `keep`."""
    path = checkpoint_path(folder, step)
    write_atomic(path, lambda f: torch.save({"format": STATE_FORMAT, "step": step, **state, "rng": _rng_state()}, f))
    for old in sorted(folder.glob("step_*.pt"))[:-keep]:
        old.unlink()
    return path


def load_state(path: Path, config: TrainConfig, world_size: int) -> dict[str, Any]:
    """A checkpoint's state, refused when written by other settings or another number of processes."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a file that is not a training state at all
        raise EyasError(f"{path}: not a readable training checkpoint ({e})",
                        "delete it to resume from the one before") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise EyasError(f"{path}: not an eyas training checkpoint", "point --out at a folder written by eyas train")
    now = config_dict(config)
    differ = [k for k in now if k not in RESUME_MAY_CHANGE and state["config"].get(k) != now[k]]
    if differ:
        changes = "; ".join(f"{k}: {state['config'].get(k)!r} there, {now[k]!r} now" for k in differ)
        raise EyasError(f"{path} was written by a different run ({changes})",
                        "resume with the same settings, or train into a new --out")
    if state["world_size"] != world_size:
        raise EyasError(f"{path} was written by {state['world_size']} processes, resuming with {world_size}",
                        f"resume with --nproc_per_node={state['world_size']} (the batch split depends on it)")
    return state


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the RNGs saved with a checkpoint. A GPU's state is restored where that GPU is here:
    a run saved where more GPUs were visible resumes on fewer (`set_rng_state_all` would fail on
    the first one missing), and one saved without a GPU resumes on one with the GPU's own seed."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        for index, gpu_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(gpu_state, index)


# --- the log and its curves ----------------------------------------------------------------------


def append_log(log: Path, record: dict[str, Any]) -> None:
    """One record more (appended, not rewritten: the log grows each step); a full disk is one line."""
    with writing(log), open(log, "a", encoding="utf-8") as f:
        f.write(dumps(record) + "\n")  # an interval from one held-out sample is NaN: null


def read_log(log: Path) -> list[dict[str, Any]]:
    """The records of a JSONL log, in order."""
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line]


def _truncate_log(log: Path, step: int) -> None:
    """Drop log records past `step` (written by a run killed after its last checkpoint), and a last record
    cut short (a full disk or a kill mid-append: the log is appended to, not rewritten); any other line that
    is not a record is refused, naming the log."""
    if not log.is_file():
        return
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line]
    keep = []
    for i, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError as e:
            if i == len(lines):
                break  # cut short mid-append: its step is past the checkpoint anyway
            record = f"not JSON ({e})"
        record_step = record.get("step") if isinstance(record, dict) else None
        if type(record_step) is not int:
            raise EyasError(f"{log}: line {i} is not a training log record ({str(record)[:80]})",
                            "restore the run's train_log.jsonl, or train into a new --out")
        if record_step <= step:
            keep.append(line)
    write_text(log, "".join(line + "\n" for line in keep))


def plot_curves(log: Path, png: Path) -> None:
    """Loss, per-step accuracy and held-out tau vs optimizer step, from the JSONL log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_log(log)
    train_recs = [r for r in records if r["kind"] == "train"]
    eval_recs = [r for r in records if r["kind"] == "eval"]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.6))
    steps = [r["step"] for r in train_recs]
    a.plot(steps, [r["loss"] for r in train_recs])
    a.set(xlabel="step", ylabel="loss", title="TTT loss (weighted sum over steps)")
    for j in range(len(train_recs[0]["acc_by_step"]) if train_recs else 0):
        b.plot(steps, [r["acc_by_step"][j] for r in train_recs], label=f"step {j}")
    b.set(xlabel="step", ylabel="argmax accuracy", ylim=(0, 1), title="accuracy per TTT step")
    if train_recs:
        b.legend(fontsize=7)
    if eval_recs:
        c.plot([r["step"] for r in eval_recs], [r["tau"] for r in eval_recs], marker="o", label=f"tau (k={EVAL_DEPTH})")
        c.plot([r["step"] for r in eval_recs], [1 + r["accept_depth1"] for r in eval_recs], marker="x",
               label="1 + depth-1 acceptance")
        c.legend(fontsize=7)
    c.set(xlabel="step", ylabel="tokens per target pass", title="held-out greedy chain")
    fig.tight_layout()
    write_atomic(png, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
