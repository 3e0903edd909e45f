"""The `eyas` command line: parse arguments, call one library function, print. Nothing else.

Every command prints one JSON object on stdout under `--json` (logs go to stderr) and exits 0 (ok),
1 (`check` found problems) or 2 (the input cannot be used: one `error:` and one `hint:` line;
`EYAS_DEBUG=1` shows the traceback instead).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from eyas.check import _target_config, check_checkpoint, consumer_warnings, consumers
from eyas.doctor import DEFAULT_LIMIT as DOCTOR_LIMIT
from eyas.doctor import DEFAULT_MAX_NEW_TOKENS as DOCTOR_MAX_NEW_TOKENS
from eyas.errors import EyasError
from eyas.formats import LAYER_CONVENTIONS, Checkpoint, convert_checkpoint, read_checkpoint


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def _print_json(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, indent=2))


def _verifier(args: argparse.Namespace) -> dict | None:
    return _target_config(args.verifier_config) if getattr(args, "verifier_config", None) else None


# --- inspect ------------------------------------------------------------------------------------


def tensor_summary(ckpt: Checkpoint) -> dict[str, Any] | None:
    """Count, parameters, dtypes and every tensor's shape; None when tensors were not read."""
    if not ckpt.tensors_loaded:
        return None
    dtypes: dict[str, int] = {}
    for t in ckpt.tensors.values():
        key = str(t.dtype).removeprefix("torch.")
        dtypes[key] = dtypes.get(key, 0) + 1
    return {
        "count": len(ckpt.tensors),
        "parameters": sum(t.numel() for t in ckpt.tensors.values()),
        "dtypes": dtypes,
        "weight_files": ckpt.weight_files,
        "naming": ckpt.weight_naming,
        "tensors": {
            n: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for n, t in sorted(ckpt.tensors.items())
        },
    }


def inspect_report(ckpt: Checkpoint) -> dict[str, Any]:
    """Everything `eyas inspect --json` prints."""
    cons = consumers(ckpt)
    return {
        "path": str(ckpt.path),
        "files": ckpt.files,
        "config_used": ckpt.config_used,
        "reason": ckpt.reason,
        "contract": ckpt.contract.to_dict(),
        "origin": ckpt.origin,
        "tensors": tensor_summary(ckpt),
        "consumers": cons,
        "warnings": ckpt.warnings + consumer_warnings(cons),
    }


def _yes(v: bool) -> str:
    return "true" if v else "false"


