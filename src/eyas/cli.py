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
