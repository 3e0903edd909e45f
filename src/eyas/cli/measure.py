"""The verbs that make and use captured features: capture (the target answers prompts), eval (a
draft measured standalone) and train, with their text reports.

Each verb imports the library code it runs (the target, capture, evaluation, the training loop), so
`eyas --help` and the other verbs load only what they need.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from eyas.cli import preflight
from eyas.cli.inputs import capture_layers_of, drafter_of, target_of
from eyas.cli.output import print_json, print_report
from eyas.errors import EyasError

# --- capture ------------------------------------------------------------------------------------


def cmd_capture(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.contract import default_capture_layers
    from eyas.data import capture, prompts_fit, read_prompts, short_of_limit
    from eyas.data.capturing import same_prompts
    from eyas.data.prompts import named_set
    from eyas.data.sources import warn_copies
    from eyas.data.shards import MANIFEST, read_manifest
    from eyas.dtypes import to_dtype
    from eyas.target import Target

    target_spec = target_of(args, weights=True)
    end = None if args.limit is None else min(args.skip + args.limit, sys.maxsize)  # both bounded by preflight
    prompts = read_prompts(args.prompts, limit=end)[args.skip :]
    if not prompts:
        raise EyasError(f"{args.prompts}: no prompts left after --skip {args.skip}", "lower --skip")
    short_of_limit(prompts, args.limit, args.prompts, after=f" after --skip {args.skip}" if args.skip else "",
                   doing="capturing")
    if not named_set(args.prompts):  # a prompt file: eyas's sources are deduplicated, its evaluation sets marked
        warn_copies(prompts, args.prompts)
    dtype = to_dtype(args.dtype)
    prompts_fit(target_spec, prompts, args.max_new_tokens, max_length=args.max_length, skip_long=args.skip_long)
    same_prompts(args.out, prompts)  # resuming with other prompts: said before the weights load
    finished = (Path(args.out) / MANIFEST).is_file() and read_manifest(Path(args.out))["complete"]
    # loaded onto --device, not moved there after: refused when too large for it, spread over GPUs
    target = Target.load(target_spec, dtype=dtype, device=args.device)
    layers = capture_layers_of(args.capture_layers) or default_capture_layers(target.num_layers)
    manifest = capture(target, prompts, layers, args.out,
                       max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, dtype=dtype,
                       do_sample=args.temperature > 0, temperature=args.temperature, top_p=args.top_p,
                       seed=args.seed, skip_long=args.skip_long, max_length=args.max_length,
                       progress=args.progress, resumable=True, answers=args.answers)
    if args.json:
        print_json(manifest)
    else:
        said = f"{args.out} was complete already, nothing captured" if finished else f"wrote {args.out}"
        n, skipped = manifest["num_samples"], len(manifest["skipped_prompts"])
        print(f"{said}: {n} sample{'s' * (n != 1)}, {manifest['num_tokens']} tokens ({manifest['num_loss_tokens']} "
              f"answer tokens), {skipped} prompt{'s' * (skipped != 1)} skipped")
    return 0


# --- eval ---------------------------------------------------------------------------------------


def format_eval(rep: dict[str, Any]) -> str:
    """The eval table: per-depth acceptance, chain tau by k, tree tau, coverage; then what the
    features were, what judged them, and what it cost."""
    from eyas.data.caches import NORMED
    from eyas.verdict import describe

    lines = [f"{rep['drafter']} on {rep['target']} (capture layers {rep['capture_layers']}): "
             f"{rep['tokens']} positions, draft-vocab coverage {rep['coverage']:.3f}",
             "depth  acceptance  positions   |  k  tau_chain"]
    taus = sorted(rep["tau_chain"].items(), key=lambda kv: int(kv[0]))
    for j, (acc, n) in enumerate(zip(rep["acceptance_by_depth"], rep["depth_counts"])):
        k, tau = taus[j]
        lines.append(f"{j + 1:>5}  {acc:>10.3f}  {n:>9}   | {k:>2}  {tau:>9.3f}")
    lines.append(_tau_line(rep["chain_starts"], rep["chains_cut"]))
    t = rep["tau_tree"]
    lines.append(f"tree (top-{t['top_k']}, depth {t['depth']}, along the greedy path): tau {t['tau']:.3f}")
    lines += _format_intervals(rep)
    read, measured = rep["samples"]["read"], rep["samples"]["measured"]
    if measured < read:
        lines.append(f"{read - measured} of the {read} samples read have no position the draft can be measured at "
                     "(no two answer tokens in a row after the first: an empty loss_mask, or an answer of 2 tokens "
                     "or fewer): not counted")
    data, cost = rep["data"], rep["cost"]
    if data.get("answers_temperature"):
        lines.append(f"the answers are sampled (temperature {data['answers_temperature']:g}): the greedy numbers above "
                     "cut each chain where the answer leaves the target's greedy path (tau is a lower bound of greedy "
                     "serving's)")
    if "sampled" in rep:
        lines += _format_sampled(rep["sampled"])
        if "against" in rep:
            lines.append(_format_sampled_difference(rep["against"]["sampled"]["difference"]))
    lines.append(f"data: {data['format']} features, {data['path']}; {data['layers']}")
    lines.append(f"verdict: {describe(data['verdict'], data['last_hidden'] == NORMED)}; answers: {data['answers']}")
    rate = "-" if cost["positions_per_s"] is None else f"{cost['positions_per_s']:.0f}"
    lines.append(f"cost: {cost['seconds']:.1f} s on {cost['runs_on']} ({cost['dtype']}), {rate} positions/s measured; "
                 f"target tensors read: {', '.join(cost['target_tensors_read']) or 'none'}")
    return "\n".join(lines)


def _tau_line(starts: int, cut: int) -> str:
    """What tau_chain is over (`eyas.acceptance.chain_acceptance`), and how many chains it cut short."""
    line = (f"tau_chain over all {starts} chain starts, each chain cut where its answer ends, as decoding cuts it "
            "(so tau grows with k, and tau(k) is one figure at any --depth >= k)")
    if not cut:
        return line
    return (f"{line}; {cut} chain{'s' * (cut != 1)} cut short where the stored answer leaves the target's greedy "
            "path, its next tokens unknown (sampled answers, or near-ties rounded otherwise than here): tau counts "
            "what they accepted up to there, a lower bound")


def _span(bounds: list[float], sign: str = "") -> str:
    """An interval as "lo to hi" ("-" where it is undefined: fewer than 2 samples); sign "+" signs both."""
    return "-" if any(math.isnan(x) for x in bounds) else f"{bounds[0]:{sign}.3f} to {bounds[1]:{sign}.3f}"


def _resampling(n: int) -> str:
    from eyas.intervals import FEW

    rough = f" (under {FEW}: too narrow)" if 1 < n < FEW else ""
    return f"95% intervals, resampling the {n} sample{'s' * (n != 1)}{rough}"


def _difference(e: dict[str, Any]) -> str:
    """A paired difference and its interval: "+0.012 (95% +0.004 to +0.020)"."""
    return f"{e['difference']:+.3f} (95% {_span(e['ci95'], '+')})"


def _format_intervals(rep: dict[str, Any]) -> list[str]:
    """The 95% intervals line, and with a second draft its figures and the paired differences."""
    ci, k = rep["ci95"], str(len(rep["tau_chain"]))
    lines = [f"{_resampling(ci['samples'])}: depth-1 {_span(ci['acceptance_depth1'])}, "
             f"chain tau({k}) {_span(ci['tau_chain'][k])}, tree tau {_span(ci['tau_tree'])}"]
    if "against" in rep:
        o, d, diff = rep["against"], rep["against"]["difference"], _difference
        lines += [f"against {o['drafter']}: depth-1 {o['acceptance_by_depth'][0]:.3f}, chain tau({k}) "
                  f"{o['tau_chain'][k]:.3f}, tree tau {o['tau_tree']['tau']:.3f}",
                  f"this draft minus it, on the same samples: depth-1 {diff(d['acceptance_depth1'])}, "
                  f"chain tau({k}) {diff(d['tau_chain'][k])}, tree tau {diff(d['tau_tree'])}"]
    return lines


def _format_sampled(s: dict[str, Any]) -> list[str]:
    """The sampled section (eyas.sampled) in four lines: acceptance by depth and tau per way of drafting."""
    def row(values: list[float]) -> str:
        return " ".join(f"{v:.3f}" for v in values)

    K, t = len(s["acceptance_by_depth"]["chain"]), s["tau_tree"]
    lines = [f"sampled at temperature {s['temperature']:g} ({s['tokens']} positions): {s['note']}"]
    for mode, name in [("chain", "chain (draft samples)"), ("greedy_draft", "greedy draft (vLLM)")]:
        lines.append(f"  {name:<22} acceptance by depth {row(s['acceptance_by_depth'][mode])}; "
                     f"tau k=1 {s['tau_chain'][mode]['1']:.3f}, k={K} {s['tau_chain'][mode][str(K)]:.3f}")
    lines.append(f"  {'tree (top-' + str(t['top_k']) + ')':<22} acceptance by depth "
                 f"{row(s['acceptance_by_depth']['tree'])}; tau depth {t['depth']} {t['tau']:.3f}")
    ci = s["ci95"]
    depth1, tau = ci["acceptance_depth1"], ci["tau_chain"]
    lines.append(f"  {_resampling(ci['samples'])}: depth-1 {_span(depth1['chain'])} (chain), "
                 f"{_span(depth1['greedy_draft'])} (greedy draft); tau k={K} {_span(tau['chain'])} (chain), "
                 f"{_span(tau['greedy_draft'])} (greedy draft); tree {_span(ci['tau_tree'])}")
    return lines


def _format_sampled_difference(d: dict[str, Any]) -> str:
    """The sampled figures' paired differences from the --against draft, in one line."""
    depth1, tau, diff = d["acceptance_depth1"], d["tau_chain"], _difference
    return (f"  this draft minus the --against one, sampled: depth-1 {diff(depth1['chain'])} (chain), "
            f"{diff(depth1['greedy_draft'])} (greedy draft); tau k={tau['k']} {diff(tau['chain'])} (chain), "
            f"{diff(tau['greedy_draft'])} (greedy draft); tree {diff(d['tau_tree'])}")


