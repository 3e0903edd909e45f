"""Held-out tau against training time: how much accuracy a recipe buys per processor-hour.

Runs hold out different samples, so where the log has it, the curve carries tau's 95% interval over
resampled held-out samples (`tau_ci95`, eyas.train.heldout): two runs' curves differ meaningfully
only beyond it. Steps of one run share their held-out set, so its own points are compared as they are.

A draft's quality is limited by compute, and runs differ in machines, processes and threads, so
curves are compared against processor-hours (CPU cores x hours, or GPUs x hours), not steps. The
time is the training steps' own wall time (each train record's tokens / tokens_per_s, measured on
rank 0), so held-out evals and checkpoint writes do not count. Logs written before the train
records carried their hardware (`device`, `procs`, `threads`) need the CPU cores they ran on given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eyas.atomic import write_atomic
from eyas.errors import EyasError
from eyas.train.checkpoint import read_log
from eyas.train.heldout import EVAL_DEPTH


@dataclass
class Curve:
    """One run's held-out evals: tau (k = EVAL_DEPTH) and depth-1 acceptance by processor-hours."""

    label: str
    unit: str  # "CPU" or "GPU": what the hours count
    hours: list[float]
    tau: list[float]
    accept_depth1: list[float]
    total_hours: float  # the run's whole training time, evals or not
    tau_ci95: list[list[float] | None] = field(default_factory=list)  # per eval (None: a log from before them)


def heldout_curve(log: Path, label: str | None = None, *, cpus: int | None = None, offset: float = 0.0) -> Curve:
    """The held-out curve of one train_log.jsonl; `cpus`: the CPU cores of records that do not say
    what they ran on (older logs); `offset` shifts it (a warm start continuing a run)."""
    hours, points = offset, []
    unit = "CPU"
    for r in read_log(log):
        if r["kind"] == "train":
            unit, procs = _processors(r, cpus, log)
            hours += r["tokens"] / r["tokens_per_s"] * procs / 3600
        elif r["kind"] == "eval":
            # the log's null is a NaN (a held-out set that measured nothing at that depth)
            tau, acc = (float("nan") if r[k] is None else r[k] for k in ("tau", "accept_depth1"))
            points.append((hours, tau, acc, r.get("tau_ci95")))
    if not points:
        raise EyasError(f"{log}: no held-out eval records", "train with --eval-fraction > 0")
    h, tau, acc, ci = (list(x) for x in zip(*points))
    return Curve(label or log.parent.name, unit, h, tau, acc, hours, ci)


def _processors(record: dict, cpus: int | None, log: Path) -> tuple[str, int]:
    """("CPU", cores) or ("GPU", devices) that a train record's step ran on."""
    if "procs" not in record:
        if cpus is not None:
            return "CPU", cpus
        raise EyasError(f"{log}: its train records do not say what they ran on",
                        "pass the number of CPU cores the run used (processes x threads)")
    if record["device"] == "cpu":
        return "CPU", record["procs"] * record["threads"]
    return "GPU", record["procs"]


def plot_heldout(curves: list[Curve], png: Path, *, title: str = "held-out greedy chain") -> None:
    """tau and 1 + depth-1 acceptance against processor-hours, one colour per curve, as a small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = {c.unit for c in curves}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, c in enumerate(curves):
        color = f"C{i}"
        ax.plot(c.hours, c.tau, marker="o", ms=3, color=color, label=f"{c.label}: tau (k={EVAL_DEPTH})")
        shown = [(h, ci) for h, ci in zip(c.hours, c.tau_ci95) if ci and None not in ci]  # null: one sample
        if shown:  # how far tau would move on another held-out set: what runs with different sets differ by
            ax.fill_between([h for h, _ in shown], [ci[0] for _, ci in shown], [ci[1] for _, ci in shown],
                            color=color, alpha=0.15, lw=0, label=f"{c.label}: tau's 95% interval")
        ax.plot(c.hours, [1 + a for a in c.accept_depth1], marker="x", ms=3, ls="--", color=color,
                label=f"{c.label}: 1 + depth-1 acceptance")
    ax.set(xlabel=f"training time ({'/'.join(sorted(units))}-hours)", ylabel="tokens per target pass", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(png, lambda f: fig.savefig(f, format="png", dpi=90))
    plt.close(fig)
