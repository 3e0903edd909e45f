"""`eyas bench`: how much faster eyas decodes than Hugging Face, on the same prompts, in one run.

Five methods produce the SAME greedy answers (HF greedy, HF prompt lookup, eyas's loop without a
draft, eyas chain, eyas tree), prompt by prompt back to back; the report gives speed, speedup over
HF greedy, tau, acceptance by depth and the time split, overall and per prompt category.

    eyas.bench.run      run_bench: the whole benchmark and its JSON report
    eyas.bench.prompts  the prompt sets (mtbench, humaneval, copy, files) and their categories
    eyas.bench.timing   the five methods, the interleaved timing, pooling per method
    eyas.bench.sweep    sweep_shapes: every chain length and tree shape timed, the fastest kept
    eyas.bench.report   environment and git commit, the terminal table, the speedup plot

`eyas generate` lives in eyas.generate, the draft shapes and their cache in eyas.draft_shape.
"""

from eyas.bench.prompts import PROMPT_SETS, BenchPrompt, bench_prompts, copy_heavy_file
from eyas.bench.report import environment, format_bench, git_commit, plot_bench
from eyas.bench.run import DEFAULT_TREE, run_bench
from eyas.bench.sweep import SWEEP_CHAINS, SWEEP_TREES, sweep_shapes
from eyas.bench.timing import METHODS

__all__ = [
    "DEFAULT_TREE",
    "METHODS",
    "PROMPT_SETS",
    "SWEEP_CHAINS",
    "SWEEP_TREES",
    "BenchPrompt",
    "bench_prompts",
    "copy_heavy_file",
    "environment",
    "format_bench",
    "git_commit",
    "plot_bench",
    "run_bench",
    "sweep_shapes",
]