def cmd_eval(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.evaluate import evaluate, plot_report

    answers = {} if args.max_new_tokens is None else {"max_new_tokens": args.max_new_tokens}
    rep = evaluate(drafter_of(args), data=args.data, data_format=args.data_format, prompts=args.prompts,
                   target=target_of(args, weights=True), limit=args.limit, **answers,
                   depth=args.depth, tree_top_k=args.tree_top_k,
                   tree_depth=args.tree_depth, layer_convention=args.layer_convention, dtype=args.dtype,
                   device=args.device, temperature=args.temperature, against=args.against,
                   progress=args.progress)
    if args.plot:
        plot_report(rep, args.plot)
    print_report(rep, args.json, format_eval)
    return 0


# --- train --------------------------------------------------------------------------------------


def format_train(summary: dict[str, Any]) -> str:
    """What a finished run made, for people; `--json` prints the summary itself."""
    loss = "-" if summary["loss"] is None else f"{summary['loss']:.4f}"
    steps = f"{summary['steps']} step{'s' * (summary['steps'] != 1)}"
    lines = [f"trained {steps} ({summary['epochs_run']:g} of {summary['epochs']} epochs, "
             f"{summary['world_size']} process(es)) "
             f"on {summary['train_samples']} samples, {summary['heldout_samples']} held out: loss {loss}, "
             f"capture layers {summary['capture_layers']}, draft vocab {summary['draft_vocab_size']} "
             f"(coverage {summary['coverage']:.3f})"]
    ev = summary.get("eval")
    if ev:
        lines.append(f"held out: depth-1 acceptance {ev['accept_depth1']:.3f}, tau {ev['tau']:.3f}")
    if "draft" in summary:
        lines.append(f"draft {summary['draft']}; log {summary['log']}, curves {summary['curves']}")
    lines.append(f"{summary['elapsed_s']:.0f} s on {summary['world_size']} x {summary['runs_on']}")
    return "\n".join(lines)


def cmd_train(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.train import config_from_args, train

    target = target_of(args, weights=True)
    args.target = None if target is None else str(target)
    summary = train(config_from_args(args))
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 reports
        return 0
    if args.json:
        print_json(summary)
    else:
        print(format_train(summary))
    return 0