def format_inspect(rep: dict[str, Any]) -> str:
    """The human-readable inspect report."""
    c, o = rep["contract"], rep["origin"]
    v = c["verifier"]
    lines = [f"eyas inspect {rep['path']}"]
    lines.append("files:      " + ", ".join(f"{n} ({fmt})" for n, fmt in rep["files"].items()))
    lines.append(f"contract:   from {rep['config_used']}: {rep['reason']}")
    layer = (
        f"{c['layer_type']} x{c['num_hidden_layers']}: hidden {c['hidden_size']}, heads "
        f"{c['num_attention_heads']} / kv {c['num_key_value_heads']}, "
        f"head_dim {c['head_dim']}, intermediate {c['intermediate_size']}, {c['hidden_act']}, eps {c['rms_norm_eps']}"
        + (", attention bias" if c["attention_bias"] else "")
    )
    vocab = f"target {c['vocab_size']}, draft {c['draft_vocab_size']}" + (
        " (reduced: d2t/t2d map draft ids to target ids)" if c["draft_vocab_size"] < c["vocab_size"] else " (full)"
    )
    cap = "not recorded" if c["capture_layers"] is None else str(c["capture_layers"])
    rope = "none named (engines build theta 10000)" if c["rope_theta"] is None else f"theta {c['rope_theta']:g}"
    if c["rope_scaling"]:
        rope += f", scaling {json.dumps(c['rope_scaling'], sort_keys=True)}"
    ver = v["name_or_path"] or "not named"
    if v["architectures"]:
        ver += f" {v['architectures']}"
    if v["num_hidden_layers"] is not None:
        ver += f", {v['num_hidden_layers']} layers, hidden {v['hidden_size']}, vocab {v['vocab_size']}"
    rows = [
        ("layer", layer),
        ("vocab", vocab),
        ("capture_layers", f"{cap}  <- {o.get('capture_layers', '')}"),
        ("fc", f"{c['num_aux_layers']} x target_hidden_size {c['target_hidden_size']} -> hidden {c['hidden_size']}"),
        (
            "norms",
            " ".join(f"{k}={_yes(c[k])}" for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")),
        ),
        ("rope", f"{rope}; max_position_embeddings {c['max_position_embeddings']}"),
        (
            "embeddings",
            ("own embed_tokens" if c["has_embeddings"] else "none (the target's are used)")
            + f"  <- {o.get('has_embeddings', '')}",
        ),
        ("vocab map", ("d2t/t2d" if c["has_vocab_map"] else "none") + f"  <- {o.get('has_vocab_map', '')}"),
        ("verifier", ver),
    ]
    lines += [f"  {k:<15}{val}" for k, val in rows]
    t = rep["tensors"]
    if t is None:
        lines.append("tensors:    not read")
    else:
        lines.append(
            f"tensors:    {t['count']} in {', '.join(t['weight_files'])} ({t['naming']} naming), "
            f"{t['parameters']:,} parameters, {', '.join(f'{k} x{n}' for k, n in t['dtypes'].items())}"
        )
        lines += [f"  {n:<44}{str(x['shape']):<16}{x['dtype']}" for n, x in t["tensors"].items()]
    lines.append("consumers:")
    for name, r in rep["consumers"].items():
        if r["loads"]:
            cap = "N-dependent default" if r["capture_layers"] is None else str(r["capture_layers"])
            lines.append(
                f"  {name:<14} loads    capture {cap}, norm_before_residual={_yes(r['norm_before_residual'])}, "
                f"embeddings: {r['embeddings']}"
            )
        else:
            lines.append(f"  {name:<14} cannot load {r['reads']}")
        lines += [f"  {'':<14}   - {note}" for note in r["notes"]]
    lines.append("warnings:" + ("" if rep["warnings"] else " none"))
    lines += [f"  - {w}" for w in rep["warnings"]]
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace) -> int:
    ckpt = read_checkpoint(args.path, layer_convention=args.layer_convention, verifier_config=_verifier(args))
    rep = inspect_report(ckpt)
    if args.json:
        _print_json(rep)
    else:
        print(format_inspect(rep))
    return 0


# --- convert ------------------------------------------------------------------------------------


def cmd_convert(args: argparse.Namespace) -> int:
    _log(f"reading {args.src}")
    source, written = convert_checkpoint(
        args.src,
        args.dst,
        args.to,
        force=args.force,
        layer_convention=args.layer_convention,
        verifier_config=_verifier(args),
        verifier_name=args.verifier_name,
    )
    files = sorted(p.name for p in written.path.iterdir())
    warnings = (
        source.warnings
        + [w for w in written.warnings if w not in source.warnings]
        + consumer_warnings(consumers(written))
    )
    if args.json:
        _print_json(
            {
                "src": str(args.src),
                "dst": str(written.path),
                "to": args.to,
                "files": files,
                "source_files": source.files,
                "contract": written.contract.to_dict(),
                "tensors": len(written.tensors),
                "warnings": warnings,
            }
        )
    else:
        print(
            f"wrote {written.path} ({args.to}): {', '.join(files)}; {len(written.tensors)} tensors "
            "bit-identical, contract unchanged"
        )
        for w in warnings:
            print(f"warning: {w}")
    return 0


