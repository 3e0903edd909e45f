"""The verbs that read and write draft checkpoints without running a model: inspect, check,
convert, init, with the inspect report and its text form.

Each verb imports the library code it runs, so `eyas --help` and the other verbs load only what they need.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from eyas.cli import preflight
from eyas.cli.inputs import capture_layers_of, drafter_of, target_of
from eyas.cli.output import log, print_json
from eyas.codes import text_of

if TYPE_CHECKING:
    from eyas.formats import Checkpoint


def _verifier_config(args: argparse.Namespace) -> dict | None:
    """The `--target` config that resolves what the draft's own config leaves to its target."""
    from eyas.target import target_config

    target = target_of(args, weights=False)
    return None if target is None else target_config(target)


# --- inspect ------------------------------------------------------------------------------------


def tensor_summary(ckpt: Checkpoint) -> dict[str, Any] | None:
    """Count, parameters, dtypes and every tensor's shape as the weight files store them; None when tensors
    were not read. `completed`: what eyas reads differently from the file (a t2d derived from d2t, a map
    cast), said beside the stored tensors rather than listed as one of them."""
    if not ckpt.tensors_loaded:
        return None
    stored = {n: t for n, t in (ckpt.tensors | ckpt.filled).items() if t is not None}
    dtypes: dict[str, int] = {}
    for t in stored.values():
        key = _dtype(t)
        dtypes[key] = dtypes.get(key, 0) + 1
    return {
        "count": len(stored),
        "parameters": sum(t.numel() for n, t in stored.items() if n not in ("d2t", "t2d")),  # ids, not weights
        "dtypes": dtypes,
        "weight_files": ckpt.weight_files,
        "naming": ckpt.weight_naming,
        "names_under_model_prefix": ckpt.wrapped,
        "tensors": {n: {"shape": list(t.shape), "dtype": _dtype(t)} for n, t in sorted(stored.items())},
        "completed": {n: _completed(was, ckpt.tensors[n]) for n, was in sorted(ckpt.filled.items())},
    }


def _completed(was: Any, now: Any) -> str:
    if was is None:
        return f"not in the file: derived from d2t, {_dtype(now)} {list(now.shape)}"
    return f"stored {_dtype(was)}, read as {_dtype(now)}"


def _dtype(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def inspect_report(ckpt: Checkpoint) -> dict[str, Any]:
    """Everything `eyas inspect --json` prints."""
    from eyas.check import consumers, draft_warnings

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
        "disagreements": ckpt.disagreements,
        # what keeps a verb from running it (a tensor missing or misshapen, ...): listed, not refused, so
        # inspect shows the draft that check diagnoses
        "problems": [p for p in ckpt.problems if p not in ckpt.disagreements],
        "warnings": draft_warnings(ckpt, cons),  # check's, but a target's
    }


def _yes(v: bool) -> str:
    return "true" if v else "false"


