"""What `eyas bench` reports besides its numbers, and how it shows them: the environment a run was
measured in (versions, threads, machine, the eyas commit), the terminal table and the speedup plot."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

from eyas.atomic import write_figure
from eyas.bench.timing import METHODS
from eyas.draft_shape import shape_label
from eyas.dtypes import short_name
from eyas.generate import TARGET_ALONE
from eyas.intervals import FEW
from eyas.machine import cpu_class, cpu_flags, cpu_model


def git_commit() -> str | None:
    """The commit of the eyas checkout this module runs from; None for an installed copy."""
    here = Path(__file__).resolve().parents[1]  # the eyas package: src/eyas in a checkout
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                             cwd=here, check=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    # a wheel installed into a venv that sits inside some git checkout is not that checkout's code
    return top[1] if len(top) == 2 and Path(top[0]).resolve() / "src" / "eyas" == here else None


def environment(dtype: torch.dtype, device: torch.device) -> dict:
    """What the timings ran on and with: `device` is where the models ran (a GPU's name, or cpu)."""
    import transformers

    try:
        version = importlib.metadata.version("eyas")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "dtype": short_name(dtype),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_class": cpu_class(),  # the kind of CPU, as tables name it
        "cpu_flags": cpu_flags(),  # the instruction sets measured shapes and dtypes are keyed by
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # what torch dispatches to (capped or not)
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "eyas_version": version,
        "eyas_commit": git_commit(),
    }


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_bench(report: dict) -> str:
    """The terminal table: one row per method, then acceptance by depth and speedup by category."""
    env, shapes = report["environment"], report["shapes"]
    label = {"eyas_chain": shape_label(shapes["eyas_chain"]), "eyas_tree": shape_label(shapes["eyas_tree"])}
    ngram = f", n-gram branch up to {report['ngram_tokens']}" if report.get("ngram_tokens") else ""
    few = f" (under {FEW} prompts: too narrow)" if report["num_prompts"] < FEW else ""
    names = {name: name + (f" ({label[name]})" if name in label else "") for name in report["methods"]}
    w = max(30, *map(len, names.values()))  # a long chain or tree label widens the column, not the row
    lines = [
        (f"{report['num_prompts']} prompts ({report['prompt_set']}), max_new_tokens {report['max_new_tokens']}, "
         f"eyas in {report['dtype']} ({report.get('dtype_source', 'given')}), {env['threads']} threads, "
         f"torch {env['torch']}{ngram}; target {report['target']}"),
        (f"GPU: {env['device']}; " if env.get("device", "cpu") != "cpu" else "")
        + f"CPU: {env.get('cpu_class', '?')} ({env['cpu']}, {env['cpus']} CPUs)",
        (f"speedup: pooled tokens/s over hf_greedy's, and its 95% interval over resampled prompts{few}; per "
         "prompt: median [quartiles] of the prompts' ratios; cpu: the same pooled ratio in tokens per CPU second"),
        (f"{'method':<{w}} {'dtype':>5} {'tok/s':>7} {'speedup':>8} {'95%':>11} {'per prompt':>18} {'cpu':>6} "
         f"{'tau':>5} {'identical':>9}  {'prefill':>7} {'draft':>6} {'verify':>6} {'other':>6}"),
    ]
    for name, m in report["methods"].items():
        split, p = m["time_split"] or {}, m["per_prompt_speedup"]
        row = f"{names[name]:<{w}} {m.get('dtype', report['dtype']):>5} "
        row += f"{_f(m['tokens_per_s'], '.1f'):>7} "
        row += f"{_f(m['speedup'], '.2f') + 'x':>8} "
        lo, hi = m.get("speedup_ci95") or (None, None)
        row += f"{'-' if lo is None else _f(lo, '.2f') + '-' + _f(hi, '.2f'):>11} "
        row += f"{_f(p['median'], '.2f') + ' [' + _f(p['q25'], '.2f') + '-' + _f(p['q75'], '.2f') + ']':>18} "
        row += f"{_f(m['cpu_speedup'], '.2f') + 'x':>6} "
        row += f"{_f(m['tau'], '.2f'):>5} {m['identical_prompts']:>4}/{report['num_prompts']:<4} "
        row += " ".join(f"{_f(split.get(k), '.0%'):>6}" for k in ("prefill", "draft", "verify", "other"))
        lines.append(row)
    for name in ("eyas_chain", "eyas_tree"):
        acc = report["methods"][name]["acceptance_by_depth"] or []
        lines.append(f"acceptance by depth, {label[name]}: " + " ".join(_f(a, ".2f") for a in acc))
    cats = list(report["categories"])
    lines.append("speedup by category: " + " ".join(f"{c[:10]:>10}" for c in cats))
    for name in METHODS[1:]:
        cells = " ".join(f"{_f(report['categories'][c]['methods'][name]['speedup'], '.2f'):>10}" for c in cats)
        lines.append(f"{name:<20} {cells}")
    for name, t in (report.get("speedup_terms") or {}).items():
        lines.append(f"{name} over eyas_target: tau {t['tau']:.2f} x T(1) {t['T1_ms']:.1f} ms / (T_verify "
                     f"{t['T_verify_ms']:.1f} + draft {t['draft_ms']:.1f} ms per round) = {t['predicted']:.2f}x "
                     f"(measured {t['measured']:.2f}x)")
    if report["sweep"]:
        s = report["sweep"]
        kind = "quick sweep (no shape was cached)" if s.get("quick") else "sweep"
        lines.append(f"{kind}: fastest {shape_label(s['best'])} at {s['best_tokens_per_s']:.1f} tok/s, target alone "
                     f"{s['target_tokens_per_s']:.1f} tok/s; saved to {s['cache']}")
    gen = shapes["generate"]
    if gen["source"] == TARGET_ALONE:
        lines.append(f"eyas generate decodes with the {TARGET_ALONE} (the draft is off: the rows above that use it "
                     "are for comparison)")
    elif gen["shape"]:
        lines.append(f"eyas generate decodes with {shape_label(gen['shape'])} ({gen['source']})")
    else:
        lines.append(f"eyas generate decodes with a measured shape: {gen['source']}")
    return "\n".join(lines)


def plot_bench(report: dict, path: str | Path) -> None:
    """Speedup over hf_greedy per method, for all prompts and per category, as grouped bars (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {"all": report["methods"], **{c: v["methods"] for c, v in report["categories"].items()}}
    methods = METHODS[1:]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) + 2), 4))
    for j, m in enumerate(methods):
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [g[m]["speedup"] or 0.0 for g in groups.values()], width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), list(groups), rotation=30, ha="right")
    ax.set_ylabel("speedup over HF greedy")
    ax.set_title(f"{report['target']}\n{report['dtype']}, {report['num_prompts']} prompts x "
                 f"{report['max_new_tokens']} new tokens", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_figure(path, fig, dpi=120)
    plt.close(fig)