# --- check --------------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    rep = check_checkpoint(args.path, target=args.target, layer_convention=args.layer_convention)
    if args.json:
        _print_json(
            {
                "path": str(rep.path),
                "ok": rep.ok,
                "problems": rep.problems,
                "warnings": rep.warnings,
                "contract": rep.checkpoint.contract.to_dict(),
                "target": rep.target,
            }
        )
    else:
        print(f"{rep.path}: " + ("ok" if rep.ok else f"{len(rep.problems)} problem(s)"))
        for p in rep.problems:
            print(f"  - [{p['field']}] {p['problem']}\n      fix: {p['fix']}")
        for w in rep.warnings:
            print(f"  warning: {w}")
    return 0 if rep.ok else 1


# --- init ---------------------------------------------------------------------------------------


def _layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(k) for k in text.split(","))
    except ValueError:
        raise EyasError(f"--capture-layers {text!r} is not a comma-separated list of integers",
                        "write e.g. --capture-layers 2,15,27") from None


def cmd_init(args: argparse.Namespace) -> int:
    from eyas.contract import contract_for_target
    from eyas.drafter import Drafter
    from eyas.formats import write_checkpoint
    from eyas.target import load_target_embeddings, target_config, target_name

    contract = contract_for_target(target_config(args.target), capture_layers=_layers(args.capture_layers),
                                   name=target_name(args.target))
    drafter = Drafter(contract, embed_tokens=load_target_embeddings(args.target)).init_weights(args.seed)
    path = write_checkpoint(args.dst, contract, drafter.state_dict(), args.format, force=args.force)
    if args.json:
        _print_json({"path": str(path), "format": args.format, "contract": contract.to_dict()})
    else:
        print(f"wrote {path} ({args.format}): a random draft for {contract.verifier.name_or_path}, "
              f"capture layers {list(contract.capture_layers)}")
    return 0


# --- capture ------------------------------------------------------------------------------------


def cmd_capture(args: argparse.Namespace) -> int:
    import torch

    from eyas.contract import default_capture_layers
    from eyas.data import capture, read_prompts
    from eyas.target import Target

    if args.skip < 0:
        raise EyasError(f"--skip {args.skip}: must be >= 0", "pass the number of prompts to leave out")
    end = None if args.limit is None else args.skip + args.limit
    prompts = read_prompts(args.prompts, limit=end)[args.skip :]
    if not prompts:
        raise EyasError(f"{args.prompts}: no prompts left after --skip {args.skip}", "lower --skip")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    target = Target.load(args.target, dtype=dtype)
    layers = _layers(args.capture_layers) or default_capture_layers(target.num_layers)
    manifest = capture(target, prompts, layers, args.out,
                       max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, dtype=dtype,
                       do_sample=args.temperature > 0, temperature=args.temperature or 1.0, top_p=args.top_p,
                       seed=args.seed, skip_long=args.skip_long, max_length=args.max_length)
    if args.json:
        _print_json(manifest)
    else:
        print(f"wrote {args.out}: {manifest['num_samples']} samples, {manifest['num_tokens']} tokens "
              f"({manifest['num_loss_tokens']} answer tokens), {len(manifest['skipped_prompts'])} prompts skipped")
    return 0


# --- eval ---------------------------------------------------------------------------------------