def _contract_rows(c: dict[str, Any], o: dict[str, str]) -> list[tuple[str, str]]:
    """The contract as (label, value) rows; `o` says where each derived fact came from."""
    v = c["verifier"]
    layer = (
        f"{c['layer_type']} x{c['num_hidden_layers']}: hidden {c['hidden_size']}, heads "
        f"{c['num_attention_heads']} / kv {c['num_key_value_heads']}, "
        + ("" if "latent attention" in (c.get("unsupported") or "") else f"head_dim {c['head_dim']}, ")  # MLA has none
        + f"intermediate {c['intermediate_size']}, {c['hidden_act']}, eps {c['rms_norm_eps']}"
        + (", attention bias" if c["attention_bias"] else "")
        + (f", sliding window {c['sliding_window']}" if c["sliding_window"] else "")
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
    if v.get("model_type"):
        ver += f"; model_type {v['model_type']} (target_model_type)"
    norms = " ".join(f"{k}={_yes(c[k])}" for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"))
    if c["has_embeddings"]:
        embeddings = "own embed_tokens"
    elif c["target_hidden_size"] == c["hidden_size"]:
        embeddings = "none (the target's are used)"
    else:
        embeddings = f"none (the target's are {c['target_hidden_size']} wide: none can be used)"
    if c.get("embed_scale") not in (None, 1):
        embeddings += f"; trained scaled by embed_scale {c['embed_scale']:g} (served unscaled)"
    lm_head = "own" if c["has_lm_head"] else "none (the target's is used)"
    return [
        ("layer", layer),
        ("vocab", vocab),
        ("capture_layers", f"{cap}  <- {o.get('capture_layers', '')}"),
        ("fc", f"{c['num_aux_layers']} x target_hidden_size {c['target_hidden_size']} -> hidden {c['hidden_size']}"),
        ("norms", norms),
        ("rope", f"{rope}; max_position_embeddings {c['max_position_embeddings']}"),
        ("embeddings", f"{embeddings}  <- {o.get('has_embeddings', '')}"),
        ("lm_head", f"{lm_head}  <- {o.get('has_lm_head', '')}"),
        ("vocab map", ("d2t/t2d" if c["has_vocab_map"] else "none") + f"  <- {o.get('has_vocab_map', '')}"),
        ("verifier", ver),
        ("runs in eyas", "yes" if not c.get("unsupported") else f"no: no code for its {c['unsupported']}"),
    ]


def _tensor_lines(t: dict[str, Any] | None) -> list[str]:
    if t is None:
        return ["tensors:    not read"]
    head = (
        f"tensors:    {t['count']} in {', '.join(t['weight_files'])} ({t['naming']} naming"
        f"{f', {n} under model.' if (n := t['names_under_model_prefix']) else ''}), "
        f"{t['parameters']:,} parameters, {', '.join(f'{k} x{n}' for k, n in t['dtypes'].items())}"
    )
    return [head] + [f"  {n:<44}{str(x['shape']):<16}{x['dtype']}" for n, x in t["tensors"].items()] + [
        f"  {n:<44}{how}" for n, how in t["completed"].items()]


def _consumer_lines(consumers: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["consumers:"]
    for name, r in consumers.items():
        if r["loads"]:
            cap = "N-dependent default" if r["capture_layers"] is None else str(r["capture_layers"])
            lines.append(
                f"  {name:<14} loads    capture {cap}, norm_before_residual="
                f"{'not read' if r['norm_before_residual'] is None else _yes(r['norm_before_residual'])}, "
                f"embeddings: {r['embeddings']}"
            )
        else:
            lines.append(f"  {name:<14} cannot load {r['reads']}")
        lines += [f"  {'':<14}   - {note}" for note in (r["holds_for"], *r["notes"])]
    return lines


def _disagreement_lines(rep: dict[str, Any]) -> list[str]:
    """Each field the config files state differently, graded: a problem changes what the draft computes."""
    if not rep["disagreements"]:
        return []
    lines = [f"disagreements (the contract is read from {rep['config_used']}):"]
    for d in rep["disagreements"]:
        grade = "problem" if "problem" in d else "warning"
        lines += [f"  - {grade} [{d['field']}] {text_of(d)}", f"      fix: {d['fix']}"]
    return lines


def format_inspect(rep: dict[str, Any]) -> str:
    """The human-readable inspect report."""
    lines = [f"eyas inspect {rep['path']}"]
    lines.append("files:      " + ", ".join(f"{n} ({fmt})" for n, fmt in rep["files"].items()))
    lines.append(f"contract:   from {rep['config_used']}: {rep['reason']}")
    lines += [f"  {k:<15}{val}" for k, val in _contract_rows(rep["contract"], rep["origin"])]
    lines += _disagreement_lines(rep)
    lines += _tensor_lines(rep["tensors"])
    lines += _consumer_lines(rep["consumers"])
    if rep["problems"]:
        lines.append("problems (the verbs that run the draft refuse it; eyas check lists every one):")
        lines += [f"  - [{p['field']}] {p['problem']}\n      fix: {p['fix']}" for p in rep["problems"]]
    warnings = [w for w in rep["warnings"] if w not in rep["disagreements"]]  # those are listed above
    lines.append("warnings:" + ("" if warnings else " none"))
    lines += [f"  - {text_of(w)}" for w in warnings]
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.formats import read_checkpoint

    ckpt = read_checkpoint(drafter_of(args), layer_convention=args.layer_convention,
                           verifier_config=_verifier_config(args), strict=False)
    rep = inspect_report(ckpt)
    if args.json:
        print_json(rep)
    else:
        print(format_inspect(rep))
    return 1 if ckpt.problems else 0  # a tensor that misfits, config files that disagree on what it computes


# --- check --------------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.check import check_checkpoint

    rep = check_checkpoint(drafter_of(args), target=target_of(args, weights=False),
                           layer_convention=args.layer_convention, engine=args.engine)
    if args.json:
        print_json(
            {
                "path": str(rep.path),
                "ok": rep.ok,
                "engine": rep.engine,
                "problems": rep.problems,
                "warnings": rep.warnings,
                "contract": rep.checkpoint.contract.to_dict(),
                "target": rep.target,
            }
        )
    else:
        served = f" to serve with {rep.engine}" if rep.engine else ""
        print(f"{rep.path}: " + (f"ok{served}" if rep.ok else f"{len(rep.problems)} problem(s){served}"))
        for p in rep.problems:
            print(f"  - [{p['field']}] {p['problem']}\n      fix: {p['fix']}")
        for w in rep.warnings:
            print(f"  warning: {text_of(w)}")
    return 0 if rep.ok else 1


# --- convert ------------------------------------------------------------------------------------


def cmd_convert(args: argparse.Namespace) -> int:
    if args.src == "default":  # the shipped draft, as every DRAFTER reads it
        from eyas.drafter_loading import resolve_drafter

        args.src = str(resolve_drafter(args.src, args.target))
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.check import consumer_warnings, consumers
    from eyas.check.rules import target_problems
    from eyas.contract import target_facts
    from eyas.formats import convert_checkpoint, read_checkpoint
    from eyas.formats.validate import VOCAB_MAP_COMPLETED
    from eyas.target import target_name

    if args.progress:
        log(f"reading {args.src}")
    target_cfg = _verifier_config(args)
    source, written = convert_checkpoint(
        args.src,
        args.dst,
        args.format,
        force=args.force,
        layer_convention=args.layer_convention,
        verifier_config=target_cfg,
        verifier_name=args.verifier_name,
        target_name=None if args.target is None else target_name(args.target),
    )
    files = sorted(p.name for p in written.path.iterdir())
    seen = {_said(w) for w in source.warnings}  # the written copy repeats the source's findings
    warnings = (
        source.warnings
        + [w for w in written.warnings if _said(w) not in seen]
        + consumer_warnings(consumers(written))
    )
    problems = _unnamed_verifier(written, args.format)
    if target_cfg is not None:  # what `eyas check DST --target T` will say of the copy (another verifier, ...)
        copy = read_checkpoint(written.path, verifier_config=target_cfg, strict=False)  # as check reads it
        problems += target_problems(copy.contract, target_facts(target_cfg))
    completed = any(w["code"] in VOCAB_MAP_COMPLETED for w in source.warnings)  # else every tensor bit-identical
    if args.json:
        print_json(
            {
                "src": str(args.src),
                "dst": str(written.path),
                "format": args.format,
                "files": files,
                "source_files": source.files,
                "contract": written.contract.to_dict(),
                "tensors": len(written.tensors),
                "vocab_map_completed": completed,
                "warnings": warnings,
                "problems": problems,
            }
        )
    else:
        same = ": the vocab map completed as warned, the others bit-identical" if completed else " bit-identical"
        print(f"wrote {written.path} ({args.format}): {', '.join(files)}; {len(written.tensors)} tensors{same}, "
              "contract unchanged")
        for w in warnings + problems:
            print(f"warning: {text_of(w)}")
    return 0


def _said(w: dict[str, str]) -> tuple[str, str]:
    """A finding as the same fact in either format: its code and its field without the object a format
    nests it in (layer ids absent from `eagle_config` and from the top level are one warning)."""
    return w["code"], w["field"].removeprefix("eagle_config.").removeprefix("transformer_layer_config.")


def _unnamed_verifier(written: Checkpoint, fmt: str) -> list[dict[str, str]]:
    """`eyas check`'s verifier_name_missing, said as convert writes it: a speculators config without a
    verifier name, where neither the source, --target nor --verifier-name gave one."""
    from eyas.codes import finding

    if fmt == "eagle" or written.contract.verifier.name_or_path:
        return []
    return [finding(
        "verifier_name_missing",
        "speculators_config.verifier.name_or_path",
        f"{written.path / 'config.json'}: no verifier name (the source names none, and neither --verifier-name nor "
        "--target gave one): `vllm serve DIR` has no target to serve (vLLM loads it only beside a target it is "
        "given: --speculative-config); pass --verifier-name ID (the target's hub id)",
        "eyas convert SRC DST --format speculators --verifier-name ORG/MODEL",
    )]


# --- init ---------------------------------------------------------------------------------------


def cmd_init(args: argparse.Namespace) -> int:
    preflight.check(args)  # flags and input files, before anything loads
    from eyas.check import draft_warnings
    from eyas.contract import contract_for_target
    from eyas.drafter import Drafter
    from eyas.formats import read_checkpoint, write_checkpoint
    from eyas.target import load_target_embeddings, target_config, target_name

    target = target_of(args, weights=True)
    contract = contract_for_target(target_config(target), capture_layers=capture_layers_of(args.capture_layers),
                                   name=target_name(target)).verifier_named(args.verifier_name)  # errors name --target
    drafter = Drafter(contract, embed_tokens=load_target_embeddings(target)).init_weights(args.seed)
    path = write_checkpoint(args.dst, contract, drafter.state_dict(), args.format, force=args.force)
    warnings = draft_warnings(read_checkpoint(path))  # as check says them: an engine that will not load it, ...
    if args.json:
        print_json({"path": str(path), "format": args.format, "contract": contract.to_dict(), "warnings": warnings})
    else:
        print(f"wrote {path} ({args.format}): a random draft for {contract.verifier.name_or_path}, "
              f"capture layers {list(contract.capture_layers)}")
        for w in warnings:
            print(f"warning: {text_of(w)}")
    return 0