def format_eval(rep: dict[str, Any]) -> str:
    """The eval table: per-depth acceptance, chain tau by k, tree tau, coverage."""
    lines = [f"{rep['drafter']} on {rep['target']} (capture layers {rep['capture_layers']}): "
             f"{rep['tokens']} positions, draft-vocab coverage {rep['coverage']:.3f}",
             "depth  acceptance  positions   |  k  tau_chain"]
    taus = sorted(rep["tau_chain"].items(), key=lambda kv: int(kv[0]))
    for j, (acc, n) in enumerate(zip(rep["acceptance_by_depth"], rep["depth_counts"])):
        k, tau = taus[j]
        lines.append(f"{j + 1:>5}  {acc:>10.3f}  {n:>9}   | {k:>2}  {tau:>9.3f}")
    t = rep["tau_tree"]
    lines.append(f"tree (top-{t['top_k']}, depth {t['depth']}, along the greedy path): tau {t['tau']:.3f}")
    return "\n".join(lines)


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from eyas.evaluate import evaluate, plot_report

    if args.data and args.prompts:
        raise EyasError("--data and --prompts both given", "evaluate on stored shards OR on prompts, not both")
    rep = evaluate(args.drafter, data=args.data, prompts=args.prompts, target=args.target, limit=args.limit,
                   max_new_tokens=args.max_new_tokens, depth=args.depth, tree_top_k=args.tree_top_k,
                   tree_depth=args.tree_depth, layer_convention=args.layer_convention,
                   dtype={"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype])
    if args.plot:
        plot_report(rep, args.plot)
    print(json.dumps(rep, indent=2) if args.json else format_eval(rep))
    return 0


# --- train --------------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from eyas.train import config_from_args, train

    summary = train(config_from_args(args))
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, rank 0 reports
        return 0
    if args.json:
        _print_json(summary)
    else:
        print(json.dumps(summary, indent=2))
    return 0


# --- generate and bench -------------------------------------------------------------------------


def cmd_generate(args: argparse.Namespace) -> int:
    from eyas.bench import format_generate, run_generate
    from eyas.drafter import resolve_drafter

    def stream(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    result = run_generate(resolve_drafter(args.drafter, args.target), args.prompt, draft_tokens=args.draft_tokens, tree=args.tree,
                          temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                          max_new_tokens=args.max_new_tokens, seed=args.seed, target=args.target,
                          dtype=args.dtype, stream=None if args.json else stream)
    if args.json:
        _print_json(result)
    else:
        print()
        _log(format_generate(result))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from eyas.bench import format_bench, run_bench
    from eyas.drafter import resolve_drafter

    report = run_bench(resolve_drafter(args.drafter, args.target), prompts=args.prompts, target=args.target, dtype=args.dtype,
                       max_new_tokens=args.max_new_tokens, limit=args.limit, draft_tokens=args.draft_tokens,
                       tree=args.tree, sweep=args.sweep, plot=args.plot)
    print(json.dumps(report, indent=2) if args.json else format_bench(report))
    return 0


# --- doctor -------------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    from eyas.doctor import diagnose, format_report
    from eyas.drafter import resolve_drafter

    report = diagnose(resolve_drafter(args.drafter, args.target), target=args.target, prompts=args.prompts,
                      features=args.features, layer_convention=args.layer_convention, limit=args.limit,
                      max_new_tokens=args.max_new_tokens)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["verdict"] == "ok" else 1


# --- parser -------------------------------------------------------------------------------------

_EXAMPLES = {
    "inspect": """examples:
  eyas inspect ./EAGLE3-LLaMA3.1-Instruct-8B
  eyas inspect ./draft/config.json --verifier-config ./Llama-3.1-8B-Instruct --json
  eyas inspect ./kimi-eagle3 --layer-convention output""",
    "convert": """examples:
  eyas convert ./EAGLE3-LLaMA3.1-8B ./eagle3-spec --to speculators --verifier-name meta-llama/Llama-3.1-8B-Instruct
  eyas convert ./speculators-draft ./sglang-draft --to eagle
  eyas convert ./draft ./draft-both --to both --verifier-config ./Llama-3.1-8B-Instruct --force""",
    "check": """examples:
  eyas check ./EAGLE3-LLaMA3.1-Instruct-8B --target ./Llama-3.1-8B-Instruct
  eyas check ./draft --target ./target/config.json --json
  eyas check ./draft/config.json""",
    "init": """examples:
  eyas init ./smollm2-draft
  eyas init ./my-draft --target ./Llama-3.2-1B-Instruct --capture-layers 2,8,13 --format speculators""",
    "capture": """examples:
  eyas capture --prompts sharegpt --limit 2000 --out ./shards
  eyas capture --target ./my-target --prompts prompts.jsonl --out ./shards --capture-layers 2,8,13""",
    "generate": """examples:
  eyas generate ./draft --prompt "Explain speculative decoding in two sentences."
  eyas generate ./draft --prompt "Write a haiku" --tree 6,4,24 --temperature 0.7 --seed 1
  eyas generate ./draft --prompt "Hi" --draft-tokens 4 --dtype fp32 --json""",
    "bench": """examples:
  eyas bench ./draft --limit 8
  eyas bench ./draft --prompts copy,mtbench --max-new-tokens 256 --json
  eyas bench ./draft --sweep --limit 8 --plot speedup.png""",
    "doctor": """examples:
  eyas doctor ./draft
  eyas doctor ./draft --target ./my-target --prompts prompts.jsonl --json
  eyas doctor ./draft --features ./vllm-dump.safetensors""",
    "train": """examples:
  eyas train --data ./shards --out ./run --draft-vocab 8192 --epochs 3
  eyas train --data ./shards --out ./run --resume
  torchrun --nproc_per_node=2 -m eyas.train --data ./shards --out ./run""",
    "eval": """examples:
  eyas eval ./draft --prompts mtbench --limit 10
  eyas eval ./draft --data ./shards --json
  eyas eval ./draft --target ./my-target --prompts prompts.jsonl --plot acceptance.png""",
}


def _add_reading(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layer-convention",
        choices=LAYER_CONVENTIONS,
        default=None,
        help="how to read nested eagle_config layer ids: input = capture indices, output = output of layer i (+1); "
        "default: as current SGLang (+1 only when the first id is 1)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def _add_decoding(p: argparse.ArgumentParser, target_help: str) -> None:
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--draft-tokens", type=int, metavar="K", help="chain of K draft tokens")
    p.add_argument("--tree", metavar="D,K,N", help="dynamic tree: depth, top-k per level, draft-node budget")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eyas", description="Read, check and convert EAGLE-3 draft models, offline.")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, fn: Callable[[argparse.Namespace], int], help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help_,
            description=help_,
            epilog=_EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=fn)
        return p

    p = command(
        "inspect", cmd_inspect, "config files and formats, the contract, tensors, what each engine will do, warnings"
    )
    p.add_argument("path", help="a draft folder, or a single draft config .json (tensor checks skipped)")
    p.add_argument(
        "--verifier-config",
        metavar="PATH",
        help="the target's config.json (or its folder): its depth resolves default layers",
    )
    _add_reading(p)

    p = command("convert", cmd_convert, "rewrite a draft as speculators, eagle or both formats (lossless)")
    p.add_argument("src", help="the draft folder to read")
    p.add_argument("dst", help="the folder to write (must be empty or new, unless --force)")
    p.add_argument(
        "--to",
        required=True,
        choices=("speculators", "eagle", "both"),
        help="format to write; both = config.json (speculators) + config_eagle.json",
    )
    p.add_argument(
        "--verifier-config",
        metavar="PATH",
        help="the target's config.json (or its folder): verifier name, architectures and depth",
    )
    p.add_argument(
        "--verifier-name", metavar="ID", help="the target's hub id to record as the verifier (vLLM serves it)"
    )
    p.add_argument("--force", action="store_true", help="replace a non-empty DST")
    _add_reading(p)

    p = command("check", cmd_check, "every problem with a draft, offline; exit 0 clean, 1 problems, 2 unreadable")
    p.add_argument("path", help="a draft folder, or a single draft config .json")
    p.add_argument("--target", metavar="DIR_OR_CONFIG", help="the target's folder or config.json (never downloaded)")
    _add_reading(p)

    target_help = "the target's folder (default: the embedded SmolLM2-135M-Instruct)"
    drafter_help = "the draft folder, any format (default: the draft eyas ships for the target)"
    p = command("init", cmd_init, "write a fresh (random) draft whose contract fits a target")
    p.add_argument("dst", help="the folder to write")
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--capture-layers", metavar="K,K,K", help="capture indices (default: 2, N//2, N-3)")
    p.add_argument("--format", choices=("speculators", "eagle", "both"), default="both")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace a non-empty DST")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = command("capture", cmd_capture, "answer prompts with the target and store its features as shards")
    p.add_argument("--prompts", default="sharegpt",
                   help="a prompt file (.json/.jsonl ShareGPT or {prompt}, or text lines), or sharegpt / mtbench")
    p.add_argument("--out", required=True, help="the shard folder (resumable: finished shards are kept)")
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--capture-layers", metavar="K,K,K", help="capture indices (default: 2, N//2, N-3)")
    p.add_argument("--limit", type=int, help="use the first N prompts (after --skip)")
    p.add_argument("--skip", type=int, default=0,
                   help="leave out the first N prompts (split one source across captures run in parallel)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy answers (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-length", type=int, help="prompt + answer token limit (default: the target's context)")
    p.add_argument("--skip-long", action="store_true", help="skip prompts that do not fit instead of failing")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON on stdout")

    p = command("eval", cmd_eval, "measure a draft standalone: per-depth acceptance, chain and tree tau, coverage")
    p.add_argument("drafter", nargs="?", help=drafter_help)
    p.add_argument("--data", metavar="SHARDS", help="a capture folder (eyas capture)")
    p.add_argument("--prompts", help="a prompt file, or mtbench (default when --data is not given)")
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--limit", type=int, help="use the first N prompts or samples")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--depth", type=int, default=8, help="draft depths to measure (tau for k = 1..depth)")
    p.add_argument("--tree-top-k", type=int, default=4)
    p.add_argument("--tree-depth", type=int, default=5)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--plot", metavar="PNG", help="write acceptance by depth and tau vs k as a PNG")
    _add_reading(p)

    p = command("generate", cmd_generate, "answer a prompt with speculative decoding, streaming the text")
    p.add_argument("drafter", nargs="?", help=drafter_help)
    p.add_argument("--prompt", required=True, help="the user turn (the chat template is applied)")
    _add_decoding(p, target_help)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.add_argument("--json", action="store_true", help="print one JSON object (no streaming)")

    p = command("bench", cmd_bench, "time HF greedy, HF prompt lookup, eyas target, chain and tree on the same prompts")
    p.add_argument("drafter", nargs="?", help=drafter_help)
    p.add_argument("--prompts", default="mtbench",
                   help="mtbench, humaneval, copy, a .jsonl of {prompt, category}, or a comma-separated list")
    p.add_argument("--limit", type=int, help="N prompts, spread over the categories")
    _add_decoding(p, target_help)
    p.add_argument("--sweep", action="store_true", help="try chain lengths and tree shapes; remember the fastest")
    p.add_argument("--plot", metavar="PNG", help="speedup per method and prompt category")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    p = command("doctor", cmd_doctor, "name the wiring fault behind a low acceptance, and the fix; exit 1 if faulty")
    p.add_argument("drafter", nargs="?", help=drafter_help)
    p.add_argument("--target", metavar="DIR", help=target_help)
    p.add_argument("--prompts", help="prompts to answer and measure on (default: MT-bench)")
    p.add_argument("--features", metavar="DUMP", help="an engine dump (safetensors: input_ids [T], features [T, W])")
    p.add_argument("--limit", type=int, default=DOCTOR_LIMIT, help="prompts measured")
    p.add_argument("--max-new-tokens", type=int, default=DOCTOR_MAX_NEW_TOKENS)
    _add_reading(p)

    from eyas.train import add_arguments

    p = command("train", cmd_train, "train an EAGLE-3 draft on captured features (training-time test)")
    add_arguments(p)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object on stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`eyas`); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already printed by argparse)
        return int(e.code or 0)
    try:
        return args.func(args)
    except EyasError as e:
        if os.environ.get("EYAS_DEBUG") == "1":
            raise
        print(f"error: {e}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
